"""Completions a person can read: scored responses as JSON lines.

One record per response: the prompt (the last user turn, as the task wrote it), the completion text, the reward, its
parts (the reward's ``components``), the reward's reason when it gave one (always when a reward is 0: a malformed
completion scores 0 *with a reason*), the gold answer, whether generation hit the token budget, and for multi-turn
episodes the episode's summary. Nothing here knows about trainers or models: it reads scored `mmrl.batch.Group`s.

Two writers:
* :class:`RunSamples`, ``samples.jsonl`` in a run directory: a few prompts per evaluation, appended with the step; a
  resumed run first drops the records of steps it will redo (as ``metrics.jsonl`` does), a fresh run starts it empty.
* :func:`write_samples`: every record of one evaluation into a new file (``mmrl.eval --save-samples``); an existing
  file is refused unless ``overwrite``.

Read them with ``jq``, e.g. ``jq -c 'select(.reward == 0) | {completion, reason}' runs/x/samples.jsonl | head``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mmrl.batch import Group
from mmrl.errors import RunError, UserError
from mmrl.files import atomic_write_text

SAMPLES_FILE = "samples.jsonl"


def prompt_text(sample: dict[str, Any]) -> str:
    """The last user turn of a sample's chat; image parts appear as ``<image>``."""
    users = [m for m in sample.get("messages", []) if m.get("role") == "user"]
    if not users:
        return ""
    content = users[-1].get("content", "")
    if isinstance(content, str):
        return content
    parts = []
    for part in content:  # a multimodal turn: [{"type": "image", ...}, {"type": "text", "text": ...}]
        parts.append(part.get("text", "") if part.get("type") == "text" else f"<{part.get('type', 'part')}>")
    return " ".join(p for p in parts if p)


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def group_records(groups: Iterable[Group], step: int | None = None, max_prompts: int = 0) -> list[dict[str, Any]]:
    """One record per scored response of the first ``max_prompts`` groups (0: all groups)."""
    records = []
    for i, group in enumerate(groups):
        if max_prompts and i >= max_prompts:
            break
        for j, resp in enumerate(group.responses):
            result = resp.reward
            record: dict[str, Any] = {"step": step, "problem": i, "sample": j, "prompt": prompt_text(group.sample),
                                      "answer": group.sample.get("answer"), "completion": resp.text,
                                      "tokens": len(resp.token_ids), "truncated": resp.truncated}
            if result is not None:
                record.update(reward=_finite(result.score),
                              parts={k: _finite(float(v)) for k, v in result.components.items()},
                              reason=result.reason)
            if resp.episode is not None:
                record["episode"] = resp.episode
            records.append(record)
    return records


def _dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, default=str)


class RunSamples:
    """``samples.jsonl`` of a run directory. ``resume_step``: keep only records of steps before it (None: start
    empty)."""

    def __init__(self, run_dir: Path, resume_step: int | None = None):
        self.path = Path(run_dir) / SAMPLES_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None or not self.path.exists():
            atomic_write_text(self.path, "")
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a kill mid-write
                continue
            step = record.get("step")
            if isinstance(step, int) and step < resume_step:  # the step numbers of metrics.jsonl
                kept.append(line)
        atomic_write_text(self.path, "".join(line + "\n" for line in kept))  # a kill now keeps every old line

    def append(self, records: list[dict[str, Any]]) -> None:
        with self.path.open("a") as f:
            f.writelines(_dumps(r) + "\n" for r in records)


def write_samples(path: str | Path, records: list[dict[str, Any]], overwrite: bool = False) -> Path:
    """Write ``records`` as JSON lines to a new file; refuse an existing one unless ``overwrite``."""
    target = Path(path)
    if target.exists() and not overwrite:
        raise UserError(f"--save-samples: {str(target)!r} already exists; pass --overwrite-samples to replace it")
    if target.is_dir():
        raise UserError(f"--save-samples: {str(target)!r} is a directory; name a file")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:  # a file that appeared there since the check is kept unless overwrite
        atomic_write_text(target, "".join(_dumps(r) + "\n" for r in records), replace=overwrite)
    except FileExistsError:
        raise RunError(f"--save-samples: {str(target)!r} appeared while the samples were drawn and was kept (pass "
                       f"--overwrite-samples to replace it)") from None
    return target

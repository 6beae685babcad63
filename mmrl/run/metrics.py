"""Metrics of a run: one JSON object per line in ``metrics.jsonl``, and ``curves.png`` at the end."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from mmrl.files import atomic_write_text


class MetricsLog:
    def __init__(self, path: Path, resume_step: int | None = None):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and path.exists():
            # Steps logged after the checkpoint we resume from are re-run; drop them so nothing is duplicated.
            kept = [line for line, record in _parse(path) if record.get("step", -1) < resume_step]
            atomic_write_text(path, "".join(line + "\n" for line in kept))  # a kill now keeps every old line
        elif resume_step is None:
            atomic_write_text(path, "")

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(clean) + "\n")


def _parse(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(line, record) pairs; a line cut short by a kill mid-write is skipped, not fatal."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append((line, json.loads(line)))
        except json.JSONDecodeError:
            continue
    return out


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [record for _, record in _parse(path)]


PANELS = [
    ("reward", "reward (mean)"), ("accuracy", "accuracy"), ("eval/pass@1", "eval pass@1"),
    ("response_length", "response length"), ("entropy", "token entropy"), ("kl_old", "KL(π_θ || π_old)"),
    ("grad_norm", "grad norm"), ("clip_frac", "clip fraction"), ("alpha", "GPG α"), ("format_rate", "format rate"),
    ("kl_init", "KL(π || π_init)"), ("moe/routing_mismatch", "MoE routing mismatch"),
    ("moe/load_imbalance", "MoE load imbalance (max/mean)"),
    ("valid_action_rate", "valid-action rate"), ("episode_length", "episode length (steps)"),
]


def plot_curves(records: list[dict[str, Any]], path: Path, title: str = "") -> Path | None:
    """Plot every panel that has data; returns the PNG path (None if there is nothing to plot)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # A panel whose metric never changes over several points (e.g. KL to π_old with one update per rollout) says
    # nothing: leave it out. A metric with a single point (a one-step run) is shown as that point.
    values = {k: [r[k] for r in records if r.get(k) is not None] for k, _ in PANELS}
    panels = [(k, label) for k, label in PANELS if len(set(values[k])) > 1 or len(values[k]) == 1]
    if not panels:
        return None
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, (key, label) in zip(axes.flat, panels, strict=False):
        pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o" if len(pts) < 20 else None, lw=1.5)
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path

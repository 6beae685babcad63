"""Task splits as the JSONL prompt files OpenRLHF's ``PromptDataset`` reads.

One line per task row: ``messages`` (the chat, read with ``--data.input_key messages --data.apply_chat_template``),
``label`` (the sample without its chat, as JSON: what :mod:`mmrl.openrlhf.reward` hands back to mmrl's reward) and,
for vision rows, ``images`` (``--data.image_key images``). Vision rows follow the qwen-vl-utils layout of the task
contract (a user content list with ``{"type": "image", "image": path | PIL.Image | bytes}`` entries): each image entry
becomes ``{"type": "image"}`` in the chat (the processor's placeholder) and its payload a file path in ``images``, in
order; in-memory images are written as PNG files beside the JSONL.

``annotate(sample) -> dict`` adds reward context computed on the driver before export (the vision layer's
``coord_frame`` / ``resized_hw`` / ``original_hw``, which need the model's processor); its keys go into the label.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from mmrl.errors import UserError

Annotate = Callable[[dict[str, Any]], dict[str, Any]]


def _image_file(payload: Any, image_dir: Path, stem: str) -> str:
    if isinstance(payload, (str, Path)):
        return str(Path(payload).expanduser().resolve()) if not str(payload).startswith(("http://", "https://")) \
            else str(payload)
    image_dir.mkdir(parents=True, exist_ok=True)
    target = image_dir / f"{stem}.png"
    if isinstance(payload, bytes):
        from PIL import Image

        payload = Image.open(io.BytesIO(payload))
    if hasattr(payload, "save"):
        payload.save(target, format="PNG")
        return str(target.resolve())
    raise ValueError(f"image of type {type(payload).__name__} (expected a path, bytes or a PIL image)")


def split_images(messages: list[dict[str, Any]], image_dir: Path, stem: str) -> tuple[list[dict[str, Any]], list[str]]:
    """(chat with bare ``{"type": "image"}`` placeholders, image file paths in order of appearance)."""
    chat, images = [], []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            chat.append(dict(message))
            continue
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image":
                images.append(_image_file(part.get("image"), image_dir, f"{stem}-{len(images)}"))
                parts.append({"type": "image"})
            else:
                parts.append(part)
        chat.append({**message, "content": parts})
    return chat, images


def count_images(row: dict[str, Any]) -> int:
    return sum(1 for m in row["messages"] if isinstance(m.get("content"), list)
               for p in m["content"] if isinstance(p, dict) and p.get("type") == "image")


def export_rows(rows: Iterable[dict[str, Any]], path: Path, split: str, datasource: str,
                annotate: Annotate | None = None) -> int:
    """Write ``rows`` as OpenRLHF prompt JSONL at ``path``; returns the most images any row holds.

    A row whose sample is not JSON-serialisable fails here, naming the split, row and key.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    image_dir = path.parent / f"{split}-images"
    most_images = 0
    with path.open("w") as out:
        for i, row in enumerate(rows):
            chat, images = split_images(row["messages"], image_dir, f"{split}-{i}")
            sample = {k: v for k, v in row.items() if k != "messages"}
            if annotate is not None:
                sample.update(annotate(row))
            for key, value in sample.items():
                try:
                    json.dumps(value)
                except TypeError as exc:
                    raise UserError(f"{split} row {i}: field {key!r} cannot be exported for OpenRLHF ({exc})") from exc
            line = {"messages": chat, "label": json.dumps(sample), "datasource": datasource}
            if images:
                line["images"] = images
                most_images = max(most_images, len(images))
            out.write(json.dumps(line) + "\n")
    return most_images

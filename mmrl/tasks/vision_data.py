"""Loading vision rows: local tables (jsonl/json/parquet/csv), image folders, hub ids; images checked at start.

A vision sample follows the qwen-vl-utils layout (docs/vision-rewards.md):
``{"messages": [{"role": "user", "content": [{"type": "image", "image": <path | bytes | PIL>}, {"type": "text",
"text": ...}]}], "answer": ..., ...}``. Images are kept as absolute paths (files) or bytes (parquet cells); the
vision layer opens them. Every image is opened once at start (`check_image`), so a missing or corrupt image fails
before training with one line naming the row and column, never mid-run.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmrl.cache import EMBEDDED_VL_NAME, build_once, cache_root
from mmrl.errors import UserError
from mmrl.paths import expand_path
from mmrl.tasks.tables import Rows, check_sources, load_rows, row_place

# Recommended config of every task with images (``register_task(..., config_defaults=IMAGE_TASK_DEFAULTS)``): the
# embedded Qwen2.5-VL, so that ``--task geoqa`` without ``--model`` gets a model that sees images, on either backend.
IMAGE_TASK_DEFAULTS = {"model.name": EMBEDDED_VL_NAME}
# Classification and visual-choice answers are a <think> sentence, then the label or option in <answer>: the generic
# 16 new tokens end inside the <think> part, so every response would be cut before its answer and score 0.
CHOICE_TASK_DEFAULTS = {**IMAGE_TASK_DEFAULTS, "rollout.max_new_tokens": 32}
URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def vision_cache_root() -> Path:
    """Where bundled synthetic sets are generated (``$MMRL_CACHE/vision-data``)."""
    return cache_root() / "vision-data"


def build_cached(name: str, build: Callable[[Path], None]) -> Path:
    """``vision_cache_root()/name``, built by ``build(tmp_dir)`` on first use; atomic (a concurrent reader sees
    either nothing or the whole set)."""
    return build_once(vision_cache_root() / name, build, "rows.jsonl")


@dataclasses.dataclass(frozen=True)
class ImageRoot:
    """The folder a dataset's image paths must stay in: its table's own folder, or the image folder itself (None for
    a hub dataset, which has no folder). A path that leaves it (``../x.png``, ``/home/me/x.png``, a symlink out) is
    refused unless ``allow_outside`` (the task option ``allow_outside_images``): a dataset is someone else's text,
    and each image it names is opened, decoded and shown to the model, so it could read any image on the machine."""

    folder: Path | None
    allow_outside: bool = False

    def locate(self, name: str, where: str) -> Path:
        """The resolved path of the image ``name``; raises ValueError naming ``where`` if it leaves the folder."""
        path = Path(os.path.expanduser(name))
        if not path.is_absolute() and self.folder is not None:
            path = self.folder / path
        resolved = path.resolve()
        if self.allow_outside:
            return resolved
        if self.folder is None:
            raise UserError(f"{where}: image path {name!r} in a dataset without a folder of its own (a hub "
                             "dataset); pass --task.allow_outside_images true to read image files it names")
        if not resolved.is_relative_to(self.folder.resolve()):
            raise UserError(f"{where}: image path {name!r} leads outside the dataset's folder {str(self.folder)!r}; "
                             "pass --task.allow_outside_images true to allow it")
        return resolved


def image_value(cell: Any, root: ImageRoot, where: str) -> str | bytes:
    """A table cell as an image reference: a path (relative ones resolved against ``root.folder``, and kept in it),
    raw bytes, or an HF ``{"bytes": ..., "path": ...}`` dict. Checked to open as an image; raises ValueError naming
    ``where``."""
    return sized_image(cell, root, where)[0]


def sized_image(cell: Any, root: ImageRoot, where: str) -> tuple[str | bytes, tuple[int, int]]:
    """:func:`image_value` and the image's (h, w), read as it is checked (one decode, not two)."""
    from PIL import Image

    if isinstance(cell, Image.Image):
        buf = io.BytesIO()
        cell.save(buf, format="PNG")
        return buf.getvalue()
    if isinstance(cell, dict):
        if cell.get("bytes"):
            cell = cell["bytes"]
        elif cell.get("path"):
            cell = cell["path"]
        else:
            raise UserError(f"{where}: image dict has neither 'bytes' nor 'path'")
    if isinstance(cell, (bytes, bytearray, memoryview)):
        value: str | bytes = bytes(cell)
    elif isinstance(cell, (str, os.PathLike)) and str(cell).strip():
        # read as a path, "http://host/x.png" names a file "http:/host/x.png" in the dataset's folder
        if URL.match(str(cell)) and not str(cell).startswith("file://"):
            raise UserError(f"{where}: image {str(cell)[:80]!r} is a URL; nothing is downloaded at run time, give "
                             "a local path or the image bytes")
        path = root.locate(str(cell), where)
        # one message for a missing file and one this user may not read (or that is not a file)
        if not path.is_file() or not os.access(path, os.R_OK):
            raise UserError(f"{where}: image file {str(path)!r} does not exist or cannot be read")
        value = str(path)
    else:
        raise UserError(f"{where}: no image (got {type(cell).__name__})")
    return value, check_image(value, where)


def row_image_hw(row: dict[str, Any], sizes: list[tuple[int, int]], where: str) -> list[int] | None:
    """A row's own ``image_hw`` column, [height, width] of its image(s), checked against the images as decoded (None
    when the row has none). Rewards scale boxes by it, so a size that is not the image's would score every answer
    against another picture; a wrong one is refused rather than trusted."""
    written = to_plain(row.get("image_hw"))
    if written is None:
        return None
    if not (isinstance(written, list) and len(written) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in written)):
        raise UserError(f"{where} column 'image_hw': {str(written)[:60]!r} is not [height, width] in pixels")
    for h, w in sizes:
        if written != [h, w]:
            raise UserError(f"{where} column 'image_hw': {written} is not the image's size [{h}, {w}] (height, "
                             "width); correct it or drop the column")
    return written


def check_image(value: str | bytes, where: str) -> tuple[int, int]:
    """Open and fully decode an image; returns its (h, w). A corrupt or truncated image raises ValueError."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(value) if isinstance(value, bytes) else value) as im:
            im.load()
            return im.height, im.width
    except Exception as exc:  # noqa: BLE001 -- PIL raises many types for bad files; one clear line instead
        raise UserError(f"{where}: image cannot be read ({type(exc).__name__}: {exc})") from exc


def load_table(source: str, split: str, max_samples: int = 0, allow_outside_images: bool = False,
               field: str = "task.path") -> tuple[list[dict[str, Any]], ImageRoot]:
    """Rows of a local table (jsonl/json/parquet/csv), an image folder (``<label>/<image>``) or a hub dataset
    ``split``, and the folder that its image paths are resolved against and kept in. Errors name ``field``, the
    option that named ``source``."""
    path = Path(expand_path(field, source))
    if path.is_dir():
        rows, folder = image_folder_rows(path, field), path.resolve()
    else:
        rows, folder = load_rows(source, split, field), (path.parent.resolve() if path.exists() else None)
    if max_samples:
        rows = rows[:max_samples]
    if not rows:
        raise UserError(f"{field}: {source!r} has no rows")
    return rows, ImageRoot(folder, allow_outside_images)


def refuse_file_options(task: Callable[..., Any], given: dict[str, Any], names: tuple[str, ...]) -> None:
    """Refuse the options of ``names`` that ``given`` sets away from ``task``'s defaults when there is no
    ``task.path``: the bundled set has its own columns, boxes, size and split, so such an option would be ignored,
    and a run on other data than the user asked for must not pass for the one they meant."""
    defaults = inspect.signature(task).parameters
    for name in names:
        if given[name] != defaults[name].default:
            raise UserError(f"task.{name} applies to task.path data; without task.path the bundled synthetic set is "
                             f"used, which has its own columns and split (set task.path, or drop task.{name})")


def to_plain(value: Any) -> Any:
    """Nested numpy arrays (parquet list columns) as plain Python lists; anything else unchanged."""
    if hasattr(value, "tolist") and not isinstance(value, (bytes, str)):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


def strip_answer_tags(value: Any) -> Any:
    """``"<answer> x </answer>"`` -> ``"x"`` (Visual-RFT stores solutions tagged); anything else unchanged."""
    if isinstance(value, str):
        m = re.search(r"<answer>(.*?)</answer>", value, re.DOTALL)
        if m:
            return m.group(1).strip()
    return value


def image_folder_rows(root: Path, field: str = "task.path") -> Rows:
    """An ImageFolder layout ``root/<label>/<image>`` as rows ``{"image": path, "label": label}`` (sorted)."""
    rows, places = [], []
    for class_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for image in sorted(p for p in class_dir.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES):
            rows.append({"image": str(image.resolve()), "label": class_dir.name})
            places.append(f"file {class_dir.name}/{image.name}")
    if not rows:
        raise UserError(f"{field}: image folder {str(root)!r} has no <label>/<image> files "
                         f"({', '.join(IMAGE_SUFFIXES)})")
    return Rows(rows, places, field)


def require_column(rows: list[dict[str, Any]], key: str, option: str, where: str) -> None:
    """Every row has ``key``: a column no row has is named as a column, a row without it by its number."""
    missing = next((i for i, row in enumerate(rows) if key not in row), None)
    if missing is None:
        return
    if all(key not in row for row in rows):
        raise UserError(f"task.{option}: {where} has no column {key!r} (columns: {sorted(map(str, rows[0]))})")
    raise UserError(f"{getattr(rows, 'field', 'task.path')}: {where} {row_place(rows, missing)} has no {key!r}")


def vision_messages(image: Any, text: str, system_prompt: str | None = None) -> list[dict[str, Any]]:
    """A one-image user turn in the qwen-vl-utils layout (image first, then the text)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": text}]})
    return messages


def split_rows(rows: list[dict[str, Any]], eval_fraction: float, seed: int) -> tuple[list, list]:
    """A seeded held-out split (files are often sorted by class or source)."""
    import random

    if not 0 <= eval_fraction < 1:
        raise UserError(f"task.eval_fraction must be in [0, 1), got {eval_fraction}")
    rows = list(rows)
    random.Random(seed).shuffle(rows)
    n_eval = int(round(len(rows) * eval_fraction))
    if rows and n_eval >= len(rows):  # rounding holds out every row of a small set: say which option did it
        raise UserError(f"task.eval_fraction {eval_fraction} holds out all {len(rows)} rows, leaving none to train "
                         f"on; lower it, or give the held-out rows in task.eval_path")
    return rows[n_eval:], rows[:n_eval]


def load_splits(path: str, eval_path: str, make_samples: Callable[[list, ImageRoot, str], list], *,
                max_samples: int, eval_fraction: float, seed: int, allow_outside_images: bool = False,
                make_eval_samples: Callable[[list, ImageRoot, str, list], list] | None = None) -> tuple[list, list]:
    """(train, eval) samples of a user's dataset: ``path``'s train split (``max_samples`` rows at most), and
    ``eval_path``'s test split when given, else a seeded ``eval_fraction`` of train.

    ``make_samples(rows, image_root, source)`` turns a table into samples; ``make_eval_samples(rows, image_root,
    source, train)``, when given, builds the eval samples instead (for tasks whose eval rows depend on train, e.g. the
    list of classes). Train is built first, so ``make_samples`` may settle options from the training rows.
    ``allow_outside_images`` lets image paths leave the dataset's folder (:class:`ImageRoot`).
    """
    check_sources(path, eval_path, max_samples)
    rows, base = load_table(path, "train", max_samples, allow_outside_images)
    train = make_samples(rows, base, path)
    if not eval_path:
        return split_rows(train, eval_fraction, seed)
    eval_rows, eval_base = load_table(eval_path, "test", allow_outside_images=allow_outside_images,
                                      field="task.eval_path")
    if make_eval_samples is not None:
        return train, make_eval_samples(eval_rows, eval_base, eval_path, train)
    return train, make_samples(eval_rows, eval_base, eval_path)

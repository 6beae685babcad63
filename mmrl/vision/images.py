"""Images of vision samples: loading from a path, raw bytes (parquet), an HF ``{"bytes", "path"}`` dict or a PIL image,
and finding them in a chat.

A vision sample's user content is a list in the qwen-vl-utils layout (docs/architecture.md)::

    {"messages": [{"role": "user", "content": [{"type": "image", "image": <path | bytes | PIL.Image>},
                                               {"type": "text", "text": "..."}]}], "answer": ...}

A missing or corrupt image is an :class:`ImageError` (a ``ValueError``, so the CLI prints it as one line) that names
the row, never a traceback deep inside PIL.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from mmrl.errors import UserError


class ImageError(UserError):
    """An image of a sample cannot be read; the message names the row."""


def is_image_item(item: Any) -> bool:
    return isinstance(item, dict) and (item.get("type") == "image" or "image" in item)


def image_entries(messages: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The ``{"type": "image", ...}`` items of a chat, in prompt order."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            yield from (item for item in content if is_image_item(item))


def has_images(row: dict[str, Any]) -> bool:
    return any(True for _ in image_entries(row.get("messages") or []))


def _describe(source: Any) -> str:
    if isinstance(source, (bytes, bytearray)):
        return f"{len(source)} bytes"
    text = repr(source)
    return text if len(text) <= 80 else text[:77] + "..."


def open_image(source: Any, where: str, decode: bool = True) -> Image.Image:
    """``source`` as an RGB PIL image (``decode=False``: only the header is read, for cheap start-up checks).

    ``where`` names the sample (e.g. ``"train row 12"``) for the error message.
    """
    if isinstance(source, dict):  # datasets' Image feature: {"bytes": b"...", "path": "..."}
        source = source.get("bytes") or source.get("path")
    try:
        if isinstance(source, Image.Image):
            image = source
        elif isinstance(source, (bytes, bytearray, memoryview)):
            image = Image.open(io.BytesIO(bytes(source)))
        elif isinstance(source, (str, os.PathLike)):
            text = str(source)
            if text.startswith(("http://", "https://")):
                raise ImageError(f"{where}: image {_describe(text)} is a URL; nothing is downloaded at run time, "
                                 "give a local path or the bytes")
            path = Path(text.removeprefix("file://")).expanduser()
            if not path.is_file():
                raise ImageError(f"{where}: image file {str(path)!r} does not exist")
            image = Image.open(path)
        else:
            raise ImageError(f"{where}: an image must be a path, bytes or a PIL image, got {type(source).__name__}")
        if decode:
            image.load()
            if image.mode != "RGB":
                image = image.convert("RGB")
        return image
    except ImageError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:  # PIL's ways of saying "corrupt"
        raise ImageError(f"{where}: image {_describe(source)} is missing or corrupt: {exc}") from exc


def check_row_images(row: dict[str, Any], where: str) -> int:
    """Open every image of ``row`` far enough to know it is readable (header only); returns how many there are."""
    count = 0
    for item in image_entries(row.get("messages") or []):
        if "image" not in item:
            raise ImageError(f"{where}: an image item has no 'image' key: {_describe(item)}")
        open_image(item["image"], where, decode=False)
        count += 1
    return count

"""The embedded models as the package ships them: ``mmrl/models/weights/<version>/`` and ``weights/manifest.json``.

The manifest holds, per model name (``embedded:tiny-qwen2``, ...): its folder, the sha256 of every file in it, the
recipe and the command that built it, the build's torch / transformers versions and CPU kernels, and its measured
skill with the command that measured it. `shipped_model` is how an ``embedded:`` name becomes a folder: it checks
the folder's files against the manifest once per process (a few MB: milliseconds), so a file changed or cut short on
disk is one clear error instead of a silently different model. Nothing is built at run time; a model is added or
replaced with ``python -m mmrl.models.recipes.ship`` (`mmrl.models.recipes.ship`).
"""

from __future__ import annotations

import json
from pathlib import Path

from mmrl.errors import UserError
from mmrl.files import file_sha256

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
MANIFEST_NAME = "manifest.json"
# A built model's record of how it was built (the recipe, its steps, the kernels, the library versions): the file
# that marks a folder as an embedded model's build (`mmrl.models.loading.is_embedded`).
BUILD_RECORD = "build.json"

_checked: dict[tuple[Path, str], Path] = {}  # (weights folder, name) -> model folder whose files matched



def read_manifest(weights_dir: Path = WEIGHTS_DIR) -> dict:
    """The manifest of ``weights_dir`` (``{"models": {}}`` when there is none yet)."""
    path = weights_dir / MANIFEST_NAME
    if not path.is_file():
        return {"models": {}}
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"model: {path} is not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("models"), dict):
        raise UserError(f"model: {path} has no 'models' object")
    return manifest


def shipped_names(weights_dir: Path = WEIGHTS_DIR) -> list[str]:
    return sorted(read_manifest(weights_dir)["models"])


def mismatch(directory: Path, files: dict[str, str]) -> str | None:
    """What in ``directory`` differs from ``files`` ({file name: sha256}), or None when every file matches."""
    for name, digest in sorted(files.items()):
        path = directory / name
        if not path.is_file():
            return f"{path} is missing"
        if file_sha256(path) != digest:
            return f"{path} does not match its sha256"
    return None


def shipped_model(name: str, weights_dir: Path = WEIGHTS_DIR) -> Path:
    """The folder of shipped embedded model ``name``, its files checked against the manifest (once per process)."""
    key = (weights_dir, name)
    if key in _checked:
        return _checked[key]
    models = read_manifest(weights_dir)["models"]
    if name not in models:
        raise UserError(f"model: unknown embedded model {name!r}; the package ships: {', '.join(sorted(models))}")
    entry = models[name]
    directory = weights_dir / entry["dir"]
    problem = mismatch(directory, entry["files"])
    if problem is not None:
        raise UserError(f"model: {name}: {problem} in {weights_dir / MANIFEST_NAME} (a changed or incomplete "
                         f"install; reinstall mmrl)")
    _checked[key] = directory
    return directory

"""A model's own code, and its config read without loading anything (docs/security.md).

A checkpoint may ship Python files that transformers imports and runs when ``trust_remote_code=True`` (its config
files name them under ``auto_map``). mmrl passes ``model.trust_remote_code`` (default false) to every loader it calls.
OpenRLHF's loaders, on the openrlhf backend, always pass true, so there the launcher reads the configs first and
refuses a model with its own code unless the field allows it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmrl.errors import UserError
from mmrl.hub import hub_reachable
from mmrl.hub import offline_by_env as hub_offline

# the files whose ``auto_map`` makes transformers import the model's own code (model, tokenizer, processors)
CONFIG_FILES = ("config.json", "tokenizer_config.json", "preprocessor_config.json", "processor_config.json",
                "video_preprocessor_config.json")


def read_configs(where: str, download: bool = False) -> dict[str, dict[str, Any]] | None:
    """{file name: JSON} of ``where`` (a directory, or a hub id read from the local Hugging Face cache, or with
    ``download`` fetched from the hub: a few small JSON files), or None when its ``config.json`` cannot be read."""
    found: dict[str, dict[str, Any]] = {}
    # one quick probe first: an unreachable hub would otherwise be retried for every file
    download = download and _local_file(where, "config.json") is None and not hub_offline() and hub_reachable()
    for name in CONFIG_FILES:
        path = _local_file(where, name) or (_downloaded(where, name) if download else None)
        if path is None:
            continue
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UserError(f"model: cannot read {path}: {exc}") from None
        if isinstance(data, dict):
            found[name] = data
    return found if "config.json" in found else None


def _local_file(where: str, name: str) -> str | None:
    directory = Path(where)
    if directory.is_dir():
        return str(directory / name) if (directory / name).is_file() else None
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        cached = try_to_load_from_cache(where, name)
    except HFValidationError:  # not a hub id either: the model loader names it
        return None
    return cached if isinstance(cached, str) else None


def _downloaded(where: str, name: str) -> str | None:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HFValidationError, LocalEntryNotFoundError

    if Path(where).exists():
        return None
    try:
        return hf_hub_download(where, name)
    except (EntryNotFoundError, LocalEntryNotFoundError, HFValidationError, OSError):  # absent file, or no network
        return None


def custom_code(configs: dict[str, dict[str, Any]]) -> list[str]:
    """The config files that name code of the model's own (``auto_map``)."""
    return [name for name, data in configs.items() if data.get("auto_map")]


def check_custom_code(spec: str, configs: dict[str, dict[str, Any]], trust: bool) -> None:
    """One line refusing a model that ships its own code, unless ``model.trust_remote_code`` allows it."""
    files = custom_code(configs)
    if files and not trust:
        raise UserError(f"model: {spec!r} ships its own Python code ({', '.join(files)} name it under auto_map), "
                         f"which loading it would run; read that code, then pass --model.trust_remote_code true to "
                         f"allow it")

"""What a saved or printed config hides: credentials.

``cluster.extra`` passes raw OpenRLHF flags through, and a user may put a W&B key or a hub token there; a URL (a remote
reward model's, a Ray address) may carry a password. Every place that writes a config to disk (``config.json``,
``resumes.jsonl``, the W&B and TensorBoard config) or shows it goes through :func:`masked_config`, whichever backend
runs, so a run directory that others can read never holds the value; :func:`masked_argv` is the same for a command line.
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

# Flags whose value is a credential: the last word of the flag's name (``logger.wandb.key``, ``hub_token``,
# ``api_secret``). The data section's ``*_key`` flags and ``ckpt.best_metric_key`` name dataset columns and metrics.
SECRET_WORDS = ("key", "token", "secret", "password", "passwd", "apikey", "credential", "credentials")
NOT_SECRET_SECTIONS = ("data.",)
NOT_SECRET = {"ckpt.best_metric_key"}
MASK = "***"
# where the tools behind OpenRLHF read their credentials when no flag gives them
SECRET_ENV = {"logger.wandb.key": "WANDB_API_KEY"}


# the password of a URL's user information: scheme://user:password@host
URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s:]*:)[^/?#\s]+@")
MASKED_URL = f":{MASK}@"  # what a masked URL holds in place of its password


def is_secret(flag: str) -> bool:
    name = str(flag).lstrip("-").lower()
    if name in NOT_SECRET or name.startswith(NOT_SECRET_SECTIONS):
        return False
    return re.split(r"[_\-]", name.rsplit(".", 1)[-1])[-1] in SECRET_WORDS


def mask_urls(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***`` (``ray://alice:***@head:10001``)."""
    return URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}@", text)


def _masked_values(value: Any) -> Any:
    """``value`` with `mask_urls` applied to every string in it, containers walked."""
    if isinstance(value, str):
        return mask_urls(value)
    if isinstance(value, dict):
        return {k: _masked_values(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_masked_values(v) for v in value)
    return value


def masked_extra(extra: Any) -> Any:
    """``cluster.extra`` as it may be shown or saved: the value of each secret flag replaced by ``***`` (anything but
    a mapping is returned as is: the config's own check refuses it)."""
    if not isinstance(extra, dict):
        return extra
    return {key: MASK if is_secret(key) else value for key, value in extra.items()}


def masked_config(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``TrainConfig.to_dict()`` with :func:`masked_extra` applied to ``cluster.extra`` and the password of
    every URL in it masked."""
    out = dict(config)
    if isinstance(out.get("cluster"), dict):
        out["cluster"] = {**out["cluster"], "extra": masked_extra(out["cluster"].get("extra", {}))}
    return _masked_values(out)


def masked_argv(argv: list[str]) -> list[str]:
    """A command line of mmrl's as it may be shown or stored: a ``cluster.extra`` mapping given on it masked as
    `masked_extra` masks it, and the password of every URL masked."""
    out = []
    for arg in argv:
        text = arg
        if text.lstrip().startswith("{"):  # a mapping flag's value (cluster.extra, evaluation sets) as JSON or YAML
            try:
                value = yaml.safe_load(text)
            except (yaml.YAMLError, RecursionError):
                value = None
            if isinstance(value, dict):
                text = json.dumps(masked_extra(value))
        out.append(mask_urls(text))
    return out

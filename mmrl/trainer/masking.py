"""What a saved or printed config hides: the values of credential flags in ``cluster.extra``.

``cluster.extra`` passes raw OpenRLHF flags through, and a user may put a W&B key or a hub token there. Every place that
writes a config to disk (``config.json``, ``resumes.jsonl``) or shows it goes through :func:`masked_config`, whichever
backend runs, so a run directory that others can read never holds the value.
"""

from __future__ import annotations

import re
from typing import Any

# Flags whose value is a credential: the last word of the flag's name (``logger.wandb.key``, ``hub_token``,
# ``api_secret``). The data section's ``*_key`` flags and ``ckpt.best_metric_key`` name dataset columns and metrics.
SECRET_WORDS = ("key", "token", "secret", "password")
NOT_SECRET_SECTIONS = ("data.",)
NOT_SECRET = {"ckpt.best_metric_key"}
MASK = "***"
# where the tools behind OpenRLHF read their credentials when no flag gives them
SECRET_ENV = {"logger.wandb.key": "WANDB_API_KEY"}


def is_secret(flag: str) -> bool:
    name = str(flag).lstrip("-").lower()
    if name in NOT_SECRET or name.startswith(NOT_SECRET_SECTIONS):
        return False
    return re.split(r"[_\-]", name.rsplit(".", 1)[-1])[-1] in SECRET_WORDS


def masked_extra(extra: Any) -> Any:
    """``cluster.extra`` as it may be shown or saved: the value of each secret flag replaced by ``***`` (anything but
    a mapping is returned as is: the config's own check refuses it)."""
    if not isinstance(extra, dict):
        return extra
    return {key: MASK if is_secret(key) else value for key, value in extra.items()}


def masked_config(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``TrainConfig.to_dict()`` with :func:`masked_extra` applied to ``cluster.extra``."""
    out = dict(config)
    if isinstance(out.get("cluster"), dict):
        out["cluster"] = {**out["cluster"], "extra": masked_extra(out["cluster"].get("extra", {}))}
    return out

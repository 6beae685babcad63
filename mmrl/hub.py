"""Hugging Face hub ids on a machine that may be offline: fail in seconds, not after a minute of retries.

`locate_hub_id` asks once, with a short timeout, whether the hub answers. If it does, the id is loaded as usual. If it
does not (or ``HF_HUB_OFFLINE`` is set), the id resolves to its snapshot in the local Hugging Face cache, so nothing
after that touches the network; with no cached copy it is one line saying so. Without this, transformers retries
an unreachable hub for ~70 s and ends in a traceback.
"""

from __future__ import annotations

import os
import threading

from mmrl.errors import UserError

PROBE_TIMEOUT_S = 3.0


def offline_by_env() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_reachable(timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether the hub endpoint (``$HF_ENDPOINT``) gives any HTTP answer to one HEAD request within ``timeout``
    (an open TCP port is not enough: a proxy may accept connections it never answers)."""
    import urllib.error
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    answered: list[bool] = []

    def ask() -> None:  # in a thread: a name lookup ignores timeouts and can hang
        try:
            urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout).close()
            answered.append(True)
        except urllib.error.HTTPError:  # an HTTP status is an answer
            answered.append(True)
        except (OSError, ValueError):
            answered.append(False)

    probe = threading.Thread(target=ask, daemon=True)
    probe.start()
    probe.join(timeout)
    return bool(answered and answered[0])


def cached_snapshot(repo_id: str, repo_type: str = "model") -> str | None:
    """The local snapshot folder of ``repo_id`` in the Hugging Face cache, or None."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return snapshot_download(repo_id, repo_type=repo_type, local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        return None


def locate_hub_id(repo_id: str, field: str) -> str:
    """``repo_id`` itself when the hub answers, else its cached snapshot folder; ValueError (one line) when neither
    is there. ``field`` names the option in the message (``model``, ``task.reward_model``)."""
    if not offline_by_env() and hub_reachable():
        return repo_id
    snapshot = cached_snapshot(repo_id)
    if snapshot is not None:
        return snapshot
    why = "HF_HUB_OFFLINE is set" if offline_by_env() else f"the hub did not answer within {PROBE_TIMEOUT_S:.0f} s"
    raise UserError(f"{field}: {repo_id!r} is not a local path, and it is not in the Hugging Face cache while "
                     f"offline ({why}); give a local directory, or download it on a machine with network access")


def locate_path_or_hub_id(spec: str, field: str, check_hub: bool = True) -> str:
    """A spec that is no existing local path: a path that does not exist is said to be one (``./x``, ``/x``, ``~/x``,
    ``x/y/z``, ``x\\y``); anything else is a hub id (``org/name`` or ``name``), checked by `locate_hub_id` unless
    ``check_hub`` is false (a cluster launch: the id is loaded on the cluster, not here)."""
    if spec.startswith(("/", ".", "~")) or spec.count("/") > 1 or "\\" in spec or not spec.strip():
        raise UserError(f"{field}: no such directory {spec!r}")
    return locate_hub_id(spec, field) if check_hub else spec

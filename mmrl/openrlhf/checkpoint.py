"""Reading a DeepSpeed checkpoint (``--resume`` on the openrlhf backend) as data, never as code.

DeepSpeed reads its checkpoint files with ``torch.load(weights_only=False)``: full unpickling, which runs whatever a
crafted file names (a shell command as easily as a tensor). While :func:`weights_only_loading` is active, every
``torch.load`` of the process reads weights only, whatever its caller asks (torch's ``TORCH_FORCE_WEIGHTS_ONLY_LOAD``,
read at each call), and the only classes it may build besides tensors and containers are the DeepSpeed types a
checkpoint of mmrl's runs holds (:data:`DEEPSPEED_TYPES`). A file that names anything else is refused with one line,
before any of it is built. mmrl's strategy (:mod:`mmrl.openrlhf.strategy`) loads every checkpoint under it.

Removing a checkpoint (the rotation past ``ckpt.max_num``, ``--run.overwrite``) removes only the files DeepSpeed,
OpenRLHF and mmrl wrote in it (:func:`remove_tag`): OpenRLHF's own rotation removes whole folders of ``_actor``, the
oldest first, whatever they are, a user's own folder there included. What else a tag folder holds stays, with it.

GVPO's replay store (:mod:`mmrl.openrlhf.replay`) is saved with each policy checkpoint, in the tag's own folder
(``_actor/<tag>/mmrl_replay/``), so that the rotation of old tags removes it with them. It is the local
trainer's checkpoint format (`mmrl.run.checkpoint`: ``state.json``, ``tensors.safetensors``, ``SHA256SUMS``),
written into a temporary folder and renamed into place: a kill midway leaves no store, never half of one.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from mmrl.errors import UserError
from mmrl.files import is_file_entry, remove_named_files, remove_owned
from mmrl.run.checkpoint import (
    PARTIAL_PREFIX,
    install,
    is_partial_write,
    read_state,
    remove_checkpoint,
    verify,
    write_state,
)

log = logging.getLogger("mmrl.openrlhf")

FORCE_WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
ACTOR_DIR = "_actor"  # OpenRLHF's DeepSpeed checkpoints of the policy, under ``ckpt.path``
REPLAY_DIR = "mmrl_replay"  # GVPO's replay store, inside the tag folder it was saved with
# What DeepSpeed and OpenRLHF write: beside the tags, the name of the newest and DeepSpeed's ZeRO-to-fp32 script; in a
# tag (OpenRLHF names them global_step<N>, best_global_step<N> for its best-metric saves), each rank's model and
# optimizer states (DeepSpeed's engine names every such file *_model_states.pt or *_optim_states.pt) and OpenRLHF's
# metric.json (DeepspeedStrategy.CKPT_METRIC_FILENAME).
TAG_NAME = re.compile(r"(best_)?global_step\d+")
BESIDE_TAGS = ("latest", "zero_to_fp32.py")
TAG_FILE_SUFFIXES = ("_model_states.pt", "_optim_states.pt")
METRIC_FILE = "metric.json"


def deepspeed_types() -> list[type]:
    """The classes a DeepSpeed ZeRO checkpoint pickles besides tensors, containers and numbers: the ZeRO stage, the
    loss scaler (``LossScaler`` in bf16, as mmrl trains; ``DynamicLossScaler`` when ``ds.param_dtype`` is fp16) and
    the flat-buffer addresses of ZeRO-1/2. Each holds plain numbers only."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address]


def checkpoint_folder(load_dir: str | Path, tag: str | None) -> Path:
    """The folder DeepSpeed will read: ``load_dir/tag``, the tag named by ``load_dir/latest`` when not given."""
    load_dir = Path(load_dir)
    if tag is None and (load_dir / "latest").is_file():
        tag = (load_dir / "latest").read_text().strip()
    return load_dir / tag if tag else load_dir


def _refused_global(error: pickle.UnpicklingError) -> str:
    """The name torch's weights-only reader refused (its message goes on to suggest ways around the refusal)."""
    found = re.search(r"GLOBAL ([\w.]+)", str(error))
    return found.group(1) if found else "an object that is not a tensor"


def _file_naming(folder: Path, name: str) -> Path:
    """The file of ``folder`` whose pickle names ``name`` (read without running it), else the folder itself."""
    for path in sorted(folder.glob("*.pt")):
        try:
            names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except (ValueError, RuntimeError, OSError):  # not torch's zip format: the loader's error is all we have
            continue
        if any(n == name or n.endswith(f".{name}") for n in names):  # torch's message may leave out builtins.
            return path
    return folder


@contextmanager
def weights_only_loading(folder: str | Path) -> Iterator[None]:
    """Within: every ``torch.load`` reads weights only, DeepSpeed's checkpoint types allowed. A file of ``folder``
    (the checkpoint being read) that holds anything else raises ValueError, one line naming the file and what it
    names; nothing in it is run."""
    previous = os.environ.get(FORCE_WEIGHTS_ONLY)
    os.environ[FORCE_WEIGHTS_ONLY] = "1"
    try:
        with torch.serialization.safe_globals(deepspeed_types()):
            yield
    except pickle.UnpicklingError as exc:
        name = _refused_global(exc)
        raise UserError(f"{_file_naming(Path(folder), name)} holds what a DeepSpeed checkpoint never does (it names "
                         f"{name}); not loaded, and nothing in it was run") from None
    finally:
        if previous is None:
            os.environ.pop(FORCE_WEIGHTS_ONLY, None)
        else:
            os.environ[FORCE_WEIGHTS_ONLY] = previous


def write_replay_store(tag_folder: str | Path, state: dict) -> Path:
    """Save a replay store's state (tensors, containers, JSON values) as ``tag_folder/mmrl_replay``, replacing an
    earlier save of the same tag (its files only: anything else in that folder stays)."""
    tag_folder = Path(tag_folder)
    target = tag_folder / REPLAY_DIR
    tmp = Path(tempfile.mkdtemp(dir=tag_folder, prefix=PARTIAL_PREFIX))
    try:
        write_state(tmp, {"replay": state})
        install(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def read_replay_store(tag_folder: str | Path) -> dict:
    """The replay store's state saved with the checkpoint ``tag_folder``; UserError, one line naming the folder or
    file, when it is missing, damaged or not a replay store."""
    folder = Path(tag_folder) / REPLAY_DIR
    if not folder.is_dir():
        raise UserError(f"{folder} is missing: the checkpoint has no GVPO replay store (rollout.replay_historical), "
                         f"which a resumed run needs to replay what the uninterrupted one would")
    verify(folder)
    state = read_state(folder)
    if not isinstance(state, dict) or not isinstance(state.get("replay"), dict):
        raise UserError(f"{folder} is not a GVPO replay store (its state.json holds no 'replay')")
    return state["replay"]


def is_tag(folder: Path) -> bool:
    """``folder`` is a checkpoint tag as OpenRLHF names them, holding DeepSpeed's model states."""
    return (TAG_NAME.fullmatch(folder.name) is not None and folder.is_dir() and not folder.is_symlink()
            and any(child.name.endswith(TAG_FILE_SUFFIXES[0]) for child in folder.iterdir()))


def remove_tag(folder: Path) -> tuple[list[str], list[str]]:
    """Remove what DeepSpeed, OpenRLHF and mmrl wrote in the checkpoint tag ``folder`` (the ranks' states, the metric,
    the replay store's files), then the folder if that empties it. Returns (the names removed, the names left)."""
    removed = []
    replay = folder / REPLAY_DIR
    if replay.is_dir() and not replay.is_symlink():
        _, left = remove_checkpoint(replay)
        removed.extend([] if left else [REPLAY_DIR])

    def owned(child: Path) -> bool:  # the states and metric; a replay store's write that never finished
        if child.name.startswith(PARTIAL_PREFIX):
            return is_partial_write(child)
        return (child.name.endswith(TAG_FILE_SUFFIXES) or child.name == METRIC_FILE) and is_file_entry(child)

    # the model states last: until they go, a removal cut short still leaves a tag the next rotation finds
    gone, left = remove_owned(folder, owned, last=lambda child: child.name.endswith(TAG_FILE_SUFFIXES[0]))
    return sorted(removed + gone), left


def remove_actor_checkpoints(folder: Path) -> tuple[list[str], list[str]]:
    """Remove a run's ``_actor`` folder as far as DeepSpeed, OpenRLHF and mmrl wrote it (``--run.overwrite``): every
    tag's files, ``latest`` and the recovery script; the folder too if that empties it. Returns (the names removed,
    the names left, a tag's as ``tag/name``)."""
    return remove_owned(folder, lambda child: child.name in BESIDE_TAGS and is_file_entry(child),
                        inside=lambda child: remove_tag if TAG_NAME.fullmatch(child.name) else None)


def rotate_tags(save_dir: Path, tag: str | None, max_num: int, max_mem_gb: float,
                metric: Callable[[str], float | None]) -> list[Path]:
    """Before ``tag`` is saved into ``save_dir``: OpenRLHF's rotation (``DeepspeedStrategy.save_ckpt``), confined to
    the checkpoints themselves. A new best tag replaces the earlier best ones; otherwise regular tags go, the first
    without a metric, then the worst, then the oldest, until ``max_num - 1`` remain and all tags together hold at
    most ``max_mem_gb`` GiB. Each goes by :func:`remove_tag`; a folder left with a user's files is no checkpoint any
    more and is named in a warning. Returns the tags removed."""
    tags = [f for f in sorted(save_dir.iterdir()) if is_tag(f)]
    is_best = tag is not None and tag.startswith("best")
    doomed = [t for t in tags if t.name.startswith("best") and t.name != tag] if is_best else []
    regular = [t for t in tags if not t.name.startswith("best")]
    sizes = {t: sum(f.stat().st_size for f in t.rglob("*") if f.is_file() and not f.is_symlink()) for t in tags}
    size = sum(sizes[t] for t in tags if t not in doomed)
    metrics = {t: metric(str(t)) for t in regular}
    ranked = sorted(regular, key=lambda t: (metrics[t] is not None,
                                            -math.inf if metrics[t] is None else metrics[t], t.stat().st_mtime))
    while ranked and ((not is_best and len(ranked) > max_num - 1) or size > max_mem_gb * 1024 ** 3):
        victim = ranked.pop(0)
        doomed.append(victim)
        size -= sizes[victim]
    for victim in doomed:
        _, left = remove_tag(victim)
        if left:
            log.warning("checkpoint %s: removed its states; left %s (not written by the run)", victim, ", ".join(left))
    return doomed


# What OpenRLHF's final save (``DeepspeedStrategy.save_model``: the model's and its tokenizer's ``save_pretrained``)
# writes into ``ckpt.output_dir``: weights (one file, or shards and their index; LoRA adapters), configs, tokenizer and
# processor files.
SAVED_MODEL_FILES = re.compile(
    r"model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\.index\.json|adapter_(model\.(safetensors|bin)|config"
    r"\.json)|(generation_|processor_|preprocessor_|video_preprocessor_)?config\.json|tokenizer(_config)?\.json|"
    r"tokenizer\.model|special_tokens_map\.json|added_tokens\.json|vocab\.json|merges\.txt|chat_template\.(jinja|json)")


def remove_saved_model(folder: Path) -> tuple[list[str], list[str]]:
    """Remove the files OpenRLHF's final save wrote in ``folder`` (the run's ``model/``, ``--run.overwrite``), then the
    folder if that empties it. Returns (the names removed, the names left: a model card of the user's, ...)."""
    return remove_named_files(folder, SAVED_MODEL_FILES.fullmatch)

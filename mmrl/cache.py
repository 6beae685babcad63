"""The on-disk cache every run shares, and the names and recipe versions of the embedded models.

A leaf: it imports nothing from mmrl, so tasks, models, config and both backends can name an embedded model or find
the cache without importing the code that loads one. The embedded models ship with the package, one folder per recipe
version (`mmrl.models.shipped`); the cache holds what is generated on a user's machine: de-quantised GGUF copies and
the generated vision and ALFWorld sets. Changing a recipe means bumping its version here and shipping the new build
(``python -m mmrl.models.recipes.build`` then ``python -m mmrl.models.recipes.ship``) beside the old one.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from mmrl.errors import UserError

try:
    import fcntl
except ImportError:  # not a POSIX system: builds are not serialised (each builds; the complete copy is kept)
    fcntl = None

log = logging.getLogger(__name__)
# What flock raises on file systems that do not support it (NFS mounted nolock, some FUSE / CIFS mounts, Lustre
# without -o flock): the build then goes on without the lock, as before locks existed.
NO_LOCK_ERRNOS = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL}

EMBEDDED_NAME = "embedded:tiny-qwen2"  # the text default
EMBEDDED_MOE_NAME = "embedded:tiny-qwen3-moe"
EMBEDDED_AGENT_NAME = "embedded:tiny-qwen2-agent"  # the default of --task alfworld
EMBEDDED_VL_NAME = "embedded:tiny-qwen2.5-vl"  # the default of tasks with images
EMBEDDED_GROUNDING_NAME = "embedded:tiny-qwen3-vl"  # the default of --task grounding (it needs absolute positions)
EMBEDDED_AGENT_SFT_NAME = "embedded:tiny-qwen2-agent-sft"  # the agent, warm-started on ALFWorld demonstrations
EMBEDDED_AGENT_SFT_TURN_NAME = "embedded:tiny-qwen2-agent-sft-turn"  # that agent, warm-started again in the turn layout

RECIPE_VERSION = "tiny-qwen2-v3"
MOE_RECIPE_VERSION = "tiny-qwen3-moe-v2"
AGENT_RECIPE_VERSION = "tiny-qwen2-agent-v3"  # v3: tool-calling chat template (TRL)
VL_RECIPE_VERSION = "tiny-qwen2.5-vl-v4"  # v4: 900 clean steps on geo-synth-v3 diagrams
GROUNDING_RECIPE_VERSION = "tiny-qwen3-vl-v2"  # v2: 2400 steps on one-shape grid scenes, 1200 on 2-3-shape ones
# built by benchmarks/alfworld.py's warm start (SFT of the agent on the explorer's demonstrations), not by a recipe here
AGENT_SFT_VERSION = "tiny-qwen2-agent-sft-v1"
AGENT_SFT_TURN_VERSION = "tiny-qwen2-agent-sft-turn-v1"

RECIPE_VERSIONS = {EMBEDDED_NAME: RECIPE_VERSION, EMBEDDED_MOE_NAME: MOE_RECIPE_VERSION,
                   EMBEDDED_AGENT_NAME: AGENT_RECIPE_VERSION, EMBEDDED_VL_NAME: VL_RECIPE_VERSION,
                   EMBEDDED_GROUNDING_NAME: GROUNDING_RECIPE_VERSION}
EMBEDDED_VERSIONS = {**RECIPE_VERSIONS, EMBEDDED_AGENT_SFT_NAME: AGENT_SFT_VERSION,  # the folder each one ships in
                     EMBEDDED_AGENT_SFT_TURN_NAME: AGENT_SFT_TURN_VERSION}


def cache_root() -> Path:
    """``$MMRL_CACHE`` (unset or empty: ``~/.cache/mmrl``). ValueError (one line) when it is, or lies under, a file."""
    given = os.environ.get("MMRL_CACHE")
    root = Path(given or Path.home() / ".cache" / "mmrl")
    for where in (root, *root.parents):
        if os.path.lexists(where):
            if not where.is_dir():
                name = f"MMRL_CACHE={given}" if given else f"the cache folder {root}"
                raise UserError(f"{name}: {where} is a file, not a folder; "
                                 + ("point MMRL_CACHE at a folder" if given else "set MMRL_CACHE to a folder"))
            break
    return root


@contextlib.contextmanager
def exclusive_lock(path: Path, waiting: str = "") -> Iterator[bool]:
    """Holds an exclusive ``flock`` on ``path`` (created if missing, never truncated) until the block ends; yields
    whether it holds one. Where the file system or the platform has no ``flock`` it warns and yields False. If another
    process holds the lock, logs ``waiting`` (when given) once before blocking."""
    with open(path, "a") as handle:
        if fcntl is None:
            log.warning("no flock on this platform: %s is not locked", path)
            yield False
            return
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if waiting:
                    log.info("%s", waiting)
                fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno not in NO_LOCK_ERRNOS:
                raise
            log.warning("the file system of %s does not support flock (%s): going on without the lock", path, exc)
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_once(target: Path, build: Callable[[Path], None], marker: str, *, force: bool = False) -> Path:
    """``target``, built by ``build(tmp_dir)`` unless ``target/marker`` exists (or ``force``).

    One builder at a time per target: processes that start on an empty cache together (parallel test workers, runs
    side by side) queue on the lock file ``.<target name>.lock`` beside it, and those that find the marker once they
    hold the lock use the first one's result instead of building it again. The result is built in a temporary sibling
    directory and renamed into place, so a reader that does not take the lock sees either nothing or the whole result.
    """
    if (target / marker).exists() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(target.parent / f".{target.name}.lock", f"waiting for another process building {target}"):
        if (target / marker).exists() and not force:
            return target  # built by the process that held the lock before this one
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".building-{target.name}-"))
        try:
            build(tmp)
            tmp.chmod(0o755)  # mkdtemp makes it 0700: other users of a shared cache (MMRL_CACHE on a volume) read it
            if (target / marker).exists() and not force:  # built meanwhile by a process the lock did not hold back
                shutil.rmtree(tmp)  # (no flock here): keep the copy its readers may be loading
                return target
            if target.is_symlink():  # not a copy of ours: never emptied, never replaced
                raise UserError(f"{target} is a link, where the cache keeps a folder it builds; remove the link or "
                                 f"set MMRL_CACHE to another folder")
            if target.exists():  # an unfinished or forced-out earlier copy
                shutil.rmtree(target)
            os.replace(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target

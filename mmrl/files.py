"""Whole-file rewrites that never leave a file half-written.

A leaf: it imports nothing from mmrl. `atomic_write_text` writes into a temporary file in the same folder, flushes it
to the disk and renames it over the target, so a kill, a crash or a full disk at any moment leaves either the old
file or the new one, never a truncated mix. Appending one line per step does not need this; replacing a file does.
`remove_owned` removes from a folder only what a writer of ours made there; `remove_named_files` is it for writers
that own files by name.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path


def file_sha256(path: str | Path) -> str:
    """The hex sha256 of a file's bytes, read in 1 MiB blocks (model and checkpoint files do not fit a read)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_temporary_of(name: str, target: str) -> bool:
    """``name`` is what `atomic_write_text` of a file named ``target`` leaves if it is killed before the rename."""
    prefix, suffix = f".{target}.", ".tmp"
    middle = name[len(prefix):-len(suffix)] if name.startswith(prefix) and name.endswith(suffix) else ""
    return len(middle) == 8 and all(c in "0123456789abcdef" for c in middle)


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8", *, replace: bool = True) -> Path:
    """Replace ``path`` with ``text`` atomically (temporary file in the same folder, fsync, ``os.replace``). The
    file keeps its permissions; a new one gets the usual ones (0o666 less the umask). With ``replace=False`` the
    file must not exist (FileExistsError, and nothing is written): whatever appeared at ``path`` since a caller
    checked it, a symlink included, stays as it is."""
    return atomic_write_bytes(path, text.encode(encoding), replace=replace)


def atomic_write_bytes(path: str | Path, data: bytes, *, replace: bool = True) -> Path:
    """`atomic_write_text` for bytes (a parquet table, an image)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with open(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        if replace:
            if target.exists():
                os.chmod(tmp, target.stat().st_mode & 0o7777)
            os.replace(tmp, target)
        else:
            _link_new(tmp, target, data)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _link_new(tmp: Path, target: Path, data: bytes) -> None:
    """Give the written ``tmp`` the name ``target`` only if that name is free (a hard link fails on any existing
    entry). A filesystem without hard links gets ``target`` created exclusively and written in place; a failed write
    removes it again (this call created it)."""
    try:
        os.link(tmp, target)
        return
    except FileExistsError:
        raise
    except OSError:  # no hard links here (EPERM, ENOTSUP on some network and FAT filesystems)
        pass
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    try:
        with open(fd, "wb") as out:
            out.write(data)
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def remove_owned(folder: Path, owned: Callable[[Path], bool], last: Callable[[Path], bool] = lambda _: False,
                 inside: Callable[[Path], Callable[[Path], tuple[list[str], list[str]]] | None] = lambda _: None
                 ) -> tuple[list[str], list[str]]:
    """Remove the entries of ``folder`` that ``owned`` says a writer of ours made (a folder with all it holds, a
    file or a link itself), those that ``last`` names after the others, then ``folder`` if that empties it. A
    subfolder for which ``inside`` gives a remover is handed to it instead, its names reported as ``sub/name``.
    Returns (the names removed, the names left). The removers of run folders (checkpoints, W&B, a saved model) are
    this."""
    removed, nested_left, nested = [], [], set()
    for child in sorted(folder.iterdir(), key=lambda c: (last(c), c.name)):
        remover = inside(child) if child.is_dir() and not child.is_symlink() else None
        if remover is not None:
            gone, kept = remover(child)
            removed += [f"{child.name}/{name}" for name in gone]
            nested_left += [f"{child.name}/{name}" for name in kept]
            nested.add(child.name)
            continue
        if not owned(child):
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
        removed.append(child.name)
    left = sorted(nested_left + [name for name in os.listdir(folder) if name not in nested])
    if not left:
        folder.rmdir()
    return removed, left


def is_file_entry(path: Path) -> bool:
    """``path`` (an entry of a folder) is a file or a link: what a writer of files may remove. A link to a folder
    counts, as the link itself goes, never what it points to."""
    return path.is_symlink() or not path.is_dir()


def remove_named_files(folder: Path, named: Callable[[str], object]) -> tuple[list[str], list[str]]:
    """`remove_owned` for a writer that owns the files (and links) whose name ``named`` accepts, never a folder."""
    return remove_owned(folder, lambda child: bool(named(child.name)) and is_file_entry(child))

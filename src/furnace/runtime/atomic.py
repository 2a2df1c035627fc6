"""Atomic output files: a result on disk is either the previous one or the whole new one.

Every output a `furnace` command writes (reports, JSON results, plots, checkpoints) goes
through here. The bytes go to a temporary file in the destination's folder, which is
fsynced, renamed over the destination with `os.replace` (atomic on POSIX within one file
system) and the folder fsynced, so a full disk, a kill or a power cut can never leave a
truncated file where a good one was.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

__all__ = [
    "OutputError",
    "atomic_open",
    "atomic_save",
    "atomic_write_bytes",
    "atomic_write_many",
    "atomic_write_text",
    "check_writable_dir",
    "check_writable_file",
]


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates 0600 files; an output should get the mode a plain open() would give it
_UMASK = _current_umask()


def _give_mode(tmp: str | os.PathLike[str], dest: Path) -> None:
    try:
        mode = dest.stat().st_mode & 0o777 if dest.exists() else 0o666 & ~_UMASK
        os.chmod(tmp, mode)
    except OSError:
        pass


class OutputError(OSError):
    """An output could not be written; the previous file, if any, is untouched."""

    # set by a caller that re-raises it with what the output was to hold
    # (`furnace.runtime.reproduce.run`: the run's outcomes)
    outcomes: list[Any]


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a directory; the rename is still atomic
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``path`` for writing; on success it replaces ``path``.

    If the block raises (a full disk included) the temporary file is removed, ``path`` keeps
    its previous content and an `OutputError` naming ``path`` is raised.
    """
    if "r" in mode or "a" in mode or "+" in mode:
        raise ValueError(f"atomic_open writes a new file; mode {mode!r} is not allowed")
    dest = Path(path)
    folder = dest.parent if str(dest.parent) else Path(".")
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise OutputError(f"cannot write {dest}: {exc.strerror or exc}") from exc
    tmp = Path(tmp_name)
    _give_mode(tmp, dest)
    try:
        with os.fdopen(fd, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {dest}: {exc.strerror or exc}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(folder)


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically and return the path."""
    with atomic_open(path, "w", encoding=encoding) as f:
        f.write(text)
    return Path(path)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically and return the path."""
    with atomic_open(path, "wb") as f:
        f.write(data)
    return Path(path)


def atomic_write_many(files: dict[str | os.PathLike[str], bytes | str]) -> list[Path]:
    """Write several files so that either all are replaced or none is.

    Every temporary file is written and fsynced first; only when all of them are on disk
    are they renamed over their destinations. A report and its data thus never disagree
    because the disk filled up between the two.
    """
    staged: list[tuple[Path, Path]] = []
    try:
        for path, content in files.items():
            dest = Path(path)
            folder = dest.parent if str(dest.parent) else Path(".")
            try:
                fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp",
                                                dir=folder)
            except OSError as exc:
                raise OutputError(f"cannot write {dest}: {exc.strerror or exc}") from exc
            staged.append((Path(tmp_name), dest))
            _give_mode(tmp_name, dest)
            data = content.encode("utf-8") if isinstance(content, str) else content
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as exc:
                raise OutputError(f"cannot write {dest}: {exc.strerror or exc}") from exc
        for tmp, dest in staged:
            os.replace(tmp, dest)
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for folder in {dest.parent for _, dest in staged}:
        _fsync_dir(folder if str(folder) else Path("."))
    return [dest for _, dest in staged]


def atomic_save(path: str | os.PathLike[str], writer: Callable[[IO[Any]], Any],
                binary: bool = True) -> Path:
    """Call ``writer(file)`` on a temporary sibling of ``path``, then replace ``path``.

    For writers that take a file object: ``torch.save(obj, f)``, ``fig.savefig(f, format=...)``.
    """
    with atomic_open(path, "wb" if binary else "w") as f:
        writer(f)
    return Path(path)


def check_writable_dir(path: str | os.PathLike[str], *, create: bool = True) -> Path:
    """Make sure ``path`` is a folder this process can create files in, before any work.

    Creates it (and its parents) when ``create``. Raises `OutputError` with a one-line
    reason otherwise. The check writes and removes a probe file, which also catches a
    read-only mount that ``os.access`` would not.
    """
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{folder} exists and is not a folder")
    if not folder.exists():
        if not create:
            raise OutputError(f"folder {folder} does not exist")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot create folder {folder}: {exc.strerror or exc}") from exc
    try:
        fd, probe = tempfile.mkstemp(prefix=".furnace-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(f"folder {folder} is not writable: {exc.strerror or exc}") from exc
    return folder


def check_writable_file(path: str | os.PathLike[str]) -> Path:
    """Make sure ``path`` can be written later: its folder exists and is writable.

    The folder is not created, since a typo in a file name's folder is more likely than a
    wish for a new folder. ``path`` itself, if it exists, must be a regular file.
    """
    dest = Path(path)
    if dest.is_dir():
        raise OutputError(f"{dest} is a folder, not a file")
    folder = dest.parent if str(dest.parent) else Path(".")
    if not folder.is_dir():
        raise OutputError(f"folder {folder} of {dest} does not exist")
    check_writable_dir(folder, create=False)
    return dest

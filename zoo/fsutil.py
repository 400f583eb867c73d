"""Atomic directory writes and file hashing."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # not POSIX: staging directories are not locked, nor swept
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

#: `atomic_directory`'s staging directories: `.NAME.tmp-XXXXXXXX`, beside the directory written
STAGING = re.compile(r"\..+\.tmp-[0-9a-f]{8}")
#: the directory `atomic_directory` replaces, moved aside (`.NAME.old-XXXXXXXX`) until the new one has its name
OLD = re.compile(r"\.(.+)\.old-[0-9a-f]{8}")
#: a staging directory this old whose writer holds no lock on it is a dead writer's (the
#: margin covers the instant between its `mkdir` and its lock)
STALE_AFTER_S = 2.0


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success fsync it and rename it to `final`.

    If the body raises, the temporary directory is removed, and so are the folders above
    it that were made for it (empty still), and `final` is untouched. An
    existing `final` is replaced only after the new one is complete: it is moved aside,
    the new one renamed in, and the old one deleted, so at every instant `final` is
    either the old complete directory or the new complete one (or, for an instant
    between the two renames, absent; never half-written). An exception or Ctrl-C in that
    instant puts the old one back; a writer killed there leaves it as `.NAME.old-XXXXXXXX`,
    which the next write beside it puts back (`sweep_stale`).

    Before the rename every file and directory inside gets the mode a newly created one
    gets here (0o666 or 0o777 less the umask, as `open` and `mkdir` make them): libraries
    that write private files (safetensors' `save_file` makes them 0600) would otherwise
    leave an artifact that a server running as another user (Triton, `zoo serve`) cannot
    read. Executable files keep their execute bits (as the umask allows).

    The writer holds a lock on its staging directory (`flock`, released when the process
    ends however it ends), and each write first removes the staging directories beside
    it that no live writer holds (`sweep_stale`): what a process killed mid-write (SIGKILL,
    a time-out) could not remove itself.
    """
    final = Path(final)
    made = [p for p in (final.parent, *final.parent.parents) if not p.exists()]  # deepest first
    final.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(final.parent)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    lock = _lock(tmp)
    try:
        modes = _new_file_modes(tmp)
        yield tmp
        _normalize_modes(tmp, *modes)
        _fsync_tree(tmp)
        if final.exists():
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(final.parent)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        _put_back(old, final)
        shutil.rmtree(tmp, ignore_errors=True)
        for folder in made:  # the folders made for it (a new repository), left as they were: absent
            try:
                folder.rmdir()
            except OSError:  # something else was written there meanwhile: kept
                break
        raise
    finally:
        if lock is not None:
            os.close(lock)


def _put_back(old: Path, final: Path) -> None:
    """After a write that stopped: the directory it had moved aside back in place where the
    new one did not take its name (an interrupt between the two renames), else removed."""
    if not old.exists():
        return
    if not final.exists():
        try:
            os.rename(old, final)
            return
        except OSError:  # taken meanwhile: the old copy is not needed
            pass
    shutil.rmtree(old, ignore_errors=True)


def _lock(directory: Path) -> int | None:
    """An exclusive `flock` on `directory`, held while the descriptor is open (None where
    there is no flock)."""
    if fcntl is None:
        return None
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def sweep_stale(parent: Path) -> list[Path]:
    """Remove the staging directories in `parent` (`.NAME.tmp-XXXXXXXX`) that no live writer
    holds: a process killed while writing leaves one (it holds its lock until it ends).
    Then a directory a killed writer had moved aside (`.NAME.old-XXXXXXXX`) is put back as
    NAME where NAME is missing, or removed where the new NAME took its place. Those it removed
    or put back."""
    removed: list[Path] = []
    if fcntl is None:
        return removed
    try:
        entries = [e for e in os.scandir(parent) if STAGING.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        try:
            if entry.stat(follow_symlinks=False).st_mtime > now - STALE_AFTER_S:
                continue
            fd = os.open(entry.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:  # gone meanwhile (its writer finished), or not ours to open
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a live writer holds it
            os.close(fd)
            continue
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
        finally:
            os.close(fd)
        log.info("removed %s: a write that did not finish (its process ended mid-write)", entry.path)
        removed.append(Path(entry.path))
    return removed + _sweep_old(Path(parent))


def _sweep_old(parent: Path) -> list[Path]:
    """The `.NAME.old-XXXXXXXX` directories in `parent` whose writer is gone (no staging
    directory of NAME is held by a live one, which would be between its two renames): put
    back as NAME where it is missing, else removed."""
    try:
        olds = [(e.path, m.group(1)) for e in os.scandir(parent)
                if (m := OLD.fullmatch(e.name)) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    done: list[Path] = []
    for path, name in olds:
        if _held(parent, name):
            continue
        missing = not (parent / name).exists()
        _put_back(Path(path), parent / name)
        log.info("%s: a write that did not finish had moved %s aside: %s", path, parent / name,
                 "put back" if missing else "removed, the new one is in place")
        done.append(Path(path))
    return done


def _held(parent: Path, name: str) -> bool:
    """Whether a live writer holds a staging directory of `name` in `parent`."""
    for entry in os.scandir(parent):
        if not (entry.name.startswith(f".{name}.tmp-") and STAGING.fullmatch(entry.name)):
            continue
        try:
            fd = os.open(entry.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
    return False


def _new_file_modes(directory: Path) -> tuple[int, int]:
    """(file mode, directory mode) that `open(..., 0o666)` and `mkdir(0o777)` give in
    `directory` (just made by `mkdir`): the umask applied, read back from a probe file rather
    than by setting the process's umask, which other threads share."""
    import stat

    directory_mode = stat.S_IMODE(os.stat(directory).st_mode)
    probe = directory / f".mode-probe-{uuid.uuid4().hex[:8]}"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        file_mode = stat.S_IMODE(os.fstat(fd).st_mode)
    finally:
        os.close(fd)
        os.unlink(probe)
    return file_mode, directory_mode


def _normalize_modes(root: Path, file_mode: int, directory_mode: int) -> None:
    """Give every file under `root` `file_mode` (with `directory_mode`'s execute bits where it
    had one) and every directory `directory_mode`; symbolic links are left as they are."""
    import stat

    executable = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
    for dirpath, dirnames, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                mode = (file_mode | (directory_mode & executable)) if st.st_mode & executable else file_mode
                if stat.S_IMODE(st.st_mode) != mode:
                    os.chmod(path, mode)
        for name in dirnames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path) and stat.S_IMODE(os.lstat(path).st_mode) != directory_mode:
                os.chmod(path, directory_mode)
    if stat.S_IMODE(os.stat(root).st_mode) != directory_mode:
        os.chmod(root, directory_mode)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write a file through a temporary sibling and rename: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write a text file atomically (see `atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode())


def check_destination(path: Path, option: str, directory: bool = True) -> None:
    """Refuse a destination that cannot be written before the work that fills it (a
    benchmark, a training run), so that none of that work is lost to it after: a file
    where a folder is wanted or the reverse, a file among its parents, a folder this user
    cannot write (tried: a probe file made and removed, which holds where permission bits
    do not, as for root or on /proc). `UsageError` naming `option`."""
    import tempfile

    from .errors import UsageError

    path = Path(path)
    if directory and path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path}: exists and is not a directory")
    if not directory and path.is_dir():
        raise UsageError(f"{option} {path}: is a directory; name the file to write, e.g. {path / 'report.json'}")
    folder = path if directory else path.parent
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise UsageError(f"{option} {path}: {existing} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(dir=existing, prefix=".zoo-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError:
        raise UsageError(f"{option} {path}: {existing} is not writable") from None


"""Triton's system shared memory extension: the registry of regions a same-host client shares with the server.

A client creates a POSIX shared memory object (`shm_open` + `ftruncate`, as
`tritonclient.utils.shared_memory.create_shared_memory_region` does), registers it under a name with a key (the
object's name in /dev/shm), an offset and a byte size, and then names the region in an inference request's input or
output `parameters` (`shared_memory_region`, `shared_memory_offset`, `shared_memory_byte_size`): the server reads
that input from the region, or writes that output into it, instead of carrying the bytes in the request.

The extension is off by default (`zoo serve --shared-memory system` turns it on); while it is off `register`,
`unregister`, `read`, `write` and `take` raise `FeatureOffError` (403), and `status` lists no regions (as Triton answers
it). The rules, Triton's fixes for its shared memory CVEs among them:

- a key is one file name in /dev/shm (`^/?[A-Za-z0-9_.-]{1,255}$`, no "..", no other slash), so a registration can
  never reach a file elsewhere; the object is opened with O_NOFOLLOW (a symbolic link is refused), must already exist
  (it is never created), must be a regular file and must hold `offset + byte_size` bytes;
- the object's descriptor is opened once at registration and kept while the region is registered; `unregister` and
  `close` close it (once: closing again is a no-op, so a recycled descriptor number is never closed);
- an inference request `take`s the regions it names when it starts (each part it names checked against the region's
  size before the model runs) and `release`s them when it ends. Unregistering a region a request holds succeeds, as in
  Triton, but the region stays registered (listed in `status`, its name taken) until the last request holding it ends;
  a new request naming it meanwhile is refused as naming an unknown region (Triton would still serve it: refusing is
  the safe choice, nothing new starts on a region its owner has let go). `close` (shutdown) closes every region,
  held or not;
- every read and write is checked against the region's registered size and copies, with `os.pread` and `os.pwrite` at
  the region's offset: nothing the server holds aliases the object's memory. A copy holds its region (a count taken
  under the registry's lock, which is held only to look regions up, never over a copy), and an unregistered region's
  descriptor is closed when its last copy (and the last request holding it) ends: an unregister never closes a
  descriptor in the middle of a copy, and a large copy in a worker thread never makes a small one on the event loop
  wait;
- an error never echoes a region's name or key (another client could probe for them); it may state offsets and sizes;
- at most `MAX_REGIONS` regions (each holding one open descriptor) are registered at a time.

Why pread/pwrite and not a mapping (as Triton has): a client may shrink (ftruncate) its object after registering it,
and touching a mapped page past the object's new end raises SIGBUS, which kills the whole server. A system call on the
descriptor cannot fault that way: a read past the new end comes back short, which is a `SharedMemoryError` (the object
is now smaller than when it was registered), and a write checks the object's size first. It costs no extra copy:
reading from a mapping copied the bytes out anyway, and a write copies once into the object either way. (A client that
shrinks its object between that check and the write gets it grown back by the write: its own doing, never a crash.)

What the extension cannot guard against: any process that can reach the server's API may register any shared
memory object the server's user can open.
"""

from __future__ import annotations

import errno
import logging
import numbers
import os
import re
import stat
import threading
from dataclasses import dataclass
from typing import Any

from .errors import FeatureOffError, RegionExistsError, RegionNotFoundError, SharedMemoryError

log = logging.getLogger("zoo.serve")

SHM_DIR = "/dev/shm"  # where Linux keeps POSIX shared memory objects (tmpfs)
MAX_REGIONS = 256  # registered at a time
MAX_NAME = 256  # characters in a region name
#: a POSIX shared memory object name: one file name in SHM_DIR, an optional leading slash as shm_open takes it.
KEY = re.compile(r"^/?[A-Za-z0-9_.\-]{1,255}$")
OFF = "system shared memory is off; start the server with --shared-memory system to use it"
UNKNOWN = "unknown shared memory region: register it first (POST /v2/systemsharedmemory/region/NAME/register)"
CLOSED = "the shared memory region was closed (the server is shutting down)"
DUPLICATE = "a shared memory region of that name is already registered; unregister it first"
SHRUNK = ("the shared memory object is now smaller than when it was registered (its owner shrank it): register it "
          "again once it holds the region")


@dataclass(eq=False)
class Region:
    """One registered region: `fd` is the object's descriptor, open (O_RDWR) while the region is registered."""

    name: str
    key: str
    offset: int  # where the region starts in the shared memory object
    byte_size: int
    fd: int  # -1 once closed
    copies: int = 0  # copies in progress (the registry's lock guards it, as the two fields below)
    users: int = 0  # requests holding it (`Regions.take`): unregistered, it stays registered until they end
    dropped: bool = False  # unregistered: closed when `copies` and `users` fall to 0

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def close(self) -> None:
        """Close the descriptor; a second call does nothing (its number may belong to another file by then)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError as exc:  # nothing to do about it, and the descriptor is gone either way
                log.warning("closing a shared memory object failed (%s)", errno.errorcode.get(exc.errno or 0, "error"))


def _count(value: Any, what: str, least: int) -> int:
    """`value` as an int of at least `least`; bools and other types are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SharedMemoryError(f"{what} must be an integer, not {type(value).__name__}")
    if value < least:
        raise SharedMemoryError(f"{what} must be at least {least}, not {int(value)}")
    return int(value)


def _check_key(key: Any) -> str:
    if not isinstance(key, str) or not KEY.match(key) or ".." in key or key.lstrip("/") == ".":
        raise SharedMemoryError("a shared memory key must be the name of one object in /dev/shm: 1 to 255 letters, "
                                "digits, '_', '-' or '.', an optional leading '/', no other '/' and no '..'")
    return key.lstrip("/")


def _open_object(key: str, size: int) -> int:
    """A read-write descriptor of the existing regular file `SHM_DIR/key`, which must hold at least `size` bytes."""
    if not os.path.isdir(SHM_DIR):
        raise SharedMemoryError("system shared memory needs Linux's /dev/shm, which this machine does not have")
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(f"{SHM_DIR}/{key}", flags)
    except OSError as exc:
        raise SharedMemoryError(_open_failure(exc)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SharedMemoryError("the shared memory key does not name a shared memory object (not a regular file)")
        if info.st_size < size:
            raise SharedMemoryError(f"the shared memory object holds {info.st_size} bytes, fewer than the registered "
                                    f"offset + byte_size ({size} bytes)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_failure(exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return "no shared memory object has that key: create it (shm_open, ftruncate) before registering it"
    if exc.errno == errno.ELOOP:
        return "the shared memory key names a symbolic link, which is refused"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "the server may not open that shared memory object read-write (permission denied)"
    if exc.errno == errno.EISDIR:
        return "the shared memory key does not name a shared memory object (a directory)"
    return f"cannot open the shared memory object ({errno.errorcode.get(exc.errno or 0, 'error')})"


def _io_failure(what: str, exc: OSError) -> SharedMemoryError:
    return SharedMemoryError(f"cannot {what} the shared memory object ({errno.errorcode.get(exc.errno or 0, 'error')})")


def _read_at(fd: int, size: int, position: int) -> bytes:
    """`size` bytes at `position` of the object; fewer there (the object was shrunk) is a `SharedMemoryError`."""
    try:
        data = os.pread(fd, size, position)  # one system call and one copy, all but always
        if len(data) == size:
            return data
        parts, got = [data], len(data)  # Linux moves at most 2 GiB - 4 KiB a call: take the rest
        while got < size:
            part = os.pread(fd, size - got, position + got)
            if not part:  # end of file before `size` bytes
                raise SharedMemoryError(SHRUNK)
            parts.append(part)
            got += len(part)
        return b"".join(parts)
    except OSError as exc:
        raise _io_failure("read", exc) from None


def _write_at(fd: int, view: memoryview, position: int) -> None:
    """Write all of `view` (bytes) at `position` of the object, which must still reach that far."""
    try:
        if os.fstat(fd).st_size < position + view.nbytes:  # pwrite would grow the object, not fail
            raise SharedMemoryError(SHRUNK)
        done = 0
        while done < view.nbytes:
            written = os.pwrite(fd, view[done:], position + done)
            if written <= 0:  # never for a regular file; refuse to spin if it ever were
                raise SharedMemoryError("cannot write the shared memory object (no progress)")
            done += written
    except OSError as exc:
        raise _io_failure("write", exc) from None


def _buffer(data: Any) -> memoryview:
    """`data` (bytes, a memoryview, a numpy array) as a C-contiguous memoryview of its bytes."""
    try:
        view = memoryview(data)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"shared memory takes bytes-like data or a numpy array of a fixed-size dtype ({exc})") from None
    return (view if view.c_contiguous else memoryview(view.tobytes())).cast("B")


class Regions:
    """The registered system shared-memory regions of one server."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()  # guards `_regions` and each region's counts; never held over a copy

    def _on(self) -> None:
        if not self.enabled:
            raise FeatureOffError(OFF)

    def _region(self, name: str) -> Region:
        """The region registered as `name` for a new use (not one unregistered while requests still hold it); the
        caller holds the lock."""
        region = self._regions.get(name) if isinstance(name, str) else None
        if region is None or region.dropped:
            raise SharedMemoryError(UNKNOWN)
        return region

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Register `byte_size` bytes at `offset` of the existing shared memory object `key` as the region `name`."""
        self._on()
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME:
            raise SharedMemoryError(f"a shared memory region name must be 1 to {MAX_NAME} characters")
        path_key = _check_key(key)
        offset = _count(offset, "offset", 0)
        byte_size = _count(byte_size, "byte_size", 1)
        with self._lock:
            self._may_add(name)
        fd = _open_object(path_key, offset + byte_size)  # outside the lock: copies need not wait on the open
        with self._lock:
            try:
                self._may_add(name)  # another registration may have won while the object was opened
            except SharedMemoryError:
                os.close(fd)
                raise
            self._regions[name] = Region(name, key, offset, byte_size, fd)

    def _may_add(self, name: str) -> None:
        if name in self._regions:  # also while requests still hold it after an unregister, as in Triton
            raise RegionExistsError(DUPLICATE)
        if len(self._regions) >= MAX_REGIONS:
            raise SharedMemoryError(f"{MAX_REGIONS} shared memory regions are registered, the most the server "
                                    "keeps: unregister one first")

    def unregister(self, name: str | None = None) -> None:
        """Drop the region `name`, or every region, closing its descriptor once no request holds it; a name that is
        not registered is no error (as in Triton)."""
        self._on()
        self._drop(name, shutdown=False)

    def _drop(self, name: str | None, shutdown: bool) -> None:
        """Mark regions unregistered; remove those no request holds (at shutdown, all) and close those no copy uses."""
        with self._lock:
            if name is None:
                dropped = list(self._regions.values())
            else:
                region = self._regions.get(name) if isinstance(name, str) else None
                dropped = [region] if region is not None else []
            for region in dropped:
                region.dropped = True
                if shutdown:
                    del self._regions[region.name]
                self._settle(region)

    def _settle(self, region: Region) -> None:
        """Remove an unregistered region no request holds, and close a removed one no copy uses (else the last
        request or copy to end does); the caller holds the lock."""
        if not region.dropped:
            return
        if not region.users and self._regions.get(region.name) is region:
            del self._regions[region.name]
        if not region.copies and self._regions.get(region.name) is not region:
            region.close()

    def status(self, name: str | None = None) -> list[dict]:
        """The registered regions, sorted by name, or only `name` (which must be registered). With the extension
        off there are none, as Triton answers."""
        with self._lock:
            if name is not None:
                region = self._regions.get(name) if isinstance(name, str) else None
                if region is None:
                    raise RegionNotFoundError(UNKNOWN)
                return [region.to_json()]
            return [self._regions[n].to_json() for n in sorted(self._regions)]

    def take(self, parts: list[tuple[str, int, int]]) -> dict[str, Region]:
        """The regions an inference request names, by name, held until `release`: each `(name, offset, byte_size)`
        part must lie inside its region, checked here, before the model runs. An unregister while the request runs
        waits for it (Triton's rule) instead of failing it halfway."""
        if not parts:
            return {}
        self._on()
        checked = [(name, _count(offset, "offset", 0), _count(size, "byte size", 0)) for name, offset, size in parts]
        held: dict[str, Region] = {}
        with self._lock:
            for name, offset, size in checked:
                region = held.get(name) or self._region(name)
                self._span(region, offset, size)
                held[name] = region
            for region in held.values():
                region.users += 1
        return held

    def release(self, held: dict[str, Region]) -> None:
        """End a request's hold (`take`); a region unregistered meanwhile goes now if no other request holds it."""
        with self._lock:
            for region in held.values():
                region.users -= 1
                self._settle(region)

    def read(self, region: str | Region, offset: int, byte_size: int) -> bytes:
        """A copy of `byte_size` bytes at `offset` within `region`: a registered one's name, or one the caller holds
        (`take`)."""
        self._on()
        offset = _count(offset, "offset", 0)
        byte_size = _count(byte_size, "byte size", 0)
        held, start = self._hold(region, offset, byte_size)
        if not byte_size:
            self._release(held)
            return b""
        try:
            return _read_at(held.fd, byte_size, start)
        finally:
            self._release(held)

    def write(self, region: str | Region, offset: int, data: Any) -> None:
        """Copy `data` (bytes-like or a numpy array) into `region` (as `read` takes it) at `offset`."""
        self._on()
        offset = _count(offset, "offset", 0)
        view = _buffer(data)
        held, start = self._hold(region, offset, view.nbytes)
        try:
            if view.nbytes:
                _write_at(held.fd, view, start)
        finally:
            self._release(held)

    def _hold(self, which: str | Region, offset: int, size: int) -> tuple[Region, int]:
        """The region, held for one copy of `size` bytes at `offset`, and where they start in the object."""
        with self._lock:
            region = which if isinstance(which, Region) else self._region(which)
            if region.fd < 0:  # a held region closed at shutdown: its descriptor number may be another file's now
                raise SharedMemoryError(CLOSED)
            start = self._span(region, offset, size)
            region.copies += 1
            return region, start

    def _release(self, region: Region) -> None:
        with self._lock:
            region.copies -= 1
            self._settle(region)

    @staticmethod
    def _span(region: Region, offset: int, size: int) -> int:
        """Where `size` bytes at `offset` of the region start in the object; they must lie inside the region."""
        if offset + size > region.byte_size:
            raise SharedMemoryError(f"offset {offset} + {size} bytes runs past the end of the region "
                                    f"({region.byte_size} bytes)")
        return region.offset + offset

    def close(self) -> None:
        """Drop every region, held by a request or not (server shutdown); closing twice is fine, and so is closing a
        disabled registry."""
        self._drop(None, shutdown=True)


# ---------------------------------------------------------------- CUDA shared memory, as a server without GPUs


#: Triton built without GPUs still answers the CUDA shared memory routes (http_server.cc,
#: `HandleCudaSharedMemory`): no region is ever registered, so the status lists none and
#: unregistering succeeds; a registration is refused. Clients rely on it: perf_analyzer and
#: tritonclient's C++ client unregister every region, CUDA ones included, before and after a run.
CUDA_OFF = ("CUDA shared memory: this server shares no GPU memory, so no CUDA region can be registered; use system "
            "shared memory (--shared-memory system)")
CUDA_UNKNOWN = "unknown CUDA shared memory region: this server shares no GPU memory, so none is ever registered"


def cuda_register() -> None:
    raise SharedMemoryError(CUDA_OFF)


def cuda_status(name: str | None = None) -> list[dict]:
    if name is not None:
        raise RegionNotFoundError(CUDA_UNKNOWN)
    return []


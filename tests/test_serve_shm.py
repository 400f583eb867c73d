"""The system shared memory registry (`zoo.serve.shm.Regions`) against regions made by Triton's own client library,
as users make them: data a client writes is read back exactly, data the server writes is what the client sees, and
every refusal the extension's safety rules ask for (bad keys, symbolic links, sizes, unknown or duplicate names, the
extension turned off) happens without ever echoing a region's name or key, and a client that shrinks its object after
registering it gets an error, never a dead server."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
import threading
import uuid

import numpy as np
import pytest
import tritonclient.utils.shared_memory as client

from zoo.serve import shm
from zoo.serve.errors import FeatureOffError, RegionExistsError, RegionNotFoundError, SharedMemoryError, status_for
from zoo.serve.shm import Regions

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="system shared memory needs Linux's /dev/shm")

SECRET = "secret-region-name-xyz"


def new_key() -> str:
    return f"/zoo_test_{uuid.uuid4().hex}"


@pytest.fixture
def make_region():
    """Create client regions (`create_shared_memory_region`) destroyed after the test: (key, handle)."""
    handles = []

    def make(byte_size: int) -> tuple[str, object]:
        key = new_key()
        handle = client.create_shared_memory_region(f"client-{key[1:]}", key, byte_size, create_only=True)
        handles.append(handle)
        return key, handle

    yield make
    for handle in handles:
        client.destroy_shared_memory_region(handle)


@pytest.fixture
def regions():
    r = Regions(enabled=True)
    yield r
    r.close()


@pytest.fixture
def plain_object():
    """An object made with os calls only (no client mapping of our own): key, path."""
    key = f"zoo_test_{uuid.uuid4().hex}"
    path = f"/dev/shm/{key}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, 4096)
    os.close(fd)
    yield key, path
    os.unlink(path)


def open_fds(path: str) -> int:
    """How many of this process's descriptors are open on `path` (the client library keeps its own open too)."""
    count = 0
    for entry in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{entry}") == path
        except OSError:  # the descriptor listdir itself used, gone by now
            pass
    return count


needs_proc_fd = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")


def error(call, *args, kind=SharedMemoryError) -> str:
    with pytest.raises(kind) as info:
        call(*args)
    assert type(info.value) is kind
    return str(info.value)


# -- data through the region ------------------------------------------------------------------------------------

def test_client_array_reads_back_exactly(regions, make_region):
    data = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    key, handle = make_region(data.nbytes)
    client.set_shared_memory_region(handle, [data])
    regions.register("in", key, 0, data.nbytes)
    got = regions.read("in", 0, data.nbytes)
    assert isinstance(got, bytes)
    np.testing.assert_array_equal(np.frombuffer(got, np.float32).reshape(3, 5), data)


def test_register_offset_and_read_offset_are_added(regions, make_region):
    data = np.arange(24, dtype=np.float32)  # 96 bytes, put 32 bytes into the object
    key, handle = make_region(32 + data.nbytes + 16)
    client.set_shared_memory_region(handle, [np.full(8, -1, np.float32)])  # bytes before the region: never read
    client.set_shared_memory_region(handle, [data], offset=32)
    regions.register("in", key, 32, data.nbytes)
    np.testing.assert_array_equal(np.frombuffer(regions.read("in", 0, data.nbytes), np.float32), data)
    # a read offset is relative to the region's registered offset: elements 4.. of `data`
    np.testing.assert_array_equal(np.frombuffer(regions.read("in", 16, 40), np.float32), data[4:14])
    assert regions.read("in", data.nbytes, 0) == b""  # an empty read at the very end is fine


def test_read_is_a_copy(regions, make_region):
    key, handle = make_region(16)
    client.set_shared_memory_region(handle, [np.ones(4, np.float32)])
    regions.register("in", key, 0, 16)
    before = regions.read("in", 0, 16)
    client.set_shared_memory_region(handle, [np.zeros(4, np.float32)])
    np.testing.assert_array_equal(np.frombuffer(before, np.float32), np.ones(4))
    np.testing.assert_array_equal(np.frombuffer(regions.read("in", 0, 16), np.float32), np.zeros(4))


def test_write_is_seen_by_the_client(regions, make_region):
    out = np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5
    key, handle = make_region(64 + out.nbytes)
    regions.register("out", key, 16, 48 + out.nbytes)
    regions.write("out", 48, out)  # object offset 16 + 48
    np.testing.assert_array_equal(client.get_contents_as_numpy(handle, np.float32, [3, 4], offset=64), out)
    np.testing.assert_array_equal(client.get_contents_as_numpy(handle, np.float32, [4]), np.zeros(4))  # untouched


@pytest.mark.parametrize("data", [b"\x01\x02\x03\x04", memoryview(bytearray(b"\x01\x02\x03\x04")),
                                  np.array([1, 0, 2, 0, 3, 0, 4, 0], np.uint8)[::2],  # not contiguous
                                  np.array([[0x0201], [0x0403]], "<u2")])
def test_write_takes_bytes_memoryviews_and_numpy_buffers(regions, make_region, data):
    key, handle = make_region(8)
    regions.register("out", key, 0, 8)
    regions.write("out", 2, data)
    assert client.get_contents_as_numpy(handle, np.uint8, [8]).tolist() == [0, 0, 1, 2, 3, 4, 0, 0]


# -- bounds ------------------------------------------------------------------------------------------------------

def test_reads_and_writes_past_the_region_are_refused(regions, make_region):
    key, handle = make_region(128)
    client.set_shared_memory_region(handle, [np.arange(128, dtype=np.uint8)])
    regions.register("r", key, 8, 72)  # object bytes 8..80; the object itself is longer
    assert error(regions.read, "r", 16, 64) == "offset 16 + 64 bytes runs past the end of the region (72 bytes)"
    assert "offset 72 + 1 bytes" in error(regions.read, "r", 72, 1)
    assert "offset 0 + 73 bytes" in error(regions.read, "r", 0, 73)
    assert "offset 70 + 4 bytes" in error(regions.write, "r", 70, b"\xff" * 4)
    assert client.get_contents_as_numpy(handle, np.uint8, [128]).tolist() == list(range(128))  # nothing written
    assert "offset" in error(regions.read, "r", -1, 4)
    assert "byte size" in error(regions.read, "r", 0, -1)
    assert "offset" in error(regions.write, "r", -8, b"\xff" * 8)
    assert "integer" in error(regions.read, "r", True, 4)
    assert "integer" in error(regions.read, "r", 0, 4.0)
    assert regions.read("r", 0, 72) == bytes(range(8, 80))  # exactly the region: fine
    regions.write("r", 68, b"\xee" * 4)
    assert client.get_contents_as_numpy(handle, np.uint8, [128])[76:81].tolist() == [238] * 4 + [80]


def test_registration_must_fit_the_object(regions, make_region):
    key, _ = make_region(64)
    message = error(regions.register, "r", key, 16, 49)
    assert "64 bytes" in message and "65 bytes" in message
    regions.register("r", key, 16, 48)
    assert regions.status() == [{"name": "r", "key": key, "offset": 16, "byte_size": 48}]


@pytest.mark.parametrize("offset, byte_size", [(-1, 8), (0, 0), (0, -8), (True, 8), (0, True), (0.0, 8), (0, "8")])
def test_registration_needs_integer_offset_and_size(regions, make_region, offset, byte_size):
    key, _ = make_region(64)
    error(regions.register, "r", key, offset, byte_size)
    assert regions.status() == []


@pytest.mark.parametrize("name", ["", "n" * 257, None, 7])
def test_registration_needs_a_name(regions, make_region, name):
    key, _ = make_region(8)
    error(regions.register, name, key, 0, 8)
    regions.register("n" * 256, key, 0, 8)  # the longest name


# -- keys --------------------------------------------------------------------------------------------------------

BAD_KEYS = ["../etc/passwd", "a/b", "", "/dev/shm/x", "/", "..", ".", "../target", "x/../target",
            "a\x00b", "sp ace", "k" * 256, "//k", None, 42]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_keys_are_refused_before_any_file_is_opened(regions, key):
    assert "must be the name of one object in /dev/shm" in error(regions.register, "r", key, 0, 1)


@pytest.mark.parametrize("key", ["../target", "a/b", "/dev/shm/x", "x/../target"])
def test_keys_never_reach_outside_the_shm_directory(regions, tmp_path, monkeypatch, key):
    """Each key here names an existing, large enough regular file relative to the shm directory: only the key
    rules refuse them."""
    root = tmp_path / "shm"
    for path in (tmp_path / "target", root / "a" / "b", root / "dev" / "shm" / "x"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\0" * 64)
    monkeypatch.setattr(shm, "SHM_DIR", str(root))
    assert "must be the name of one object in /dev/shm" in error(regions.register, "r", key, 0, 1)
    assert regions.status() == []


def test_the_longest_key_and_a_leading_slash_are_fine(regions, tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "SHM_DIR", str(tmp_path))
    (tmp_path / ("k" * 255)).write_bytes(b"abcd")
    regions.register("long", "/" + "k" * 255, 1, 2)
    assert regions.read("long", 0, 2) == b"bc"


def test_a_key_that_does_not_exist_is_never_created(regions):
    key = new_key()
    assert "no shared memory object has that key" in error(regions.register, "r", key, 0, 8)
    assert not os.path.exists(f"/dev/shm{key}")


def test_a_symbolic_link_is_refused(regions, make_region):
    target, handle = make_region(64)  # a real region: the link points at a regular file
    link = f"zoo_test_link_{uuid.uuid4().hex}"
    os.symlink(f"/dev/shm{target}", f"/dev/shm/{link}")
    try:
        assert "symbolic link" in error(regions.register, "r", link, 0, 8)
        assert "symbolic link" in error(regions.register, "r", "/" + link, 0, 8)
        assert regions.status() == []
    finally:
        os.unlink(f"/dev/shm/{link}")
    regions.register("r", target, 0, 8)  # the object itself is fine


def test_a_directory_is_not_a_shared_memory_object(regions):
    name = f"zoo_test_dir_{uuid.uuid4().hex}"
    os.mkdir(f"/dev/shm/{name}")
    try:
        assert "not" in error(regions.register, "r", name, 0, 1)
        assert regions.status() == []
    finally:
        os.rmdir(f"/dev/shm/{name}")


def test_a_fifo_is_not_a_shared_memory_object(regions, tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "SHM_DIR", str(tmp_path))
    os.mkfifo(tmp_path / "fifo")
    assert "not a regular file" in error(regions.register, "r", "fifo", 0, 1)


def test_without_dev_shm_registration_says_so(regions, tmp_path, monkeypatch):
    monkeypatch.setattr(shm, "SHM_DIR", str(tmp_path / "absent"))
    assert "/dev/shm" in error(regions.register, "r", "key", 0, 1)


def test_the_resource_tracker_is_never_told(regions, plain_object, monkeypatch):
    """multiprocessing.shared_memory would register the object with the resource tracker, which unlinks it (the
    client's object!) when the server exits."""
    from multiprocessing import resource_tracker

    told = []
    monkeypatch.setattr(resource_tracker, "register", lambda *args: told.append(args))
    key, path = plain_object
    regions.register("r", key, 0, 4096)
    regions.write("r", 0, b"x")
    regions.close()
    assert told == [] and os.path.exists(path)


# -- names, status, unregister ------------------------------------------------------------------------------------

def test_a_name_registered_twice_is_refused_and_the_first_stays(regions, make_region):
    first, handle = make_region(8)
    second, _ = make_region(8)
    client.set_shared_memory_region(handle, [np.array([7], np.float64)])
    regions.register("r", first, 0, 8)
    message = error(regions.register, "r", second, 0, 8, kind=RegionExistsError)
    assert message == "a shared memory region of that name is already registered; unregister it first"
    assert regions.status("r")[0]["key"] == first
    assert np.frombuffer(regions.read("r", 0, 8), np.float64)[0] == 7
    regions.register("r2", first, 0, 8)  # the same object under another name is fine


def test_status_with_and_without_a_name(regions, make_region):
    key_a, _ = make_region(32)
    key_b, _ = make_region(16)
    regions.register("zeta", key_a, 8, 24)
    regions.register("alpha", key_b, 0, 16)
    regions.register("mid", key_a, 0, 4)
    assert regions.status() == [{"name": "alpha", "key": key_b, "offset": 0, "byte_size": 16},
                                {"name": "mid", "key": key_a, "offset": 0, "byte_size": 4},
                                {"name": "zeta", "key": key_a, "offset": 8, "byte_size": 24}]
    assert regions.status("zeta") == [{"name": "zeta", "key": key_a, "offset": 8, "byte_size": 24}]
    assert error(regions.status, "absent", kind=RegionNotFoundError).startswith("unknown shared memory region")
    assert Regions(enabled=True).status() == []


def test_unregister_one_and_all(regions, make_region):
    key, _ = make_region(16)
    for name in ("a", "b", "c"):
        regions.register(name, key, 0, 16)
    regions.unregister("b")
    assert [r["name"] for r in regions.status()] == ["a", "c"]
    regions.unregister("b")  # not registered (any more): no error, as in Triton
    regions.unregister("never")
    assert [r["name"] for r in regions.status()] == ["a", "c"]
    regions.unregister()
    assert regions.status() == []
    regions.register("b", key, 0, 16)  # the name is free again
    assert regions.read("b", 0, 16) == bytes(16)


def test_unknown_regions(regions):
    unknown = "unknown shared memory region: register it first (POST /v2/systemsharedmemory/region/NAME/register)"
    assert error(regions.read, "nope", 0, 1) == unknown
    assert error(regions.write, "nope", 0, b"x") == unknown
    assert error(regions.status, "nope", kind=RegionNotFoundError) == unknown


@needs_proc_fd
def test_unregister_and_close_close_the_descriptor(regions, plain_object):
    key, path = plain_object
    assert open_fds(path) == 0
    regions.register("r", key, 0, 4096)
    assert open_fds(path) == 1  # kept open while registered
    regions.unregister("r")
    assert open_fds(path) == 0
    assert error(regions.read, "r", 0, 1).startswith("unknown shared memory region")
    regions.register("r", key, 0, 4096)
    regions.register("s", key, 0, 16)
    assert open_fds(path) == 2
    regions.close()
    assert open_fds(path) == 0
    assert error(regions.read, "s", 0, 1).startswith("unknown shared memory region")
    regions.close()  # twice is fine


@needs_proc_fd
def test_failed_registrations_leave_no_descriptor_open(regions, plain_object):
    key, path = plain_object
    error(regions.register, "r", key, 0, 4097)  # larger than the object: opened, then refused
    assert open_fds(path) == 0
    regions.register("r", key, 0, 8)
    error(regions.register, "r", key, 0, 8, kind=RegionExistsError)  # a duplicate name
    assert open_fds(path) == 1


def test_the_descriptor_is_read_write_close_on_exec_and_non_blocking(regions, plain_object):
    key, _ = plain_object
    regions.register("r", key, 0, 8)
    fd = regions._regions["r"].fd
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    assert flags & os.O_ACCMODE == os.O_RDWR and flags & os.O_NONBLOCK
    assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC


def test_closing_a_region_twice_never_closes_a_recycled_descriptor(regions, plain_object, tmp_path):
    key, _ = plain_object
    regions.register("r", key, 0, 16)
    region = regions._regions["r"]
    regions.unregister("r")
    assert region.fd == -1
    other = os.open(tmp_path / "other", os.O_CREAT | os.O_RDWR)  # the lowest free number: most likely `number`
    try:
        region.close()
        regions.close()
        os.fstat(other)  # still open, whether or not it got the region's old number
    finally:
        os.close(other)


def test_long_reads_and_writes_take_several_calls(regions, plain_object, monkeypatch):
    """Linux moves at most 2 GiB - 4 KiB a pread or pwrite call: the copies go on until every byte is moved."""
    key, path = plain_object
    regions.register("r", key, 100, 1000)
    data = bytes(range(256)) * 3 + bytes(232)
    pread, pwrite, calls = os.pread, os.pwrite, []
    monkeypatch.setattr(shm.os, "pread", lambda fd, n, at: calls.append("r") or pread(fd, min(n, 300), at))
    monkeypatch.setattr(shm.os, "pwrite", lambda fd, b, at: calls.append("w") or pwrite(fd, memoryview(b)[:70], at))
    regions.write("r", 0, data)
    assert calls.count("w") == 15
    assert regions.read("r", 0, 1000) == data and calls.count("r") == 4
    monkeypatch.undo()
    with open(path, "rb") as f:
        assert f.read()[100:1100] == data


SHRINK = textwrap.dedent("""
    import os, sys
    from zoo.serve.errors import SharedMemoryError
    from zoo.serve.shm import Regions

    key, page = sys.argv[1], os.sysconf("SC_PAGE_SIZE")  # a mapping faults only on whole pages past the end
    pattern = bytes(range(256)) * (4 * page // 256)
    fd = os.open("/dev/shm/" + key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.pwrite(fd, pattern, 0)
        regions = Regions(enabled=True)
        regions.register("secret-region-name-xyz", key, page, 3 * page)  # object pages 1 to 3
        os.ftruncate(fd, 2 * page)  # the client shrinks its object: pages 2 and 3 are gone

        def refused(call, *args):
            try:
                call("secret-region-name-xyz", *args)
            except SharedMemoryError as exc:
                message = str(exc)
                assert "secret" not in message and key not in message, message
                print("refused:", message)
            else:
                raise AssertionError("not refused")

        refused(regions.read, 0, 3 * page)  # with a mapping: SIGBUS, the process dies here
        refused(regions.read, page - 50, 100)
        refused(regions.write, 0, b"x" * 3 * page)
        refused(regions.write, page - 4, b"x" * 8)
        assert os.fstat(fd).st_size == 2 * page, "a refused write grew the object"
        assert regions.read("secret-region-name-xyz", 0, page) == pattern[page:2 * page]  # what is left reads fine
        regions.write("secret-region-name-xyz", page - 24, b"y" * 24)
        assert os.pread(fd, 24, 2 * page - 24) == b"y" * 24
        os.ftruncate(fd, 0)
        refused(regions.read, 0, 1)
        refused(regions.write, 0, b"z")
        os.ftruncate(fd, 4 * page)  # grown back: the region works again (zeros now)
        assert regions.read("secret-region-name-xyz", 0, 3 * page) == bytes(3 * page)
        regions.close()
        print("survived")
    finally:
        os.close(fd)
        os.unlink("/dev/shm/" + key)
""")


def test_a_shrunk_object_is_an_error_not_a_crash():
    """A client that ftruncates its object smaller after registering it: with a mapping, the next read faulted
    (SIGBUS) and killed the server; now reads and writes past the object's new end are refused. In a subprocess, so
    that a regression kills that process and fails this test rather than ending the test run."""
    key = f"zoo_test_{uuid.uuid4().hex}"
    result = subprocess.run([sys.executable, "-c", SHRINK, key], capture_output=True, text=True, timeout=60,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    refusals = [line for line in result.stdout.splitlines() if line.startswith("refused: ")]
    assert len(refusals) == 6, output
    assert all("the shared memory object is now smaller than when it was registered" in line for line in refusals)
    assert result.stdout.splitlines()[-1] == "survived"
    assert not os.path.exists(f"/dev/shm/{key}")


def test_at_most_256_regions(regions, make_region):
    key, _ = make_region(8)
    for i in range(shm.MAX_REGIONS):
        regions.register(f"r{i:03d}", key, 0, 8)
    assert "256" in error(regions.register, "one-more", key, 0, 8)
    regions.unregister("r000")
    regions.register("one-more", key, 0, 8)
    assert len(regions.status()) == 256


# -- the extension turned off ------------------------------------------------------------------------------------

def test_disabled_regions_refuse_everything_but_status_and_close(make_region):
    key, _ = make_region(8)
    off = Regions(enabled=False)
    assert off.enabled is False
    calls = [(off.register, "r", key, 0, 8), (off.unregister,), (off.unregister, "r"), (off.read, "r", 0, 1),
             (off.write, "r", 0, b"x"), (off.take, [("r", 0, 1)])]
    for call, *args in calls:
        assert error(call, *args, kind=FeatureOffError) == (
            "system shared memory is off; start the server with --shared-memory system to use it")
    assert off.status() == [] and off.take([]) == {}  # as Triton: status answers, with no regions
    assert error(off.status, "r", kind=RegionNotFoundError).startswith("unknown shared memory region")
    assert status_for(FeatureOffError("x")) == 403 and status_for(SharedMemoryError("x")) == 400
    assert status_for(RegionNotFoundError("x")) == 404 and status_for(RegionExistsError("x")) == 400
    off.close()
    off.close()


# -- secrets ------------------------------------------------------------------------------------------------------

def test_errors_never_echo_a_region_name_or_key(regions, make_region):
    key, _ = make_region(64)
    missing = f"/secret-key-xyz-{uuid.uuid4().hex}"
    link = f"secret-link-xyz-{uuid.uuid4().hex}"
    os.symlink(f"/dev/shm{key}", f"/dev/shm/{link}")
    try:
        messages = [error(regions.read, SECRET, 0, 1), error(regions.write, SECRET, 0, b"x"),
                    error(regions.status, SECRET, kind=RegionNotFoundError),
                    error(regions.register, SECRET, missing, 0, 8),
                    error(regions.register, SECRET, link, 0, 8),
                    error(regions.register, SECRET, "../secret-key-xyz", 0, 8),
                    error(regions.register, SECRET, key, 0, 65)]
        regions.register(SECRET, key, 0, 64)
        messages += [error(regions.register, SECRET, key, 0, 8, kind=RegionExistsError),
                     error(regions.read, SECRET, 60, 8),
                     error(regions.write, SECRET, 0, b"x" * 65), error(regions.read, SECRET, -1, 8)]
    finally:
        os.unlink(f"/dev/shm/{link}")
    for message in messages:
        assert "secret" not in message and key[1:] not in message, message


# -- threads ------------------------------------------------------------------------------------------------------

class Stalling:
    """A stand-in for `shm._read_at` that waits for the test, to hold a copy in progress."""

    def __init__(self, read_at):
        self.read_at, self.copying, self.go = read_at, threading.Event(), threading.Event()

    def __call__(self, fd, size, position):
        self.copying.set()
        assert self.go.wait(10)
        return self.read_at(fd, size, position)


@needs_proc_fd
def test_unregister_leaves_a_copy_in_progress_its_descriptor(regions, make_region, monkeypatch):
    """Unregistering returns at once (the name is free again), but the descriptor a copy
    is reading through stays open until that copy ends, and is closed then."""
    key, handle = make_region(16)
    path = f"/dev/shm{key}"
    client.set_shared_memory_region(handle, [np.arange(16, dtype=np.uint8)])
    client_fds = open_fds(path)
    regions.register("r", key, 0, 16)
    region = regions._regions["r"]
    stalling = Stalling(shm._read_at)
    monkeypatch.setattr(shm, "_read_at", stalling)
    results: list = []
    reader = threading.Thread(target=lambda: results.append(regions.read("r", 4, 8)))
    reader.start()
    assert stalling.copying.wait(10)
    regions.unregister("r")
    assert regions.status() == [] and region.fd >= 0  # the copy holds the region: its descriptor stays open
    assert open_fds(path) == client_fds + 1
    with pytest.raises(SharedMemoryError, match="unknown shared memory region"):
        regions.read("r", 0, 4)  # new copies no longer find it
    stalling.go.set()
    reader.join(10)
    assert results == [bytes(range(4, 12))]
    assert region.fd == -1 and open_fds(path) == client_fds


def test_a_copy_in_progress_holds_up_no_other_copy(regions, make_region, monkeypatch):
    """A long copy (a large region, in a worker thread) must not make the small copies
    the event loop does itself wait: no lock is held over a copy."""
    big, big_handle = make_region(64)
    small, small_handle = make_region(16)
    client.set_shared_memory_region(small_handle, [np.arange(16, dtype=np.uint8)])
    regions.register("big", big, 0, 64)
    regions.register("small", small, 0, 16)
    real = shm._read_at
    stalling = Stalling(real)
    monkeypatch.setattr(shm, "_read_at", lambda fd, size, position: (stalling if size == 64 else real)(fd, size,
                                                                                                          position))
    reader = threading.Thread(target=regions.read, args=("big", 0, 64))
    reader.start()
    try:
        assert stalling.copying.wait(10)
        done: list = []
        other = threading.Thread(target=lambda: done.append((regions.read("small", 0, 16),
                                                             regions.write("small", 0, b"\x07" * 4))))
        other.start()
        other.join(5)
        assert done == [(bytes(range(16)), None)], "a copy of another region waited for the copy in progress"
        assert regions.read("small", 0, 4) == b"\x07" * 4
    finally:
        stalling.go.set()
        reader.join(10)


def test_concurrent_reads_writes_and_unregisters(regions, make_region):
    key, _ = make_region(4096)
    failures: list[BaseException] = []
    stop = threading.Event()

    def work(k: int) -> None:
        payload = bytes([k]) * 256
        while not stop.is_set():
            try:
                regions.write("r", 256 * k, payload)
                got = regions.read("r", 256 * k, 256)
                assert got == payload, "a region read back other bytes"
            except SharedMemoryError as exc:
                if not str(exc).startswith("unknown shared memory region"):
                    failures.append(exc)
            except BaseException as exc:  # noqa: BLE001 - anything else is a failure
                failures.append(exc)

    workers = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for w in workers:
        w.start()
    try:
        for _ in range(200):
            regions.register("r", key, 0, 4096)
            regions.unregister("r")
    finally:
        stop.set()
        for w in workers:
            w.join(10)
    assert failures == []


# -- requests holding regions (take / release) ---------------------------------------------------------------------

@needs_proc_fd
def test_an_unregister_waits_for_the_requests_holding_the_region(regions, plain_object):
    """As Triton: unregistering a region in-flight requests use succeeds, the region stays listed (its name taken)
    until the last of them ends, and is closed then; a new request naming it meanwhile is refused."""
    key, path = plain_object
    regions.register("in", key, 0, 16)
    regions.register("out", key, 16, 16)
    first = regions.take([("in", 0, 16), ("out", 0, 8), ("out", 8, 8)])
    second = regions.take([("in", 4, 4)])
    assert [r.users for r in (first["in"], first["out"])] == [2, 1]
    regions.unregister()
    assert [r["name"] for r in regions.status()] == ["in", "out"] and regions.status("in")[0]["byte_size"] == 16
    assert error(regions.take, [("in", 0, 1)]).startswith("unknown shared memory region")
    assert error(regions.read, "out", 0, 1).startswith("unknown shared memory region")
    assert error(regions.register, "in", key, 0, 16, kind=RegionExistsError).startswith("a shared memory region")
    regions.write(first["out"], 0, b"\x05" * 16)  # the requests go on through the regions they hold
    assert regions.read(first["in"], 16, 0) == b"" and regions.read(second["in"], 16, 0) == b""
    assert regions.read(first["out"], 0, 16) == b"\x05" * 16 and regions.read(second["in"], 0, 16) == bytes(16)
    regions.release(first)
    assert [r["name"] for r in regions.status()] == ["in"] and open_fds(path) == 1
    regions.release(second)
    assert regions.status() == [] and open_fds(path) == 0
    regions.register("in", key, 0, 16)  # the name is free again


def test_take_checks_every_part_before_holding_any(regions, make_region):
    key, _ = make_region(64)
    regions.register("x", key, 0, 64)
    regions.register("y", key, 32, 32)
    assert regions.take([]) == {}
    for parts, words in [([("x", 0, 64), ("y", 1, 32)], "offset 1 + 32 bytes runs past the end of the region (32"),
                         ([("x", 0, 64), ("y", 32, 2**64 - 32)], f"offset 32 + {2**64 - 32} bytes runs past"),
                         ([("x", 2**64 - 32, 64)], f"offset {2**64 - 32} + 64 bytes runs past"),
                         ([("x", 0, 1), (SECRET, 0, 1)], "unknown shared memory region"),
                         ([("x", -1, 1)], "offset must be at least 0")]:
        message = error(regions.take, parts)
        assert message.startswith(words) and "secret" not in message and key[1:] not in message, message
    assert all(r.users == 0 for r in regions._regions.values())  # a refused request holds nothing
    regions.unregister()
    assert regions.status() == []


@needs_proc_fd
def test_close_closes_the_regions_requests_hold(regions, plain_object):
    """Shutdown closes every region, held or not: a request still holding one gets an error, and its descriptor
    number (perhaps another file's by then) is never used."""
    key, path = plain_object
    regions.register(SECRET, key, 0, 16)
    held = regions.take([(SECRET, 0, 16)])
    regions.close()
    assert regions.status() == [] and open_fds(path) == 0 and held[SECRET].fd == -1
    for message in (error(regions.read, held[SECRET], 0, 4), error(regions.write, held[SECRET], 0, b"x")):
        assert message == "the shared memory region was closed (the server is shutting down)"
    regions.release(held)
    assert regions.status() == []


@needs_proc_fd
def test_a_copy_in_progress_outlives_the_request_that_started_it(regions, make_region, monkeypatch):
    """A request cancelled while its copy runs in a worker thread releases its hold; the descriptor stays open
    until the copy ends."""
    key, handle = make_region(16)
    path = f"/dev/shm{key}"
    client.set_shared_memory_region(handle, [np.arange(16, dtype=np.uint8)])
    client_fds = open_fds(path)
    regions.register("r", key, 0, 16)
    held = regions.take([("r", 0, 16)])
    stalling = Stalling(shm._read_at)
    monkeypatch.setattr(shm, "_read_at", stalling)
    results: list = []
    reader = threading.Thread(target=lambda: results.append(regions.read(held["r"], 0, 16)))
    reader.start()
    assert stalling.copying.wait(10)
    regions.unregister("r")
    regions.release(held)  # the request ends (cancelled) with its copy still running
    assert regions.status() == [] and open_fds(path) == client_fds + 1
    stalling.go.set()
    reader.join(10)
    assert results == [bytes(range(16))] and open_fds(path) == client_fds

"""Writes that stop half-way: a staging directory is removed by its writer on an exception,
Ctrl-C or SIGTERM, and by the next write beside it where the writer was killed outright
(SIGKILL, a benchmark's time-out), never while a live writer holds it (`zoo.fsutil`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from zoo.fsutil import STAGING, atomic_directory, sweep_stale


def _staging(repository: Path) -> list[Path]:
    return [p for p in repository.iterdir() if STAGING.fullmatch(p.name)] if repository.is_dir() else []


def _export_until_staged(repository: Path) -> subprocess.Popen:
    """`zoo export` in its own process, returned once its staging directory exists."""
    process = subprocess.Popen([sys.executable, "-m", "zoo", "export", "ppo.cartpole", "-b", "onnxruntime",
                                "-r", str(repository), "--random-init"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not _staging(repository):
        assert process.poll() is None, f"export ended before it staged anything: {process.communicate()}"
        assert time.monotonic() < deadline, "no staging directory after 120 s"
        time.sleep(0.02)
    return process


def _age(path: Path, seconds: float = 60) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_killed_writers_staging_directory_is_removed_by_the_next_write(tmp_path):
    # before: `zoo bench --timeout` (which kills its measuring process) and `kill -9` left
    # `.ppo.cartpole.onnxruntime.fp32.tmp-XXXXXXXX/` in the repository for good
    repository = tmp_path / "exports"
    process = _export_until_staged(repository)
    process.kill()
    process.communicate()
    (left,) = _staging(repository)
    _age(left)  # a killed writer's, not one that has just been made
    with atomic_directory(repository / "another") as tmp:
        (tmp / "file").write_text("x")
    assert not left.exists() and (repository / "another" / "file").read_text() == "x"
    assert _staging(repository) == []


def test_a_live_writers_staging_directory_is_left_alone(tmp_path):
    with atomic_directory(tmp_path / "a") as tmp:
        _age(tmp)
        assert sweep_stale(tmp_path) == [] and tmp.is_dir()
        with atomic_directory(tmp_path / "b") as other:  # a second write beside it, as a second export's
            assert tmp.is_dir() and other.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_sigterm_stops_an_export_as_ctrl_c_does(tmp_path):
    # before: SIGTERM (a time-out's, CI's, a container stop's) ended the process at once,
    # its staging directory (and the new repository made for it) left behind
    repository = tmp_path / "exports"
    process = _export_until_staged(repository)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert not repository.exists(), list(repository.iterdir())
    assert "Traceback" not in stderr

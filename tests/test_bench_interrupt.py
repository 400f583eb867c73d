"""Ctrl-C during `zoo bench` stops the export under way without leaving its staging
directory in the repository: the worker was killed at once, before the interrupted export
could remove its `.NAME.tmp-XXXXXXXX` (the next write beside it swept it, until then it
lay in the user's repository). Run as a user runs it: `zoo bench` in its own process
group, Ctrl-C sent to the group (as a terminal sends it) once the export's staging
directory exists."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest


@pytest.mark.skipif(sys.platform == "win32", reason="process groups and SIGINT as a terminal sends them")
def test_ctrl_c_during_an_export_leaves_no_staging_directory(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_DEBUG", "ZOO_PLUGINS")}
    repo = tmp_path / "r"
    proc = subprocess.Popen([sys.executable, "-m", "zoo", "bench", "resnet8.digits", "--random-init", "--backends",
                             "openvino", "--batch-sizes", "1", "--min-time", "0.1", "-r", str(repo), "--report-dir",
                             str(tmp_path / "rep")], cwd=tmp_path, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (repo.is_dir() and any(p.name.startswith(".") for p in repo.iterdir())):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the export never started"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, (out, err)
    # no staging directory, no half-written artifact; the repository it made for the export removed with it
    assert not repo.exists() or sorted(p.name for p in repo.iterdir()) == [], (out, err)
    assert "Traceback" not in err, err

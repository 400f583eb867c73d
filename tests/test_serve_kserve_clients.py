"""`zoo serve` through KServe's own Python clients: tests/kserve_clients.py, run in an
interpreter of its own. The kserve package and tritonclient.grpc (which the other server
tests, and `zoo serve`'s gRPC front end, import) define the same protobuf messages, and
one process cannot import both: "duplicate symbol 'inference.ServerLiveRequest'"."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


@pytest.mark.skipif(importlib.util.find_spec("kserve") is None, reason="kserve is not installed (the kserve extra)")
def test_kserve_rest_and_grpc_clients_against_zoo_serve(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pytest", str(TESTS / "kserve_clients.py"), "-q", "-p", "no:xdist",
                           "-p", "no:randomly", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "t"),
                           "-o", "addopts=", "-rfEX"],
                          cwd=TESTS.parent, capture_output=True, text=True, timeout=600)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0 and " passed" in summary, done.stdout[-6000:] + done.stderr[-2000:]

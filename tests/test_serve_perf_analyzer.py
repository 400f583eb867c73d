"""Triton's own load generator against `zoo serve`: perf_analyzer 2.51 (the C++ client of
tritonclient's manylinux wheel, laid out by `make triton`), as users of Triton measure a
server with it.

perf_analyzer reads the model's metadata and configuration, sends requests over HTTP or
gRPC (sync, async, streaming, system shared memory), reads the statistics extension before
and after each window, and, given `validation_data`, compares every answer byte for byte
with the expected output. Before these tests it could not run against `zoo serve` at all:
its gRPC requests carry `triton_enable_empty_final_response` (refused as a reserved name),
its HTTP client reads an output's `parameters` as binary data (a shared-memory output
answered with its region failed), and it unregisters CUDA shared memory before and after
each run (no such route).

With one client at a time every answer of resnet8.digits is checked by perf_analyzer
itself against the artifact's own runner; under load, runs must end without an error and
with the statistics perf_analyzer reads back consistent with what it sent.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

import zoo

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from tritonserver import perf_analyzer, triton_home  # noqa: E402

pytest.register_assert_rewrite("serve_support")
from serve_support import ONNX, RAGGED, plugin_registered  # noqa: E402

pytest_plugins = ["serve_support"]
pytestmark = pytest.mark.skipif(not (triton_home() / "bin" / "perf_analyzer").exists(),
                                reason="no perf_analyzer: run `make triton` (scripts/triton_setup.sh)")

#: a short run: 200 ms windows, stable at once, at most 3 of them
QUICK = ["-p", "200", "-s", "1000", "--max-trials", "3"]

#: transport and mode, as perf_analyzer's options
MODES = {
    "http": [],
    "http-async": ["--async"],
    "http-shm": ["--shared-memory", "system"],
    "grpc": ["-i", "grpc"],
    "grpc-async": ["-i", "grpc", "--async"],
    "grpc-stream": ["-i", "grpc", "--streaming"],
    "grpc-gzip": ["-i", "grpc", "--grpc-compression-algorithm", "gzip"],
    "grpc-shm": ["-i", "grpc", "--shared-memory", "system"],
}


def run(server, model: str, mode: str, *args: str) -> str:
    """perf_analyzer's report of one run; the run must succeed."""
    url = server.grpc_url if "-i" in MODES[mode] else server.url.removeprefix("http://")
    done = perf_analyzer(["-m", model, "-u", url, *MODES[mode], *QUICK, *args])
    # "Unable to unregister all shared memory regions": its clean-up before and after a run
    assert done.returncode == 0 and not re.search("error|unable", done.stdout, re.I), done.stdout
    return done.stdout


def report(text: str, field: str) -> int:
    """A count of perf_analyzer's report (the last concurrency's)."""
    values = re.findall(rf"{field}: (\d+)", text)
    assert values, text
    return int(values[-1])


@pytest.fixture(scope="module")
def runner(serve_repo):
    with plugin_registered():
        return zoo.load(serve_repo / ONNX, threads=1)


def digits_data(path: Path, runner, off_by_one_step: bool = False) -> Path:
    """Four images for resnet8.digits and the logits the artifact's own runner gives each
    (one row, one thread, as the server runs a request that is not batched with others),
    for perf_analyzer to compare byte for byte."""
    rng = np.random.default_rng(7)
    data, expected = [], []
    for _ in range(4):
        image = rng.uniform(0.0, 1.0, (1, 1, 8, 8)).astype(np.float32)
        logits = runner({"image": image})["logits"][0].astype(np.float32)
        if off_by_one_step:
            logits[0] = np.nextafter(logits[0], np.float32(np.inf))
        data.append({"image": image.ravel().tolist()})
        expected.append({"logits": logits.tolist()})
    path.write_text(json.dumps({"data": data, "validation_data": expected}))
    return path


@pytest.mark.parametrize("mode", [m for m in MODES if not m.endswith("-shm")])
def test_every_answer_is_the_expected_one(server, runner, tmp_path, mode):
    """One client at a time (no request batched with another, so the logits are the
    runner's to the bit), each answer compared byte for byte by perf_analyzer; its
    statistics read back."""
    out = run(server, ONNX, mode, "--concurrency-range", "1", "--input-data", str(digits_data(tmp_path / "d.json", runner)))
    assert report(out, "Request count") > 0
    assert report(out, "Successful request count") > 0  # read back through the statistics extension


@pytest.mark.parametrize("mode", ["http-shm", "grpc-shm"])
def test_shared_memory_runs_and_leaves_no_region(server, runner, tmp_path, mode):
    """Inputs and outputs in system shared memory, two clients. perf_analyzer cannot compare
    outputs it receives in shared memory (its check reads the response's data, which such an
    output has none of, with Triton as here); the regions it registered are gone after it.
    Its region keys are fixed (`/image_0_0`, ...), so two such runs must not overlap: this
    module runs in one worker (`make test` distributes by file)."""
    data = json.loads(digits_data(tmp_path / "d.json", runner).read_text())
    (tmp_path / "inputs.json").write_text(json.dumps({"data": data["data"]}))
    out = run(server, ONNX, mode, "--concurrency-range", "2", "--input-data", str(tmp_path / "inputs.json"))
    assert report(out, "Successful request count") > 0
    # perf_analyzer unregisters every region at its end (other tests' included): none is left
    assert httpx.get(f"{server.url}/v2/systemsharedmemory/status").json() == []


@pytest.mark.parametrize("mode", ["http", "grpc"])
def test_a_wrong_answer_is_caught(server, runner, tmp_path, mode):
    """The check above can fail: an expected logit one float32 step off is reported."""
    url = server.grpc_url if mode == "grpc" else server.url.removeprefix("http://")
    data = digits_data(tmp_path / "d.json", runner, off_by_one_step=True)
    done = perf_analyzer(["-m", ONNX, "-u", url, *MODES[mode], *QUICK, "--input-data", str(data)])
    assert done.returncode != 0 and "Output doesn't match expected output" in done.stdout, done.stdout


@pytest.mark.parametrize("mode", ["http", "grpc-async", "grpc-shm"])
def test_batched_requests_count_their_rows(server, mode):
    """Requests of 4 rows each (perf_analyzer's -b) to a batched model: the statistics it
    reads count 4 inferences per request and no more executions than requests."""
    out = run(server, ONNX, mode, "-b", "4", "--concurrency-range", "2")
    requests = report(out, "Successful request count")
    assert report(out, "Inference count") == 4 * requests
    assert 0 < report(out, "Execution count") <= requests


def test_variable_length_inputs(server, tmp_path):
    """A model with a ragged axis, at two lengths perf_analyzer takes from the data."""
    data = [{name: {"content": values, "shape": [len(values)]} for name, values in
             (("tokens", list(range(1, n + 1))), ("mask", [1] * n))} for n in (3, 9)]
    (tmp_path / "d.json").write_text(json.dumps({"data": data}))
    for mode in ("http", "grpc-stream"):
        run(server, RAGGED, mode, "--concurrency-range", "3", "--input-data", str(tmp_path / "d.json"))

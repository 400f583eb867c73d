"""`zoo bench --url` (`zoo.serve.perf.sweep`) against a real `zoo serve`: over gRPC with the
server's view from its HTTP /metrics, over both transports through system shared memory
(every region unregistered and destroyed afterwards), for a model whose plugin this
process does not have (inputs made from the server's metadata), and the refusals.
Speed is never asserted: these are 1-second loads on a shared machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import numpy as np
import pytest

import zoo
from zoo.errors import ZooError
from zoo.serve import perf

pytest.register_assert_rewrite("serve_support")
from serve_support import DIGITS, ONNX, RAGGED  # noqa: E402

pytest_plugins = ["serve_support"]

needs_shm = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="system shared memory needs Linux's /dev/shm")


def url_of(server, protocol: str) -> str:
    return f"grpc://{server.grpc_url}" if protocol == "grpc" else server.url


def check_point(point: dict) -> None:
    assert point["requests"] > 0
    assert point["errors"] == 0
    assert point["requests_per_s"] > 0 and point["p50_ms"] > 0 and point["p99_ms"] >= point["p50_ms"]
    s = point["server"]  # the server's own view, from /metrics
    assert s["request_ms"] is not None and s["compute_ms"] is not None and s["overhead_ms"] is not None
    assert s["mean_batch"] >= 1


def perf_regions(server) -> list[dict]:
    """Regions the load generator registered that the server still holds."""
    status = httpx.get(f"{server.url}/v2/systemsharedmemory/status", timeout=30)
    assert status.status_code == 200, status.text
    return [r for r in status.json() if r["name"].startswith("zoo-perf-")]


def leftover_objects() -> list[str]:
    """This process's shared memory objects still in /dev/shm."""
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"zoo-perf-{os.getpid()}-")]


def test_grpc_sweep_with_the_servers_view_from_http_metrics(server):
    report = perf.sweep(f"grpc://{server.grpc_url}", ONNX, DIGITS, [2], duration=1.0, warmup=0.2,
                        metrics_url=server.url)
    assert report["protocol"] == "grpc" and report["shared_memory"] is False
    assert report["model"] == ONNX and report["metrics_url"] == server.url
    [point] = report["results"]
    assert point["concurrency"] == 2 and point["batch"] == 1
    check_point(point)


def grpc_answers(server, method: str) -> float:
    """The server's count of OK answers to a gRPC method, from its /metrics."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("zoo_grpc_responses_total{") and f'method="{method}"' in line and 'code="OK"' in line)


def test_a_streaming_sweep_sends_every_request_over_model_stream_infer(server):
    """perf_analyzer's --streaming: each client's requests go over one ModelStreamInfer
    stream; the server's own counts say they did, and no ModelInfer call was made."""
    unary, streamed = grpc_answers(server, "ModelInfer"), grpc_answers(server, "ModelStreamInfer")
    report = perf.sweep(f"grpc://{server.grpc_url}", ONNX, DIGITS, [3], duration=1.0, warmup=0.2,
                        metrics_url=server.url, streaming=True)
    assert report["protocol"] == "grpc" and report["streaming"] is True
    [point] = report["results"]
    check_point(point)
    assert grpc_answers(server, "ModelInfer") == unary
    assert grpc_answers(server, "ModelStreamInfer") - streamed >= point["requests"]


def test_errors_on_a_stream_are_counted_with_the_servers_reason(server):
    import asyncio

    import grpc

    good = perf.grpc_request(ONNX, {"image": np.zeros((1, 1, 8, 8), np.float32)}, {"image": "FP32"})
    bad = perf.grpc_request(ONNX, {"picture": np.zeros((1, 1, 8, 8), np.float32)}, {"picture": "FP32"})
    statuses, reasons = perf.Counter(), []

    async def run():
        async with grpc.aio.insecure_channel(server.grpc_url) as channel:
            return await perf.grpc_closed_loop(channel, [good, bad], 2, 0.5, statuses, reasons=reasons, streaming=True)

    latencies, errors, _ = asyncio.run(run())
    assert latencies and errors == sum(n for (i, code), n in statuses.items() if i == 1)
    assert {code for (i, code) in statuses if i == 1} == {"INVALID_ARGUMENT"}
    assert {code for (i, code) in statuses if i == 0} == {"OK"}
    assert "picture" in reasons[0] and reasons[0].startswith("INVALID_ARGUMENT")


def test_streaming_over_http_is_refused():
    with pytest.raises(ZooError, match="--streaming is gRPC's ModelStreamInfer"):
        perf.sweep("http://127.0.0.1:1", ONNX, DIGITS, [1], streaming=True)
    done = run_cli("--url", "http://127.0.0.1:1", "--streaming")
    assert done.returncode == 2 and "--streaming is gRPC's ModelStreamInfer" in done.stderr


@needs_shm
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shared_memory_sweep_leaves_no_region_behind(server, protocol):
    report = perf.sweep(url_of(server, protocol), ONNX, DIGITS, [2], batch_sizes=(3,), duration=1.0, warmup=0.2,
                        metrics_url=server.url, shared_memory=True)
    assert report["protocol"] == protocol and report["shared_memory"] is True
    [point] = report["results"]
    assert point["batch"] == 3
    check_point(point)
    assert perf_regions(server) == []  # every region unregistered
    assert leftover_objects() == []  # and destroyed


@needs_shm
def test_shared_memory_requests_really_use_the_regions(server):
    """The requests name the regions and carry no tensor; the server writes the outputs there."""
    meta, info = perf.model_metadata(perf.target(server.url), ONNX)
    x = {"image": np.random.default_rng(0).random((2, 1, 8, 8), dtype=np.float32)}  # in the image's range, 0 to 1
    with perf.shared_memory_requests(perf.target(server.url), ONNX, meta, info, [x], {"image": "FP32"}, 2) as own:
        [[(body, headers)]] = own
        doc = json.loads(body)
        assert "data" not in doc["inputs"][0] and doc["inputs"][0]["parameters"]["shared_memory_byte_size"] == x[
            "image"].nbytes
        assert {r["name"] for r in perf_regions(server)} == {f"zoo-perf-{os.getpid()}-0-in",
                                                             f"zoo-perf-{os.getpid()}-0-out"}
        answer = httpx.post(f"{server.url}/v2/models/{ONNX}/infer", content=body, headers=headers, timeout=30)
        assert answer.status_code == 200, answer.text
        [out] = answer.json()["outputs"]
        assert out == {"name": "logits", "datatype": "FP32", "shape": [2, 10]}  # Triton's form: no data
        logits = np.fromfile(f"/dev/shm/zoo-perf-{os.getpid()}-0-out", dtype="<f4", count=2 * 10)
        direct = httpx.post(f"{server.url}/v2/models/{ONNX}/infer", json={"inputs": [
            {"name": "image", "shape": [2, 1, 8, 8], "datatype": "FP32", "data": x["image"].ravel().tolist()}]},
            timeout=30).json()
        np.testing.assert_allclose(logits.ravel(), direct["outputs"][0]["data"], rtol=1e-5, atol=1e-5)
    assert perf_regions(server) == [] and leftover_objects() == []


@needs_shm
def test_shared_memory_refuses_an_output_of_unknown_size(server):
    """ragged.test's "hidden" output is batch x seq x width: its size is not known before the answer."""
    with pytest.raises(ZooError, match="'hidden' has a dynamic dimension besides the batch axis"):
        perf.sweep(server.url, RAGGED, "ragged.test", [1], duration=0.2, shared_memory=True)
    assert perf_regions(server) == [] and leftover_objects() == []


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_whose_plugin_this_process_lacks(server, protocol):
    """ragged.test is registered only inside `plugin_registered()`: the inputs are made from
    the server's metadata (int64 tokens and mask at the seq axis' opt size)."""
    assert "ragged.test" not in zoo.list_models()
    report = perf.sweep(url_of(server, protocol), RAGGED, "ragged.test", [2], batch_sizes=(1, 3), duration=0.5,
                        warmup=0.2, metrics_url=server.url)
    assert [p["batch"] for p in report["results"]] == [1, 3]
    for point in report["results"]:
        check_point(point)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_failed_requests_are_errors_only_and_the_first_says_why(server, protocol):
    """As perf_analyzer: a refused request (rows beyond the exported batch range) is counted
    as an error, not as throughput or latency, and the server's reason is kept."""
    too_many = zoo.get_model(DIGITS).tiny().axes["batch"].max + 1
    report = perf.sweep(url_of(server, protocol), ONNX, DIGITS, [1], batch_sizes=(too_many,), duration=0.3,
                        warmup=0, metrics_url=server.url)
    point, = report["results"]
    assert point["errors"] > 0 and point["requests"] == 0
    assert point["requests_per_s"] == point["samples_per_s"] == 0 and point["p50_ms"] is None
    assert point["first_error"].startswith("HTTP 400: " if protocol == "http" else "INVALID_ARGUMENT: ")
    assert str(too_many) in point["first_error"], point["first_error"]


def test_synthesized_inputs_follow_the_metadata():
    meta = {"name": "m", "inputs": [{"name": "ids", "datatype": "INT64", "shape": [-1, -1]},
                                    {"name": "mask", "datatype": "INT64", "shape": [-1, -1]},
                                    {"name": "x", "datatype": "FP16", "shape": [-1, 3]},
                                    {"name": "side", "datatype": "FP32", "shape": [1]},
                                    {"name": "flag", "datatype": "INT32", "shape": [-1, 2]}]}
    info = {"axes": {"batch": [1, 8, 32], "seq": [2, 32, 256]},
            "value_ranges": {"ids": [0, 5], "mask": [0, 1], "side": [0.5, 2.0]}}
    got = perf.synthesize(meta, info, 4, np.random.default_rng(0))
    assert got["ids"].shape == got["mask"].shape == (4, 32) and got["ids"].dtype == np.int64
    assert got["ids"].min() >= 0 and got["ids"].max() == 5  # integers: the range is inclusive
    assert set(np.unique(got["mask"])) == {0, 1}
    assert got["x"].shape == (4, 3) and got["x"].dtype == np.float16
    assert got["side"].shape == (1,) and 0.5 <= got["side"][0] <= 2.0
    assert got["flag"].dtype == np.int32 and set(np.unique(got["flag"])) <= {0, 1}

    with pytest.raises(ZooError, match="BYTES.*plugin"):
        perf.synthesize({"name": "t", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}]},
                        {"model": "t"}, 1, np.random.default_rng(0))
    two = {"axes": {"batch": [1, 8, 32], "height": [8, 64, 128], "width": [8, 32, 128]}}
    image = {"name": "i", "inputs": [{"name": "image", "datatype": "FP32", "shape": [-1, 3, -1, -1]}]}
    assert perf.synthesize(image, two, 2, np.random.default_rng(0))["image"].shape == (2, 3, 64, 32)
    with pytest.raises(ZooError, match="cannot tell which axis"):
        perf.synthesize({"name": "i", "inputs": [{"name": "row", "datatype": "FP32", "shape": [-1, -1]}]}, two, 2,
                        np.random.default_rng(0))


def test_grpc_without_metrics_url_is_refused():
    with pytest.raises(ZooError, match="give --metrics-url http://HOST:PORT"):
        perf.sweep("grpc://127.0.0.1:1", ONNX, DIGITS, [1])
    for url, why in (("ftp://h:1", "http://HOST:PORT or grpc://HOST:PORT"), ("grpc://h", "needs the gRPC port")):
        with pytest.raises(ZooError, match=why):
            perf.target(url, "http://h:2")
    with pytest.raises(ZooError, match="--metrics-url must be"):
        perf.target("grpc://h:1", "grpc://h:2")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_DEBUG", "ZOO_PLUGINS")}
    return subprocess.run([sys.executable, "-m", "zoo", "bench", DIGITS, *args], env=env, capture_output=True,
                          text=True, timeout=300)


def test_cli_refuses_grpc_without_metrics_url():
    done = run_cli("--url", "grpc://127.0.0.1:1")
    assert done.returncode != 0
    assert "--metrics-url http://HOST:PORT" in done.stderr + done.stdout


@needs_shm
def test_cli_grpc_with_shared_memory(server, tmp_path):
    done = run_cli("--model-name", ONNX, "--url", f"grpc://{server.grpc_url}", "--metrics-url", server.url,
                   "--shared-memory", "--concurrency", "2", "--min-time", "0.5", "--output", str(tmp_path / "r.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "(grpc, shared memory)" in done.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["protocol"] == "grpc" and report["shared_memory"] is True
    assert report["results"][0]["errors"] == 0 and report["results"][0]["requests"] > 0
    assert perf_regions(server) == []


def test_a_range_that_only_bounds_validity_is_not_drawn_from_uniformly():
    """ppo.cartpole's observation takes float32's finite range (its unbounded sides refuse
    only NaN and infinity): drawn uniformly from it, a load's observations were around 1e38
    and the policy's outputs overflowed. A narrow range is still drawn from uniformly."""
    from zoo.serve.perf import _values

    big = float(np.finfo(np.float32).max)
    wide = _values("FP32", (1000, 4), (-big, big), np.random.default_rng(0))
    assert np.isfinite(wide).all() and np.abs(wide).max() < 10 and wide.std() > 0.5
    for low, high in ((1e3, 1e8), (0.0, big)):  # 0 outside, or at an end: spread, not one value
        drawn = _values("FP32", (1000,), (low, high), np.random.default_rng(0))
        assert drawn.min() >= low and drawn.max() <= high and len(np.unique(drawn)) > 500
    narrow = _values("FP32", (1000,), (5.0, 6.0), np.random.default_rng(0))
    assert narrow.min() >= 5 and narrow.max() <= 6 and narrow.std() > 0.2


def test_a_range_in_a_message_is_written_as_a_number_not_39_digits():
    from zoo.spec import _number

    assert _number(float(np.finfo(np.float32).max)) == "3.4028234663852886e+38"
    assert _number(1099511627776.0) == "1099511627776" and _number(-8.0) == "-8" and _number(0.5) == "0.5"

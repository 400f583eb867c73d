"""The server's life: artifacts it cannot load are skipped with the reason; a backend
failure in the middle of a request gives that request a prompt 500, readiness shows the
recovery, and the next request succeeds; a full queue answers 503 at once; models load
and unload by name only when enabled (over HTTP and gRPC); SIGTERM finishes in-flight
requests of both front ends.

The failures are real: the test plugin's `faulty` backend (tests/serve_plugin.py,
loaded into the server with `--plugin`) raises or stalls inside its runner on
sentinel inputs.
"""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

pytest.register_assert_rewrite("serve_support")
from serve_support import DIGITS, ONNX, ServerProcess, copy_as, export, plugin_registered, touch  # noqa: E402

pytest_plugins = ["serve_support"]
FAULTY = f"{DIGITS}.faulty.fp32"


@pytest.fixture(scope="module")
def plugin():
    with plugin_registered() as module:
        yield module


@pytest.fixture(scope="module")
def lifecycle_repo(serve_repo, tmp_path_factory, plugin):
    repo = tmp_path_factory.mktemp("lifecycle") / "exports"
    export(DIGITS, "faulty", repo)
    shutil.copytree(serve_repo / ONNX, repo / ONNX)
    broken = copy_as(serve_repo / ONNX, repo / "broken.onnxruntime.fp32")
    (broken / "1" / "model.onnx").write_bytes(b"tampered")
    orphan = copy_as(serve_repo / ONNX, repo / "orphan.onnxruntime.fp32")
    manifest = json.loads((orphan / "zoo.json").read_text())
    manifest["model"]["name"] = "orphan.model"  # a model whose plugin is not installed: served all the same
    (orphan / "zoo.json").write_text(json.dumps(manifest))
    stale = copy_as(serve_repo / ONNX, repo / "stale.onnxruntime.fp32")
    manifest = json.loads((stale / "zoo.json").read_text())
    manifest["signature"]["outputs"][0]["shape"] = ["batch", 11]  # exported from another version of the model
    (stale / "zoo.json").write_text(json.dumps(manifest))
    return repo


def start(repo, log: str) -> ServerProcess:
    return ServerProcess(repo, "--model-control", "--max-queue-size", "2", "--max-queue-delay-ms", "0",
                         log=repo.parent / log).wait_ready()


@pytest.fixture(scope="module")
def faulty_server(lifecycle_repo):
    proc = start(lifecycle_repo, "server.log")
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
def own_server(lifecycle_repo):
    """A server of its own, for a test that stops it: the module's stays up whatever the order."""
    proc = start(lifecycle_repo, "own-server.log")
    try:
        yield proc
    finally:
        proc.kill()


def infer(server, first: float, model: str = FAULTY, timeout: float = 30) -> httpx.Response:
    data = np.full(64, 0.25, np.float32)
    data[0] = first
    body = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": data.tolist()}]}
    return httpx.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=timeout)


def test_skipped_artifacts_say_why(faulty_server):
    log = faulty_server.log()
    assert "skipped broken.onnxruntime.fp32" in log and "does not match its sha256" in log
    assert "skipped stale.onnxruntime.fp32" in log and f"another version of model {DIGITS}" in log
    index = {row["name"]: row for row in httpx.post(f"{faulty_server.url}/v2/repository/index").json()}
    # no plugin registers orphan.model: its manifest describes it, and it is served
    assert index[FAULTY]["state"] == index[ONNX]["state"] == index["orphan.onnxruntime.fp32"]["state"] == "READY"
    assert index["broken.onnxruntime.fp32"]["state"] == index["stale.onnxruntime.fp32"]["state"] == "UNAVAILABLE"
    assert "sha256" in index["broken.onnxruntime.fp32"]["reason"]
    assert "/" not in index["stale.onnxruntime.fp32"]["reason"].replace("zoo export", "")


def test_items_for_a_model_whose_plugin_is_not_loaded_say_what_to_install(faulty_server):
    """orphan.model takes images through its plugin, which the server lacks: an image item
    is refused with what to install and the tensors to send instead, not a datatype error."""
    body = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["a PNG's bytes"]}]}
    answer = httpx.post(f"{faulty_server.url}/v2/models/orphan.onnxruntime.fp32/infer", json=body, timeout=30)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert "model orphan.model was defined by plugin" in error and "to send it image items" in error, error
    assert "send the tensors ['image'] instead" in error


def test_a_server_with_nothing_to_serve_is_not_ready(serve_repo, tmp_path):
    from starlette.testclient import TestClient

    from zoo.serve.app import Settings, create_app

    repo = tmp_path / "exports"
    copy_as(serve_repo / ONNX, repo / "broken.onnxruntime.fp32")
    (repo / "broken.onnxruntime.fp32" / "1" / "model.onnx").write_bytes(b"tampered")
    with TestClient(create_app(Settings(repo))) as client:
        assert client.get("/v2/health/live").status_code == 200
        response = client.get("/v2/health/ready")
        assert response.status_code == 503 and "no artifact in the model repository can run here (1 skipped" in \
            response.json()["error"]
    with TestClient(create_app(Settings(repo, model_control=True))) as client:  # models can still be loaded
        assert client.get("/v2/health/ready").status_code == 200


def test_an_empty_repository_with_model_control_serves_what_is_exported_there_later(serve_repo, tmp_path, caplog):
    """`zoo serve` refuses an empty repository without model control (test_cli_usage_exits.py);
    with it, the server is ready, says the repository holds nothing yet, and loads an
    artifact exported there afterwards."""
    from starlette.testclient import TestClient

    from zoo.serve.app import Settings, create_app

    repo = tmp_path / "exports"
    repo.mkdir()
    with caplog.at_level("WARNING", logger="zoo.serve"), \
            TestClient(create_app(Settings(repo, model_control=True))) as client:
        assert client.get("/v2/health/ready").status_code == 200
        assert f"{repo} holds no artifact yet; serving none until one exported there is loaded" in caplog.text
        copy_as(serve_repo / ONNX, repo / ONNX)
        assert client.post(f"/v2/repository/models/{ONNX}/load").status_code == 200
        assert client.get(f"/v2/models/{ONNX}/ready").status_code == 200


def test_backend_failure_then_recovery(faulty_server, plugin):
    assert infer(faulty_server, 0.5).status_code == 200
    start = time.monotonic()
    failed = infer(faulty_server, plugin.FAIL)
    assert time.monotonic() - start < 5, "the failed request was not answered promptly"
    assert failed.status_code == 500
    message = failed.json()["error"]
    assert "failed" in message and FAULTY in message and "/opt" not in message and "RuntimeError" not in message
    # the reload takes RELOAD_SECONDS: readiness says so meanwhile
    assert httpx.get(f"{faulty_server.url}/v2/models/{FAULTY}/ready").status_code == 503
    assert httpx.get(f"{faulty_server.url}/v2/health/ready").status_code == 503
    assert infer(faulty_server, 0.5).status_code == 503
    assert httpx.get(f"{faulty_server.url}/v2/health/live").status_code == 200
    deadline = time.monotonic() + 30
    while httpx.get(f"{faulty_server.url}/v2/models/{FAULTY}/ready").status_code != 200:
        assert time.monotonic() < deadline, "the model did not recover"
        time.sleep(0.1)
    recovered, other = infer(faulty_server, 0.5), infer(faulty_server, 0.5, model=ONNX)
    assert recovered.status_code == other.status_code == 200
    np.testing.assert_allclose(recovered.json()["outputs"][0]["data"], other.json()["outputs"][0]["data"], atol=1e-5)
    assert httpx.get(f"{faulty_server.url}/v2/health/ready").status_code == 200


def test_a_full_queue_answers_503_at_once(faulty_server, plugin):
    def timed(first: float) -> tuple[int, float, str]:
        start = time.monotonic()
        r = infer(faulty_server, first)
        return r.status_code, time.monotonic() - start, r.json().get("error", "")

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(timed, [plugin.SLOW] * 8))
    refused = [(t, e) for status, t, e in results if status == 503]
    assert sorted({status for status, _, _ in results}) == [200, 503]
    assert refused and all(t < 1.0 and "queued" in e for t, e in refused), refused
    assert infer(faulty_server, 0.5).status_code == 200


def test_model_control_by_name_only(faulty_server):
    url = faulty_server.url
    assert httpx.post(f"{url}/v2/repository/models/{ONNX}/unload").status_code == 200
    assert infer(faulty_server, 0.5, model=ONNX).status_code == 404
    index = {row["name"]: row for row in httpx.post(f"{url}/v2/repository/index").json()}
    assert index[ONNX]["state"] == "UNAVAILABLE" and index[ONNX]["reason"] == "unloaded"  # listed, not gone
    assert index[ONNX]["version"] == "1"  # as Triton's index keeps it
    # unloading what is not loaded does nothing, as Triton answers (Model Analyzer unloads to clean up)
    assert httpx.post(f"{url}/v2/repository/models/{ONNX}/unload").status_code == 200
    assert httpx.post(f"{url}/v2/repository/models/no-such-artifact/unload").status_code == 200
    assert ONNX not in {row["name"] for row in httpx.post(f"{url}/v2/repository/index", json={"ready": True}).json()}
    for name, status in [("..", 404), ("http:evil.example", 404), ("no-such-artifact", 404), ("%2e%2e", 404)]:
        response = httpx.post(f"{url}/v2/repository/models/{name}/load")
        assert response.status_code == status and "error" in response.json(), (name, response.text)
    assert httpx.post(f"{url}/v2/repository/models/..%2F..%2Fetc/load").status_code == 404
    override = httpx.post(f"{url}/v2/repository/models/{ONNX}/load", json={"parameters": {"config": "{}"}})
    assert override.status_code == 400 and "not supported" in override.json()["error"]
    assert httpx.post(f"{url}/v2/repository/models/{ONNX}/load").status_code == 200
    assert infer(faulty_server, 0.5, model=ONNX).status_code == 200


def test_a_bare_model_name_is_no_artifact_to_unload_and_an_unknown_name_unloads_nothing(faulty_server):
    """Inference takes a bare model name for the one artifact serving it (`orphan.model`), load
    refuses it (no artifact by that name); unload answered OK and left the model serving, over
    HTTP and gRPC. It is refused as load refuses it, naming the artifacts to unload instead; and
    so is a model several artifacts serve. A name the server never heard of is still unloaded
    as Triton unloads it: OK, nothing done (model_repository_manager.cc: an unload finds nothing
    to delete and succeeds)."""
    import tritonclient.grpc as triton_grpc
    from tritonclient.utils import InferenceServerException

    url, orphan = faulty_server.url, "orphan.onnxruntime.fp32"
    for name, served in (("orphan.model", orphan), (DIGITS, f"{FAULTY}, {ONNX}")):
        words = (f"no artifact named {name!r} in the model repository; model {name} is served by {served}: "
                 "load or unload an artifact by its name")
        for action in ("unload", "load"):
            answer = httpx.post(f"{url}/v2/repository/models/{name}/{action}", timeout=60)
            assert (answer.status_code, answer.json()) == (404, {"error": words}), (action, answer.text)
        with triton_grpc.InferenceServerClient(faulty_server.grpc_url) as client:
            for action in (client.unload_model, client.load_model):
                with pytest.raises(InferenceServerException) as info:
                    action(name)
                assert (info.value.status(), info.value.message()) == ("StatusCode.NOT_FOUND", words)
            assert httpx.post(f"{url}/v2/repository/models/nope/unload").status_code == 200
            client.unload_model("nope")
    index = {row["name"]: row["state"] for row in httpx.post(f"{url}/v2/repository/index").json()}
    assert index[orphan] == index[FAULTY] == index[ONNX] == "READY"
    assert infer(faulty_server, 0.5, model="orphan.model").status_code == 200  # still served


def test_reloading_a_served_model_never_leaves_its_name_unserved(faulty_server, plugin):
    """A load of a model already served swaps the new one in once it is ready, as Triton
    does: while the old one still works through slow requests (3 x 1.5 s: one running,
    its queue of 2 full), every request sent during the reload is answered by one or the
    other, none finds the name unknown (404)."""
    pool = ThreadPoolExecutor(4)
    slow = [pool.submit(infer, faulty_server, plugin.SLOW) for _ in range(3)]
    time.sleep(0.3)  # the old model is running one and holds two
    touch(faulty_server.repository / FAULTY)  # changed on disk: the load reloads it
    reload = pool.submit(httpx.post, f"{faulty_server.url}/v2/repository/models/{FAULTY}/load", timeout=60)
    during = []
    while not reload.done():
        during.append(infer(faulty_server, 0.5).status_code)
        time.sleep(0.05)
    assert reload.result().status_code == 200 and [f.result().status_code for f in slow] == [200] * 3
    assert during and set(during) - {503} == {200}, during  # 503: the old queue was full until the swap


def test_a_request_during_an_unload_is_told_the_model_is_unloading(faulty_server, plugin):
    """While an unloaded model finishes what it had queued (3 x 1.5 s), a new request for it
    is answered at once that the model is unloading, as the index says, not that the name
    is unknown; once stopped, that it was unloaded."""
    pool = ThreadPoolExecutor(4)
    try:
        slow = [pool.submit(infer, faulty_server, plugin.SLOW) for _ in range(3)]
        time.sleep(0.3)
        unload = pool.submit(httpx.post, f"{faulty_server.url}/v2/repository/models/{FAULTY}/unload", timeout=60)
        time.sleep(0.3)
        assert not unload.done(), "the unload did not wait for the queued requests"
        during = infer(faulty_server, 0.5)
        assert during.status_code == 404, during.text
        assert "not served (UNAVAILABLE): unloading" in during.json()["error"], during.text
        index = {row["name"]: row for row in httpx.post(f"{faulty_server.url}/v2/repository/index").json()}
        assert index[FAULTY]["reason"] == "unloading"
        assert unload.result().status_code == 200 and [f.result().status_code for f in slow] == [200] * 3
        assert "(UNAVAILABLE): unloaded" in infer(faulty_server, 0.5).json()["error"]
    finally:
        assert httpx.post(f"{faulty_server.url}/v2/repository/models/{FAULTY}/load", timeout=60).status_code == 200
        pool.shutdown()


def test_model_control_and_shared_memory_over_grpc(faulty_server):
    import tritonclient.grpc as triton_grpc
    from tritonclient.utils import InferenceServerException

    with triton_grpc.InferenceServerClient(faulty_server.grpc_url) as client:
        client.unload_model(ONNX)
        client.unload_model(ONNX)  # again: nothing to do, no error, as Triton answers
        index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
        assert index[ONNX]["state"] == "UNAVAILABLE" and index[ONNX]["reason"] == "unloaded"
        assert index[ONNX]["version"] == "1"
        assert client.is_model_ready(ONNX) is False  # as Triton answers for a model it does not serve
        with pytest.raises(InferenceServerException) as info:
            client.load_model("..")
        assert info.value.status() == "StatusCode.NOT_FOUND"
        client.load_model(ONNX)
        assert client.is_model_ready(ONNX)
        with pytest.raises(InferenceServerException) as info:  # this server was started without it
            client.register_system_shared_memory("r", "/zoo-none", 64)
        assert info.value.status() == "StatusCode.UNIMPLEMENTED" and "--shared-memory system" in info.value.message()
        assert "system_shared_memory" not in client.get_server_metadata(as_json=True)["extensions"]
    # status answers no regions when off, as Triton answers it; registering is refused
    status = httpx.get(f"{faulty_server.url}/v2/systemsharedmemory/status")
    assert status.status_code == 200 and status.json() == [], status.text
    refused = httpx.post(f"{faulty_server.url}/v2/systemsharedmemory/region/r/register",
                         json={"key": "/zoo-none", "offset": 0, "byte_size": 64})
    assert refused.status_code == 403 and "--shared-memory system" in refused.json()["error"]


def test_sigterm_finishes_in_flight_requests(own_server, plugin):
    """SIGTERM stops the server while one request is in flight over HTTP and one over
    gRPC; both are answered."""
    import tritonclient.grpc as triton_grpc

    result: dict = {}

    def over_grpc() -> None:
        with triton_grpc.InferenceServerClient(own_server.grpc_url) as client:
            data = np.full((1, 1, 8, 8), 0.25, np.float32)
            data.flat[0] = plugin.SLOW
            item = triton_grpc.InferInput("image", [1, 1, 8, 8], "FP32")
            item.set_data_from_numpy(data)
            result["grpc"] = client.infer(FAULTY, [item], client_timeout=60).as_numpy("logits")

    threads = [threading.Thread(target=lambda: result.update(response=infer(own_server, plugin.SLOW))),
               threading.Thread(target=over_grpc)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # the slow requests are now running or queued
    # uvicorn re-raises the signal after its graceful shutdown, so the exit status says SIGTERM
    assert own_server.terminate(timeout=60) in (0, -signal.SIGTERM)
    for thread in threads:
        thread.join(10)
    assert result["response"].status_code == 200
    assert result["grpc"].shape == (1, 10)
    log = own_server.log()
    assert "Waiting for background tasks" in log or "Application shutdown complete" in log, log[-2000:]


def test_sigterm_stops_grpc_taking_calls_at_once_and_no_idle_stream_holds_it_up(lifecycle_repo, plugin):
    """At SIGTERM the gRPC front end stops taking calls together with HTTP (not once HTTP
    has drained), and an open stream with nothing in flight does not hold the shutdown up
    for its whole grace period (60 s here): Triton waits for requests, not for streams."""
    import queue

    import tritonclient.grpc as triton_grpc
    from tritonclient.utils import InferenceServerException

    server = ServerProcess(lifecycle_repo, "--shutdown-timeout", "60", log=lifecycle_repo.parent / "sigterm.log")
    server.wait_ready()
    try:
        item = triton_grpc.InferInput("image", [1, 1, 8, 8], "FP32")
        item.set_data_from_numpy(np.full((1, 1, 8, 8), 0.25, np.float32))
        answers: queue.Queue = queue.Queue()
        streaming = triton_grpc.InferenceServerClient(server.grpc_url)
        streaming.start_stream(callback=lambda result, error: answers.put((result, error)))
        streaming.async_stream_infer(ONNX, [item])
        assert answers.get(timeout=30)[1] is None  # answered; the stream stays open and idle
        result: dict = {}
        slow = threading.Thread(target=lambda: result.update(response=infer(server, plugin.SLOW)))
        slow.start()
        time.sleep(0.5)  # the slow HTTP request is running (as in the test above): HTTP drains for about 1 s more
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with triton_grpc.InferenceServerClient(server.grpc_url) as late:
            with pytest.raises(InferenceServerException) as info:
                late.infer(ONNX, [item], client_timeout=30)
        assert info.value.status() == "StatusCode.UNAVAILABLE", info.value
        assert server.proc.wait(20) in (0, -signal.SIGTERM)  # well within the 60 s grace
        slow.join(10)
        assert result["response"].status_code == 200  # the request in flight was answered
        streaming.stop_stream()
        streaming.close()
    finally:
        server.kill()


@pytest.mark.parametrize("flag, want", [("0.25", 0.25), ("0", 0.0), ("none", None), ("NONE", None)])
def test_max_padding_reaches_the_models_batching(serve_repo, tmp_path, flag, want):
    """`zoo serve --max-padding`: the fraction of padding a ragged batch's execution groups
    may hold (`none`: one execution per batch), as the model's metadata reports it."""
    from starlette.testclient import TestClient

    from zoo.cli import _max_padding
    from zoo.serve.app import Settings, create_app
    from zoo.serve.repository import ServeOptions

    repo = tmp_path / "exports"
    shutil.copytree(serve_repo / ONNX, repo / ONNX)
    with TestClient(create_app(Settings(repo, ServeOptions(max_padding=_max_padding(flag))))) as client:
        batching = client.get(f"/v2/models/{ONNX}").json()["zoo"]["batching"]
    assert batching["max_padding"] == want


@pytest.mark.parametrize("flag", ["-0.1", "inf", "nan", "a quarter"])
def test_a_bad_max_padding_is_refused_before_the_server_starts(tmp_path, flag):
    from typer.testing import CliRunner

    from zoo.cli import app

    (tmp_path / "exports").mkdir()
    result = CliRunner().invoke(app, ["serve", str(tmp_path / "exports"), "--max-padding", flag])
    assert result.exit_code != 0
    assert "--max-padding is a fraction >= 0" in result.output + str(result.exception)


@pytest.mark.parametrize(("args", "words"), [
    (["--no-batching", "--max-queue-delay-ms", "5"], "--max-queue-delay-ms does nothing with --no-batching"),
    (["--no-batching", "--preferred-batch-sizes", "8"], "--preferred-batch-sizes does nothing with --no-batching"),
    (["--no-ragged", "--max-padding", "0.5"], "--max-padding does nothing with --no-ragged"),
    (["--max-padding", "a quarter"], "--max-padding is a fraction >= 0"),
    (["--threads", "0"], "--threads must be at least 1, got 0"),
    (["--grpc-port", "70000"], "--grpc-port must be 0 (off) or a port"),
    # uvicorn takes any int: 99999 listened on 34463 (99999 mod 65536) while its log said 99999
    (["--port", "99999"], "--port must be a port from 1 to 65535, got 99999"),
    (["--port", "-5"], "--port must be a port from 1 to 65535, got -5"),
    (["--port", "0"], "--port must be a port from 1 to 65535, got 0"),
])
def test_serve_usage_errors_exit_2_in_one_line(tmp_path, monkeypatch, capsys, args, words):
    """An option the others leave without effect is refused, not ignored (README: exit 2)."""
    import sys

    from zoo.cli import main

    (tmp_path / "exports").mkdir()
    monkeypatch.setattr(sys, "argv", ["zoo", "serve", str(tmp_path / "exports"), *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1 and words in lines[0], lines


def test_a_port_in_use_is_one_line_before_any_model_loads(serve_repo):
    import socket
    import subprocess
    import sys

    with socket.socket() as held, socket.socket() as spare:
        held.bind(("127.0.0.1", 0))
        held.listen()
        spare.bind(("127.0.0.1", 0))
        taken, free = held.getsockname()[1], spare.getsockname()[1]
        spare.close()
        for args, option in ((["--port", str(taken), "--grpc-port", "0"], "--port"),
                             (["--port", str(free), "--grpc-port", str(taken)], "--grpc-port")):
            result = subprocess.run([sys.executable, "-m", "zoo", "serve", str(serve_repo), *args],
                                    capture_output=True, text=True, timeout=120)
            lines = result.stderr.strip().splitlines()
            assert result.returncode == 1 and len(lines) == 1, result.stderr[-2000:]
            assert f"cannot listen on 127.0.0.1:{taken} ({option})" in lines[0]


def test_an_unloaded_model_frees_its_runner_at_once(serve_repo, tmp_path):
    """Model control's unload (and a reload's replaced model) lets go of the runner, and so
    of its engine's memory, at once: a reviewer's MiniLM, unloaded and loaded ten times
    under load, took `zoo serve` from 806 to 3032 MB, each session freed only whenever the
    cycle collector happened to run. The collector is off here, so only references count."""
    import gc
    import weakref

    from starlette.testclient import TestClient

    from zoo.serve.app import Settings, create_app

    repo = tmp_path / "exports"
    copy_as(serve_repo / ONNX, repo / ONNX)

    def runner_of(client) -> weakref.ref:
        pool = client.app.state.zoo.models[ONNX].batcher._pool
        runner = pool.get()
        pool.put(runner)
        return weakref.ref(runner)

    gc.disable()
    try:
        with TestClient(create_app(Settings(repo, model_control=True))) as client:
            first = runner_of(client)
            touch(repo / ONNX)
            assert client.post(f"/v2/repository/models/{ONNX}/load").status_code == 200  # a reload
            assert first() is None, "the replaced model's runner is still held"
            second = runner_of(client)
            assert client.post(f"/v2/repository/models/{ONNX}/unload").status_code == 200
            assert second() is None, "the unloaded model's runner is still held"
    finally:
        gc.enable()


def test_serving_freezes_startup_out_of_the_collector_and_unloads_free_cycles_too(serve_repo, tmp_path):
    """While serving, what startup loaded is frozen out of the cycle collector's sight
    (`zoo.serve.service.Heap`); an unloaded model is freed at once even where its runner
    sits in a reference cycle (frozen, only a collection after unfreezing could free it);
    and the collector is given back as it was when the server stops (the same process may
    go on: a test, a notebook)."""
    import gc
    import weakref

    from starlette.testclient import TestClient

    from zoo.serve.app import Settings, create_app

    repo = tmp_path / "exports"
    copy_as(serve_repo / ONNX, repo / ONNX)
    before = gc.get_threshold()
    with TestClient(create_app(Settings(repo, model_control=True))) as client:
        assert gc.get_freeze_count() > 0 and gc.get_threshold() != before
        pool = client.app.state.zoo.models[ONNX].batcher._pool
        runner = pool.get()
        pool.put(runner)
        runner.cycle = [runner]  # a reference cycle through the runner
        held = weakref.ref(runner)
        del runner, pool
        assert client.post(f"/v2/repository/models/{ONNX}/unload").status_code == 200
        assert held() is None, "the unloaded model's runner, in a cycle, is still held"
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before


def test_a_load_of_a_served_unchanged_model_does_nothing_and_a_changed_one_reloads(serve_repo, tmp_path):
    """As Triton answers it (compared with tritonserver 2.51): a load of a model that is
    served and unchanged on disk keeps the loaded one and its statistics; once a file of
    the artifact changed (touched here, as an edit or a re-export would), the load reloads
    it and the statistics start again. Before, every load reloaded: a client that loads to
    make sure a model is there paid a reload and lost the statistics."""
    from starlette.testclient import TestClient

    from zoo.serve.app import Settings, create_app

    repo = tmp_path / "exports"
    copy_as(serve_repo / ONNX, repo / ONNX)
    body = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": [0.5] * 64}]}

    def success(client) -> int:
        stats = client.get(f"/v2/models/{ONNX}/stats").json()["model_stats"][0]
        return stats["inference_stats"]["success"]["count"]

    with TestClient(create_app(Settings(repo, model_control=True))) as client:
        assert client.post(f"/v2/models/{ONNX}/infer", json=body).status_code == 200
        loaded = client.app.state.zoo.models[ONNX]
        assert client.post(f"/v2/repository/models/{ONNX}/load").status_code == 200
        assert client.app.state.zoo.models[ONNX] is loaded and success(client) == 1
        touch(repo / ONNX)
        assert client.post(f"/v2/repository/models/{ONNX}/load").status_code == 200
        assert client.app.state.zoo.models[ONNX] is not loaded and success(client) == 0
        assert client.post(f"/v2/models/{ONNX}/infer", json=body).status_code == 200 and success(client) == 1


def test_an_artifact_replaced_while_its_files_are_read_is_reloaded_not_an_internal_error(serve_repo, tmp_path,
                                                                                        monkeypatch):
    """A re-export renames the old directory away and the new one in: a load that reads the
    files between the two found one gone and answered 500 "internal error" (a review's race).
    The fingerprint is then unknown, and the load reloads, as it does for a changed artifact."""
    from starlette.testclient import TestClient

    from zoo.serve import repository
    from zoo.serve.app import Settings, create_app

    repo = tmp_path / "exports"
    copy_as(serve_repo / ONNX, repo / ONNX)
    with TestClient(create_app(Settings(repo, model_control=True))) as client:
        loaded = client.app.state.zoo.models[ONNX]
        real_lstat = repository.Path.lstat

        def gone(self):
            if self.name == "zoo.json":
                raise FileNotFoundError(2, "No such file or directory", str(self))
            return real_lstat(self)

        monkeypatch.setattr(repository.Path, "lstat", gone)
        assert repository.fingerprint(repo / ONNX) is None
        monkeypatch.setattr(repository.Path, "lstat", real_lstat)
        monkeypatch.setattr(repository, "fingerprint", lambda path: None)
        assert client.post(f"/v2/repository/models/{ONNX}/load").status_code == 200
        assert client.app.state.zoo.models[ONNX] is not loaded

"""`zoo bench --ray`: the matrix as Ray tasks gives the local run's rows, in its order.

A local Ray instance is started here (2 CPUs, loopback, no dashboard), as a cluster's
head would be; the sweep is one model on 2 backends plus a combination whose exporter
fails and one a backend does not offer on this device (every combination is an export and
a measurement in processes of their own, about 10 s each here, run twice). (A combination that never
returns meets the same per-process timeout code as a local run's, tested in
tests/test_bench.py; each costs the timeout twice over here.) The same sweep runs locally; both reports must have the same
rows (model, backend, precision, device, batch, status, and the reason of a failure).
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="zoo[ray] is not installed")

import zoo  # noqa: E402
from zoo import registry  # noqa: E402
from zoo.errors import UsageError  # noqa: E402

MODELS = [zoo.get_model("resnet8.digits").tiny()]
FAST = {"warmup": 1, "min_time": 0.05, "min_iters": 5, "batch_sizes": [1, 2], "timeout": 300}
KEYS = ("model", "backend", "precision", "device", "batch", "status", "error")


@pytest.fixture(scope="module")
def failing_backends():
    plugin = Path(__file__).with_name("bench_plugin.py")
    registry.load_plugin_file(plugin)
    yield
    registry.unload_plugin_file(plugin)


@pytest.fixture(scope="module")
def _ray_for_the_file():
    yield
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture
def local_ray(_ray_for_the_file):
    """A local Ray instance, started once for the tests of this file that use one (about
    12 s on 2 cores) unless a test in between needed none."""
    if not ray.is_initialized():
        ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 _node_ip_address="127.0.0.1")


@pytest.fixture
def without_ray():
    """No Ray instance in this process: the sweep then connects to the address it is given."""
    if ray.is_initialized():
        ray.shutdown()


def rows(report: dict) -> list[tuple]:
    return [tuple(r.get(k) for k in KEYS) for r in report["results"]]


def test_a_ray_sweep_has_the_local_runs_rows(tmp_path, failing_backends, local_ray):
    # one backend of each status (ok, failed, unsupported): each ok one costs a Ray worker and
    # two fresh processes per run, so one is enough to show rows and artifacts come back
    backends = ["onnxruntime", "broken-test", "tensorrt"]
    seen = []
    on_ray = zoo.benchmark(MODELS, backends, repository=tmp_path / "ray", random_init=True, ray="auto",
                           on_combination=lambda done, total, label: seen.append(done), **FAST)
    local = zoo.benchmark(MODELS, backends, repository=tmp_path / "local", random_init=True, **FAST)
    assert rows(on_ray) == rows(local)
    statuses = {(r["model"], r["backend"]): r["status"] for r in on_ray["results"]}
    model = "resnet8.digits"
    assert statuses[model, "onnxruntime"] == "ok"
    assert statuses[model, "broken-test"] == "failed"
    assert statuses[model, "tensorrt"] == "unsupported"
    broken = next(r for r in on_ray["results"] if r["backend"] == "broken-test")
    assert "cannot lower" in broken["error"]
    assert all(r["p50_ms"] > 0 for r in on_ray["results"] if r["status"] == "ok")
    assert on_ray["options"]["ray"] == "auto" and "ray" not in local["options"]
    assert seen == list(range(1, 4))
    # every ok combination's artifact was written by a Ray worker, into the repository it was given
    assert sorted(p.name for p in (tmp_path / "ray").iterdir()) == sorted(p.name for p in (tmp_path / "local").iterdir())


def test_each_row_names_its_node_and_the_report_that_nodes_environment(tmp_path, failing_backends, local_ray):
    """The report's environment was the driver's, whatever machines measured (a CPU head
    titled the GPU workers' rows). Each task returns its node's, read in the Ray worker."""
    report = zoo.benchmark(MODELS, ["onnxruntime", "broken-test"], repository=tmp_path, random_init=True,
                           ray="local", **{**FAST, "batch_sizes": [1]})
    host = socket.gethostname()
    assert [(r["backend"], r["status"], r["node"]) for r in report["results"]] == [
        ("onnxruntime", "ok", host), ("broken-test", "failed", host)]  # a failed row names its node too
    env = report["environment"]
    node = env["nodes"][host]
    assert (node["hostname"], node["node_id"]) == (host, ray.get_runtime_context().get_node_id())
    assert "command" not in node and env["command"]  # a Ray worker's command line is no one's
    assert {k: env[k] for k in node if k not in ("hostname", "node_id", "ip")} == {
        k: v for k, v in node.items() if k not in ("hostname", "node_id", "ip")}



class _Cluster:
    """`ray.nodes()` of a cluster whose nodes are unlike the driver (and one node lost)."""

    @staticmethod
    def nodes():
        return [{"Alive": True, "Resources": {"CPU": 8.0}}, {"Alive": True, "Resources": {"CPU": 32.0, "GPU": 1.0}},
                {"Alive": False, "Resources": {"CPU": 96.0}}]


@pytest.mark.parametrize("driver_cpus", [1, 4, 128])
@pytest.mark.parametrize(("threads", "device", "wanted"), [
    (None, "cpu", {"num_cpus": 32}),  # a whole node: the largest live one's CPUs, whatever the driver has
    (4, "cpu", {"num_cpus": 4}),
    (64, "cpu", {"num_cpus": 32}),  # more than any node has would never be scheduled
    (None, "cuda", {"num_gpus": 1, "num_cpus": 1})])
def test_a_tasks_cpus_are_counted_on_the_clusters_nodes(monkeypatch, driver_cpus, threads, device, wanted):
    from zoo.bench import ray_sweep

    monkeypatch.setattr("os.cpu_count", lambda: driver_cpus)
    assert ray_sweep._resources(_Cluster, {"device": device, "threads": threads}) == wanted


def test_a_cpu_task_asks_for_a_whole_local_node(monkeypatch, local_ray):
    """On a real (local, 2-CPU) Ray instance, from a driver that counts 1 or 64 CPUs."""
    from zoo.bench import ray_sweep

    for driver_cpus in (1, 64):
        monkeypatch.setattr("os.cpu_count", lambda: driver_cpus)
        assert ray_sweep._resources(ray, {"device": "cpu", "threads": None}) == {"num_cpus": 2}


def test_a_combination_no_node_can_take_is_a_failed_row_at_once(tmp_path, local_ray):
    """A CUDA combination on a cluster without a GPU: Ray would keep its task pending for
    ever; the row says what the cluster lacks, with the local run's status, in seconds."""
    start = time.monotonic()
    report = zoo.benchmark(MODELS, ["onnxruntime"], device="cuda", repository=tmp_path, random_init=True, ray="auto",
                           **{**FAST, "batch_sizes": [1], "timeout": 10})
    assert [(r["device"], r["status"], r["error"]) for r in report["results"]] == [
        ("cuda", "failed", "no live node of the Ray cluster has a GPU")]
    assert time.monotonic() - start < 20  # not the backstop of 2 timeouts and a minute


@pytest.mark.parametrize(("asked", "lacking"), [
    ({"num_cpus": 32}, None), ({"num_gpus": 1, "num_cpus": 1}, None),
    ({"num_gpus": 1, "num_cpus": 64}, "no live node of the Ray cluster has 1 GPU and 64 CPU"),
    ({"num_cpus": 96}, "no live node of the Ray cluster has 96 CPU")])  # only the lost node had 96
def test_what_no_live_node_has_is_named(asked, lacking):
    from zoo.bench import ray_sweep

    assert ray_sweep._lacking(_Cluster.nodes(), asked) == lacking
    no_gpu = [n for n in _Cluster.nodes() if "GPU" not in n["Resources"]]
    assert ray_sweep._lacking(no_gpu, {"num_gpus": 1, "num_cpus": 1}) == "no live node of the Ray cluster has a GPU"


FORMS = "local, auto, ray://HOST:PORT (a Ray client server) or HOST:PORT (a head node's GCS)"


@pytest.mark.parametrize("address", ["ray://head", "head:port", "http://head:8265", "ray://head:10001/x", ""])
def test_a_malformed_address_is_a_usage_error(address, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from zoo.cli import app
    from zoo.errors import UsageError

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["bench", "resnet8.digits", "--ray", address])
    assert isinstance(result.exception, UsageError) and FORMS in str(result.exception), result.output
    assert not list(tmp_path.iterdir())  # no report directory, no export


def test_a_malformed_address_exits_2_with_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "zoo", "bench", "resnet8.digits", "--ray", "foo"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"error: --ray foo: not a Ray address; give {FORMS}"]


def test_another_address_than_the_instance_in_use_is_refused_not_swapped(tmp_path, local_ray):
    """With Ray already started in the process (a notebook), `--ray HOST:PORT` of another
    cluster ran the sweep on the local instance and said nothing."""
    current = ray.get_runtime_context().gcs_address
    host, _, port = current.rpartition(":")
    other = f"{host}:{int(port) + 1}"
    with pytest.raises(UsageError, match=re.escape(f"--ray {other}: this process already uses the Ray instance at "
                                                   f"{current} (`ray.init` was called before)")):
        zoo.benchmark(MODELS, ["onnxruntime"], repository=tmp_path, random_init=True, ray=other, **FAST)
    with pytest.raises(UsageError, match=r"--ray ray://127\.0\.0\.1:10001: this process already uses"):
        zoo.benchmark(MODELS, ["onnxruntime"], repository=tmp_path, random_init=True, ray="ray://127.0.0.1:10001",
                      **FAST)
    assert ray.is_initialized()  # left as it was


def test_the_address_of_a_running_gcs_passes_the_probe(local_ray):
    from zoo.bench.ray_sweep import check_reachable

    check_reachable(ray.get_runtime_context().gcs_address)  # a real head node's GCS answers gRPC's health check


@pytest.mark.parametrize("form", ["{}", "ray://{}"])
def test_an_address_where_something_else_answers_fails_at_once(form, tmp_path, without_ray):
    # before: a TCP connection was all the probe asked for, and `ray.init` retried an HTTP
    # server's port for minutes ("Failed to connect to GCS at address ...")
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = form.format(f"127.0.0.1:{server.server_address[1]}")
    start = time.monotonic()
    try:
        with pytest.raises(zoo.ZooError, match=re.escape(f"--ray {address}: what answers at 127.0.0.1:"
                                                         f"{server.server_address[1]} does not speak gRPC")):
            zoo.benchmark(MODELS, ["onnxruntime"], repository=tmp_path, random_init=True, ray=address, **FAST)
    finally:
        server.shutdown()
        server.server_close()
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("form", ["{}", "ray://{}"])
def test_an_address_where_nothing_answers_fails_at_once(form, tmp_path, without_ray):
    # after every test of the file that uses the local instance: it shuts it down, and
    # starting it again costs about 19 s on 2 cores
    with socket.socket() as s:  # a port nothing listens on: bound, then closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = form.format(f"127.0.0.1:{port}")
    start = time.monotonic()
    with pytest.raises(zoo.ZooError, match=f"--ray {address}: nothing answers at 127.0.0.1:{port}"):
        zoo.benchmark(MODELS, ["onnxruntime"], repository=tmp_path, random_init=True, ray=address, **FAST)
    assert time.monotonic() - start < 10


def test_sigterm_shuts_ray_down_without_a_crash_dump(tmp_path):
    """Ray's core worker puts absl's handler on SIGTERM in the driver (a stack dump, then an
    abort that leaves the instance's processes behind); the sweep exits 143 through ray.shutdown."""
    running = tmp_path / "running"
    driver = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from zoo.bench import ray_sweep

        def waits(job, timeout):
            Path({str(running)!r}).touch()
            time.sleep(120)

        ray_sweep._combination = waits
        list(ray_sweep.run_on_ray([{{"device": "cpu", "threads": 1}}], 60, "local"))
        """)
    proc = subprocess.Popen([sys.executable, "-c", driver], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not running.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert "SIGTERM received" not in stderr
    assert proc.returncode == 128 + signal.SIGTERM, stderr

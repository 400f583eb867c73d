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

from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="zoo[ray] is not installed")

import zoo  # noqa: E402
from zoo import registry  # noqa: E402

MODELS = [zoo.get_model("resnet8.digits").tiny()]
FAST = {"warmup": 1, "min_time": 0.05, "min_iters": 5, "batch_sizes": [1, 2], "timeout": 300}
KEYS = ("model", "backend", "precision", "device", "batch", "status", "error")


@pytest.fixture(scope="module")
def failing_backends():
    plugin = Path(__file__).with_name("bench_plugin.py")
    registry.load_plugin_file(plugin)
    yield
    registry.unload_plugin_file(plugin)


@pytest.fixture
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _node_ip_address="127.0.0.1")
    yield
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

"""A Ray sweep's report names the machines that measured, not the one that launched it.

Found on the documented `--device cpu,cuda --ray auto` cluster (a CPU head, GPU workers):
the report's environment was the driver's (`environment()` in the launching process), so
report.md titled its GPU rows with the head's CPU and no GPU, and `--compare` compared a
baseline against the laptop that started the run. Each task now returns its node's
environment (`zoo.bench.ray_sweep.node_environment`, tested on a real local Ray instance
in tests/test_bench_ray.py); these tests cover how a report merges them. And a relative
`--repository` or `--checkpoint` travelled to the workers as given, so a worker on another
node resolved it under its own working directory.
"""

from __future__ import annotations

from pathlib import Path

import zoo
from zoo.bench.compare import compare
from zoo.bench.matrix import job_for
from zoo.bench.ray_sweep import _node_name, cluster_environment

LIBS = {"onnxruntime": "1.20.0", "libraries": ["onnxruntime"]}
DRIVER = {"cpu": "Apple M3", "cores": 8, "threads": 8, "torch": "2.5.0", "command": "zoo bench all --ray auto", **LIBS}
HEAD = {"hostname": "head", "node_id": "a1", "ip": "10.0.0.1", "cpu": "Intel Xeon", "cores": 16, "threads": 16,
        "torch": "2.5.0", **LIBS}
WORKER = {"hostname": "gpu-1", "node_id": "b2", "ip": "10.0.0.2", "cpu": "AMD EPYC", "cores": 64, "threads": 1,
          "torch": "2.5.0", "gpu": "NVIDIA H100", "gpus": 1, "tensorrt": "10.3.0",
          "libraries": ["onnxruntime", "tensorrt"], "onnxruntime": "1.20.0"}


def nodes_of(*envs: dict) -> dict[str, dict]:
    nodes: dict[str, dict] = {}
    for env in envs:
        _node_name(nodes, env)
    return nodes


def test_the_reports_machine_facts_are_the_nodes_not_the_drivers():
    env = cluster_environment(DRIVER, nodes_of(HEAD, WORKER))
    assert env["command"] == DRIVER["command"]  # where it was started from: the driver's
    assert env["cpu"] == "gpu-1: AMD EPYC; head: Intel Xeon" and env["cores"] == "gpu-1: 64; head: 16"
    assert env["gpu"] == "NVIDIA H100" and env["torch"] == "2.5.0"  # one value where the nodes agree
    assert env["libraries"] == ["onnxruntime", "tensorrt"] and env["tensorrt"] == "10.3.0"
    assert env["nodes"]["head"]["cpu"] == "Intel Xeon" and env["nodes"]["gpu-1"]["gpu"] == "NVIDIA H100"
    assert "Apple M3" not in str(env)


def test_one_node_that_ran_everything_is_the_reports_machine():
    env = cluster_environment(DRIVER, nodes_of(WORKER))
    assert {k: env[k] for k in ("cpu", "cores", "gpu", "threads")} == {
        "cpu": "AMD EPYC", "cores": 64, "gpu": "NVIDIA H100", "threads": 1}
    assert cluster_environment(DRIVER, {}) == {**DRIVER, "nodes": {}}  # no node measured anything


def test_a_node_is_named_by_its_host_and_keeps_what_its_first_task_saw():
    later = {**HEAD, "threads": 2, "gpu": "NVIDIA L4"}  # a GPU task after a CPU task that saw none
    twin = {**WORKER, "hostname": "head"}  # another node with the same host name
    nodes = nodes_of(HEAD, later, twin)
    assert list(nodes) == ["head", "head (10.0.0.2)"]
    assert nodes["head"]["threads"] == 16 and nodes["head"]["gpu"] == "NVIDIA L4"


def rows(device: str = "cuda") -> list[dict]:
    return [{"model": "m", "backend": "onnxruntime", "precision": "fp32", "device": device, "batch": 1,
             "status": "ok", "p50_ms": 1.0, "noise": 0.0}]


def test_compare_names_what_differs_between_the_clusters_not_between_drivers():
    before = {"environment": cluster_environment(DRIVER, nodes_of(HEAD, WORKER)), "results": rows()}
    elsewhere = {**DRIVER, "cpu": "Intel i7", "cores": 4}  # started from another laptop: the same cluster
    same = {"environment": cluster_environment(elsewhere, nodes_of(HEAD, WORKER)), "results": rows()}
    assert compare(before, same)["environment"] == {}
    upgraded = {"environment": cluster_environment(DRIVER, nodes_of(HEAD, {**WORKER, "gpu": "NVIDIA H200"})),
                "results": rows()}
    assert compare(before, upgraded)["environment"] == {"gpu": ["NVIDIA H100", "NVIDIA H200"]}


def test_a_relative_repository_and_checkpoint_reach_the_workers_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = zoo.get_model("resnet8.digits").tiny()
    job = job_for(spec, "onnxruntime", "fp32", "cpu", Path("exports"), "runs/best", False, None)
    assert (job["repository"], job["checkpoint"]) == (str(tmp_path / "exports"), str(tmp_path / "runs" / "best"))
    (tmp_path / "checkpoints" / spec.name).mkdir(parents=True)  # the default, which the driver found here
    job = job_for(spec, "onnxruntime", "fp32", "cpu", "exports", None, False, None)
    assert job["checkpoint"] == str(tmp_path / "checkpoints" / spec.name)
    assert job_for(spec, "onnxruntime", "fp32", "cpu", "exports", None, True, None)["checkpoint"] is None


def test_report_md_lists_each_node_on_a_line_of_its_own():
    from zoo.bench.report import markdown

    text = markdown({"environment": cluster_environment(DRIVER, nodes_of(HEAD, WORKER)), "results": rows()})
    lines = text.splitlines()
    assert "- cpu: gpu-1: AMD EPYC; head: Intel Xeon" in lines
    start = lines.index("- nodes (Ray):")
    assert [line.split(":")[0] for line in lines[start + 1:start + 3]] == ["  - head", "  - gpu-1"]

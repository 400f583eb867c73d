"""`zoo predict --tensor NAME=FILE.npy`: a model that takes tensors (most models users bring)
run from the command line on NumPy files, here and on a server, with the answers the
artifact's own runner gives; files that would be unpickled, and every malformed use, are
refused with one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import zoo

from cli_support import zoo_cli
from serve_support import ServerProcess

PLUGIN = Path(__file__).parent / "user_plugins" / "tabular_int8.py"
ARTIFACT = "mlp.cancer.onnxruntime.fp32"



@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """The user's tabular model exported with its plugin; later commands run without it
    (the artifact describes itself). Inputs: float64 features (cast to the spec's float32
    as zoo.load's runner casts them), a float32 file, and a pickled object array."""
    work = tmp_path_factory.mktemp("predict")
    result = zoo_cli("--plugin", str(PLUGIN), "export", "mlp.cancer", "-b", "onnxruntime", "--random-init",
                     "-r", "exports", cwd=work)
    assert result.returncode == 0, result.stderr
    np.save(work / "features.npy", np.random.default_rng(0).normal(size=(5, 30)))
    np.save(work / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return work


def expected(work: Path) -> np.ndarray:
    runner = zoo.load(work / "exports" / ARTIFACT)
    return runner({"features": np.load(work / "features.npy").astype(np.float32)})["logits"]


def test_outputs_are_the_runners(work):
    result = zoo_cli("predict", "mlp.cancer", "--artifact", ARTIFACT, "--tensor", "features=features.npy", "--json",
                     cwd=work)
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["model"] == "mlp.cancer" and answer["source"] == f"artifact {ARTIFACT}"
    logits = answer["outputs"]["logits"]
    assert logits["dtype"] == "float32" and logits["shape"] == [5, 2]
    np.testing.assert_array_equal(np.asarray(logits["data"], dtype=np.float32), expected(work))
    shown = zoo_cli("predict", "-", "--artifact", ARTIFACT, "--tensor", "features=features.npy", cwd=work)
    assert shown.returncode == 0 and shown.stdout.startswith("logits float32 [5, 2]:"), shown.stdout + shown.stderr


def test_out_writes_one_npy_per_output(work):
    result = zoo_cli("predict", "mlp.cancer", "--artifact", ARTIFACT, "--tensor", "features=features.npy",
                     "--out", "outputs", cwd=work)
    assert result.returncode == 0, result.stderr
    np.testing.assert_array_equal(np.load(work / "outputs" / "logits.npy", allow_pickle=False), expected(work))


def test_a_server_answers_the_same(work):
    proc = ServerProcess(work / "exports", log=work / "server.log")
    try:
        proc.wait_ready()
        result = zoo_cli("predict", ARTIFACT, "--url", proc.url, "--tensor", "features=features.npy", "--json",
                         cwd=work)
    finally:
        proc.kill()
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["source"] == f"server {proc.url}"
    np.testing.assert_array_equal(np.asarray(answer["outputs"]["logits"]["data"], dtype=np.float32), expected(work))


@pytest.mark.parametrize("args, code, message", [
    (["--tensor", "features=objects.npy"], 1, "--tensor features=objects.npy: it holds Python objects, which would "
                                              "be unpickled"),
    (["--tensor", "features=nothing.npy"], 1, "--tensor features=nothing.npy: no such file"),
    (["--tensor", "x=features.npy"], 1, "model mlp.cancer takes inputs ['features']; missing ['features'], "
                                        "unexpected ['x']"),
    (["--tensor", "features"], 2, "--tensor takes KEY=VALUE, got 'features'"),
    (["--out", "o"], 2, "--out writes the outputs of --tensor inputs"),
    (["--tensor", "features=features.npy", "--text", "hi"], 2, "--tensor gives a model's tensors"),
    ([], 2, "model mlp.cancer: give at least one csvrow input"),
    # its CSV rows are read by its plugin, which this process has not loaded
    (["1,2,3"], 1, "model mlp.cancer was defined by the plugin file tabular_int8.py; load it (`zoo --plugin "
                   "tabular_int8.py`, or ZOO_PLUGINS) to turn csvrow inputs into tensors"),
])
def test_misuse_is_one_line(work, args, code, message):
    result = zoo_cli("predict", "mlp.cancer", "--artifact", ARTIFACT, *args, cwd=work)
    assert result.returncode == code, result.stdout + result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr

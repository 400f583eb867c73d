"""Plugins as their authors meet the zoo: the files in tests/user_plugins, each taken
through `zoo check`, `zoo export`, `zoo bench` with `--plugin` in fresh `zoo` processes,
then verified and served by processes that never load the plugin (the artifacts carry
their signature and test vectors). Requests are sent by Triton's own HTTP client.

Every process is a real `python -m zoo` or a short script using the public API; nothing
here runs in the test process but the client. The processes are shared by the tests
below through module fixtures, so the file starts each command once.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from zoo.artifact import Artifact

from cli_support import zoo_cli

PLUGINS = Path(__file__).parent / "user_plugins"
#: model -> the plugin file that defines it, exported through onnxruntime
MODELS = {"scorer.mixed": "mixed_outputs.py", "bag.varlen": "variable_length.py",
          "calibrated.side": "side_input.py", "bert-tiny.modeloutput": "model_output.py",
          "gate.kwonly": "keyword_only.py", "mlp.cancer": "tabular_int8.py"}
BACKEND_PLUGIN = "onnx_reference_backend.py"



def plugin(model: str) -> list[str]:
    return ["--plugin", str(PLUGINS / MODELS[model])]


def name(model: str, precision: str = "fp32") -> str:
    return f"{model}.onnxruntime.{precision}"


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """Every model checked and exported by its author's commands: `zoo check`, then
    `zoo train` where the model is trained here, then `zoo export` (fp32, and int8 for
    the model that offers it); the user's own backend exports one model too."""
    work = tmp_path_factory.mktemp("users")
    for model in MODELS:
        checked = zoo_cli(*plugin(model), "check", model, "--json", cwd=work)
        assert checked.returncode == 0, checked.stderr
        (work / f"{model}.check.json").write_text(checked.stdout)
    trained = zoo_cli(*plugin("mlp.cancer"), "train", "mlp.cancer", cwd=work)
    assert trained.returncode == 0, trained.stderr
    for model, precision in [*((m, "fp32") for m in MODELS), ("mlp.cancer", "int8")]:
        exported = zoo_cli(*plugin(model), "export", model, "-b", "onnxruntime", "--precision", precision,
                           *([] if model == "mlp.cancer" else ["--random-init"]), "-r", "exports", cwd=work)
        assert exported.returncode == 0, f"{model} {precision}: {exported.stderr}"
    own = zoo_cli("--plugin", str(PLUGINS / BACKEND_PLUGIN), *plugin("gate.kwonly"), "export", "gate.kwonly",
                  "-b", "onnx-reference", "--random-init", "-r", "own", cwd=work)
    assert own.returncode == 0, own.stderr
    return work


def test_each_plugin_meets_its_spec(work):
    for model in MODELS:
        report = json.loads((work / f"{model}.check.json").read_text())
        assert report["passed"], (model, report)


def test_a_0d_input_is_refused_when_the_plugin_registers(tmp_path):
    listed = zoo_cli("--plugin", str(PLUGINS / "scalar_input.py"), "list", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "shift.scalar" not in {row["name"] for row in json.loads(listed.stdout)}
    assert "scalar_input.py" in listed.stderr and "'offset'" in listed.stderr and "(1,)" in listed.stderr


@pytest.fixture(scope="module")
def verified(work) -> dict:
    """`zoo.verify` and `zoo.load` of every artifact by a process that loads no plugin."""
    script = (
        "import json, sys, zoo\n"
        "from zoo.artifact import Artifact\n"
        "out = {}\n"
        "for path in sys.argv[1:]:\n"
        "    try:\n"
        "        report = zoo.verify(path)\n"
        "        out[path] = {'passed': report['parity']['passed'], 'reference': report.get('reference'),\n"
        "                     'metric': report.get('metric')}\n"
        "    except zoo.ZooError as exc:\n"
        "        out[path] = {'error': f'{type(exc).__name__}: {exc}'}\n"
        "out['torch imported'] = 'torch' in sys.modules\n"
        "print(json.dumps(out))\n")
    paths = sorted(str(p) for p in (work / "exports").iterdir()) + [str(work / "own" / "gate.kwonly.onnx-reference.fp32")]
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_DEBUG", "ZOO_PLUGINS")}
    done = subprocess.run([sys.executable, "-c", script, *paths], cwd=work, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return {Path(k).name: v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


@pytest.mark.parametrize("model", MODELS)
def test_every_artifact_verifies_against_its_test_vectors_without_the_plugin(verified, model):
    report = verified[name(model)]
    assert report.get("passed") is True, report
    assert "test vectors" in json.dumps(report["reference"]), report


def test_verifying_onnx_artifacts_without_their_plugins_imports_no_pytorch(verified):
    """The test vectors are the reference there, and ONNX Runtime runs the artifact: PyTorch
    (2 s of import) has nothing to do, as in `zoo serve` of the same artifacts."""
    assert verified["torch imported"] is False


def test_the_int8_artifact_verifies_without_the_plugin(verified, work):
    assert verified[name("mlp.cancer", "int8")].get("passed") is True
    manifest = json.loads((work / "exports" / name("mlp.cancer", "int8") / "zoo.json").read_text())
    # the trained model holds its stated quality through the int8 artifact
    assert manifest["metric"]["artifact"] >= 0.95 and manifest["quantization"] == "dynamic"


def test_a_third_party_backend_artifact_names_the_backend_it_needs(verified):
    """And where that backend came from, as an artifact names its model's plugin (it said
    only "unknown backend 'onnx-reference'; registered: ...")."""
    error = verified["gate.kwonly.onnx-reference.fp32"].get("error", "")
    assert error.startswith("UnknownBackendError: artifact gate.kwonly.onnx-reference.fp32 runs on backend "
                            "'onnx-reference', which no plugin here registers (registered here: onnxruntime, "), error
    assert error.endswith("; it came from the plugin file onnx_reference_backend.py: load it (`zoo --plugin "
                          "onnx_reference_backend.py`, or ZOO_PLUGINS)"), error


def test_the_third_party_backend_verifies_with_its_plugin(work):
    done = zoo_cli("--plugin", str(PLUGINS / BACKEND_PLUGIN), "verify", "own/gate.kwonly.onnx-reference.fp32",
                   "--json", cwd=work)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["parity"]["passed"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(work: Path, *plugins: str):
    """`zoo serve` of the repository with these `--plugin` arguments; its host:port."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_DEBUG", "ZOO_PLUGINS")}
    log_file = work / f"serve{len(plugins)}.log"
    log = open(log_file, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "zoo", *plugins, "serve", "exports", "--port", str(port),
                             "--grpc-port", "0", "--threads", "1"],
                            cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    import httpx

    url = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert proc.poll() is None, log_file.read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://{url}/v2/health/ready", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield url
    finally:
        proc.kill()
        proc.wait()
        log.close()


@pytest.fixture(scope="module")
def server(work):
    """`zoo serve` of the repository, with no plugin loaded."""
    with serving(work) as url:
        yield url


@pytest.fixture(scope="module")
def cancer_server(work):
    """`zoo serve` of the repository with mlp.cancer's plugin, which reads its CSV rows."""
    with serving(work, *plugin("mlp.cancer")) as url:
        yield url


#: rows 0 and 19 of scikit-learn's breast-cancer data: a malignant tumour, a benign one
ROWS = ["17.99,10.38,122.8,1001.0,0.1184,0.2776,0.3001,0.1471,0.2419,0.07871,1.095,0.9053,8.589,153.4,0.006399,"
        "0.04904,0.05373,0.01587,0.03003,0.006193,25.38,17.33,184.6,2019.0,0.1622,0.6656,0.7119,0.2654,0.4601,0.1189",
        "13.54,14.36,87.46,566.3,0.09779,0.08129,0.06664,0.04781,0.1885,0.05766,0.2699,0.7886,2.058,23.56,0.008462,"
        "0.0146,0.02387,0.01315,0.0198,0.0023,15.11,19.26,99.7,711.2,0.144,0.1773,0.239,0.1288,0.2977,0.07259"]


def diagnoses(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, result.stderr
    return [r["diagnosis"] for r in json.loads(result.stdout)["results"]]


def test_the_trained_model_diagnoses_csv_rows_here_and_through_a_server_with_its_plugin(work, cancer_server):
    local = zoo_cli(*plugin("mlp.cancer"), "predict", "mlp.cancer", *ROWS, "--artifact", name("mlp.cancer"),
                    "-r", "exports", "--json", cwd=work)
    assert diagnoses(local) == ["malignant", "benign"]
    remote = zoo_cli("predict", name("mlp.cancer"), *ROWS, "--url", f"http://{cancer_server}", "--json", cwd=work)
    assert diagnoses(remote) == ["malignant", "benign"]


def test_items_sent_as_another_datatype_are_named_as_such(cancer_server):
    """CSV rows sent as FP32 (or UINT8 bytes) were answered "missing ['features'],
    unexpected ['csvrow']", as if the model took no items."""
    import tritonclient.http as triton

    client = triton.InferenceServerClient(cancer_server)
    for datatype, value in (("FP32", np.zeros((1,), np.float32)), ("UINT8", np.frombuffer(ROWS[0].encode(), np.uint8))):
        given = triton.InferInput("csvrow", list(value.shape), datatype)
        given.set_data_from_numpy(value)
        with pytest.raises(triton.InferenceServerException) as refused:
            client.infer(name("mlp.cancer"), [given])
        assert (f"input 'csvrow' has datatype {datatype}; model {name('mlp.cancer')} takes one BYTES input 'csvrow' "
                f"of csvrow items, or its tensors ['features']") in refused.value.message()


def test_predict_against_a_server_without_the_plugin_names_the_plugin(work, server):
    """The client said the model "takes no domain-native inputs (it takes tensors)"; the
    server knew (from the artifact) which plugin file reads its items."""
    refused = zoo_cli("predict", name("mlp.cancer"), ROWS[0], "--url", f"http://{server}", cwd=work)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert (f"model {name('mlp.cancer')} on http://{server} takes no domain-native inputs there: model mlp.cancer "
            f"was defined by the plugin file tabular_int8.py; load it (`zoo --plugin tabular_int8.py`, or ZOO_PLUGINS) "
            f"to send it csvrow items; this server has not loaded it; send its tensors ['features'] instead"
            ) in " ".join(refused.stderr.split()), refused.stderr


@pytest.mark.parametrize("model", MODELS)
def test_every_artifact_serves_its_test_vectors_without_the_plugin(server, work, model):
    import tritonclient.http as triton

    art = Artifact.open(work / "exports" / name(model))
    client = triton.InferenceServerClient(server)
    assert client.is_model_ready(art.name)
    for vectors in art.test_vectors():
        inputs = []
        for key, value in vectors.inputs.items():
            tensor = triton.InferInput(key, list(value.shape), triton.np_to_triton_dtype(value.dtype))
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        result = client.infer(art.name, inputs)
        for key, want in vectors.outputs.items():
            got = result.as_numpy(key)
            assert got.dtype == want.dtype and got.shape == want.shape, (key, got.dtype, got.shape)
            if np.issubdtype(want.dtype, np.floating):
                np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-3, atol=1e-4)
            else:
                np.testing.assert_array_equal(got, want)


def test_every_model_benchmarks_with_its_plugin(work):
    files = [f for model in MODELS for f in plugin(model)]
    done = zoo_cli(*files, "bench", ",".join(MODELS), "--backends", "onnxruntime", "--batch-sizes", "1",
                   "--min-time", "0.05", "-r", "exports", "--report-dir", "bench", cwd=work, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = json.loads((work / "bench" / "report.json").read_text())["results"]
    assert {r["model"] for r in rows} == set(MODELS)
    assert all(r["p50_ms"] > 0 for r in rows)

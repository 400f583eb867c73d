"""The export repository in a real NVIDIA Triton server (tritonserver 2.51 from the
nvidia-pytriton wheel, CPU; `make triton` lays it out, tools/tritonserver.py starts it).

One repository holds an artifact of every backend that runs on the CPU here:

- the Python-backend form (Triton's Python backend runs `1/model.py`, which serves the
  artifact through zoo's runner): the default for torch, torch-compile and torch-aoti, and
  asked for with `triton="python"` for ONNX Runtime and OpenVINO; a variable-length model
  (requests of different lengths in one batch), a model with a side input (Triton's
  `max_batch_size: 0`, unbatched), and one whose file was modified after export;
- the native form (`onnxruntime_onnx`, `openvino`), whose backend libraries this Triton
  build lacks: those models must fail for that reason alone, never for their configuration.

Every READY model answers over tritonclient HTTP and gRPC exactly what the artifact's own
runner answers in this process, alone and when Triton's dynamic batcher merges requests.
"""

from __future__ import annotations

import shutil
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

import zoo
from zoo import registry

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from tritonserver import Tritonserver, unavailable_reason  # noqa: E402

tritonclient_http = pytest.importorskip("tritonclient.http")
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no Triton server: {REASON}")

VOCAB, WIDTH, CLASSES = 32, 8, 3


class Pooler(torch.nn.Module):
    """Token embeddings (batch, seq, width) and mean-pooled logits (batch, classes)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.head = torch.nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.embed(tokens)
        return self.head(hidden.mean(dim=1)), hidden


class Calibrated(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(5, 3)

    def forward(self, x, temperature):
        return torch.softmax(self.linear(x) / temperature, dim=-1)


POOLER = zoo.ModelSpec(
    name="pooler.triton", domain="nlp", task="text-classification",
    inputs=(zoo.TensorSpec("tokens", "int64", ("batch", "seq")),),
    outputs=(zoo.TensorSpec("logits", "float32", ("batch", CLASSES)),
             zoo.TensorSpec("hidden", "float32", ("batch", "seq", WIDTH))),
    build=Pooler,
    sample=lambda batch, rng: {"tokens": rng.integers(0, VOCAB, (batch, int(rng.integers(2, 17))), dtype=np.int64)},
    axes={"batch": zoo.AxisRange(1, 4, 16), "seq": zoo.AxisRange(2, 8, 16)})

SIDE = zoo.ModelSpec(
    name="calibrated.triton", domain="tabular", task="classification",
    inputs=(zoo.TensorSpec("x", "float32", ("batch", 5)),
            zoo.TensorSpec("temperature", "float32", (1,), value_range=(0.05, 100.0))),
    outputs=(zoo.TensorSpec("probabilities", "float32", ("batch", 3)),),
    build=Calibrated,
    sample=lambda batch, rng: {"x": rng.standard_normal((batch, 5)).astype(np.float32),
                               "temperature": np.array([rng.uniform(0.5, 2.0)], np.float32)},
    axes={"batch": zoo.AxisRange(1, 4, 16)})

CPU = sorted(name for name, backend in registry.backends().items() if backend.probe("cpu").ok)
NATIVE = [name for name in CPU if registry.get_backend(name).triton]  # Triton has a backend for the engine
RESNET = "resnet8.digits"


def exports() -> list[tuple[zoo.ModelSpec, str, str | None]]:
    """(spec, backend, triton form asked for) of every artifact in the repository."""
    tiny = zoo.get_model(RESNET).tiny()
    rows = [(tiny, b, None) for b in CPU]  # native where Triton has a backend, else python
    rows += [(POOLER, b, "python") for b in CPU if b not in ("torch-compile", "torch-aoti")]
    rows += [(SIDE, "torch", None)]
    return rows


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> tuple[Path, dict[str, zoo.Artifact]]:
    root = tmp_path_factory.mktemp("triton-repository")
    arts = {}
    for spec, backend, form in exports():
        art = zoo.export(spec, backend, repository=root, random_init=True, triton=form)
        arts[art.name] = art
    # modified after export: the weights file no longer matches its sha256 in zoo.json
    modified = zoo.export(zoo.get_model(RESNET).tiny(), "torch", "bf16", repository=root, random_init=True)
    with open(modified.path / "weights.safetensors", "ab") as f:
        f.write(b"\0")
    return root, arts


@pytest.fixture(scope="module")
def triton(repository, tmp_path_factory):
    root, _ = repository
    server = Tritonserver(root, log=tmp_path_factory.mktemp("triton") / "tritonserver.log")
    with server:
        yield server


def python_form(arts: dict[str, zoo.Artifact]) -> list[str]:
    return sorted(name for name, art in arts.items() if art.manifest["triton"]["form"] == "python")


def test_every_cpu_backend_is_in_the_repository(repository):
    _, arts = repository
    assert {"torch", "onnxruntime"} <= set(CPU)
    assert {art.backend for art in arts.values()} == set(CPU)
    forms = {(art.backend, art.manifest["triton"]["form"]) for art in arts.values()}
    for backend in CPU:  # every backend in the python form, and the native one where Triton has it
        assert (backend, "python") in forms
        assert (backend in NATIVE) == ((backend, "native") in forms)


def test_python_form_models_are_ready(triton, repository):
    _, arts = repository
    index = triton.index()
    not_ready = {name: index.get(name) for name in python_form(arts) if index.get(name, {}).get("state") != "READY"}
    assert not not_ready, f"{not_ready}\n{triton.log()[-6000:]}"


def test_native_models_fail_for_the_missing_backend_library_only(triton, repository):
    _, arts = repository
    native = [name for name, art in arts.items() if art.manifest["triton"]["form"] == "native"]
    assert native, "no native-form artifact was exported"
    index = triton.index()
    for name in native:
        entry = index[name]
        assert entry["state"] == "UNAVAILABLE", entry
        backend = dict(registry.get_backend(arts[name].backend).triton)
        library = {"onnxruntime_onnx": "onnxruntime"}.get(backend.get("platform"), backend.get("backend"))
        # Triton's wording when the backend's shared library is absent from --backend-directory
        assert entry["reason"] == (f"Invalid argument: unable to find backend library for backend '{library}', "
                                   "try specifying runtime on the model configuration."), entry


def test_a_modified_artifact_never_becomes_ready(triton, repository):
    root, _ = repository
    name = f"{RESNET}.torch.bf16"
    entry = triton.index()[name]
    assert entry["state"] == "UNAVAILABLE", entry
    assert "weights.safetensors does not match its sha256" in triton.log(), triton.log()[-4000:]


def request(art: zoo.Artifact, batch: int, seed: int) -> dict[str, np.ndarray]:
    """Inputs for `art` at `batch` rows from its spec's own sampler (the manifest's for
    a model no plugin registers)."""
    return {k: np.asarray(v) for k, v in art.spec().sample(batch, np.random.default_rng(seed)).items()}


def tensors(client_module, inputs: dict[str, np.ndarray]) -> list:
    found = []
    for key, value in inputs.items():
        tensor = client_module.InferInput(key, list(value.shape), tritonclient_http.np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value)
        found.append(tensor)
    return found


def outputs(result, names: list[str]) -> dict[str, np.ndarray]:
    return {n: result.as_numpy(n) for n in names}


def infer(client_module, client, name: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    meta = client.get_model_metadata(name)
    names = [o["name"] for o in meta["outputs"]] if isinstance(meta, dict) else [o.name for o in meta.outputs]
    return outputs(client.infer(name, tensors(client_module, inputs)), names)


def test_answers_equal_the_artifacts_own_runner_over_http_and_grpc(triton, repository):
    _, arts = repository
    http = tritonclient_http.InferenceServerClient(triton.http_url)
    grpc = tritonclient_grpc.InferenceServerClient(triton.grpc_url)
    try:
        for name in python_form(arts):
            if name.endswith(".torch.bf16"):
                continue
            runner = zoo.load(arts[name].path)
            for batch, seed in ((1, 0), (3, 1)):
                inputs = request(arts[name], batch, seed)
                expected = {k: np.asarray(v) for k, v in runner(inputs).items()}
                for module, client in ((tritonclient_http, http), (tritonclient_grpc, grpc)):
                    got = infer(module, client, name, inputs)
                    assert sorted(got) == sorted(expected), name
                    for key in expected:
                        np.testing.assert_array_equal(got[key], expected[key], err_msg=f"{name} {key}")
    finally:
        grpc.close()
        http.close()


def test_classification_names_the_labels_as_zoo_serve_does(triton, repository):
    """Triton's classification extension over an output whose spec has labels: the
    exported config's `label_filename` gives Triton the labels, so it answers
    "score:index:label" exactly as zoo serve's classification of the same outputs."""
    from zoo.serve.classify import classify

    _, arts = repository
    name = f"{RESNET}.torch.fp32"
    art = arts[name]
    labels = next(t.labels for t in art.spec().outputs if t.name == "logits")
    inputs = request(art, 3, 5)
    logits = np.asarray(zoo.load(art.path)(inputs)["logits"])
    want = classify(logits, 4, batched=True, labels=labels)
    http = tritonclient_http.InferenceServerClient(triton.http_url)
    try:
        result = http.infer(name, tensors(tritonclient_http, inputs),
                            outputs=[tritonclient_http.InferRequestedOutput("logits", class_count=4)])
        got = result.as_numpy("logits")
    finally:
        http.close()
    assert got.shape == (3, 4) and all(x.count(b":") == 2 for x in got.reshape(-1))
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize("model", [f"{RESNET}.torch.fp32", f"{POOLER.name}.onnxruntime.fp32"])
def test_dynamic_batching_merges_requests_and_answers_each_its_own_rows(triton, repository, model):
    """Rounds of 16 concurrent gRPC requests of 2 rows (and, for the pooler, two sequence
    lengths), released together from 16 threads: Triton's batcher merges some (fewer
    executions than requests), and every answer equals the runner on that request alone."""
    _, arts = repository
    art = arts[model]
    runner = zoo.load(art.path)
    names = [o.name for o in art.spec().outputs]
    tolerance = art.spec().tolerance("fp32")
    http = tritonclient_http.InferenceServerClient(triton.http_url)
    grpc = tritonclient_grpc.InferenceServerClient(triton.grpc_url)
    sent = 0
    try:
        before = _counts(http, model)
        for round_ in range(3):  # the batcher waits 1 ms for a batch: a round may arrive too spread out
            inputs = [request(art, 2, 16 * round_ + i) for i in range(16)]
            if model.startswith(POOLER.name):  # two lengths, so one batch holds a group of each
                inputs = [{"tokens": x["tokens"][:, :4] if i % 2 else np.tile(x["tokens"], 6)[:, :12]}
                          for i, x in enumerate(inputs)]
            barrier = threading.Barrier(len(inputs))

            def call(x):
                prepared = tensors(tritonclient_grpc, x)
                barrier.wait()
                return outputs(grpc.infer(model, prepared), names)

            with ThreadPoolExecutor(len(inputs)) as pool:
                answers = list(pool.map(call, inputs))
            sent += len(inputs)
            for x, got in zip(inputs, answers):
                for key, value in runner(x).items():
                    np.testing.assert_allclose(got[key], value, rtol=tolerance.rtol, atol=tolerance.atol)
            after = _counts(http, model)
            if after[1] - before[1] < sent:
                break
    finally:
        grpc.close()
        http.close()
    rows, executions = after[0] - before[0], after[1] - before[1]
    assert rows == sent * 2  # Triton counts rows
    assert executions < sent, f"Triton's batcher merged nothing: {executions} executions for {sent} requests"


def _counts(client, model: str) -> tuple[int, int]:
    stats = client.get_inference_statistics(model)["model_stats"][0]
    return stats["inference_count"], stats["execution_count"]


def test_unbatched_side_input_model(triton, repository):
    _, arts = repository
    name = f"{SIDE.name}.torch.fp32"
    http = tritonclient_http.InferenceServerClient(triton.http_url)
    try:
        config = http.get_model_config(name)
        assert config["max_batch_size"] == 0 and config["backend"] == "python"
        inputs = request(arts[name], 3, 7)
        expected = zoo.load(arts[name].path)(inputs)["probabilities"]
        np.testing.assert_array_equal(infer(tritonclient_http, http, name, inputs)["probabilities"], expected)
    finally:
        http.close()


def test_python_form_of_a_native_engine_is_verified_by_zoo_verify(repository, tmp_path):
    """The python form changes only config.pbtxt and adds 1/model.py, which is hashed like
    every file: the artifact verifies, and a changed model.py is refused before it runs."""
    _, arts = repository
    art = arts[f"{POOLER.name}.onnxruntime.fp32"]
    assert (art.path / "1" / "model.py").is_file() and "model.py" not in art.manifest["model_file"]
    assert zoo.verify(art.path)["parity"]["passed"]
    copy = tmp_path / art.name
    shutil.copytree(art.path, copy)
    (copy / "1" / "model.py").write_text("raise SystemExit\n")
    with pytest.raises(zoo.ZooError, match="1/model.py does not match its sha256"):
        zoo.load(copy)


def test_a_port_another_server_answers_on_is_not_taken_for_triton(tmp_path):
    """A `zoo serve` (here, a stand-in answering its routes) holds the HTTP port: tritonserver
    fails to bind, and the other server's "live" must not pass for Triton's."""
    import http.server
    import json as json_

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = json_.dumps({"name": "zoo", "version": "0", "extensions": []} if self.path == "/v2" else {})
            self.answer(body)

        def do_POST(self):  # noqa: N802 - /v2/repository/index: no model loading
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.answer("[]")

        def answer(self, body: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    (tmp_path / "models").mkdir()
    try:
        server = Tritonserver(tmp_path / "models", log=tmp_path / "triton.log", http_port=other.server_address[1])
        with pytest.raises(RuntimeError, match=r"tritonserver exited|is 'zoo', not Triton") as refused:
            server.wait_live(timeout=60)
    finally:
        other.shutdown()
    assert server.proc.poll() is not None  # stopped, not left running
    assert str(refused.value).count("\n") >= 1  # with its log's tail

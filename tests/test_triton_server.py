"""The export repository in a real NVIDIA Triton server (tritonserver 2.51 from the
nvidia-pytriton wheel, CPU; `make triton` lays it out, tools/tritonserver.py starts it).

One repository holds an artifact of every backend that runs on the CPU here:

- the Python-backend form (Triton's Python backend runs `1/model.py`, which serves the
  artifact through zoo's runner): the default for torch, torch-compile and torch-aoti, and
  asked for with `triton="python"` for ONNX Runtime and OpenVINO; a variable-length model
  (requests of different lengths in one batch), a model with a side input (Triton's
  `max_batch_size: 0`, unbatched), and one whose file was modified after export;
- the native form (`onnxruntime_onnx`; OpenVINO's only when asked), whose backend libraries this Triton
  build lacks: those models must fail for that reason alone, never for their configuration.

Every READY model answers over tritonclient HTTP and gRPC the same values, bit for bit, as
the artifact's own runner in this process, alone and when Triton's dynamic batcher merges
requests (a per-row scalar output comes back as [batch, 1], Triton's shape for
config.pbtxt's `dims: [1]` with `reshape: []`). A request the spec refuses fails alone,
as INVALID_ARGUMENT, even when merged with others; a configuration given at load time that
departs from the spec leaves the model UNAVAILABLE; tools/tritonserver.py stops the server
when it is terminated; `zoo predict --url` says that Triton does not advertise
domain-native inputs.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

import zoo
from zoo import registry
from zoo.triton import batched, triton_form

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from tritonserver import Tritonserver, unavailable_reason  # noqa: E402

tritonclient_http = pytest.importorskip("tritonclient.http")
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")

REASON = unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no Triton server: {REASON}")

VOCAB, WIDTH, CLASSES = 32, 8, 3


class Pooler(torch.nn.Module):
    """Token embeddings (batch, seq, width), mean-pooled logits (batch, classes) and a score
    per row (batch,): a per-row scalar, which Triton answers as [batch, 1]."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.head = torch.nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = self.embed(tokens)
        logits = self.head(hidden.mean(dim=1))
        return logits, hidden, logits.amax(dim=1)


class Calibrated(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(5, 3)

    def forward(self, x, temperature):
        return torch.softmax(self.linear(x) / temperature, dim=-1)


POOLER = zoo.ModelSpec(
    name="pooler.triton", domain="nlp", task="text-classification",
    inputs=(zoo.TensorSpec("tokens", "int64", ("batch", "seq"), value_range=(0, VOCAB - 1)),),
    outputs=(zoo.TensorSpec("logits", "float32", ("batch", CLASSES)),
             zoo.TensorSpec("hidden", "float32", ("batch", "seq", WIDTH)),
             zoo.TensorSpec("score", "float32", ("batch",))),
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

class Weighted(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)

    def forward(self, x, weight):
        return self.linear(x) * weight[:, None]


#: a per-row scalar input (spec shape ("batch",)): config.pbtxt's dims [1] with an empty
#: reshape, so Triton's clients send it as [batch, 1]
WEIGHTED = zoo.ModelSpec(
    name="weighted.triton", domain="tabular", task="regression",
    inputs=(zoo.TensorSpec("x", "float32", ("batch", 4)), zoo.TensorSpec("weight", "float32", ("batch",))),
    outputs=(zoo.TensorSpec("y", "float32", ("batch", 2)),),
    build=Weighted,
    sample=lambda batch, rng: {"x": rng.standard_normal((batch, 4)).astype(np.float32),
                               "weight": rng.uniform(0.5, 2.0, batch).astype(np.float32)},
    axes={"batch": zoo.AxisRange(1, 4, 16)})

class Centered(torch.nn.Module):
    """Each row centred on the batch's mean: a row's answer depends on the rows beside it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.linear(x - x.mean(0, keepdim=True))


#: rows that are not independent: exported with no batch axis for Triton (max_batch_size 0)
CENTERED = zoo.ModelSpec(
    name="centered.triton", domain="tabular", task="regression",
    inputs=(zoo.TensorSpec("x", "float32", ("batch", 4)),), outputs=(zoo.TensorSpec("y", "float32", ("batch", 3)),),
    build=Centered, sample=lambda batch, rng: {"x": rng.standard_normal((batch, 4)).astype(np.float32)},
    axes={"batch": zoo.AxisRange(1, 4, 16)})

CPU = sorted(name for name, backend in registry.backends().items() if backend.probe("cpu").ok)
#: Triton has a backend for the engine that serves its artifacts as verified: their default form
NATIVE = [name for name in CPU if triton_form(registry.get_backend(name).triton, None) == "native"]
RESNET = "resnet8.digits"


def exports() -> list[tuple[zoo.ModelSpec, str, str | None]]:
    """(spec, backend, triton form asked for) of every artifact in the repository."""
    tiny = zoo.get_model(RESNET).tiny()
    rows = [(tiny, b, None) for b in CPU]  # native where Triton has a backend, else python
    rows += [(POOLER, b, "python") for b in CPU if b not in ("torch-compile", "torch-aoti")]
    rows += [(SIDE, "torch", None), (WEIGHTED, "torch", None), (CENTERED, "torch", None)]
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
    """Every model of the repository loaded at start, with model control explicit, so that
    a test can load one again with a configuration given at load time."""
    root, _ = repository
    server = Tritonserver(root, models=["*"], log=tmp_path_factory.mktemp("triton") / "tritonserver.log")
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


def served_shape(art: zoo.Artifact, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape Triton answers for output `name` where the runner answers `shape`: the same,
    but for a per-row scalar (spec shape ("batch",)) of a batched model, which config.pbtxt
    gives as dims [1] with `reshape: { shape: [ ] }`, and Triton answers as [batch, 1]."""
    spec = art.spec()
    t = next(t for t in spec.outputs if t.name == name)
    return (*shape, 1) if t.shape == ("batch",) and batched(spec) else shape


def as_triton_takes_it(art: zoo.Artifact, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The inputs in the shapes Triton takes: a per-row scalar as [batch, 1] (dims [1])."""
    spec = art.spec()
    scalars = {t.name for t in spec.inputs if t.shape == ("batch",)} if batched(spec) else set()
    return {k: v.reshape(-1, 1) if k in scalars else v for k, v in inputs.items()}


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
                    got = infer(module, client, name, as_triton_takes_it(arts[name], inputs))
                    assert sorted(got) == sorted(expected), name
                    for key in expected:  # the same values bit for bit; a per-row scalar as [batch, 1]
                        assert got[key].shape == served_shape(arts[name], key, expected[key].shape), (name, key)
                        np.testing.assert_array_equal(got[key].reshape(expected[key].shape), expected[key],
                                                      err_msg=f"{name} {key}")
    finally:
        grpc.close()
        http.close()


def test_one_client_request_serves_a_per_row_scalar_input_on_triton_and_on_zoo_serve(triton, repository, tmp_path):
    """A client written for Triton sends a per-row scalar input as [batch, 1] (the model's
    config says dims [1]); zoo serve, on the same artifact, takes that request too, and the
    spec's own [batch]: every answer equals the runner's."""
    from serve_support import ServerProcess

    _, arts = repository
    name = f"{WEIGHTED.name}.torch.fp32"
    shutil.copytree(arts[name].path, tmp_path / "repo" / name)
    inputs = request(arts[name], 3, 4)
    expected = zoo.load(arts[name].path)(inputs)["y"]
    as_triton = as_triton_takes_it(arts[name], inputs)
    assert as_triton["weight"].shape == (3, 1)
    server = ServerProcess(tmp_path / "repo", log=tmp_path / "serve.log")
    try:
        server.wait_ready()
        for url, grpc_url, sent in ((triton.http_url, triton.grpc_url, [as_triton]),
                                    (server.url.removeprefix("http://"), server.grpc_url, [as_triton, inputs])):
            http = tritonclient_http.InferenceServerClient(url)
            grpc = tritonclient_grpc.InferenceServerClient(grpc_url)
            try:
                for x in sent:
                    for module, client in ((tritonclient_http, http), (tritonclient_grpc, grpc)):
                        np.testing.assert_array_equal(infer(module, client, name, x)["y"], expected,
                                                      err_msg=f"{url} {x['weight'].shape}")
            finally:
                grpc.close()
                http.close()
    finally:
        server.kill()


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
                    value = np.asarray(value)
                    assert got[key].shape == served_shape(art, key, value.shape), key
                    np.testing.assert_allclose(got[key].reshape(value.shape), value, rtol=tolerance.rtol,
                                               atol=tolerance.atol)
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


def test_a_model_whose_rows_depend_on_each_other_is_never_merged_by_triton(triton, repository):
    """Its export's config.pbtxt had `dynamic_batching`, so Triton merged concurrent requests
    and answered each with the other requests' rows in its mean. With no batch axis for
    Triton (`max_batch_size: 0`, as Triton loads it, auto-complete included), 16 concurrent
    2-row requests run as 16 executions, each answered as the artifact answers it alone."""
    _, arts = repository
    name = f"{CENTERED.name}.torch.fp32"
    runner = zoo.load(arts[name].path)
    http = tritonclient_http.InferenceServerClient(triton.http_url)
    grpc = tritonclient_grpc.InferenceServerClient(triton.grpc_url)
    try:
        config = http.get_model_config(name)
        assert config["max_batch_size"] == 0 and "dynamic_batching" not in config, config
        before = _counts(http, name)
        inputs = [request(arts[name], 2, 100 + i) for i in range(16)]
        barrier = threading.Barrier(len(inputs))

        def call(x):
            prepared = tensors(tritonclient_grpc, x)
            barrier.wait()
            return outputs(grpc.infer(name, prepared), ["y"])["y"]

        with ThreadPoolExecutor(len(inputs)) as pool:
            answers = list(pool.map(call, inputs))
        after = _counts(http, name)
    finally:
        grpc.close()
        http.close()
    for x, got in zip(inputs, answers):
        np.testing.assert_allclose(got, runner(x)["y"], rtol=1e-5, atol=1e-6)
    assert after[1] - before[1] == len(inputs)  # one execution per request: none merged


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


BAD_TOKEN = 300  # outside the pooler's vocabulary, 0 to VOCAB - 1


def _input_error(art: zoo.Artifact, inputs: dict[str, np.ndarray]) -> str:
    """The message zoo serve answers (400) for `inputs`: `check_arrays` on that request alone."""
    from zoo.errors import InputError
    from zoo.inputs import check_arrays

    with pytest.raises(InputError) as refused:
        check_arrays(inputs, art.spec(), art.name, art.spec().axes["batch"].max)
    return str(refused.value)


def test_a_bad_request_fails_alone_when_the_batcher_merges_it(triton, repository):
    """Rounds of 16 concurrent gRPC requests of 2 rows released together, one of which holds
    a token outside the vocabulary: that one alone fails, as INVALID_ARGUMENT, with zoo serve's
    message (its index within its own 2 rows, not the merged batch's); every other request,
    merged with it or not, answers its own rows."""
    from tritonclient.utils import InferenceServerException

    _, arts = repository
    model = f"{POOLER.name}.torch.fp32"
    art = arts[model]
    runner = zoo.load(art.path)
    names = [o.name for o in art.spec().outputs]
    http = tritonclient_http.InferenceServerClient(triton.http_url)
    grpc = tritonclient_grpc.InferenceServerClient(triton.grpc_url)
    sent = 0
    try:
        before = _counts(http, model)
        for round_ in range(3):
            inputs = [{"tokens": np.tile(request(art, 2, 100 + 16 * round_ + i)["tokens"], 8)[:, :8]}
                      for i in range(16)]
            bad = 5 + round_
            inputs[bad]["tokens"][1, 3] = BAD_TOKEN
            barrier = threading.Barrier(len(inputs))

            def call(x):
                prepared = tensors(tritonclient_grpc, x)
                barrier.wait()
                try:
                    return outputs(grpc.infer(model, prepared), names)
                except InferenceServerException as exc:
                    return exc

            with ThreadPoolExecutor(len(inputs)) as pool:
                answers = list(pool.map(call, inputs))
            sent += len(inputs)
            failed = {i: f"{a.status()} {a.message()}" for i, a in enumerate(answers)
                      if isinstance(a, InferenceServerException)}
            assert failed == {bad: f"StatusCode.INVALID_ARGUMENT {_input_error(art, inputs[bad])}"}, failed
            assert f"value {BAD_TOKEN} at index [1, 3]" in failed[bad]
            tol = art.spec().tolerance("fp32")  # a merged batch may round differently from one request's rows
            for i, (x, got) in enumerate(zip(inputs, answers)):
                if i != bad:
                    for key, value in runner(x).items():
                        np.testing.assert_allclose(got[key].reshape(np.shape(value)), value, atol=tol.atol,
                                                   rtol=tol.rtol)
        after = _counts(http, model)
    finally:
        grpc.close()
        http.close()
    executions = after[1] - before[1]
    assert executions < sent - 3, f"Triton's batcher merged nothing: {executions} executions for {sent} requests"


def test_input_errors_are_invalid_argument_as_in_zoo_serve(triton, repository):
    """A request the artifact's spec refuses (a token outside the vocabulary, a sequence
    longer than the exported range, which Triton's dims [-1] let through) is the caller's
    error: HTTP 400 and gRPC INVALID_ARGUMENT with zoo serve's message, not 500 / INTERNAL."""
    from tritonclient.utils import InferenceServerException

    _, arts = repository
    model = f"{POOLER.name}.torch.fp32"
    art = arts[model]
    out_of_vocabulary = request(art, 3, 11)
    out_of_vocabulary["tokens"][2, 1] = BAD_TOKEN
    too_long = {"tokens": np.zeros((1, art.spec().axes["seq"].max + 1), np.int64)}
    http = tritonclient_http.InferenceServerClient(triton.http_url)
    grpc = tritonclient_grpc.InferenceServerClient(triton.grpc_url)
    try:
        for inputs in (out_of_vocabulary, too_long):
            message = _input_error(art, inputs)
            for module, client, status in ((tritonclient_http, http, "400"),
                                           (tritonclient_grpc, grpc, "StatusCode.INVALID_ARGUMENT")):
                with pytest.raises(InferenceServerException) as refused:
                    client.infer(model, tensors(module, inputs))
                assert (refused.value.status(), refused.value.message()) == (status, message)
    finally:
        grpc.close()
        http.close()


def test_a_load_time_configuration_that_departs_from_the_spec_is_refused(triton, repository):
    """Model control `load_model(name, config=...)` with an output's data type changed, or a
    `max_batch_size` above the artifact's batch axis: the model does not load (no READY model
    answering zeros, or failing every large batch), and its reason names the difference.
    Loaded again without the override, it is READY."""
    import copy
    import json

    from tritonclient.utils import InferenceServerException

    _, arts = repository
    model = f"{POOLER.name}.openvino.fp32"
    if model not in arts:
        model = f"{POOLER.name}.onnxruntime.fp32"
    http = tritonclient_http.InferenceServerClient(triton.http_url)
    config = http.get_model_config(model)

    def int32_output(c):
        next(o for o in c["output"] if o["name"] == "hidden")["data_type"] = "TYPE_INT32"

    def larger_batches(c):
        c["max_batch_size"] = 64

    cases = [(int32_output, "output 'hidden' has data_type TYPE_INT32; the artifact's is TYPE_FP32"),
             (larger_batches, "max_batch_size is 64; the artifact takes batches of 1 to 16")]
    try:
        http.unload_model(model)  # a failed load would leave a loaded model serving as it was
        for change, reason in cases:
            bad = copy.deepcopy(config)
            change(bad)
            with pytest.raises(InferenceServerException, match="does not match the artifact's spec"):
                http.load_model(model, config=json.dumps(bad))
            entry = triton.index()[model]
            assert entry["state"] == "UNAVAILABLE" and reason in entry.get("reason", ""), entry
    finally:
        try:
            http.load_model(model)
            assert triton.index()[model]["state"] == "READY"
        finally:
            http.close()


def test_configuration_parameters_reach_the_engine_in_tritons_python_backend(triton, repository):
    """The `parameters` of the configuration Triton loads reach the artifact's engine, as
    `zoo serve` passes those of config.pbtxt (Triton's own ONNX Runtime backend documents
    `enable_mem_arena`): a value ONNX Runtime cannot read leaves the model UNAVAILABLE with
    the reason naming the key; with 0 the model is READY and answers as its own runner."""
    import json

    from tritonclient.utils import InferenceServerException

    _, arts = repository
    model = f"{POOLER.name}.onnxruntime.fp32"
    http = tritonclient_http.InferenceServerClient(triton.http_url)
    config = http.get_model_config(model)
    try:
        http.unload_model(model)
        bad = {**config, "parameters": {"enable_mem_arena": {"string_value": "maybe"}}}
        with pytest.raises(InferenceServerException, match="enable_mem_arena must be 1 or 0"):
            http.load_model(model, config=json.dumps(bad))
        assert triton.index()[model]["state"] == "UNAVAILABLE"
        http.load_model(model, config=json.dumps({**config, "parameters": {"enable_mem_arena": {"string_value": "0"}}}))
        assert triton.index()[model]["state"] == "READY"
        inputs = request(arts[model], 2, 5)
        expected = zoo.load(arts[model].path)(inputs)
        got = infer(tritonclient_http, http, model, inputs)
        for key, value in expected.items():
            np.testing.assert_array_equal(got[key].reshape(np.shape(value)), np.asarray(value), err_msg=key)
    finally:
        try:
            http.load_model(model)
            assert triton.index()[model]["state"] == "READY"
        finally:
            http.close()


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_the_script_stops_tritonserver_when_it_is_terminated(tmp_path, sig):
    """`python tools/tritonserver.py REPOSITORY` started tritonserver in a session of its own:
    a SIGTERM (a supervisor, a container stop) or SIGHUP (the terminal closed) to the script
    must stop it, as Ctrl-C does, not leave it (and its stubs) running."""
    import os
    import signal
    import subprocess

    from tritonserver import children, free_port

    (tmp_path / "models").mkdir()
    script = Path(__file__).resolve().parents[1] / "tools" / "tritonserver.py"
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "models"), "--http-port", str(free_port()),
                             "--grpc-port", str(free_port()), "--log", str(tmp_path / "triton.log")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started: list[int] = []
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("Triton serving"):
                break
        started = children(proc.pid)
        assert started, "".join(lines)
        proc.send_signal(getattr(signal, sig))
        code = proc.wait(60)
        time.sleep(0.5)
        left = [pid for pid in started if _running(pid)]
        assert not left, f"tritonserver still running after {sig} to the script: {left}"
        assert code == 0  # as after Ctrl-C
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in started:  # tritonserver leads its own process group: the group holds its stubs
            if _running(pid):
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_predict_url_says_triton_does_not_advertise_domain_native_inputs(triton, tmp_path):
    """`zoo predict --url` needs the model metadata's `zoo` block, which only zoo serve sends:
    against Triton it says so (not that the model "takes tensors inputs"), and its help does
    not offer Triton."""
    import subprocess

    import typer

    from zoo.cli import app

    predict = typer.main.get_command(app).commands["predict"]
    url_help = next(p.help for p in predict.params if p.name == "url")
    assert "(or Triton)" not in url_help and "Triton does not" in url_help
    image = tmp_path / "seven.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n")
    result = subprocess.run([sys.executable, "-m", "zoo", "predict", f"{RESNET}.torch.fp32", "--url",
                             f"http://{triton.http_url}", "--image", str(image)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout
    assert result.stderr.strip() == (
        f"error: server http://{triton.http_url} does not advertise domain-native inputs for model "
        f"{RESNET}.torch.fp32: zoo serve advertises them in its model metadata, Triton and other servers do "
        f"not; send the model's tensors instead (zoo.client.Client.infer, tritonclient)"), result.stderr


# ---------------------------------------------------------------- zoo serve beside Triton, on the same artifact


@pytest.fixture(scope="module")
def twin(repository, tmp_path_factory):
    """`zoo serve` (model control on) on a copy of one Python-backend artifact Triton serves,
    and its name: the same request goes to both servers."""
    from serve_support import ServerProcess

    _, arts = repository
    name = f"{RESNET}.torch.fp32"
    root = tmp_path_factory.mktemp("twin")
    shutil.copytree(arts[name].path, root / "repo" / name)
    server = ServerProcess(root / "repo", "--model-control", log=root / "serve.log")
    try:
        yield server.wait_ready(), name
    finally:
        server.kill()


def _prefix(message: str) -> str | None:
    """The `[request id: ID] ` an error message starts with, if any."""
    found = re.match(r"\[request id: [^\]]*\] ", message)
    return found and found.group(0)


def _refusals(module, client, name: str, request_id: str) -> dict[str, tuple[str, str | None]]:
    """(status, request-id prefix) of each refused request, by case."""
    def tensor(input_name: str, shape: tuple, datatype: str = "FP32"):
        item = module.InferInput(input_name, list(shape), datatype)
        item.set_data_from_numpy(np.zeros(shape, np.float64 if datatype == "FP64" else np.float32))
        return item

    good = (1, 1, 8, 8)
    cases = {"shape": (name, [tensor("image", (1, 1, 8, 9))], None),
             "datatype": (name, [tensor("image", good, "FP64")], None),
             "batch-over-maximum": (name, [tensor("image", (65, 1, 8, 8))], None),
             "extra-input": (name, [tensor("image", good), tensor("extra", good)], None),
             "unknown-input": (name, [tensor("pixels", good)], None),
             "unknown-output": (name, [tensor("image", good)], [module.InferRequestedOutput("probs")]),
             "unknown-model": ("no-such-model", [tensor("image", good)], None)}
    from tritonclient.utils import InferenceServerException

    answers = {}
    for case, (model, inputs, outputs) in cases.items():
        with pytest.raises(InferenceServerException) as refused:
            client.infer(model, inputs, outputs=outputs, request_id=request_id)
        answers[case] = (refused.value.status(), _prefix(refused.value.message()))
    return answers


def _streamed(client, name: str, request_id: str) -> list[str | None]:
    """The request-id prefix of a stream's error for a request of the wrong shape, and for an unknown model."""
    import queue

    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error))
    try:
        found = []
        for model in (name, "no-such-model"):
            item = tritonclient_grpc.InferInput("image", [1, 1, 8, 9], "FP32")
            item.set_data_from_numpy(np.zeros((1, 1, 8, 9), np.float32))
            client.async_stream_infer(model, [item], request_id=request_id)
            found.append(_prefix(answers.get(timeout=60).message()))
        return found
    finally:
        client.stop_stream()


def test_request_errors_name_the_request_where_triton_does(triton, twin):
    """tritonserver 2.51's core words its refusals of a request against the model's
    configuration (count, datatype, shape, batch size) `[request id: ID] ...`, `<id_unknown>`
    without an id, over HTTP, gRPC and streams; its front ends' refusals (an unknown model,
    input or output name) carry no id. zoo serve answers each with the same status and
    prefix (its own words after it)."""
    server, name = twin
    for request_id in ("t-1", ""):
        answers = {}
        for where, http_url, grpc_url in (("triton", triton.http_url, triton.grpc_url),
                                          ("zoo", server.url.removeprefix("http://"), server.grpc_url)):
            http = tritonclient_http.InferenceServerClient(http_url)
            grpc = tritonclient_grpc.InferenceServerClient(grpc_url)
            try:
                answers[where] = (_refusals(tritonclient_http, http, name, request_id),
                                  _refusals(tritonclient_grpc, grpc, name, request_id),
                                  _streamed(grpc, name, request_id))
            finally:
                grpc.close()
                http.close()
        assert answers["zoo"] == answers["triton"]
        assert answers["triton"][0]["shape"][1] == f"[request id: {request_id or '<id_unknown>'}] "


def test_repository_index_takes_the_bodies_triton_takes(triton, twin):
    """Any JSON document that is not an object, as an empty body and `{}`, asks for every
    model (200), as tritonserver 2.51 answers; `ready` filters. Where Triton answers 500 (a
    `ready` that is not a boolean, JSON that does not parse) zoo serve answers 400
    (docs/serving.md, Differences from Triton)."""
    import httpx

    server, name = twin
    for body in (b"", b"{}", b"[]", b"null", b"1", b'"x"', b"true", b'[{"ready": true}]', b'{"ready": true}',
                 b'{"ready": false}', b'{"other": 1}'):
        theirs = httpx.post(f"http://{triton.http_url}/v2/repository/index", content=body, timeout=30)
        ours = httpx.post(f"{server.url}/v2/repository/index", content=body, timeout=30)
        assert (ours.status_code, theirs.status_code) == (200, 200), (body, ours.text, theirs.text)
        assert ours.json() == [row for row in theirs.json() if row["name"] == name], body
    for body in (b'{"ready": "yes"}', b'{"ready": 1}', b"{"):
        theirs = httpx.post(f"http://{triton.http_url}/v2/repository/index", content=body, timeout=30)
        ours = httpx.post(f"{server.url}/v2/repository/index", content=body, timeout=30)
        assert (ours.status_code, theirs.status_code) == (400, 500), (body, ours.text, theirs.text)


def test_model_config_is_the_one_triton_fills_in(triton, twin):
    """GET .../config and gRPC ModelConfig of the same artifact: every field tritonserver 2.51
    writes, with the defaults it fills in (version_policy, instance group names, the preferred
    batch size, the model file, and over HTTP every unset field at its default), but for
    `optimization`: pinned memory is Triton's, not zoo serve's."""
    import httpx

    server, name = twin
    theirs = httpx.get(f"http://{triton.http_url}/v2/models/{name}/config", timeout=30).json()
    assert theirs.pop("optimization")["input_pinned_memory"] == {"enable": True}
    assert httpx.get(f"{server.url}/v2/models/{name}/config", timeout=30).json() == theirs
    configs = []
    for url in (triton.grpc_url, server.grpc_url):
        with tritonclient_grpc.InferenceServerClient(url) as client:
            configs.append(client.get_model_config(name, as_json=True)["config"])
            configs[-1].pop("optimization", None)
    assert configs[1] == configs[0]


def test_a_version_in_a_path_is_digits_as_in_triton(triton, twin):
    """Triton's HTTP routes take a version of digits only: any other is no endpoint (404);
    digits past std::stol's range are 400, `01` is version 1."""
    import httpx

    server, name = twin
    for version, status in (("abc", 404), ("-1", 404), ("1.5", 404), ("1abc", 404), ("%201", 404), ("01", 200),
                            ("9" * 30, 400)):
        for path in ("", "/config", "/stats"):
            theirs = httpx.get(f"http://{triton.http_url}/v2/models/{name}/versions/{version}{path}", timeout=30)
            ours = httpx.get(f"{server.url}/v2/models/{name}/versions/{version}{path}", timeout=30)
            assert (ours.status_code, theirs.status_code) == (status, status), (version, path, ours.text)

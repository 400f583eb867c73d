"""Artifacts carry their own proof (STYLE 12): one exported from a user's plugin file
loads, serves, benchmarks and verifies from its directory in a process that never loads
that plugin, against the test vectors stored inside it; what needs the plugin's code
says which plugin to load. A model registered from a notebook verifies after it is
unregistered; tampered, drifting or mismatched artifacts are refused.

The plugin file is written into a temporary directory; the CLI runs in subprocesses
(`python -m zoo`) with a clean plugin environment, so the model exists only where
`--plugin` names it. The notebook models run in this process with the torch backend.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import zoo
from zoo.artifact import Artifact
from zoo.errors import ArtifactError, PluginNotLoadedError, StaleArtifactError, ToleranceError
from zoo.fsutil import sha256_file

from cli_support import zoo_cli

PLUGIN = textwrap.dedent('''
    """A user's plugin file: a bag-of-tokens text classifier with a ragged "seq" axis."""
    import numpy as np
    import torch

    import zoo
    from zoo import AxisRange, Dataset, Metric, ModelSpec, TensorSpec

    VOCAB = 16


    class Bag(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, 4)
            self.head = torch.nn.Linear(4, 3)

        def forward(self, tokens, mask):
            pooled = (self.embed(tokens) * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)
            return self.head(pooled)


    def sample(batch, rng):
        seq = int(rng.integers(2, 7))
        return {"tokens": rng.integers(0, VOCAB, (batch, seq)), "mask": np.ones((batch, seq), np.float32)}


    def load(split):
        x = sample(24, np.random.default_rng(split == "test"))
        return x, np.random.default_rng(2).integers(0, 3, 24)


    def preprocess(items):
        ids = [[b % VOCAB for b in bytes(item)] or [0] for item in items]
        seq = max(map(len, ids))
        return {"tokens": np.array([i + [0] * (seq - len(i)) for i in ids], np.int64),
                "mask": np.array([[1.0] * len(i) + [0.0] * (seq - len(i)) for i in ids], np.float32)}


    def agreement(reference, runner, precision="fp32"):
        x = sample(4, np.random.default_rng(1))
        return {"agreement": float(np.mean(reference(x)["logits"].argmax(-1) == runner(x)["logits"].argmax(-1)))}


    @zoo.hookimpl
    def zoo_register_models(register):
        register(ModelSpec(
            name="bag.user", domain="nlp", task="text-classification",
            inputs=(TensorSpec("tokens", "int64", ("batch", "seq"), value_range=(0, VOCAB - 1)),
                    TensorSpec("mask", "float32", ("batch", "seq"), value_range=(0, 1))),
            outputs=(TensorSpec("logits", "float32", ("batch", 3)),),
            build=Bag, sample=sample, axes={"batch": AxisRange(1, 4, 16), "seq": AxisRange(1, 6, 12)},
            dataset=Dataset("generated", load),
            metric=Metric("accuracy", compute=lambda out, y: float(np.mean(out["logits"].argmax(-1) == y))),
            domain_check=agreement, raw_kind="text", preprocess=preprocess,
            postprocess=lambda out: [int(i) for i in out["logits"].argmax(-1)]))
''')
ARTIFACT = "bag.user.torch.fp32"



@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """bag.user exported through the CLI with `--plugin`; the plugin file stays where it was
    written, and no later process is told about it."""
    work = tmp_path_factory.mktemp("user")
    (work / "bag_plugin.py").write_text(PLUGIN)
    result = zoo_cli("--plugin", "bag_plugin.py", "export", "bag.user", "-b", "torch", "--random-init",
                     "-r", "exports", cwd=work)
    assert result.returncode == 0, result.stderr
    return work / "exports" / ARTIFACT


@pytest.fixture
def copy(exported, tmp_path) -> Path:
    """A private copy of the exported artifact, to tamper with."""
    return Path(shutil.copytree(exported, tmp_path / "exports" / ARTIFACT))


def rehash(artifact: Path, member: str) -> None:
    """Record a changed file's sha256 in the manifest, as someone who edits both would."""
    manifest = json.loads((artifact / "zoo.json").read_text())
    manifest["files"][member] = sha256_file(artifact / member)
    (artifact / "zoo.json").write_text(json.dumps(manifest))


def test_manifest_describes_the_model_and_lists_its_test_vectors(exported):
    m = json.loads((exported / "zoo.json").read_text())
    assert m["model"]["origin"] == {"file": "bag_plugin.py"} and m["model"]["raw_input"] == "text"
    assert m["model"]["tolerances"]["fp32"] == {"atol": 1e-4, "rtol": 1e-4, "metric_drop": None, "compare": None}
    sets = m["test_data"]["sets"]
    # smallest, typical and largest batch, the sequence axis at its own min/opt/max with it
    assert [s["axes"] for s in sets] == [{"batch": 1, "seq": 1}, {"batch": 4, "seq": 6}, {"batch": 16, "seq": 12}]
    for s in sets:
        assert m["files"][s["file"]] == sha256_file(exported / s["file"])
        tensors = load_file(str(exported / s["file"]))
        assert set(tensors) == {"input.tokens", "input.mask", "output.logits"}
        assert tensors["input.tokens"].dtype == torch.int64 and tuple(tensors["input.tokens"].shape) == (
            s["axes"]["batch"], s["axes"]["seq"])


def test_verify_without_the_plugin_uses_the_test_vectors_and_skips_what_needs_it(exported):
    result = zoo_cli("verify", str(exported), "--json", cwd=exported.parent.parent)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["reference"] == "test vectors" and report["parity"]["passed"]
    assert report["parity"]["sets"] == 3 and {c["set"] for c in report["parity"]["checks"]} == {
        f"test_data/set_{i}.safetensors" for i in range(3)}
    for check in ("metric", "domain"):  # skipped with what to load, never reported as passed
        assert set(report[check]) == {"skipped"}
        assert "bag_plugin.py" in report[check]["skipped"] and "--plugin" in report[check]["skipped"]


SCRIPT = textwrap.dedent('''
    """Everything but verify, in a process that never loads bag_plugin.py."""
    import json
    import sys
    from pathlib import Path

    import numpy as np
    from starlette.testclient import TestClient
    from typer.testing import CliRunner

    import zoo
    from zoo.bench.measure import measure_job
    from zoo.cli import app
    from zoo.serve.app import Settings, create_app

    path = Path(sys.argv[1])
    assert "bag.user" not in zoo.list_models()
    found = {}
    stored = zoo.Artifact.open(path).test_vectors()[1]
    found["load"] = zoo.load(path)(stored.inputs)["logits"].tolist()
    spec, fn, _ = zoo.predictor(artifact=path)
    x = spec.sample(5, np.random.default_rng(0))
    found["sample"] = {k: [v.dtype.name, list(v.shape), float(v.min()), float(v.max())] for k, v in x.items()}
    found["predictor"] = fn(x)["logits"].tolist()
    for name, call in {"build": spec.build, "predict": lambda: zoo.predict(spec, fn, ["hello"])}.items():
        try:
            call()
        except zoo.ZooError as exc:
            found[name] = f"{type(exc).__name__}: {exc}"
    cli = CliRunner().invoke(app, ["predict", "-", "--artifact", str(path), "--text", "hello"])
    found["cli_predict"] = str(cli.exception)
    rows = measure_job({"plugin_files": [], "threads": None, "path": str(path), "batch_sizes": [1, 16],
                        "lengths": [12], "warmup": 1, "min_time": 0.0, "min_iters": 2, "max_iters": 2})
    found["bench"] = [[r["batch"], r["lengths"]] for r in rows]
    with TestClient(create_app(Settings(path.parent))) as client:
        model = client.app.state.zoo.models[path.name]
        found["probe"] = {k: list(v.shape) for k, v in model._sample().items()}  # the health probe's inputs
        found["ready"] = client.get(f"/v2/models/{path.name}/ready").status_code
        body = {"inputs": [{"name": k, "datatype": "INT64" if k == "tokens" else "FP32", "shape": list(v.shape),
                            "data": v.flatten().tolist()} for k, v in x.items()]}
        answer = client.post(f"/v2/models/{path.name}/infer", json=body).json()
        found["served"] = np.reshape(answer["outputs"][0]["data"], answer["outputs"][0]["shape"]).tolist()
        found["metadata"] = client.get(f"/v2/models/{path.name}").json()["zoo"]
    print(json.dumps(found))
''')


def test_loads_predicts_benchmarks_and_serves_without_the_plugin(exported, tmp_path):
    (tmp_path / "standalone.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_DEBUG", "ZOO_PLUGINS")}
    result = subprocess.run([sys.executable, "standalone.py", str(exported)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    stored = Artifact.open(exported).test_vectors()[1]
    np.testing.assert_allclose(found["load"], stored.outputs["logits"], rtol=1e-4, atol=1e-5)
    # inputs drawn from the stored typical set: its sequence length, values inside the ranges
    assert found["sample"]["tokens"][:2] == ["int64", [5, 6]] and 0 <= found["sample"]["tokens"][2]
    assert found["sample"]["tokens"][3] <= 15 and found["sample"]["mask"] == ["float32", [5, 6], 1.0, 1.0]
    np.testing.assert_allclose(found["served"], found["predictor"], rtol=1e-5, atol=1e-6)
    for key in ("build", "predict", "cli_predict"):
        assert "bag_plugin.py" in found[key] and "--plugin" in found[key], found[key]
    assert found["build"].startswith("PluginNotLoadedError") and "PyTorch module" in found["build"]
    assert found["bench"] == [[1, {"seq": 12}], [16, {"seq": 12}]]
    assert found["probe"] == {"tokens": [1, 6], "mask": [1, 6]} and found["ready"] == 200
    assert found["metadata"]["model"] == "bag.user" and found["metadata"]["domain_native"] is None
    assert found["metadata"]["value_ranges"] == {"tokens": [0, 15], "mask": [0, 1]}


def test_tampered_test_vectors_are_refused_on_open(copy):
    data = bytearray((copy / "test_data" / "set_1.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (copy / "test_data" / "set_1.safetensors").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="test_data/set_1.safetensors does not match its sha256"):
        Artifact.open(copy)


def test_test_vectors_outside_the_hashed_files_are_refused(copy):
    manifest = json.loads((copy / "zoo.json").read_text())
    manifest["test_data"]["sets"][0]["file"] = "weights-unlisted.safetensors"
    (copy / "zoo.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="not among its hashed files"):
        Artifact.open(copy)


def test_an_artifact_without_test_vectors_synthesizes_inputs_and_cannot_verify_alone(copy):
    manifest = json.loads((copy / "zoo.json").read_text())
    for s in manifest.pop("test_data")["sets"]:  # as an artifact exported before they existed
        del manifest["files"][s["file"]]
    shutil.rmtree(copy / "test_data")
    (copy / "zoo.json").write_text(json.dumps(manifest))
    spec = Artifact.open(copy).spec()
    x = spec.sample(3, np.random.default_rng(0))
    assert x["tokens"].dtype == np.int64 and x["tokens"].shape == (3, 6) and 0 <= x["tokens"].min()
    assert x["tokens"].max() <= 15 and x["mask"].dtype == np.float32 and 0 <= x["mask"].min() <= x["mask"].max() <= 1
    assert zoo.load(copy)(x)["logits"].shape == (3, 3)
    with pytest.raises(PluginNotLoadedError, match="bag_plugin.py.*predates test vectors"):
        zoo.verify(copy)


# ---------------------------------------------------------------- a notebook's model


class Mlp(torch.nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))

    def forward(self, x):
        return self.net(x)


NOTEBOOK = zoo.ModelSpec(
    name="mlp.notebook", domain="tabular", task="regression",
    inputs=(zoo.TensorSpec("x", "float32", ("batch", 4)),), outputs=(zoo.TensorSpec("y", "float32", ("batch", 2)),),
    build=Mlp, sample=lambda batch, rng: {"x": rng.standard_normal((batch, 4)).astype(np.float32)},
    axes={"batch": zoo.AxisRange(1, 4, 8)})


@pytest.fixture(scope="module")
def notebook(tmp_path_factory) -> tuple[Path, Path]:
    """mlp.notebook registered with zoo.register, exported, unregistered; and the same
    model exported from other weights, whose model file stands in for a drifting runner."""
    repository = tmp_path_factory.mktemp("notebook")
    zoo.register(NOTEBOOK)
    try:
        art = zoo.export("mlp.notebook", "torch", repository=repository / "a", random_init=True)
        other = zoo.Checkpoint(NOTEBOOK.name, {}, Mlp(seed=1).state_dict())
        drifted = zoo.export("mlp.notebook", "torch", repository=repository / "b", checkpoint=other)
    finally:
        zoo.unregister("mlp.notebook")
    return art.path, drifted.path


def test_a_notebook_model_verifies_after_it_is_unregistered(notebook):
    path, _ = notebook
    assert "mlp.notebook" not in zoo.list_models()
    report = zoo.verify(path)
    assert report["reference"] == "test vectors" and report["parity"]["passed"]
    assert "metric" not in report and "domain" not in report  # the model has neither: nothing skipped
    with pytest.raises(PluginNotLoadedError, match="registered with zoo.register.*register it again"):
        Artifact.open(path).spec().build()


def test_a_spec_that_no_plugin_registered_exports_and_verifies_from_its_manifest(repository):
    spec = replace(NOTEBOOK, name="mlp.unregistered")
    art = zoo.export(spec, "torch", repository=repository, random_init=True)
    assert art.manifest["model"]["plugin"] == "" and art.manifest["model"]["origin"] == {}
    assert zoo.verify(art.path)["reference"] == "test vectors"
    with pytest.raises(PluginNotLoadedError, match="no plugin registered"):
        Artifact.open(art.path).spec().build()


def test_a_runner_that_drifts_is_caught_by_the_test_vectors(notebook, tmp_path):
    path, drifted = notebook
    path = Path(shutil.copytree(path, tmp_path / path.name))
    shutil.copy(drifted / "1" / "model.pt2", path / "1" / "model.pt2")  # a valid model, other weights
    rehash(path, "1/model.pt2")
    with pytest.raises(ToleranceError, match=r"test vectors test_data/set_0\.safetensors: .*output y"):
        zoo.verify(path)


def test_with_the_plugin_the_stored_test_vectors_must_reproduce_too(notebook, tmp_path):
    path = Path(shutil.copytree(notebook[0], tmp_path / notebook[0].name))
    member = "test_data/set_2.safetensors"
    tensors = load_file(str(path / member))
    tensors["output.y"] = tensors["output.y"] + 0.5  # the vectors no longer match the weights
    save_file(tensors, str(path / member))
    rehash(path, member)
    zoo.register(NOTEBOOK)
    try:
        with pytest.raises(ToleranceError, match=r"test vectors test_data/set_2\.safetensors"):
            zoo.verify(path)  # parity with the reference rebuilt from the weights alone would pass
    finally:
        zoo.unregister("mlp.notebook")


class Rescaled(Mlp):
    """The same parameters and signature, another forward: the plugin was edited."""

    def forward(self, x):
        return self.net(x) * 1.5


def test_with_the_plugin_a_forward_changed_since_the_export_is_named_not_blamed_on_the_artifact(notebook):
    """Parity against the rebuilt module said only "differs from PyTorch fp32 by up to
    ...": the artifact, which still reproduces its test vectors, looked broken."""
    zoo.register(replace(NOTEBOOK, build=Rescaled))
    try:
        with pytest.raises(StaleArtifactError, match=r"artifact mlp\.notebook\.torch\.fp32: mlp\.notebook as plugin "
                                                     r".* registers it now computes something else than when it was "
                                                     r"exported \(mlp\.notebook \[fp32\]: output y .*\), while the "
                                                     r"artifact still reproduces its test vectors: the model's forward "
                                                     r"changed since the export\. Re-export it"):
            zoo.verify(notebook[0])
    finally:
        zoo.unregister("mlp.notebook")
    assert zoo.verify(notebook[0])["reference"] == "test vectors"  # without it: as exported


def test_a_registered_model_with_another_signature_is_refused(notebook):
    changed = replace(NOTEBOOK, outputs=(zoo.TensorSpec("y", "float32", ("batch", 3)),))
    zoo.register(changed)
    try:
        with pytest.raises(StaleArtifactError, match=r"another version of model mlp.notebook: its outputs "
                                                     r"\[y:float32\[batch,2\]\] differ from \[y:float32\[batch,3\]\]"):
            zoo.load(notebook[0])
    finally:
        zoo.unregister("mlp.notebook")


def test_test_vectors_keep_every_numeric_dtype_and_stay_small(tmp_path):
    from zoo.vectors import SET_BYTES, read, record

    dtypes = ("bool", "int8", "int32", "float16", "bfloat16")
    spec = zoo.ModelSpec(
        name="dtypes.test", domain="test", task="test",
        inputs=tuple(zoo.TensorSpec(d, d, ("batch", 2)) for d in dtypes),
        outputs=(zoo.TensorSpec("wide", "float32", ("batch", 65536)),),  # 256 KiB a row
        build=lambda: None, axes={"batch": zoo.AxisRange(1, 2, 64)},
        sample=lambda batch, rng: {d: torch.ones(batch, 2, dtype=getattr(torch, d)).numpy() if d != "bfloat16"
                                   else np.full((batch, 2), 1.5, np.float32) for d in dtypes})
    ran = []

    def reference(x):
        ran.append(len(x["bool"]))
        return {"wide": np.ones((len(x["bool"]), 65536), np.float32)}

    sets, entry = record(spec, reference, tmp_path)
    assert [s["axes"]["batch"] for s in entry["sets"]] == [1, 2, 7]  # 64 rows would be 16 MiB
    assert ran == [1, 2, 7]  # sized from the signature: the reference never ran at 64
    assert entry["notes"] == ["the max set is recorded at batch 7, not 64: it would exceed 2 MiB"]
    assert all((tmp_path / s["file"]).stat().st_size <= SET_BYTES for s in entry["sets"])
    stored = load_file(str(tmp_path / entry["sets"][0]["file"]))
    assert {k: str(v.dtype) for k, v in stored.items() if k.startswith("input.")} == {
        f"input.{d}": f"torch.{d}" for d in dtypes}
    manifest = {"signature": {"inputs": [t.to_json() for t in spec.inputs],
                              "outputs": [t.to_json() for t in spec.outputs]}, "test_data": entry}
    back = read(Artifact(tmp_path, manifest))
    assert back[0].inputs["bfloat16"].tolist() == [[1.5, 1.5]] and back[0].inputs["bool"].dtype == np.bool_
    assert back[2].outputs["wide"].shape == (7, 65536)

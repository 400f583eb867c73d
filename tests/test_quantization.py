"""int8: calibration from the training split, export through every backend that offers
int8 on the CPU, the task-metric change reported and gated, and the refusals.

The refusal is planted honestly: a model whose test targets are its own fp32 outputs,
so PyTorch fp32 scores a perfect 0 error and any int8 rounding makes it worse; a tight
`metric_drop` then must refuse the artifact. Nothing in onnxruntime is mocked.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch

import zoo
from zoo import AxisRange, Dataset, Metric, ModelSpec, TensorSpec, Tolerance
from zoo.calibration import DEFAULT_SAMPLES, calibration_batches, calibration_rows
from zoo.check import check
from zoo.errors import ExportError, ToleranceError, UnsupportedError, ZooError
from zoo.registry import backends
from zoo.spec import _default_tolerances

INT8_MODELS = [name for name in zoo.list_models() if "int8" in zoo.get_model(name).tolerances]
INT8_BACKENDS = [name for name, be in backends().items()
                 if "int8" in be.precisions.get("cpu", ()) and be.probe("cpu").ok]


def test_every_model_states_int8_with_a_method_and_a_gate():
    """int8 is offered with a method; with a task metric, its drop is bounded."""
    assert {"resnet8.digits", "mobilenetv2.digits", "minilm-l6.all-v2", "mpnn.freesolv", "ppo.cartpole",
            "gpt.pydoc"} <= set(INT8_MODELS)
    for name in INT8_MODELS:
        spec = zoo.get_model(name)
        assert spec.quantization in ("static", "dynamic"), name
        gated = spec.tolerances["int8"].metric_drop is not None or spec.domain_check is not None
        assert gated or spec.metric is None, f"{name} has a metric but no int8 gate"


# -- calibration ------------------------------------------------------------------------

def test_calibration_draws_a_seeded_subset_of_the_training_split():
    spec = zoo.get_model("resnet8.digits").tiny()
    batches = calibration_batches(spec, samples=40, batch_size=16)
    assert [len(b["image"]) for b in batches] == [16, 16, 8]
    assert all(b["image"].dtype == np.float32 and b["image"].flags.c_contiguous for b in batches)
    again = calibration_batches(spec, samples=40, batch_size=16)
    assert all(np.array_equal(a["image"], b["image"]) for a, b in zip(batches, again))
    other = calibration_batches(spec, samples=40, batch_size=16, seed=1)
    assert not np.array_equal(batches[0]["image"], other[0]["image"])

    rows = lambda images: {x.tobytes() for x in images}  # noqa: E731
    train, test = spec.dataset.load("train")[0]["image"], spec.dataset.load("test")[0]["image"]
    drawn = rows(np.concatenate([b["image"] for b in batches]))
    assert len(drawn) == 40 and drawn <= rows(train) and not drawn & (rows(test) - rows(train))


def test_calibration_is_capped_by_the_split_and_the_batch_range():
    spec = zoo.get_model("resnet8.digits").tiny()
    available = len(spec.dataset.load("train")[1])
    batches = calibration_batches(spec, samples=10 * available, batch_size=10_000)
    assert max(len(b["image"]) for b in batches) == spec.axes["batch"].max
    assert sum(len(b["image"]) for b in batches) == available
    with pytest.raises(ZooError, match="at least one sample"):
        calibration_batches(spec, samples=0)


@pytest.mark.parametrize("spoil, message", [
    (lambda x: x * 16.0, r"input 'image' has value .* at index .*; it takes values from 0 to 1"),  # unscaled
    (lambda x: np.where(np.arange(len(x))[:, None, None, None] == 3, np.nan, x),
     r"input 'image' has non-finite values \(NaN or infinity\) in 1 row \(3\): clean the dataset"),
    (lambda x: x[:0], r"it holds no examples, and a run is trained and int8 calibrated on it"),
], ids=["out-of-range", "nan", "empty"])
def test_calibration_data_is_checked_as_training_checks_it(spoil, message):
    """Calibrated on as it came: an unscaled split made an OpenVINO int8 artifact without a
    word, and an empty one failed in the quantizer's words ("No data is collected")."""
    spec = zoo.get_model("resnet8.digits").tiny()
    ranged = replace(spec.inputs[0], value_range=(0.0, 1.0))

    def load(split):
        x, y = spec.dataset.load(split)
        image = spoil(x["image"]) if split == "train" else x["image"]
        return {"image": image}, y[:len(image)]

    unranged = replace(spec.inputs[0], value_range=None)  # a NaN is then found as non-finite, not out of range
    spoiled = replace(spec, inputs=(ranged,) if "takes values" in message else (unranged,),
                      dataset=replace(spec.dataset, load=load))
    with pytest.raises(ZooError, match=rf"^{spec.name}: dataset 'train': {message}$"):
        calibration_batches(spoiled, samples=40)


def test_calibration_without_a_dataset_uses_the_plugins_samples():
    spec = zoo.get_model("resnet18").tiny()
    assert spec.dataset is None
    batches = calibration_batches(spec, samples=5, batch_size=2)
    assert [b["image"].shape for b in batches] == [(2, 3, 32, 32), (2, 3, 32, 32), (1, 3, 32, 32)]
    assert np.array_equal(batches[0]["image"], calibration_batches(spec, samples=5, batch_size=2)[0]["image"])
    # the same rows whatever the batch (ONNX Runtime calibrates in typical batches, OpenVINO one by one)
    one_by_one = calibration_batches(spec, samples=5, batch_size=1)
    assert np.array_equal(np.concatenate([b["image"] for b in batches]), np.concatenate([b["image"] for b in one_by_one]))


# -- export through the registry --------------------------------------------------------

@pytest.mark.parametrize("backend", INT8_BACKENDS)
@pytest.mark.parametrize("name", INT8_MODELS)
def test_int8_export_is_gated_and_verifies(name, backend, repository):
    spec = zoo.get_model(name).tiny()
    art = zoo.export(spec, backend, precision="int8", repository=repository, random_init=True)
    m = art.manifest
    assert art.path.name == f"{name}.{backend}.int8" and m["precision"] == "int8"
    assert m["quantization"] == spec.quantization
    assert m["parity"]["tolerance"] == spec.tolerances["int8"].to_json()
    if spec.metric is not None:  # the change against fp32 is reported with the bound it met
        assert m["metric"]["delta"] == pytest.approx(m["metric"]["artifact"] - m["metric"]["reference"])
        if spec.tolerances["int8"].metric_drop is not None:
            assert m["metric"]["allowed_drop"] == spec.tolerances["int8"].metric_drop and m["metric"]["passed"]
    report = zoo.verify(art.path)
    assert report["precision"] == "int8" and report["parity"]["passed"]
    recorded = m["backend"]["info"]["quantization"].get("calibration_samples")
    if recorded is not None:  # what was calibrated on, also where the split is smaller (tiny centernet: 64)
        assert recorded == calibration_rows(spec) == min(DEFAULT_SAMPLES, len(spec.dataset.load("train")[1])
                                                         if spec.dataset else DEFAULT_SAMPLES)


# -- one artifact per int8 method -------------------------------------------------------

NAMES = {"static": "resnet8.digits.onnxruntime.int8", "dynamic": "resnet8.digits.onnxruntime.int8-dynamic"}


@pytest.fixture(scope="module")
def both_methods(tmp_path_factory):
    """Tiny resnet8.digits (its own method: static) exported with each int8 method into
    one repository, static first, as a user overriding the method would."""
    repository = tmp_path_factory.mktemp("both") / "exports"
    spec = zoo.get_model("resnet8.digits").tiny()
    arts = {m: zoo.export(spec, "onnxruntime", "int8", repository=repository, random_init=True, quantization=m)
            for m in ("static", "dynamic")}
    return spec, repository, arts


@pytest.fixture
def builds(monkeypatch):
    """The int8 methods the onnxruntime backend is asked to build, in order: an export
    that reuses its artifact builds nothing."""
    backend = type(zoo.get_backend("onnxruntime"))
    built, export = [], backend.export

    def counting(self, module, spec, *args, **kwargs):
        built.append(spec.quantization)
        return export(self, module, spec, *args, **kwargs)

    monkeypatch.setattr(backend, "export", counting)
    return built


def test_each_int8_method_is_an_artifact_of_its_own_that_records_it(both_methods):
    """The model's own method keeps `...int8`, the other is `...int8-dynamic`: the
    dynamic export did not replace the static artifact."""
    _, repository, arts = both_methods
    assert sorted(p.name for p in repository.iterdir()) == sorted(NAMES.values())
    for method, art in arts.items():
        opened = zoo.Artifact.open(repository / NAMES[method])
        assert opened.manifest == art.manifest and art.manifest["name"] == NAMES[method]
        assert art.manifest["quantization"] == art.manifest["backend"]["info"]["quantization"]["method"] == method
        assert f'name: "{NAMES[method]}"' in (art.path / "config.pbtxt").read_text()  # Triton's name is the directory's
        vectors = {s["file"] for s in art.manifest["test_data"]["sets"]}
        labels = {f"labels.{t.name}.txt" for t in art.spec().outputs if t.labels}  # for Triton's classification
        assert set(art.manifest["files"]) == {"1/model.onnx", "config.pbtxt", "weights.safetensors"} | vectors | labels

    static = arts["static"].manifest["backend"]["info"]["quantization"]
    assert static["format"] == "QDQ" and static["per_channel"]
    assert static["calibration_samples"] > 0 and static["quantized_ops"]["QuantizeLinear"] > 0
    dynamic = arts["dynamic"].manifest["backend"]["info"]["quantization"]
    assert dynamic["op_types"] == ["MatMul"]
    assert "MatMulInteger" in dynamic["quantized_ops"] and "QuantizeLinear" not in dynamic["quantized_ops"]


def test_re_exporting_either_method_reuses_its_artifact(both_methods, builds):
    spec, repository, arts = both_methods
    for method in ("static", "dynamic"):
        again = zoo.export(spec, "onnxruntime", "int8", repository=repository, random_init=True, quantization=method)
        assert again.path == arts[method].path and again.manifest == arts[method].manifest
    plain = zoo.export(spec, "onnxruntime", "int8", repository=repository, random_init=True)
    assert plain.path == arts["static"].path  # no override: the model's own method
    assert builds == []


def test_an_artifact_recording_the_other_method_is_rebuilt(both_methods, repository, monkeypatch):
    """Reuse compares the method in the manifest, not only the name (an artifact written
    by a zoo that named both methods alike holds either)."""
    spec, _, arts = both_methods
    shutil.copytree(arts["static"].path, repository / NAMES["static"])
    manifest = repository / NAMES["static"] / "zoo.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "quantization": "dynamic"}))

    class Rebuilding(Exception):
        pass

    def rebuild(self, module, spec, *args, **kwargs):  # stop at the build: its start is the answer
        raise Rebuilding(spec.quantization)

    monkeypatch.setattr(type(zoo.get_backend("onnxruntime")), "export", rebuild)
    with pytest.raises(ExportError, match="failed to export resnet8.digits .*: Rebuilding: static$") as raised:
        zoo.export(spec, "onnxruntime", "int8", repository=repository, random_init=True)
    assert isinstance(raised.value.__cause__, Rebuilding)


def test_a_model_whose_method_is_dynamic_gets_int8_static_for_the_override(repository):
    spec = replace(zoo.get_model("resnet8.digits").tiny(), quantization="dynamic")
    art = zoo.export(spec, "onnxruntime", "int8", repository=repository, random_init=True, quantization="static")
    assert art.path.name == "resnet8.digits.onnxruntime.int8-static" and art.manifest["quantization"] == "static"


def test_bench_measures_the_models_own_method_and_leaves_the_other_alone(both_methods):
    """`zoo bench` asks for the model's own int8 method: it reuses `...int8`, neither
    measures nor rebuilds `...int8-dynamic`, and every int8 row (holes too) names its method."""
    from zoo.bench.report import markdown

    spec, repository, arts = both_methods
    report = zoo.benchmark(spec, ["torch", "onnxruntime"], [1], precision="int8", repository=repository,
                           random_init=True, warmup=1, min_time=0.01, min_iters=2)
    hole, row = report["results"]
    assert (hole["status"], hole["quantization"]) == ("unsupported", "static")
    assert row["status"] == "ok", row
    assert (row["quantization"], row["artifact"]) == ("static", NAMES["static"])
    for art in arts.values():  # the static one reused, the dynamic one untouched
        assert zoo.Artifact.open(art.path).manifest == art.manifest
    text = markdown(report)
    assert "| onnxruntime | int8 (static) |" in text and "- torch int8 (static) cpu: **unsupported**" in text


# -- the metric gate, planted -----------------------------------------------------------

class Conv(torch.nn.Module):
    """A small CNN whose int8 rounding certainly changes its outputs."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(),
                                        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(),
                                        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 3))

    def forward(self, image):
        return self.body(image)


def _images(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 1, 8, 8)).astype(np.float32)


def _own_outputs(split: str):
    """Inputs, and as targets what the seed-0 weights say about them in fp32."""
    images = _images(64, seed=0 if split == "train" else 1)
    torch.manual_seed(0)
    with torch.no_grad():
        targets = Conv().eval()(torch.from_numpy(images)).numpy()
    return {"image": images}, targets


def _mse(outputs, targets) -> float:
    return float(np.mean((outputs["logits"].astype(np.float64) - targets) ** 2))


def _spec(metric_drop: float, higher_is_better: bool = False) -> ModelSpec:
    compute = _mse if not higher_is_better else (lambda o, t: -_mse(o, t))
    return ModelSpec(
        name="selfmatch.test", domain="test", task="regression",
        inputs=(TensorSpec("image", "float32", ("batch", 1, 8, 8)),),
        outputs=(TensorSpec("logits", "float32", ("batch", 3)),),
        axes={"batch": AxisRange(1, 4, 16)}, build=Conv,
        sample=lambda batch, rng: {"image": rng.standard_normal((batch, 1, 8, 8)).astype(np.float32)},
        dataset=Dataset("its own fp32 outputs", _own_outputs),
        metric=Metric("mse" if not higher_is_better else "negative_mse", compute, higher_is_better=higher_is_better),
        tolerances={**_default_tolerances(), "int8": Tolerance(1.0, 0.1, metric_drop=metric_drop)},
        quantization="static")


@pytest.mark.parametrize("higher_is_better", [False, True], ids=["lower-is-better", "higher-is-better"])
def test_a_metric_drop_beyond_the_tolerance_is_refused_and_leaves_nothing(repository, higher_is_better):
    with pytest.raises(ToleranceError, match=r"PyTorch fp32's .*allows at most 1e-12 at int8"):
        zoo.export(_spec(1e-12, higher_is_better), "onnxruntime", precision="int8", repository=repository,
                   random_init=True)
    assert not repository.exists() or list(repository.iterdir()) == []


def test_the_metric_change_is_reported_when_within_the_tolerance(repository):
    art = zoo.export(_spec(1.0), "onnxruntime", precision="int8", repository=repository, random_init=True)
    m = art.manifest["metric"]
    assert m["reference"] == pytest.approx(0, abs=1e-10) and m["artifact"] > 0
    assert m["delta"] == m["artifact"] - m["reference"] and m["allowed_drop"] == 1.0


def test_cli_export_prints_the_change_against_fp32_and_refuses_with_a_reason(tmp_path):
    from typer.testing import CliRunner

    from zoo.cli import app

    args = ["export", "resnet8.digits", "-b", "onnxruntime", "--precision", "int8", "--random-init",
            "-r", str(tmp_path / "repo"), "--quantization", "static"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "(static int8)" in result.output and "PyTorch fp32" in result.output
    assert "allowed worsening 0.01" in result.output
    manifest = json.loads((tmp_path / "repo" / "resnet8.digits.onnxruntime.int8" / "zoo.json").read_text())
    assert manifest["metric"]["allowed_drop"] == 0.01

    refused = CliRunner().invoke(app, ["export", "mobilenetv2", "-b", "onnxruntime", "--precision", "int8",
                                       "--random-init", "-r", str(tmp_path / "repo")])
    assert refused.exit_code != 0 and "no tolerance for precision int8" in str(refused.exception)
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == ["resnet8.digits.onnxruntime.int8"]


# -- domain checks learn the precision --------------------------------------------------

def test_the_domain_check_is_told_the_precision(repository):
    seen = []

    def check(reference, runner, precision="fp32"):
        seen.append(precision)
        return {"precision": precision}

    spec = replace(_spec(1.0), domain_check=check)
    art = zoo.export(spec, "onnxruntime", precision="int8", repository=repository, random_init=True)
    assert seen == ["int8"] and art.manifest["domain"] == {"precision": "int8"}


@pytest.mark.parametrize("name", ["ppo.cartpole", "minilm-l6.all-v2"])
def test_int8_domain_thresholds_still_refuse_a_wrong_runner(name):
    from zoo.train import module_fn

    spec = zoo.get_model(name).tiny()
    torch.manual_seed(0)
    reference = module_fn(spec.build().eval(), spec, "cpu")
    key = spec.outputs[0].name

    def noisy(inputs):
        out = {k: np.asarray(v).copy() for k, v in reference(inputs).items()}
        out[key] += 10 * np.random.default_rng(0).standard_normal(out[key].shape).astype(np.float32)
        return out

    assert spec.domain_check(reference, reference, precision="int8")
    with pytest.raises(ToleranceError, match="int8" if name == "ppo.cartpole" else "below 0.99"):
        spec.domain_check(reference, noisy, precision="int8")


def test_int8_domain_thresholds_are_the_looser_ones():
    from zoo_nlp.minilm import MIN_COSINE
    from zoo_rl.domain import thresholds

    assert MIN_COSINE["int8"] < MIN_COSINE["fp32"]
    assert all(thresholds("int8")[k] < thresholds("fp32")[k] for k in ("min_agreement",))
    assert all(thresholds("int8")[k] > thresholds("fp32")[k] for k in ("action_tolerance", "return_rtol"))


# -- bad requests -----------------------------------------------------------------------

def test_int8_on_a_model_without_an_int8_tolerance_says_why(repository):
    # a quantization method without the int8 tolerance it is for (a spec narrowed to other
    # precisions is one): the export says what to add
    named = replace(_spec(1.0), tolerances=_default_tolerances())
    with pytest.raises(UnsupportedError, match=r"no tolerance for precision int8.*measured what quantization costs.* "
                                               r"\(it names quantization 'static' and no int8 tolerance: add "
                                               r"tolerances=\{..., 'int8': zoo.Tolerance\(atol, rtol, metric_drop="):
        zoo.export(named, "onnxruntime", precision="int8", repository=repository, random_init=True)
    spec = replace(_spec(1.0), tolerances=_default_tolerances(), quantization=None)
    with pytest.raises(UnsupportedError, match="no tolerance for precision int8.*measured what quantization costs"):
        zoo.export(spec, "onnxruntime", precision="int8", repository=repository, random_init=True,
                   quantization="dynamic")  # the method given for an export of a model without int8
    with pytest.raises(UnsupportedError, match="no tolerance for precision int8.*measured what quantization costs"):
        zoo.export(spec, "onnxruntime", precision="int8", repository=repository, random_init=True)


def test_int8_where_the_backend_lacks_it(repository):
    with pytest.raises(UnsupportedError, match="does not support int8 on cuda"):
        zoo.export(_spec(1.0), "onnxruntime", precision="int8", device="cuda", repository=repository, random_init=True)


@pytest.mark.parametrize("precision, method, message", [
    ("fp32", "static", "applies to int8 exports, not fp32"),
    ("int8", "float", "unknown quantization 'float'"),
])
def test_bad_quantization_requests(repository, precision, method, message):
    with pytest.raises(UnsupportedError, match=message):
        zoo.export(_spec(1.0), "onnxruntime", precision=precision, repository=repository, random_init=True,
                   quantization=method)


def test_a_method_that_quantizes_nothing_is_an_error(repository):
    """Dynamic quantization covers MatMul only: a pure conv net would come out fp32."""
    only_conv = ModelSpec(**{**_fields(_spec(1.0)), "outputs": (TensorSpec("logits", "float32", ("batch", 8, 8, 8)),),
                             "build": lambda: torch.nn.Conv2d(1, 8, 3, padding=1), "dataset": None, "metric": None})
    with pytest.raises(ExportError, match="without a single int8 op.*--quantization static"):
        zoo.export(only_conv, "onnxruntime", precision="int8", repository=repository, random_init=True,
                   quantization="dynamic")


def test_spec_contracts_for_int8():
    with pytest.raises(ZooError, match="int8 tolerance but no `quantization`"):
        replace(_spec(1.0), quantization=None)
    with pytest.raises(ZooError, match="quantization 'fp8' is not one of"):
        replace(_spec(1.0), quantization="fp8")
    with pytest.raises(ZooError, match="compares outputs \\['boxes'\\]"):
        replace(_spec(1.0), tolerances={"int8": Tolerance(1.0, compare=("boxes",))})
    with pytest.raises(ZooError, match="cannot be negative"):
        Tolerance(1.0, metric_drop=-0.1)
    # was exported, ungated, without a word (a spec rebuilt from a manifest has no metric: not refused there)
    unmeasured = replace(_spec(0.5), metric=None)
    assert check(unmeasured, unmeasured.build()).warnings == [
        "selfmatch.test: its int8 tolerance bounds the task metric's drop (metric_drop=0.5), and it has no `metric` "
        "to measure it: the bound is not applied (give it a metric and a dataset, or leave metric_drop out)"]
    # an artifact's manifest holds them: an infinite one was written, and every artifact then refused
    for fields, name in (({"metric_drop": float("inf")}, "metric_drop"), ({"atol": float("nan")}, "atol"),
                         ({"rtol": "0.1"}, "rtol"), ({"atol": True}, "atol")):
        with pytest.raises(ZooError, match=rf"^Tolerance\(.*\): {name} must be a finite number \(a bound; "
                                           rf"metric_drop=None leaves the metric ungated\)$"):
            Tolerance(**{"atol": 1.0, **fields})
    assert _spec(0.5).to_json()["tolerances"]["int8"] == {"atol": 1.0, "rtol": 0.1, "metric_drop": 0.5,
                                                          "compare": None}


def _fields(spec):
    return {k: getattr(spec, k) for k in spec.__dataclass_fields__ if k != "plugin"}


def test_int8_parity_refuses_an_output_off_by_all_of_its_magnitude():
    """Random-init logits are about 0.1 in size, int8's stated atol 1.0: zeros from an
    int8 artifact would pass the stated bound and, at chance accuracy, the metric too.
    (A random-init policy's int8 logits, 2e-4 in size, are rightly off by 0.65 of it.)"""
    from zoo.export import reference_module
    from zoo.train import module_fn
    from zoo.verify import parity

    spec = zoo.get_model("resnet8.digits").tiny()
    module, _ = reference_module(spec, random_init=True)
    reference = module_fn(module, spec)
    assert spec.tolerances["int8"].atol >= 1.0
    with pytest.raises(ToleranceError, match=r"int8\]: output logits at batch \d+ is no closer to PyTorch fp32 than "
                                             r"zeros are \(\|error\| / \|reference\| = 1,"):
        parity(spec, reference, lambda inputs: {k: np.zeros_like(v) for k, v in reference(inputs).items()}, "int8")
    off_by_two_thirds = lambda inputs: {k: v * (1 + 2 / 3) for k, v in reference(inputs).items()}  # noqa: E731
    assert parity(spec, reference, off_by_two_thirds, "int8")["passed"]  # int8's elementwise bound stays loose

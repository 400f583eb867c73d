"""Models a user registers that the zoo once took and then served wrongly, or refused
with another backend's internal error: each is refused at once, naming the model, the
tensor and what to do, or now works as its spec says.

The models are the plugin tests/user_plugins/refused.py (loaded as `zoo --plugin` loads
it) and specs written inline; tiny, exported only to the CPU backends.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import zoo
from zoo.check import check
from zoo.export import reference_module
from zoo.errors import ExportError, SpecError, VerificationError, ZooError
from zoo.inputs import CheckedRunner

PLUGIN = Path(__file__).parent / "user_plugins" / "refused.py"


def plugin_specs(path: Path = PLUGIN) -> dict[str, zoo.ModelSpec]:
    """What the plugin file registers, by name, loaded as `zoo --plugin` loads it."""
    loaded = importlib.util.spec_from_file_location(f"{path.stem}_plugin", path)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    specs: list[zoo.ModelSpec] = []
    module.zoo_register_models(specs.append)
    return {s.name: s for s in specs}


SPECS = plugin_specs()


def zoo_check(model: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_DEBUG", "ZOO_PLUGINS")}
    return subprocess.run([sys.executable, "-m", "zoo", "--plugin", str(PLUGIN), "check", model], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


class Half(torch.nn.Module):
    """float16 weights, float16 in and out."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 4).half()

    def forward(self, x):
        return self.linear(x)


def half_spec() -> zoo.ModelSpec:
    return zoo.ModelSpec(
        name="half.weights", domain="tabular", task="regression",
        inputs=(zoo.TensorSpec("x", "float16", ("batch", 8)),), outputs=(zoo.TensorSpec("y", "float16", ("batch", 4)),),
        build=Half, sample=lambda batch, rng: {"x": rng.standard_normal((batch, 8)).astype(np.float16)},
        axes={"batch": zoo.AxisRange(1, 4, 16)}, tolerances={"fp32": zoo.Tolerance(1e-3, 1e-3)})


def test_zoo_check_refuses_a_forward_that_updates_its_buffers(tmp_path):
    checked = zoo_check("counter.buffer", tmp_path)
    assert checked.returncode != 0
    assert ("counter.buffer: forward changes buffers calls, running: an exported model must not keep "
            "state between calls") in checked.stderr


def test_the_state_check_puts_the_buffers_back_and_export_refuses_before_any_backend(tmp_path):
    spec = SPECS["counter.buffer"]
    module = spec.build().eval()
    report = check(spec, module)
    assert [p for p in report.failures if "forward changes buffers calls, running" in p], report.failures
    assert module.calls.item() == 0 and not module.running.any()
    with pytest.raises(SpecError, match="forward changes buffers calls, running: "):
        zoo.export(spec, backend="onnxruntime", random_init=True, repository=tmp_path)
    assert not list(tmp_path.iterdir())


def test_a_parameter_updated_in_place_is_named_too():
    class Drift(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(6))

        def forward(self, x):
            self.scale.add_(1)
            return x * self.scale

    spec = zoo.ModelSpec(name="drift.param", domain="tabular", task="regression",
                         inputs=(zoo.TensorSpec("x", "float32", ("batch", 6)),),
                         outputs=(zoo.TensorSpec("y", "float32", ("batch", 6)),),
                         build=Drift, sample=SPECS["counter.buffer"].sample, axes={"batch": zoo.AxisRange(1, 4, 16)})
    module = Drift()
    assert any("forward changes parameters scale: " in p for p in check(spec, module).failures)
    assert torch.equal(module.scale, torch.ones(6))


class CacheAttribute(torch.nn.Module):
    """State kept outside parameters and buffers: a plain tensor attribute and a counter."""

    def __init__(self, counter: bool) -> None:
        super().__init__()
        self.lin, self.cache, self.calls, self.counter = torch.nn.Linear(6, 3), torch.zeros(6), 0, counter

    def forward(self, x):
        if self.counter:
            self.calls += 1
            return self.lin(x) * self.calls
        self.cache.add_(x.mean(0))
        return self.lin(x + self.cache)


@pytest.mark.parametrize("counter, named", [(False, "attributes cache"), (True, "attributes calls")])
def test_state_kept_in_plain_attributes_is_refused_and_put_back(counter, named):
    """A cache tensor or a Python counter on the module drifts call by call just as a buffer
    does (the torch artifact of the cache once passed parity at 0 and failed `zoo verify`)."""
    spec = zoo.ModelSpec(name="cache.attr", domain="tabular", task="regression",
                         inputs=(zoo.TensorSpec("x", "float32", ("batch", 6)),),
                         outputs=(zoo.TensorSpec("y", "float32", ("batch", 3)),),
                         build=lambda: CacheAttribute(counter), sample=SPECS["counter.buffer"].sample,
                         axes={"batch": zoo.AxisRange(1, 4, 16)})
    module = spec.build()
    assert any(f"forward changes {named}: an exported model must not keep state" in p
               for p in check(spec, module).failures)
    assert module.calls == 0 and torch.equal(module.cache, torch.zeros(6))


class OneHot(torch.nn.Module):
    def forward(self, ids):
        return torch.nn.functional.one_hot(ids, 10).float().sum(1)


def test_ids_a_forward_fails_on_out_of_range_are_warned_of_whatever_the_op():
    """one_hot, not a table: PyTorch raises for id 65536, ONNX Runtime and OpenVINO answer
    an all-zero row."""
    spec = zoo.ModelSpec(name="onehot.ids", domain="tabular", task="count",
                         inputs=(zoo.TensorSpec("ids", "int64", ("batch", 6)),),
                         outputs=(zoo.TensorSpec("counts", "float32", ("batch", 10)),), build=OneHot,
                         sample=lambda batch, rng: {"ids": rng.integers(0, 10, (batch, 6))},
                         axes={"batch": zoo.AxisRange(1, 4, 16)})
    report = check(spec, spec.build())
    assert report.passed and any("input 'ids' has no value_range, and the forward raises RuntimeError" in w
                                 for w in report.warnings), report.warnings


def test_zoo_check_warns_of_ids_that_index_a_table_without_a_value_range(tmp_path):
    """A warning, not a refusal: the model runs, but only a declared range has every
    runner refuse an id out of the table (OpenVINO answers id 10 of 10 rows with zeros)."""
    checked = zoo_check("bag.norange", tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert "warning" in checked.stderr and "bag.norange: input 'ids' has no value_range" in checked.stderr
    assert "declare value_range=(0, 9) on it (its nn.Embedding has 10 rows)" in checked.stderr
    report = check(SPECS["bag.norange"], SPECS["bag.norange"].build().eval())
    assert report.passed and any("declare value_range=(0, 9)" in w for w in report.warnings)


def test_ids_with_their_value_range_pass():
    spec = SPECS["bag.norange"]
    bounded = zoo.ModelSpec(**{**{f: getattr(spec, f) for f in ("name", "domain", "task", "outputs", "build",
                                                                "sample", "axes")},
                               "inputs": (zoo.TensorSpec("ids", "int64", ("batch", 6), value_range=(0, 9)),)})
    report = check(bounded, bounded.build().eval())
    assert report.passed and not any("value_range" in w for w in report.warnings)


@pytest.mark.parametrize("kind", ["inputs", "outputs"])
def test_a_spec_without_inputs_or_outputs_is_refused_when_made(kind):
    tensors = {"inputs": (zoo.TensorSpec("x", "float32", ("batch", 4)),),
               "outputs": (zoo.TensorSpec("y", "float32", ("batch", 4)),)}
    with pytest.raises(ZooError, match=f"model nothing.out: the spec declares no {kind}"):
        zoo.ModelSpec(name="nothing.out", domain="tabular", task="none", build=torch.nn.Identity,
                      sample=lambda batch, rng: {}, **{**tensors, kind: ()})


@pytest.mark.parametrize("backend", ["torch", "onnxruntime", "openvino"])
def test_a_float16_model_answers_float16_on_every_backend(tmp_path, backend):
    artifact = zoo.export(half_spec(), backend=backend, random_init=True, repository=tmp_path)
    out = zoo.load(artifact.path)({"x": np.ones((2, 8), np.float16)})
    assert out["y"].dtype == np.float16 and out["y"].shape == (2, 4)


def test_a_runner_answering_another_dtype_than_the_spec_is_refused():
    spec = half_spec()
    runner = CheckedRunner(lambda inputs: {"y": np.zeros((2, 4), np.float32)}, spec, "half.weights.mine.fp32")
    with pytest.raises(VerificationError, match="output 'y' is FP32, but its spec declares FP16"):
        runner({"x": np.ones((2, 8), np.float16)})


def test_parity_refuses_an_artifact_answering_another_dtype_so_no_export_writes_one():
    """Export's parity (and `zoo verify`'s) refuses the artifact before it is written; at
    fp16 an engine may answer in its own precision, and only values are compared."""
    from zoo.verify import parity

    spec = half_spec()
    reference = spec.build().eval()

    def ref(inputs):
        return {"y": reference(torch.as_tensor(inputs["x"])).detach().numpy()}

    def widened(inputs):
        return {"y": ref(inputs)["y"].astype(np.float32)}

    with pytest.raises(VerificationError, match="output 'y' is FP32, but its spec declares FP16"):
        parity(spec, ref, widened, "fp32", batch_sizes=(2,))
    assert parity(spec, ref, ref, "fp32", batch_sizes=(2,))["max_abs_error"] == 0


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_onnx_export_refuses_a_branch_on_a_dynamic_axis(tmp_path, backend):
    with pytest.raises(ExportError, match=r"holds axis 'seq' \(input 'tokens', dimension 1\) to sizes 0 to 10, "
                                          r"where the spec's range is 1 to 32"):
        zoo.export(SPECS["clip.seqbranch"], backend=backend, random_init=True, repository=tmp_path)


def test_zoo_check_refuses_a_forward_that_fails_at_a_length_inside_the_range(tmp_path):
    """A reshape into pairs raises at an odd length, which the samples (8) and the range's
    ends (2, 8, 32) never have: `zoo check` passed it with a padding warning ("batched only
    with requests of the same length"), though the server takes length 9 and every backend
    then fails on it."""
    checked = zoo_check("pairs.reshaped", tmp_path)
    assert checked.returncode == 1 and "Traceback" not in checked.stderr, checked.stderr
    assert ("error: pairs.reshaped: the forward fails at seq = 9, inside the spec's range 2 to 32 (RuntimeError: "
            "shape '[1, -1, 8]' is invalid") in checked.stderr, checked.stderr
    assert "ragged batching" not in checked.stderr


UNET = Path(__file__).parent / "user_plugins" / "unet.py"


def test_a_unet_that_takes_only_multiples_of_four_is_refused_and_one_that_pads_exports(tmp_path):
    """Two poolings and skip connections: heights and widths of 16, 32 and 128 (the range's
    ends and the sample) work, 33 does not. `zoo check` passed it (with a padding warning),
    and only the export refused it; now the check names the size and the fix. The same
    network padding its input to a multiple of 4 inside forward passes and exports."""
    specs = plugin_specs(UNET)
    report = check(specs["unet.tiny"], specs["unet.tiny"].build().eval())
    assert [c.name for c in report.checks if c.problems] == ["sizes"]
    assert report.failures == [
        f"unet.tiny: the forward fails at {axis} = 33, inside the spec's range 16 to 128 (RuntimeError: Sizes of "
        f"tensors must match except in dimension 1. Expected size 32 but got size 33 for tensor number 1 in the "
        f"list; the sample at batch 1 grown along {axis} from 32): the server takes every size in the "
        f"range, so let the forward take each (pad the input inside forward to a size it takes and cut the output "
        f"back), or declare the axis static, AxisRange(n, n, n)" for axis in ("height", "width")]
    with pytest.raises(SpecError, match="unet.tiny: the forward fails at height = 33"):
        zoo.export(specs["unet.tiny"], backend="onnxruntime", random_init=True, repository=tmp_path / "tiny")
    padded = specs["unet.padded"]
    assert check(padded, padded.build().eval()).passed
    art = zoo.export(padded, backend="onnxruntime", random_init=True, repository=tmp_path / "padded")
    image = np.random.default_rng(1).standard_normal((2, 3, 35, 19)).astype(np.float32)  # neither a multiple of 4
    module, _ = reference_module(padded, random_init=True)
    with torch.inference_mode():
        want = module(torch.from_numpy(image)).numpy()
    got = art.load()({"image": image})["mask_logits"]
    assert got.shape == (2, 2, 35, 19) and np.abs(got - want).max() < 1e-4


def test_onnx_export_refuses_a_forward_that_needs_an_even_length(tmp_path):
    """A branch on seq % 2: the ONNX exporter's capture defers torch.export's guard to an
    assertion the graph drops, and the artifact, whose parity samples were all of even
    length, answered odd lengths with the even branch."""
    with pytest.raises(ExportError, match=r"input 'tokens' axis 1 \('seq'\) must be even \(torch.export found "
                                          r".*Mod\(seq, 2\).*\), so sizes 3, 5, 7, 9, 11, \.\.\. of the spec's "
                                          r"range 2 to 32 break it.*Declare the axis static"):
        zoo.export(SPECS["pairs.evenseq"], backend="onnxruntime", random_init=True, repository=tmp_path)
    assert not list(tmp_path.iterdir())


def test_zoo_check_refuses_ids_the_forward_fails_at_the_end_of_their_value_range(tmp_path):
    """value_range=(0, 100) on a table of 100 rows: the server would pass id 100 to every
    runner, and PyTorch raises for it where ONNX Runtime answers an engine error or zeros."""
    report = check(SPECS["table.pastend"], SPECS["table.pastend"].build().eval())
    assert any("table.pastend: input 'ids' at 100, the high end of its value_range (0, 100): the forward raises "
               "IndexError" in p for p in report.failures), report.failures
    checked = zoo_check("table.pastend", tmp_path)
    assert checked.returncode != 0 and "input 'ids' at 100, the high end of its value_range" in checked.stderr


def test_a_forward_that_makes_float32_is_refused_at_bf16_naming_the_fix(tmp_path):
    with pytest.raises(ExportError, match=r"widened.fp32: its forward mixes dtypes at bf16 \(.*same dtype.*\): "
                                          r".*Cast it back.*torch.autocast.*export at fp32"):
        zoo.export(SPECS["widened.fp32"], backend="torch", precision="bf16", random_init=True, repository=tmp_path)
    assert not list(tmp_path.iterdir())


def test_torch_export_of_a_constrained_axis_names_the_size_and_the_fix(tmp_path):
    """The torch backend's own torch.export raises the violation; captured with the range
    as a hint, the program's own check fails at the first odd length past the example's:
    its message names the size, the guard and what to do."""
    with pytest.raises(ExportError, match=r"torch.export could not capture pairs.evenseq for every seq in the "
                                          r"spec's range 2 to 32: captured from the example \(seq = 8\), the program "
                                          r"fails at seq = 9 \(AssertionError: Guard failed: .*% 2 == 0\)\. .*Let the "
                                          r"forward take one path at every size .* or declare the axis static, "
                                          r"AxisRange\(n, n, n\)"):
        zoo.export(SPECS["pairs.evenseq"], backend="torch", random_init=True, repository=tmp_path)
    assert not list(tmp_path.iterdir())


def test_a_size_the_forward_derives_being_1_is_refused_naming_the_range_to_give(tmp_path):
    # before: "the program fails at seq = 2 (... Guard failed: -1 + inputs_0.size()[1] != 1) ...
    # a condition on the size, or an op that does nothing at some sizes": the forward has
    # neither, and the fix (a range from 3) went unsaid
    with pytest.raises(ExportError, match=r"torch.export could not capture steps.from2 for seq = 2: it takes every "
                                          r"size it keeps dynamic to be other than 1 .*start the range above it, "
                                          r"AxisRange\(3, \.\.\.\); else export it with the onnxruntime"):
        zoo.export(SPECS["steps.from2"], backend="torch", random_init=True, repository=tmp_path / "from2")
    art = zoo.export(SPECS["steps.from3"], backend="torch", random_init=True, repository=tmp_path / "from3")
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    assert zoo.load(art.path)({"x": x})["diffs"].shape == (2, 2, 2)


def test_the_torch_backend_takes_a_range_torch_export_cannot_prove_and_refuses_a_path_fixed_at_the_example(tmp_path):
    """A U-Net padding its input to the next multiple of 4 inside forward: torch.export
    refused the range ("Not all values of height ... satisfy the generated guard") whether
    the pad can be 0 (`unet.padded`: a path fixed at the example's 32, failing at 33) or
    never is (`unet.always`: one path at every size). The second now exports, its program
    checking at run time what torch could not prove, and answers PyTorch at 35x19; the
    first is refused naming the size it fails at."""
    specs = plugin_specs(UNET)
    with pytest.raises(ExportError, match=r"torch.export could not capture unet.padded for every height in the "
                                          r"spec's range 16 to 128: captured from the example \(height = 32\), the "
                                          r"program fails at height = 33 \(AssertionError: Guard failed: "):
        zoo.export(specs["unet.padded"], backend="torch", random_init=True, repository=tmp_path / "padded")
    assert not (tmp_path / "padded").exists()  # nothing written, not even the repository folder
    always = specs["unet.always"]
    art = zoo.export(always, backend="torch", random_init=True, repository=tmp_path / "always")
    module, _ = reference_module(always, random_init=True)
    for shape in ((2, 3, 35, 19), (1, 3, 16, 128), (4, 3, 33, 17)):
        image = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        with torch.inference_mode():
            want = module(torch.from_numpy(image)).numpy()
        got = zoo.load(art.path)({"image": image})["mask_logits"]
        assert got.shape == want.shape and np.abs(got - want).max() < 1e-4, shape


def test_a_forward_that_fails_at_an_axis_end_is_named_by_check_and_export(tmp_path):
    """Lengths sampled up to 10 gather past a sequence cut to 1: the test vectors an export
    records at each end of the seq range (the sample cut or repeated) made `zoo export`
    answer "internal error: index 8 is out of bounds"; `zoo check` passed."""
    checked = zoo_check("gru.lastvalid", tmp_path)
    line = ("gru.lastvalid: the forward fails on its sample at batch=1, seq=1 (RuntimeError: index 8 is out of bounds "
            "for dimension 1 with size 1); the sample is cut or repeated along seq")
    assert checked.returncode == 1 and f"\nerror: {line}" in checked.stderr, checked.stderr
    # the lengths index the sequence, not a table: the advice was "its nn.Embedding has N rows"
    # where a model had one, and a value_range that cannot follow the seq axis anyway
    assert ("gru.lastvalid: input 'lengths' has no value_range, and the forward raises RuntimeError for id 65536 "
            "(index 65535 is out of bounds for dimension 1 with size 10): declare value_range=(0, 9) on it if it "
            "indexes 10 entries of something fixed; if it is a length or a position along an input's axis, clamp "
            "it to that axis in the forward") in checked.stderr, checked.stderr
    with pytest.raises(SpecError, match=re.escape(line)):
        zoo.export(SPECS["gru.lastvalid"], backend="onnxruntime", random_init=True, repository=tmp_path / "exports")
    assert not list((tmp_path / "exports").glob("*/zoo.json"))


def test_a_forward_that_is_not_deterministic_is_refused_by_check_not_blamed_on_a_backend(tmp_path):
    """Dropout left on at inference: `zoo check` said "meets its spec", then every backend's
    parity failed ("output y at batch 1 differs from PyTorch fp32 by up to 0.0123")."""
    spec = SPECS["dropout.always"]
    report = check(spec, spec.build().eval())
    assert [c.name for c in report.checks if c.problems] == ["outputs"]
    assert re.fullmatch(r"dropout.always: at batch 4: output 'y' differs by up to [\d.e-]+ between two runs of the "
                        r"same inputs \(fp32 atol [\d.e-]+\): the forward is not deterministic in eval mode .*",
                        report.failures[0]), report.failures
    with pytest.raises(SpecError, match="the forward is not deterministic"):
        zoo.export(spec, backend="torch", random_init=True, repository=tmp_path)


def test_a_transformer_encoder_on_pytorchs_fast_path_is_refused_by_check_with_the_fix(tmp_path):
    """Its padded positions are 0 on the nested-tensor fast path and computed values in every
    export: `zoo check` passed it, and every backend's parity then failed ("output hidden at
    batch 1 differs from PyTorch fp32 by up to 2.46"). Built with enable_nested_tensor=False
    it passes and exports."""
    nested = SPECS["encoder.nested"]
    report = check(nested, nested.build().eval())
    assert len(report.failures) == 1 and re.fullmatch(
        r"encoder.nested: at batch 4: output 'hidden' differs by up to [\d.e-]+ \(fp32 atol 0.0001\) between "
        r"PyTorch's fast path for attention \(eval mode's default\) and its standard path, which exports compute: "
        r".*Build it with enable_nested_tensor=False.*", report.failures[0]), report.failures
    assert torch.backends.mha.get_fastpath_enabled()  # put back
    standard = SPECS["encoder.standard"]
    assert check(standard, standard.build().eval()).passed
    zoo.export(standard, backend="onnxruntime", random_init=True, repository=tmp_path)


class ClipsOutliers(torch.nn.Module):
    """A Python `if` on tensor values (rare: a glitching sensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        if x.abs().max() > 10:
            x = x.clamp(-10, 10)
        return self.fc(x)


CLIPS_OUTLIERS = zoo.ModelSpec(name="clips.outliers", domain="tabular", task="regression",
                               inputs=(zoo.TensorSpec("x", "float32", ("batch", 4)),),
                               outputs=(zoo.TensorSpec("y", "float32", ("batch", 3)),), build=ClipsOutliers,
                               sample=lambda b, rng: {"x": rng.standard_normal((b, 4)).astype(np.float32)},
                               axes={"batch": zoo.AxisRange(1, 4, 8)})


def test_the_torch_backend_names_a_branch_on_tensor_values_and_the_fix(tmp_path):
    """It said only "Could not guard on data-dependent expression Eq(u0, 1)" (the ONNX
    backends named the line)."""
    with pytest.raises(ExportError, match=r"torch.export could not capture clips.outliers: its forward branches on "
                                          r"tensor values in Python \(test_user_models_refused.py:\d+: if "
                                          r"x.abs\(\).max\(\) > 10:\), .* Write the condition as tensor operations "
                                          r"\(torch.where, torch.clamp\) or with torch.cond"):
        zoo.export(CLIPS_OUTLIERS, backend="torch", random_init=True, repository=tmp_path)


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_a_failed_capture_says_its_one_line_without_torchs_graph_dump(tmp_path, capfd, backend):
    # before: torch.export printed the partial graph (`def forward(self, arg0_1: ...`, some
    # forty lines, twice) and "Unable to find user code corresponding to {u0}" to stderr
    # ahead of the error
    with pytest.raises(ExportError, match="branches on tensor values"):
        zoo.export(CLIPS_OUTLIERS, backend=backend, random_init=True, repository=tmp_path)
    err = capfd.readouterr().err
    assert "def forward" not in err and "Unable to find user code" not in err, err[:2000]


class MinFilled(torch.nn.Module):
    """Attention pooling masked with float32's minimum (the Hugging Face pattern), which
    bfloat16 cannot hold."""

    def __init__(self) -> None:
        super().__init__()
        self.score, self.head = torch.nn.Linear(8, 1), torch.nn.Linear(8, 3)

    def forward(self, items, valid):
        weights = self.score(items).squeeze(-1).masked_fill(~valid, torch.finfo(torch.float32).min).softmax(-1)
        return self.head((weights.unsqueeze(-1) * items).sum(1))


def test_a_float32_constant_bf16_cannot_hold_is_named_with_the_fix(tmp_path):
    """It read as an engine fault: "the artifact failed to run inputs of shapes {...}: value
    cannot be converted to type c10::BFloat16 without overflow"."""
    def sample(b, rng):
        return {"items": rng.standard_normal((b, 5, 8)).astype(np.float32),
                "valid": np.arange(5)[None] < rng.integers(1, 6, b)[:, None]}

    spec = zoo.ModelSpec(name="pool.min-filled", domain="tabular", task="set-classification",
                         inputs=(zoo.TensorSpec("items", "float32", ("batch", 5, 8)),
                                 zoo.TensorSpec("valid", "bool", ("batch", 5))),
                         outputs=(zoo.TensorSpec("y", "float32", ("batch", 3)),), build=MinFilled, sample=sample,
                         axes={"batch": zoo.AxisRange(1, 4, 8)})
    with pytest.raises(VerificationError, match=r"BFloat16 without overflow; the forward makes a constant bf16 "
                                                r"cannot hold .*torch.finfo\(x.dtype\).min, or keep fp32"):
        zoo.export(spec, backend="torch", precision="bf16", random_init=True, repository=tmp_path)


PACKED = ("lstm.packed: at batch 4: the forward packs its sequences by their lengths "
          "(torch.nn.utils.rnn.pack_padded_sequence): a PackedSequence's batch sizes are computed from the "
          "lengths' values, which neither torch.export nor ONNX export can capture. Run the recurrent layer on "
          "the padded batch and read each row at its last real step")


def test_an_lstm_over_packed_sequences_is_refused_by_check_and_its_fix_exports(tmp_path):
    """PyTorch runs it and `zoo check` passed it; then torch.export failed with "zeros():
    argument 'size' failed to unpack the object at pos 2 ... got FakeTensor" and ONNX export
    with that and "vector::_M_range_check", after printing some forty lines of TorchScript
    graph. Refused by the check, and so by every export before any backend work, naming the
    fix; the fix (`lstm.gathered`, the same weights) answers the same and exports."""
    packed, gathered = SPECS["lstm.packed"], SPECS["lstm.gathered"]
    report = check(packed, packed.build().eval())
    assert len(report.failures) == 1 and report.failures[0].startswith(PACKED), report.failures
    for backend in ("torch", "onnxruntime"):
        with pytest.raises(SpecError) as refused:
            zoo.export(packed, backend=backend, random_init=True, repository=tmp_path)
        assert str(refused.value).startswith(PACKED)
    assert not list(tmp_path.rglob("*.onnx")) and not list(tmp_path.rglob("*.pt2"))
    module = packed.build().eval()
    fixed = gathered.build().eval()
    fixed.load_state_dict(module.state_dict())
    inputs = {k: torch.from_numpy(v) for k, v in packed.sample(8, np.random.default_rng(1)).items()}
    with torch.no_grad():
        torch.testing.assert_close(fixed(**inputs), module(**inputs), atol=1e-6, rtol=1e-5)
    assert check(gathered, fixed).passed
    zoo.export(gathered, backend="onnxruntime", random_init=True, repository=tmp_path)


def test_a_failed_torchscript_export_prints_no_graph(tmp_path, capfd):
    """When both ONNX exporters fail, the TorchScript one printed its whole graph to the
    process's standard output (torch's C++ ONNX log, which it turns on whatever it is asked):
    forty lines of IR before the one-line error, and inside a `--json` answer."""
    from zoo_onnx.export import export_onnx

    spec = SPECS["lstm.packed"]
    example = {k: torch.from_numpy(v) for k, v in spec.sample(4, np.random.default_rng(0)).items()}
    with pytest.raises(ExportError, match="the TorchScript exporter failed with"):
        export_onnx(spec.build().eval(), spec, example, tmp_path / "lstm.onnx")
    print("after the export")
    out = capfd.readouterr().out
    assert out == "after the export\n", out[:2000]
    assert not torch._C._jit_is_onnx_log_enabled()


def test_torchscript_modules_are_refused_by_check_naming_where(tmp_path):
    """A scripted submodule passed `zoo check` and every export then failed with PyTorch's
    words ("Gate.forward() takes 2 positional arguments but 3 were given", "State dict entry
    for parameter ... is not an instance of torch.nn.Parameter"); a scripted whole module
    was "internal error: get_submodule is not supported on ScriptModules"."""
    for model, where in (("script.submodule", "submodule 'gate'"), ("script.whole", "the module")):
        spec = SPECS[model]
        assert check(spec, spec.build().eval()).failures == [
            f"{model}: {where} is TorchScript (torch.jit.script or torch.jit.trace), which torch.export and so every "
            f"exporter cannot take: build the plain nn.Module, without torch.jit.script or trace"]
        with pytest.raises(SpecError, match=f"{model}: {where} is TorchScript"):
            zoo.export(spec, backend="onnxruntime", random_init=True, repository=tmp_path)
    checked = zoo_check("script.whole", tmp_path)
    assert checked.returncode == 1 and "internal error" not in checked.stderr
    assert "error: script.whole: the module is TorchScript" in checked.stderr, checked.stderr


def test_a_random_buffer_no_export_saves_is_refused_by_check(tmp_path):
    """A random projection registered with persistent=False: not in the saved weights, so
    `zoo verify` with the plugin rebuilt the reference with another projection and said the
    forward had changed since the export, which re-exporting did not cure."""
    spec = SPECS["fourier.randbuf"]
    report = check(spec, spec.build().eval())
    assert report.failures == [
        "fourier.randbuf: buffer 'proj' is not persistent (register_buffer(..., persistent=False)), so no export "
        "saves it, and two builds of the module give it different values: every rebuilt reference computes "
        "something else. Register it persistent, or compute it the same on every build (a seeded torch.Generator, "
        "or a formula)"]
    module = spec.build().eval()
    torch.manual_seed(3)
    first = torch.rand(1)
    torch.manual_seed(3)
    check(spec, module)
    assert torch.equal(torch.rand(1), first)  # the second build drew from a random state of its own


def test_random_plain_attributes_no_checkpoint_saves_are_refused_by_check_and_export(tmp_path):
    """A tensor kept as a plain attribute (`self.scale = torch.rand(1)`) is in no state dict:
    a model trained with it exported with another draw (test RMSE 1.58 trained, 0.64 exported,
    "change +0.0000" against a reference rebuilt with that same other draw), `zoo check` said
    it met its spec, and `zoo verify` blamed a changed forward."""
    spec = SPECS["scaled.attribute"]
    assert check(spec, spec.build().eval()).failures == [
        f"scaled.attribute: attribute {name!r} is a {kind} held as a plain attribute (not a parameter or a "
        f"buffer), so no checkpoint or export saves it, and two builds of the module give it different values: "
        f"the weights trained with one draw are exported with another. Register it as a buffer "
        f"(self.register_buffer({name!r}, ...)), or compute it the same on every build (a seeded "
        f"torch.Generator, or a formula)" for name, kind in (("scale", "tensor"), ("shift", "number"))]
    with pytest.raises(SpecError, match="attribute 'scale' is a tensor held as a plain attribute"):
        zoo.export(spec, backend="onnxruntime", random_init=True, repository=tmp_path)
    assert not list(tmp_path.rglob("*.onnx"))


def test_a_time_major_input_pads_its_sequence_axis_not_the_batch(tmp_path, capfd):
    """(seq, batch, 4): the batch axis is second. The check padded it as a ragged axis and
    warned "output logits has shape [5, 3] padded, [2, 3] not", for a model the server
    never batches (max_batch_size 0); and every export of the GRU printed torch's warning
    about its `_flat_weights`."""
    spec = SPECS["timemajor.gru"]
    report = check(spec, spec.build().eval())
    assert report.passed and report.warnings == [], report.warnings
    zoo.export(spec, backend="onnxruntime", random_init=True, repository=tmp_path)
    assert "_flat_weights" not in capfd.readouterr().err
    # torch.export unrolls the GRU over time, whatever the user's code: said, with what keeps the axis dynamic
    with pytest.raises(ExportError, match=r"torch.export could not capture timemajor.gru: .*specialized it to be a "
                                          r"constant \(7\).*Here it is 'gru', an nn.GRU: torch.export unrolls it over "
                                          r"its time steps.*The onnxruntime and openvino backends export it with the "
                                          r"axis dynamic"):
        zoo.export(spec, backend="torch", random_init=True, repository=tmp_path)


def test_a_gru_exported_after_another_keeps_its_sequence_axis_dynamic(tmp_path, monkeypatch):
    """Each export in one process as in a fresh one. After one GRU's ONNX export, the next
    GRU's capture ran torch's unrolled GRU, not the while_loop the capture asks for, and
    fixed seq to the example's 7: "Got invalid dimensions for input: x" at seq = 2, only
    where xdist gave one worker both tests. And a capture whose graph the ONNX cache served
    left the while_loop in place, so the torch backend then took the GRU it refuses."""
    import onnx
    from zoo_onnx.export import export_onnx

    monkeypatch.setenv("ZOO_ONNX_CACHE_DIR", str(tmp_path / "cache"))  # empty: the first exports are translated
    monkeypatch.delenv("ZOO_ONNX_CACHE", raising=False)
    rng = np.random.default_rng(0)
    modules = {name: SPECS[name].build().eval() for name in ("gru.lastvalid", "timemajor.gru")}
    answers = []
    for n, name in enumerate(("gru.lastvalid", "timemajor.gru", "timemajor.gru")):
        spec = SPECS[name]
        example = {k: torch.from_numpy(v) for k, v in spec.sample(4, rng).items()}
        answers.append(export_onnx(modules[name], spec, example, tmp_path / f"{n}.onnx"))
        x = onnx.load(str(tmp_path / f"{n}.onnx")).graph.input[0]
        dims = [d.dim_param or d.dim_value for d in x.type.tensor_type.shape.dim]
        assert dims == (["batch", "seq", 6] if n == 0 else ["seq", "batch", 4]), (name, dims)
    assert [a["onnx_cache"] for a in answers] == ["miss", "miss", "hit"]  # the same capture, so the same key
    with pytest.raises(ExportError, match=r"torch.export could not capture timemajor.gru: .*constant \(7\)"):
        zoo.export(SPECS["timemajor.gru"], backend="torch", random_init=True, repository=tmp_path / "torch")


def test_an_output_axis_past_its_declared_range_is_refused_by_check():
    """torch.nonzero over (batch, 6) with its axis given 1 to 8: a batch of 4 finds about
    12, and the check, the export and its manifest took the range the model overshoots."""
    spec = SPECS["positive.narrow"]
    failures = check(spec, spec.build().eval()).failures
    assert failures and all(re.fullmatch(r"positive.narrow: at batch (4|16): output 'indices' has found = \d+, past "
                                         r"the largest size the spec's axes give it \(8\): widen its range, or cap "
                                         r"the output in forward", f) for f in failures), failures


def test_a_graph_that_fixes_a_dynamic_axis_is_refused_naming_the_axis(tmp_path, monkeypatch):
    """A capture that made the time axis a constant (the GRU unrolled over the example's 7
    steps) wrote a graph ONNX Runtime refused at any other length with its own words ("Got
    invalid dimensions for input: x"), found by the test vectors at seq=2. The written
    graph's inputs are read: an axis the spec declares dynamic and the graph fixes is named.
    The capture is made to fix it here by declaring only the batch axis to torch.export."""
    import zoo_onnx.export as onnx_export
    from zoo.tensors import dynamic_shapes

    spec = SPECS["timemajor.gru"]
    batch_only = dataclasses.replace(spec, axes={**spec.axes, "seq": zoo.AxisRange(7, 7, 7)})
    monkeypatch.setattr(onnx_export, "dynamic_shapes", lambda s: dynamic_shapes(batch_only))
    example = {k: torch.from_numpy(v) for k, v in spec.sample(4, np.random.default_rng(0)).items()}
    with pytest.raises(ExportError) as refused:
        onnx_export.export_onnx(spec.build().eval(), spec, example, tmp_path / "gru.onnx")
    assert str(refused.value) == (
        "could not export timemajor.gru to ONNX: the graph fixes axis 'seq' (input 'x', dimension 0) to 7, where the "
        "spec's range is 2 to 20: the capture made the size a constant (a loop over it unrolled, the size used as a "
        "number), so the engine would refuse every other size")
    assert not (tmp_path / "gru.onnx").exists()

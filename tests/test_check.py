"""`zoo check`: a model that departs from its spec is told so, one line per problem, by
`zoo check` and by `zoo export` before any backend work.

The models are written as users write them: a module class, a spec, and a plugin class
registered in a yield fixture (as tests/test_plugins.py does), one per kind of mistake.
Every built-in model passes at its tiny size, as timm's tests run every registered model.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import zoo
from zoo import registry
from zoo.check import check
from zoo.errors import SpecError, ToleranceError, ZooError
from zoo.train import module_fn
from zoo.verify import parity


class Linear(torch.nn.Module):
    """features (batch, 4) -> logits (batch, `classes`), whatever the spec says."""

    def __init__(self, classes: int = 2, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.fc, self.scale, self.dtype = torch.nn.Linear(4, classes), scale, dtype

    def forward(self, features):
        return (self.fc(features) * self.scale).to(self.dtype)


class Named(torch.nn.Module):
    """A dict out: its keys are what the spec must name."""

    def __init__(self, *names: str) -> None:
        super().__init__()
        self.names, self.fc = names, torch.nn.Linear(4, 2)

    def forward(self, features):
        return {name: self.fc(features) for name in self.names}


def features(batch, rng):
    return {"features": rng.standard_normal((batch, 4)).astype(np.float32)}


def spec(name: str, build, outputs=(("logits", "float32", ("batch", 2)),), sample=features,
         inputs=(("features", "float32", ("batch", 4)),), **fields) -> zoo.ModelSpec:
    return zoo.ModelSpec(name=name, domain="tabular", task="classification",
                         inputs=tuple(zoo.TensorSpec(*t) for t in inputs),
                         outputs=tuple(zoo.TensorSpec(*t) for t in outputs), build=build, sample=sample, **fields)


BAD = {
    "bad.shape": spec("bad.shape", lambda: Linear(classes=3)),
    "bad.dtype": spec("bad.dtype", lambda: Linear(dtype=torch.float64)),
    "bad.batch": spec("bad.batch", Linear, sample=lambda batch, rng: features(8, rng)),
    "bad.extra": spec("bad.extra", lambda: Named("logits", "probs")),
    "bad.missing": spec("bad.missing", lambda: Named("logits"),
                        outputs=(("logits", "float32", ("batch", 2)), ("probs", "float32", ("batch", 2)))),
    "bad.params": spec("bad.params", Linear, inputs=(("x", "float32", ("batch", 4)), ("mask", "float32", ("batch", 4))),
                       sample=lambda b, rng: {"x": np.ones((b, 4), np.float32), "mask": np.ones((b, 4), np.float32)}),
    "bad.nan": spec("bad.nan", lambda: Linear(scale=float("nan"))),
    "tiny.scale": spec("tiny.scale", lambda: Linear(scale=1e-10)),
}


@pytest.fixture
def bad_models():
    """A user's plugin registering every model above, unregistered after the test."""

    class BadModels:
        @zoo.hookimpl
        def zoo_register_models(self, register):
            for s in BAD.values():
                register(s)

    plugin = BadModels()
    registry.register_plugin(plugin, name="bad-models")
    yield
    registry.unregister_plugin(plugin)


def failures(name: str) -> list[str]:
    spec = zoo.get_model(name)
    torch.manual_seed(0)
    return check(spec, spec.build().eval()).failures


def test_wrong_output_shape_names_the_output_and_the_expected_shape(bad_models):
    lines = failures("bad.shape")
    assert lines[0] == ("bad.shape: at batch 1: output 'logits' has shape [1, 3]; the spec declares (batch, 2) "
                        "with batch = 1, i.e. [1, 2]")
    assert len(lines) == 3  # at the smallest, typical and largest batch


def test_wrong_output_dtype(bad_models):
    assert failures("bad.dtype")[0] == ("bad.dtype: at batch 1: output 'logits' has dtype float64; the spec "
                                        "declares float32 (the PyTorch reference is fp32)")


def test_a_sample_that_ignores_the_batch_size(bad_models):
    lines = failures("bad.batch")
    assert [line.split(":")[1].strip() for line in lines] == ["sample(1)", "sample(32)"]  # 8 happens to fit
    assert lines[0] == ("bad.batch: sample(1): input 'features' has batch = 8 (dimension 0); expected 1, as in "
                        "the batch size asked for: a sample must honour the batch size it is given")


@pytest.mark.parametrize("name, says", [
    ("bad.extra", "returned outputs ['logits', 'probs']; its spec names ['logits']"),
    ("bad.missing", "returned outputs ['logits']; its spec names ['logits', 'probs']: ['probs'] missing"),
    ("bad.params", "has no parameter for inputs ['x', 'mask']"),
])
def test_forward_and_spec_names_disagree(bad_models, name, says):
    lines = failures(name)
    assert len(lines) == 3 and all(line.startswith(f"{name}: at batch ") and says in line for line in lines), lines


def test_non_finite_outputs(bad_models):
    assert failures("bad.nan")[0] == ("bad.nan: at batch 1: output 'logits' has 2 non-finite values "
                                      "(NaN or infinity) of 2")


def test_sample_dtype_rank_range_and_names():
    def sample(batch, rng):
        return {"ids": np.full((batch, 5), 7, np.int32), "extra": np.zeros(1)}

    s = spec("bad.sample", Linear, inputs=(("ids", "int64", ("batch", "seq"), (0, 5)),
                                           ("mask", "int64", ("batch", "seq"))), sample=sample,
             axes={"batch": zoo.AxisRange(1, 2, 4), "seq": zoo.AxisRange(1, 4, 4)})
    lines = check(s, Linear()).failures[:4]
    assert lines == [
        "bad.sample: sample(1) has inputs ['extra', 'ids']; the spec names ['ids', 'mask'] (missing ['mask'], "
        "unexpected ['extra'])",
        "bad.sample: sample(1): input 'ids' has dtype int32; the spec declares int64",
        "bad.sample: sample(1): input 'ids' has seq = 5 (dimension 1); the spec's range for 'seq' is 1 to 4",
        "bad.sample: sample(1): input 'ids' has value 7 at index [0, 0]; it takes values from 0 to 5",
    ]


def test_export_refuses_with_the_same_lines_before_any_backend_work(bad_models, repository):
    class Spy(zoo.Backend):
        name, precisions, filename, triton = "spy", {"cpu": ("fp32",)}, "model.bin", {"backend": "python"}
        calls: list[str] = []

        def versions(self):
            return {}

        def probe(self, device):
            return zoo.Availability(True)

        def export(self, *args):
            self.calls.append("export")

        def load(self, *args, **kwargs):
            self.calls.append("load")

    zoo.register_backend(Spy())
    try:
        with pytest.raises(SpecError) as exc:
            zoo.export("bad.shape", "spy", repository=repository)
    finally:
        zoo.unregister("spy")
    assert str(exc.value).splitlines() == failures("bad.shape")
    assert Spy.calls == [] and not repository.exists()


@pytest.mark.parametrize("kind", ["input", "output"])
def test_0d_tensors_are_refused_when_the_spec_is_made(kind):
    scalar, row = ("t", "float32", ()), ("t", "float32", ("batch",))
    with pytest.raises(ZooError, match=rf"model zero.d: {kind} 't' has shape \(\).*declare shape \(1,\)"):
        spec("zero.d", Linear, **({"inputs": (("features", "float32", ("batch", 4)), scalar)} if kind == "input"
                                  else {"outputs": (("logits", "float32", ("batch", 2)), scalar)}))
    spec("zero.d", Linear, inputs=(("features", "float32", ("batch", 4)), row))  # one value per row is fine


@pytest.mark.parametrize("fields, says", [
    ({"inputs": (("x", "float32", ("batch", 4)), ("x", "float32", ("batch", 4)))},
     r"input names must be unique; \['x'\] appear more than once"),
    ({"outputs": (("o", "float32", ("batch", 2)), ("o", "float32", ("batch", 2)))},
     r"output names must be unique; \['o'\] appear more than once"),
    ({"outputs": (("features", "float32", ("batch", 2)),)}, r"\['features'\] name both an input and an output"),
])
def test_tensor_names_are_unique_when_the_spec_is_made(fields, says):
    with pytest.raises(ZooError, match=rf"model dup: {says}"):
        spec("dup", Linear, **fields)


class Aliased(torch.nn.Module):
    """Returns its input as an output, and one tensor as two outputs: nothing is copied."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, features):
        y = self.fc(features)
        return {"logits": y, "scores": y, "echo": features}


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_outputs_that_share_memory_and_axes_of_one_size_export(backend, repository):
    """Outputs aliasing an input or each other (their test vectors are stored apart), and
    an axis whose range is one size (static: `torch.export` has no dynamic dimension for it)."""
    aliased = spec("aliased", Aliased, outputs=(("logits", "float32", ("batch", 2)), ("scores", "float32", ("batch", 2)),
                                                ("echo", "float32", ("batch", 4))))
    one = spec("batch.one", Linear, axes={"batch": zoo.AxisRange(1, 1, 1)})
    for model in (aliased, one):
        art = zoo.export(model, backend, repository=repository, random_init=True)
        assert art.manifest["parity"]["passed"] and zoo.verify(art.path)["parity"]["passed"]
    assert {c["batch"] for c in art.manifest["parity"]["checks"]} == {1}


class MeanPool(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, tokens):
        return self.fc(tokens.mean(1))


def test_a_typical_length_of_1_is_traced_at_2(repository):
    """torch.export specializes a dimension its example has at size 1: the example takes
    every dynamic axis sampled at 1 to 2 (as it does the batch), so the axis stays dynamic."""
    model = spec("seq.one", MeanPool, inputs=(("tokens", "float32", ("batch", "seq", 4)),),
                 sample=lambda b, rng: {"tokens": rng.standard_normal((b, 1, 4)).astype(np.float32)},
                 axes={"batch": zoo.AxisRange(1, 2, 4), "seq": zoo.AxisRange(1, 1, 16)})
    art = zoo.export(model, "torch", repository=repository, random_init=True)
    x = {"tokens": np.random.default_rng(0).standard_normal((3, 9, 4)).astype(np.float32)}  # a length never seen
    assert zoo.load(art.path)(x)["logits"].shape == (3, 2)


def test_a_tiny_output_is_held_relative_to_its_magnitude(bad_models):
    s = zoo.get_model("tiny.scale")
    torch.manual_seed(0)
    module = s.build().eval()
    reference = module_fn(module, s)
    zeros = lambda inputs: {"logits": np.zeros((len(inputs["features"]), 2), np.float32)}  # noqa: E731
    # |logits| ~ 1e-10: the stated atol (1e-4) alone would pass zeros, or anything else that small
    with pytest.raises(ToleranceError, match=r"output logits at batch 1 .* magnitude .* under 10x the stated atol"):
        parity(s, reference, zeros, "fp32")
    report = parity(s, reference, reference, "fp32")
    assert all(c["relative"] and c["atol"] == c["magnitude"] / 10 < 1e-10 for c in report["checks"])
    warnings = check(s, module).warnings
    assert len(warnings) == 1 and warnings[0].startswith("tiny.scale: output 'logits' has magnitude ")
    assert "under 10x the fp32 atol 0.0001; parity holds it to 0.1 of its magnitude instead" in warnings[0]


def test_an_integer_output_that_differs_is_counted_not_measured():
    """It read "differs from PyTorch fp32 by up to 0.0625, beyond the tolerance atol=1": the
    fraction of rows that differed, against a bound that is not one for integers."""
    s = spec("labels.int", Linear, outputs=(("logits", "float32", ("batch", 2)), ("label", "int64", ("batch",))))

    def reference(inputs):
        return {"logits": np.zeros((len(inputs["features"]), 2), np.float32),
                "label": np.arange(len(inputs["features"]), dtype=np.int64)}

    def one_flipped(inputs):
        out = reference(inputs)
        out["label"][0] += 1
        return out

    with pytest.raises(ToleranceError, match=r"^labels.int \[fp32\]: output label at batch 1: 1 of 1 values differ "
                                             r"from PyTorch fp32's; an integer output must match exactly at any "
                                             r"precision \(to leave it to the task metric at fp32, compare only the "
                                             r"others: Tolerance\(\.\.\., compare=\('logits',\)\)\)$"):
        parity(s, reference, one_flipped, "fp32")


def test_outputs_well_above_the_atol_keep_the_stated_tolerance():
    s = spec("unit.scale", Linear)
    reference = module_fn(Linear().eval(), s)
    report = parity(s, reference, reference, "fp32")
    assert not any("relative" in c for c in report["checks"])


@pytest.mark.parametrize("name", zoo.list_models())
def test_every_built_in_model_meets_its_spec(name):
    s = zoo.get_model(name).tiny()
    torch.manual_seed(0)
    report = check(s, s.build().eval())
    assert report.passed, report.failures
    assert report.warnings == []


PLUGIN = """\
import numpy as np
import torch
import zoo


@zoo.hookimpl
def zoo_register_models(register):
    register(zoo.ModelSpec(
        name="mlp.wrong", domain="tabular", task="classification",
        inputs=(zoo.TensorSpec("features", "float32", ("batch", 4)),),
        outputs=(zoo.TensorSpec("logits", "float32", ("batch", 2)),),
        build=lambda: torch.nn.Linear(4, 3),
        sample=lambda batch, rng: {"features": rng.standard_normal((batch, 4)).astype(np.float32)}))
"""


def test_cli_exit_codes_and_lines(tmp_path):
    plugin = tmp_path / "wrong.py"
    plugin.write_text(textwrap.dedent(PLUGIN))
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_DEBUG", "ZOO_PLUGINS")}

    def zoo_cli(*args):
        return subprocess.run([sys.executable, "-m", "zoo", "--plugin", str(plugin), *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)

    bad = zoo_cli("check", "mlp.wrong")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert bad.stderr.splitlines()[0] == ("error: mlp.wrong: at batch 1: output 'logits' has shape [1, 3]; the spec "
                                          "declares (batch, 2) with batch = 1, i.e. [1, 2]")
    assert "FAILED" in bad.stdout and len(bad.stderr.splitlines()) == 3
    exported = zoo_cli("export", "mlp.wrong", "--backend", "onnxruntime")
    assert exported.returncode == 1 and exported.stderr == bad.stderr and not (tmp_path / "exports").exists()
    good = zoo_cli("check", "resnet8.digits", "-c", "width=4", "--json")
    assert good.returncode == 0, good.stderr
    assert '"passed": true' in good.stdout


def test_another_config_is_checked_at_random_init_not_with_the_default_checkpoint(tmp_path, monkeypatch, capsys):
    """checkpoints/MODEL holds the default config (`zoo train -c` needs --out): `zoo check -c`
    checked that checkpoint's module, whatever config it was asked for, and said it met its spec."""
    import json

    from zoo import cli

    monkeypatch.chdir(tmp_path)
    zoo.train("resnet8.digits", epochs=1, progress=False, options=zoo.training.TrainOptions(max_steps=1))

    def checked(*args: str) -> dict:
        monkeypatch.setattr(sys, "argv", ["zoo", "check", "resnet8.digits", *args, "--json"])
        with pytest.raises(SystemExit) as exited:
            cli.main()
        report = capsys.readouterr().out
        assert exited.value.code in (None, 0), report
        return json.loads(report)

    assert checked()["weights"].startswith("checkpoint checkpoints/resnet8.digits")
    assert checked("-c", "width=4")["weights"].startswith("random init")

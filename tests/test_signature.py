"""Inputs bound by name and outputs flattened by name, the same in the PyTorch reference
and in every exporter (`zoo.signature`), tested on modules written as users write them.

Expected values are computed here from the inputs, never through the zoo's own call, so
a binding that swapped two inputs in both the reference and the artifact would fail.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import NamedTuple

import numpy as np
import pytest
import torch

import zoo
from zoo.errors import SignatureError, ZooError
from zoo.signature import KEYWORD, POSITIONAL, binding
from zoo.tensors import call_module


def text_spec(name: str, build, outputs=("mixed",)) -> zoo.ModelSpec:
    """A spec whose inputs are listed in another order than the forward's parameters
    (BertModel's forward takes attention_mask before token_type_ids)."""
    def sample(batch, rng):
        return {"input_ids": rng.integers(0, 50, (batch, 6)),
                "token_type_ids": rng.integers(0, 2, (batch, 6)),
                "attention_mask": np.ones((batch, 6), np.int64)}

    return zoo.ModelSpec(
        name=name, domain="nlp", task="feature-extraction",
        inputs=(zoo.TensorSpec("input_ids", "int64", ("batch", 6)),
                zoo.TensorSpec("token_type_ids", "int64", ("batch", 6)),
                zoo.TensorSpec("attention_mask", "int64", ("batch", 6))),
        outputs=tuple(zoo.TensorSpec(o, "float32", ("batch", 6)) for o in outputs),
        build=build, sample=sample, axes={"batch": zoo.AxisRange(1, 2, 4)})


class Mixer(torch.nn.Module):
    """Each input weighted differently, so a swap changes the result."""

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return (input_ids + 10 * token_type_ids + 100 * attention_mask).float()


def expected(inputs) -> np.ndarray:
    return (inputs["input_ids"] + 10 * inputs["token_type_ids"] + 100 * inputs["attention_mask"]).astype(np.float32)


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_inputs_reach_the_parameters_of_their_own_name(inline, repository, backend):
    spec = text_spec("mixer.keyword", Mixer)
    inline(spec)
    assert binding(Mixer(), spec) == KEYWORD
    art = zoo.export("mixer.keyword", backend=backend, repository=repository)
    assert art.manifest["model"]["binding"] == KEYWORD
    inputs = {"input_ids": np.array([[3, 4, 5, 6, 7, 8]]), "token_type_ids": np.array([[0, 0, 1, 1, 0, 1]]),
              "attention_mask": np.array([[1, 1, 1, 0, 0, 0]])}
    np.testing.assert_array_equal(zoo.load(art.path)(inputs)["mixed"], expected(inputs))


class Out(NamedTuple):
    second: torch.Tensor
    first: torch.Tensor


@dataclasses.dataclass
class DataOut:
    second: torch.Tensor
    first: torch.Tensor
    unset: torch.Tensor | None = None  # as ModelOutput leaves fields a config turns off


def _model_output():
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    return lambda first, second: BaseModelOutputWithPooling(last_hidden_state=first, pooler_output=second)


RESULTS = {  # each returns (first, second) under the names "first" and "second", in its own order
    "tuple": lambda: lambda first, second: (first, second),
    "dict in another order": lambda: lambda first, second: {"second": second, "first": first},
    "named tuple in another order": lambda: lambda first, second: Out(second, first),
    "dataclass in another order": lambda: lambda first, second: DataOut(second, first),
    "transformers ModelOutput": _model_output,
}


def pair_spec(name: str, make, outputs=("first", "second")) -> zoo.ModelSpec:
    class Pair(torch.nn.Module):
        def forward(self, x):
            return make()(x * 2.0, x.sum(dim=1, keepdim=True).expand(-1, 3))

    return zoo.ModelSpec(
        name=name, domain="tabular", task="regression",
        inputs=(zoo.TensorSpec("x", "float32", ("batch", 3)),),
        outputs=tuple(zoo.TensorSpec(o, "float32", ("batch", 3)) for o in outputs),
        build=Pair, sample=lambda batch, rng: {"x": rng.standard_normal((batch, 3)).astype(np.float32)},
        axes={"batch": zoo.AxisRange(1, 2, 4)})


@pytest.mark.parametrize("kind", RESULTS)
def test_every_result_kind_is_flattened_by_name(kind):
    names = ("last_hidden_state", "pooler_output") if kind == "transformers ModelOutput" else ("first", "second")
    spec = pair_spec("pair.kinds", RESULTS[kind], outputs=names)
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    out = call_module(spec.build(), spec, {"x": x})
    assert list(out) == list(names)
    torch.testing.assert_close(out[names[0]], x * 2)
    torch.testing.assert_close(out[names[1]], torch.tensor([[3.0] * 3, [12.0] * 3]))


def test_a_modeloutput_program_loads_where_transformers_was_never_imported(inline, repository):
    """The `.pt2` of a module returning a third-party class loads and runs in a process
    that has not imported that class's library (it stores a plain tuple)."""
    inline(pair_spec("pair.modeloutput", _model_output, outputs=("last_hidden_state", "pooler_output")))
    art = zoo.export("pair.modeloutput", backend="torch", repository=repository)
    script = (
        "import sys, torch\n"
        f"program = torch.export.load({str(art.model_file)!r})\n"
        "out = program.module()(torch.ones(2, 3))\n"
        "assert type(out) is tuple and len(out) == 2, type(out)\n"
        "assert 'transformers' not in sys.modules\n"
        "print(out[0].sum().item(), out[1].sum().item())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["12.0", "18.0"]


@pytest.mark.parametrize("result, message", [
    (lambda first, second: {"first": first}, r"\['second'\] missing"),
    (lambda first, second: {"first": first, "second": second, "third": first},
     r"\['third'\] not declared"),
    (lambda first, second: (first,), "returned 1 outputs; its spec names 2"),
    (lambda first, second: first, "returned one tensor; its spec names 2 outputs"),
    (lambda first, second: {"first": first, "second": 3}, "output 'second' is a int, not a tensor"),
])
def test_a_result_that_does_not_match_the_spec_is_an_error_naming_the_outputs(result, message):
    spec = pair_spec("pair.bad", lambda: result)
    with pytest.raises(SignatureError, match=message):
        call_module(spec.build(), spec, {"x": torch.ones(1, 3)})


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_export_refuses_an_undeclared_output_naming_it(inline, repository, backend):
    inline(pair_spec("pair.undeclared", lambda: lambda first, second: {"first": first, "y": second}))
    with pytest.raises(ZooError, match=r"\['second'\] missing; \['y'\] not declared"):
        zoo.export("pair.undeclared", backend=backend, repository=repository)
    assert not repository.exists() or not any(repository.iterdir())


def test_the_onnx_exporter_reports_the_signature_not_its_own_failure(tmp_path):
    from zoo_onnx.export import export_onnx

    spec = pair_spec("pair.undeclared", lambda: lambda first, second: {"first": first, "y": second})
    with pytest.raises(SignatureError, match=r"\['second'\] missing"):
        export_onnx(spec.build(), spec, {"x": torch.ones(2, 3)}, tmp_path / "model.onnx")
    assert not (tmp_path / "model.onnx").exists()


class Positional(torch.nn.Module):
    def forward(self, *inputs):
        ids, types, mask = inputs
        return (ids + 10 * types + 100 * mask).float()


class Confused(torch.nn.Module):
    def forward(self, ids, types, mask):  # three inputs, none named as in the spec
        return (ids + types + mask).float()


class Keywords(torch.nn.Module):
    """Every input as a keyword: `forward(**inputs)`, and a parameter of its own."""

    def forward(self, scale=1, **inputs):
        return scale * (inputs["input_ids"] + 10 * inputs["token_type_ids"] + 100 * inputs["attention_mask"]).float()


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_a_forward_taking_every_input_as_a_keyword_gets_each_by_its_name(inline, repository, backend):
    """It was refused, with "forward(**inputs) has no parameter for inputs [...]"."""
    spec = text_spec("mixer.kwargs", Keywords)
    inline(spec)
    assert binding(Keywords(), spec) == KEYWORD
    inputs = {"input_ids": np.array([[3, 4, 5, 6, 7, 8]]), "token_type_ids": np.array([[0, 0, 1, 1, 0, 1]]),
              "attention_mask": np.array([[1, 1, 1, 0, 0, 0]])}
    out = zoo.export("mixer.kwargs", backend=backend, repository=repository).load()(inputs)
    np.testing.assert_array_equal(out["mixed"], expected(inputs))


class NeedsMore(torch.nn.Module):
    def forward(self, input_ids, token_type_ids, attention_mask, position_ids):
        return input_ids.float()


def test_forwards_without_named_parameters_are_called_in_spec_order():
    spec = text_spec("mixer.positional", Positional)
    assert binding(Positional(), spec) == POSITIONAL
    inputs = spec.sample(2, np.random.default_rng(0))
    out = call_module(Positional(), spec, {k: torch.from_numpy(v) for k, v in inputs.items()})
    np.testing.assert_array_equal(out["mixed"].numpy(), expected(inputs))
    single = pair_spec("pair.single", RESULTS["tuple"])
    assert binding(torch.nn.Linear(3, 3), single) == POSITIONAL  # forward(input) for spec input "x"


def test_a_forward_that_cannot_be_bound_by_name_is_refused():
    with pytest.raises(SignatureError, match=r"no parameter for inputs \['input_ids', 'token_type_ids', "
                                             r"'attention_mask'\]"):
        binding(Confused(), text_spec("mixer.confused", Confused))
    with pytest.raises(SignatureError, match=r"requires \['position_ids'\], which the spec does not name"):
        binding(NeedsMore(), text_spec("mixer.more", NeedsMore))


def test_a_compiled_module_is_bound_by_its_own_forward():
    spec = text_spec("mixer.compiled", Mixer)
    assert binding(torch.compile(Mixer()), spec) == KEYWORD

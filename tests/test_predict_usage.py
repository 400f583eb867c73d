"""`zoo predict` and `zoo.predict`: what the command line refuses as a usage error (exit
2) and what it refuses as bad inputs (exit 1), and how a bad item past the first batch is
named."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import zoo
from zoo import AxisRange, ModelSpec, TensorSpec
from zoo.errors import InputError, UsageError
from zoo.registry import register_plugin, unregister_plugin


class Scale(torch.nn.Module):
    def forward(self, x):
        return x * 2.0


def _numbers(items):
    rows = []
    for k, item in enumerate(items, start=1):
        try:
            rows.append([float(item)])
        except ValueError:
            raise InputError(f"item {k} is {bytes(item)[:40]!r}, not a number") from None
    return {"x": np.array(rows, dtype=np.float32)}


SPEC = ModelSpec(
    name="double.test", domain="nlp", task="regression",  # untrained: runs with its random init
    inputs=(TensorSpec("x", "float32", ("batch", 1)),), outputs=(TensorSpec("y", "float32", ("batch", 1)),),
    axes={"batch": AxisRange(1, 2, 4)}, build=Scale,
    sample=lambda batch, rng: {"x": rng.standard_normal((batch, 1)).astype(np.float32)},
    raw_kind="text", preprocess=_numbers, postprocess=lambda out: [float(v) for v in out["y"][:, 0]],
)


class Plugin:
    @zoo.hookimpl
    def zoo_register_models(self, register):
        register(SPEC)


@pytest.fixture(scope="module")
def double():
    plugin = Plugin()
    register_plugin(plugin, "double-test")
    yield SPEC
    unregister_plugin(plugin)


def test_no_inputs_is_a_usage_error_and_a_bad_item_an_input_error(double):
    from zoo.cli import app

    # the exception reaches zoo.cli.main, which exits with its exit_code
    result = CliRunner().invoke(app, ["predict", "double.test"])
    assert result.exception.exit_code == 2
    assert "model double.test: give at least one text input" in str(result.exception)
    result = CliRunner().invoke(app, ["predict", "double.test", "1.5", "x"])
    assert result.exception.exit_code == 1 and "item 2 is b'x', not a number" in str(result.exception)
    result = CliRunner().invoke(app, ["predict", "double.test", "--smiles", "CCO"])  # a flag of another kind
    assert result.exception.exit_code == 2 and "takes text inputs, not --smiles" in str(result.exception)
    result = CliRunner().invoke(app, ["predict", "double.test", "1.5"])
    assert result.exit_code == 0 and "1.5: 3.0" in result.output
    # the Python API: still an InputError, as every bad input is
    spec, fn, _ = zoo.predictor("double.test")
    with pytest.raises(InputError, match="give at least one text input") as info:
        zoo.predict(spec, fn, [])
    assert isinstance(info.value, UsageError)


def test_a_bad_item_past_the_first_batch_is_named_by_its_input_number(double):
    """Items run in batches of 4; the plugin numbers items within its batch."""
    spec, fn, _ = zoo.predictor("double.test")
    items = ["1"] * 8 + ["2", "2", "2", "x"]  # input 12 is item 4 of the third batch
    with pytest.raises(InputError) as info:
        zoo.predict(spec, fn, items)
    assert str(info.value) == ("item 4 is b'x', not a number (among inputs 9 to 12 of 12: item 1 is input 9), "
                               "so item 4 is input 12")
    bad_first = ["1"] * 4 + ["x", "2"]  # item 1 of its batch: nothing more to say
    with pytest.raises(InputError, match=r"\(among inputs 5 to 6 of 6: item 1 is input 5\)$"):
        zoo.predict(spec, fn, bad_first)


def test_a_binary_item_that_is_a_directory_or_missing_says_which(double, tmp_path):
    """A directory was "input file DIR does not exist"."""
    from zoo.cli import app

    binary = dataclasses.replace(double, name="double.binary", raw_kind="number", raw_binary=True)
    plugin = type("Binary", (), {"zoo_register_models": zoo.hookimpl(lambda self, register: register(binary))})()
    register_plugin(plugin, "double-binary")
    try:
        (tmp_path / "one").write_bytes(b"1.5")
        result = CliRunner().invoke(app, ["predict", "double.binary", str(tmp_path)])
        assert result.exception.exit_code == 1
        assert str(result.exception) == f"input file {tmp_path} is a directory; give the files in it, as {tmp_path}/*"
        result = CliRunner().invoke(app, ["predict", "double.binary", str(tmp_path / "two")])
        assert str(result.exception) == f"input file {tmp_path / 'two'} does not exist"
        result = CliRunner().invoke(app, ["predict", "double.binary", str(tmp_path / "one")])
        assert result.exit_code == 0 and result.output.endswith(": 3.0\n"), result.output
    finally:
        unregister_plugin(plugin)


def test_a_bad_file_past_the_first_batch_is_named_by_its_path(double, tmp_path):
    """The command line's files are named in the refusal, as the user gave them: the 6th of
    6 files (2nd of the second batch of 4) was "item 2 ... so item 2 is input 6", the file
    left to be found."""
    from zoo.cli import app

    binary = dataclasses.replace(double, name="double.files", raw_kind="number", raw_binary=True)
    plugin = type("Files", (), {"zoo_register_models": zoo.hookimpl(lambda self, register: register(binary))})()
    register_plugin(plugin, "double-files")
    try:
        files = [tmp_path / f"{k}.txt" for k in range(1, 7)]
        for k, path in enumerate(files, start=1):
            path.write_bytes(b"x" if k == 6 else b"1.5")
        result = CliRunner().invoke(app, ["predict", "double.files", *map(str, files)])
        assert result.exception.exit_code == 1
        assert str(result.exception) == (f"item 2 is b'x', not a number (among inputs 5 to 6 of 6: item 1 is input "
                                         f"5), so item 2 is input 6 ({files[-1]})")
    finally:
        unregister_plugin(plugin)

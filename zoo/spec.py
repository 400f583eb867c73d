"""What a model plugin registers: a `ModelSpec` and the small value types around it.

A spec is metadata kept apart from architecture code (as timm keeps `PretrainedCfg`
apart from its models): the signature with symbolic dynamic axes, how to build the
module, realistic sample inputs, the dataset, loss, task metric, training recipe and
per-precision tolerances. Specs are plain frozen dataclasses so the core can show,
serialize and compare them without importing any domain library.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from .errors import ZooError

if TYPE_CHECKING:
    import torch

#: what a model's `preprocess` accepts: items of this kind, each as bytes.
RAW_KINDS = ("text", "smiles", "image", "observation")
#: dtypes a TensorSpec may name; "string" is the protocol's BYTES (text, SMILES).
DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool", "string")
#: precisions a backend may build an artifact in.
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_\-]*(\.[a-z0-9][a-z0-9_\-]*)?$")


@dataclass(frozen=True)
class TensorSpec:
    """One named input or output. Symbolic entries in `shape` are dynamic axes."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]  # e.g. ("batch", 1, 8, 8) or ("batch", "seq")

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ZooError(f"tensor {self.name!r}: unknown dtype {self.dtype!r} (one of {', '.join(DTYPES)})")

    @property
    def dynamic_axes(self) -> dict[int, str]:
        return {i: d for i, d in enumerate(self.shape) if isinstance(d, str)}

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class AxisRange:
    """The range a dynamic axis is exported for: smallest, typical (tuning point), largest."""

    min: int
    opt: int
    max: int

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.opt <= self.max:
            raise ZooError(f"axis range must satisfy 1 <= min <= opt <= max, got {self}")


@dataclass(frozen=True)
class Tolerance:
    """Largest allowed |backend - reference| per element: atol + rtol * |reference|."""

    atol: float
    rtol: float = 0.0


@dataclass(frozen=True)
class Metric:
    """The task metric, computed from model outputs (numpy) and the dataset's targets."""

    name: str  # "accuracy", "rmse", "perplexity", "mean_return" ...
    #: (outputs over a dataset split, targets) -> value; for models measured on a dataset.
    compute: Callable[[Mapping[str, np.ndarray], np.ndarray], float] | None = None
    higher_is_better: bool = True
    #: (a runner-like callable, numpy in and out) -> value; for metrics measured by
    #: running the model, e.g. greedy episodes in a Gymnasium environment.
    evaluate: Callable[[Callable[[Mapping[str, np.ndarray]], Mapping[str, Any]]], float] | None = None

    def __post_init__(self) -> None:
        if (self.compute is None) == (self.evaluate is None):
            raise ZooError(f"metric {self.name!r} needs exactly one of `compute` (over a dataset) or `evaluate`")


@dataclass(frozen=True)
class Dataset:
    """A dataset that ships with a package or that the plugin generates: never downloaded."""

    name: str  # human description, e.g. "scikit-learn digits, 1797 8x8 images"
    #: split ("train" | "test") -> (inputs by name, targets); deterministic.
    load: Callable[[str], tuple[dict[str, np.ndarray], np.ndarray]]
    #: optional train-time augmentation of one batch (torch tensors, seeded generator).
    augment: Callable[[dict[str, "torch.Tensor"], "torch.Generator"], dict[str, "torch.Tensor"]] | None = None


@dataclass(frozen=True)
class Recipe:
    """Supervised training recipe; `zoo train` follows it exactly, so runs reproduce."""

    epochs: int
    batch_size: int
    lr: float
    weight_decay: float = 0.0
    optimizer: str = "adamw"  # "adamw" | "sgd"
    schedule: str = "onecycle"  # "onecycle" | "cosine" | "constant"
    seed: int = 0
    target: float | None = None  # the stated quality the recipe reaches on the test split
    #: training examples held out to select the best epoch and stop early (0: none)
    val_fraction: float = 0.1

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _default_tolerances() -> dict[str, Tolerance]:
    return {"fp32": Tolerance(1e-4, 1e-4), "fp16": Tolerance(2e-2, 2e-2), "bf16": Tolerance(1e-1, 5e-2)}


@dataclass(frozen=True)
class ModelSpec:
    """Everything the zoo needs to train, export, verify, serve and benchmark one model."""

    name: str  # lowercase `arch.tag`, e.g. "resnet8.digits"
    domain: str  # "vision" | "nlp" | "rl" | "drug" | anything a plugin adds
    task: str  # "image-classification", "object-detection", ...
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    build: Callable[[], "torch.nn.Module"]  # a fresh module for `config`, random init
    #: (batch size, rng) -> realistic inputs by name, as numpy arrays of the spec's dtypes.
    sample: Callable[[int, np.random.Generator], dict[str, np.ndarray]]
    #: range of every dynamic axis named in `inputs`; "batch" is always present.
    axes: Mapping[str, AxisRange] = field(default_factory=lambda: {"batch": AxisRange(1, 8, 32)})
    description: str = ""
    config: Mapping[str, Any] = field(default_factory=dict)  # architecture hyper-parameters
    #: config overrides for the tiny variant that the test suite runs.
    tiny_config: Mapping[str, Any] = field(default_factory=dict)
    #: builds this spec for another config (`get_model(name, **config)`); None: fixed.
    variant: Callable[..., "ModelSpec"] | None = None
    dataset: Dataset | None = None
    loss: Callable[[Mapping[str, "torch.Tensor"], "torch.Tensor"], "torch.Tensor"] | None = None
    metric: Metric | None = None
    recipe: Recipe | None = None  # None: not trained here (random init or pretrained)
    tolerances: Mapping[str, Tolerance] = field(default_factory=_default_tolerances)
    #: returns a state dict of real pretrained weights shipped by a package; None: none.
    pretrained: Callable[[], Mapping[str, "torch.Tensor"]] | None = None
    #: a training loop of the plugin's own (reinforcement learning) instead of the core's
    #: supervised loop: (spec, run: zoo.training.Run) -> (state dict, metrics). The `Run`
    #: gives seed, epochs, device and options, the progress bar, TensorBoard scalars and
    #: resume points; the core writes the checkpoint, so every model checkpoints the same way.
    trainer: Callable[..., tuple[Mapping[str, "torch.Tensor"], dict[str, Any]]] | None = None
    #: a domain check run after parity on every export and `zoo verify`:
    #: (reference, runner) -> JSON-able report; raises `ToleranceError` when it fails
    #: (e.g. a policy's actions must agree with PyTorch's on recorded observations).
    domain_check: Callable[[Callable, Callable], dict[str, Any]] | None = None
    #: domain-native inputs (`zoo predict`, the server's BYTES tensors): the kind of item
    #: (one of RAW_KINDS), items (bytes) -> model inputs, and outputs -> one JSON-able
    #: result per item. `preprocess` raises `InputError` naming a bad item.
    raw_kind: str | None = None
    preprocess: Callable[[Sequence[bytes]], dict[str, np.ndarray]] | None = None
    postprocess: Callable[[Mapping[str, np.ndarray]], list[Any]] | None = None
    #: language models: token ids -> text, for `zoo generate` (ids come from `preprocess`).
    detokenize: Callable[[Sequence[int]], str] | None = None
    plugin: str = ""  # filled in by the registry: the plugin that registered it

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ZooError(f"model name {self.name!r} must be lowercase `arch.tag` (letters, digits, _ and -)")
        if "batch" not in self.axes:
            raise ZooError(f"model {self.name}: axes must include 'batch'")
        if (self.preprocess is None) != (self.raw_kind is None):
            raise ZooError(f"model {self.name}: `preprocess` and `raw_kind` go together")
        if self.raw_kind is not None and self.raw_kind not in RAW_KINDS:
            raise ZooError(f"model {self.name}: raw_kind {self.raw_kind!r} is not one of {', '.join(RAW_KINDS)}")
        for t in self.inputs:
            missing = [a for a in t.dynamic_axes.values() if a not in self.axes]
            if missing:
                raise ZooError(f"model {self.name}: input {t.name} uses axes {missing} with no range in `axes`")

    @property
    def trainable(self) -> bool:
        if self.recipe is None:
            return False
        return self.trainer is not None or (self.dataset is not None and self.loss is not None)

    def configure(self, **overrides: Any) -> "ModelSpec":
        """This spec for another architecture config (timm's `create_model(name, **kw)`)."""
        if not overrides:
            return self
        unknown = sorted(set(overrides) - set(self.config))
        if unknown:
            raise ZooError(f"model {self.name}: unknown config {unknown}; known: {sorted(self.config)}")
        if self.variant is None:
            raise ZooError(f"model {self.name} has a fixed configuration")
        return replace(self.variant(**{**self.config, **overrides}), plugin=self.plugin)

    def tiny(self) -> "ModelSpec":
        """The small variant the test suite runs (same name, same signature kind)."""
        return self.configure(**self.tiny_config)

    def tolerance(self, precision: str) -> Tolerance:
        if precision not in self.tolerances:
            raise ZooError(f"model {self.name} states no tolerance for precision {precision}")
        return self.tolerances[precision]

    def batch_sizes(self) -> tuple[int, ...]:
        """Smallest, typical and largest batch: where parity is checked."""
        r = self.axes["batch"]
        return tuple(sorted({r.min, r.opt, r.max}))

    def matches(self, pattern: str | None) -> bool:
        return pattern is None or fnmatch.fnmatchcase(self.name, pattern.lower())

    def to_json(self) -> dict[str, Any]:
        """Everything but callables: for `zoo info --json` and manifests."""
        return {
            "name": self.name,
            "domain": self.domain,
            "task": self.task,
            "description": self.description,
            "plugin": self.plugin,
            "config": dict(self.config),
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
            "axes": {k: [v.min, v.opt, v.max] for k, v in self.axes.items()},
            "dataset": self.dataset.name if self.dataset else None,
            "metric": {"name": self.metric.name, "higher_is_better": self.metric.higher_is_better} if self.metric else None,
            "recipe": self.recipe.to_json() if self.recipe else None,
            "tolerances": {p: {"atol": t.atol, "rtol": t.rtol} for p, t in self.tolerances.items()},
            "pretrained": self.pretrained is not None,
            "raw_input": self.raw_kind,
        }

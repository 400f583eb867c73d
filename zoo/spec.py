"""What a model plugin registers: a `ModelSpec` and the small value types around it.

A spec is metadata kept apart from architecture code (as timm keeps `PretrainedCfg`
apart from its models): the signature with symbolic dynamic axes, how to build the
module, realistic sample inputs, the dataset, loss, task metric, training recipe and
per-precision tolerances. Specs are plain frozen dataclasses so the core can show,
serialize and compare them without importing any domain library.
"""

from __future__ import annotations

import fnmatch
import math
import numbers
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from .errors import UnsupportedError, UsageError, ZooError

if TYPE_CHECKING:
    import torch

#: a domain-native input kind's name (`ModelSpec.raw_kind`): any plugin names its own
#: ("text", "smiles", "image", "observation" are the built-in plugins'); it is also the
#: BYTES input's name on the server.
RAW_KIND = re.compile(r"^[a-z][a-z0-9_]*$")
#: dtypes a TensorSpec may name; "string" is the protocol's BYTES (text, SMILES).
DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool", "string")
#: precisions a backend may build an artifact in.
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
#: how a model is quantized to int8 (`ModelSpec.quantization`): "static" fixes activation
#: scales from calibration data and runs convolutions on int8 kernels end to end (Q/DQ);
#: "dynamic" quantizes weights ahead of time and activations per call, which keeps
#: transformers, recurrent nets and MLPs accurate but makes CNNs slower than fp32.
QUANTIZATIONS = ("static", "dynamic")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_\-]*(\.[a-z0-9][a-z0-9_\-]*)?$")


@dataclass(frozen=True)
class TensorSpec:
    """One named input or output. Symbolic entries in `shape` are dynamic axes."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]  # e.g. ("batch", 1, 8, 8) or ("batch", "seq")
    #: the inclusive range every element must lie in, where the model knows it: token ids
    #: (0, vocab - 1), a mask or one-hot features (0, 1). The server refuses a request with a
    #: value outside it (400 naming the input) before it reaches the engine, where an
    #: out-of-range index would fail the whole batch or read past an embedding table.
    value_range: tuple[float, float] | None = None
    #: outputs: the class names along the last axis (a classifier's logits), one per
    #: index. Metadata, not signature: an artifact's manifest records them beside the
    #: model, and the server appends them to the classification extension's
    #: "score:index:label" strings (Triton's `label_filename`).
    labels: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.dtype, (tuple, list)) and isinstance(self.shape, str) and self.shape in DTYPES:
            raise ZooError(f"tensor {self.name!r}: shape and dtype are the other way round: TensorSpec takes "
                           f"(name, dtype, shape), as TensorSpec({self.name!r}, {self.shape!r}, {tuple(self.dtype)!r})")
        if not isinstance(self.dtype, str) or self.dtype not in DTYPES:
            raise ZooError(f"tensor {self.name!r}: unknown dtype {self.dtype!r} (one of {', '.join(DTYPES)})")
        self._check_shape()
        if self.value_range is not None:
            low, high = self.value_range
            if self.dtype in ("string", "bool") or not low <= high:
                raise ZooError(f"tensor {self.name!r}: value_range must be (low, high) with low <= high on a "
                               f"numeric dtype, got {self.value_range!r} on {self.dtype}")
        if self.labels is not None:
            self._check_labels()

    def _check_shape(self) -> None:
        # a str is a sequence too: "batch" would be read as five axes b, a, t, c, h
        shape = self.shape
        fine = isinstance(shape, (tuple, list)) and all(
            isinstance(d, str) and d or isinstance(d, numbers.Integral) and not isinstance(d, bool) and d > 0
            for d in shape)
        if not fine:
            raise ZooError(f"tensor {self.name!r}: shape must be a tuple of positive sizes and axis names, as "
                           f"(\"batch\", 3), got {shape!r}")
        # a list or numpy sizes given: stored as a tuple of ints (hashable, written to JSON)
        object.__setattr__(self, "shape", tuple(d if isinstance(d, str) else int(d) for d in shape))

    def _check_labels(self) -> None:
        labels = self.labels
        if not isinstance(labels, (tuple, list)) or not all(isinstance(x, str) for x in labels):
            raise ZooError(f"tensor {self.name!r}: labels must be a sequence of strings, one class name per index "
                           f"of the last axis, got {labels!r}")
        labels = tuple(labels)
        object.__setattr__(self, "labels", labels)  # a list given: stored as a tuple (hashable, like the rest)
        broken = [x for x in labels if "\n" in x or "\r" in x]
        if broken:  # Triton's label files hold one label a line
            raise ZooError(f"tensor {self.name!r}: labels hold one line each; {broken[0]!r} has a line break")
        last = self.shape[-1] if self.shape else None
        if self.dtype in ("string", "bool") or not isinstance(last, int):
            raise ZooError(f"tensor {self.name!r}: labels name the classes along a numeric output's last axis, "
                           f"which must have a fixed size; it is {self.dtype}{list(self.shape)}")
        if len(labels) != last:
            raise ZooError(f"tensor {self.name!r}: {len(labels)} labels for a last axis of {last} classes "
                           f"({self.dtype}{list(self.shape)}); give one label per class")

    @property
    def dynamic_axes(self) -> dict[int, str]:
        return {i: d for i, d in enumerate(self.shape) if isinstance(d, str)}

    def out_of_range(self, array: np.ndarray) -> str | None:
        """Why `array` breaks `value_range` (the first offending value), or None."""
        if self.value_range is None or array.size == 0:
            return None
        low, high = self.value_range
        bad = ~((array >= low) & (array <= high))  # NaN fails both comparisons
        if not bad.any():
            return None
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        # a float as its own dtype prints it (float32 -0.1, not -0.10000000149011612)
        value = str(array[index]) if array.dtype.kind == "f" else repr(array[index].item())
        return (f"input {self.name!r} has value {value} at index {list(index)}; "
                f"it takes values from {_number(low)} to {_number(high)}")

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.value_range is not None:
            data["value_range"] = list(self.value_range)
        if self.labels is not None:
            data["labels"] = list(self.labels)
        return data


def name_matches(name: str, pattern: str | None) -> bool:
    """Whether a model name matches a wildcard (`resnet*`; None matches every name)."""
    return pattern is None or fnmatch.fnmatchcase(name, pattern.lower())


def _number(x: float) -> str:
    """An integer as written, up to 2**53 (float32's largest finite value is 3.4028234663852886e+38,
    not 39 digits); any other number as Python writes it."""
    return str(int(x)) if float(x).is_integer() and abs(x) <= 2 ** 53 else repr(float(x))


@dataclass(frozen=True)
class AxisRange:
    """The range a dynamic axis is exported for: smallest, typical (tuning point), largest.

    An input's axis starts at 1; an axis only outputs have (the boxes a detector keeps)
    may start at 0, an output with nothing in it."""

    min: int
    opt: int
    max: int

    def __post_init__(self) -> None:
        values = (self.min, self.opt, self.max)
        if not all(_is_int(v) for v in values):
            raise ZooError(f"{self}: an axis range is three integer sizes, smallest, typical and largest, as "
                           f"AxisRange(1, 8, 32)")
        if not 0 <= self.min <= self.opt <= self.max or self.max < 1:
            pairs = (("min", self.min, "opt", self.opt), ("opt", self.opt, "max", self.max))
            broken = (f"min {self.min} < 0" if self.min < 0 else f"max {self.max} < 1" if self.max < 1 else
                      next(f"{a} {x} > {b} {y}" for a, x, b, y in pairs if x > y))
            raise ZooError(f"{self}: an axis range must satisfy 0 <= min <= opt <= max and max >= 1 (smallest, "
                           f"typical, largest; 0 only where outputs alone have the axis), and here {broken}")


@dataclass(frozen=True)
class Tolerance:
    """How close an artifact at one precision must stay to the PyTorch fp32 reference.

    `atol`/`rtol` bound every output element: |artifact - reference| <= atol + rtol * |reference|.
    At fp32, fp16 and bf16 that is the check that matters. At int8 every weight and
    activation is rounded to one of 256 levels, so outputs move by a few percent of their
    range, more where errors add up through depth: an elementwise bound tight enough to
    mean something would refuse good artifacts. There the elementwise bound is stated
    loose, per model, to catch a broken graph (a wrong scale, a lost node), and what
    users care about is gated instead: `metric_drop` bounds how much worse the task
    metric may be through the artifact than through PyTorch, and the plugin's domain
    check (action agreement, embedding cosine) holds its int8 threshold.
    """

    atol: float
    rtol: float = 0.0
    #: largest allowed worsening of the task metric against the fp32 reference, in the
    #: metric's units (0.01: one accuracy point; 0.1 of RMSE; 0.5 of perplexity), the
    #: direction from `Metric.higher_is_better`. None: the change is reported, not gated.
    metric_drop: float | None = None
    #: the outputs held to atol/rtol (None: all). Decoded outputs whose slots re-order
    #: when near-tied scores swap (a detector's top-k boxes) are left to the metric,
    #: while the raw maps they are decoded from are still compared.
    compare: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        bounds = {"atol": self.atol, "rtol": self.rtol, **({"metric_drop": self.metric_drop}
                                                              if self.metric_drop is not None else {})}
        unbounded = [name for name, value in bounds.items() if not _is_number(value) or not math.isfinite(value)]
        if unbounded:  # inf was written to the manifest, which then refused every artifact of the model
            raise ZooError(f"{self}: {', '.join(unbounded)} must be a finite number (a bound; metric_drop=None leaves "
                           f"the metric ungated)")
        if self.atol < 0 or self.rtol < 0 or (self.metric_drop is not None and self.metric_drop < 0):
            raise ZooError(f"tolerances are bounds and cannot be negative: {self}")

    def compares(self, output: str) -> bool:
        return self.compare is None or output in self.compare

    def to_json(self) -> dict[str, Any]:
        return {"atol": self.atol, "rtol": self.rtol, "metric_drop": self.metric_drop,
                "compare": list(self.compare) if self.compare is not None else None}


#: words in a metric's name that make it lower-is-better when it does not say (`Metric`)
LOWER_IS_BETTER = frozenset({"loss", "error", "err", "mse", "rmse", "mae", "mape", "nll", "perplexity", "ppl", "wer",
                             "cer", "distance", "regret"})
NEGATED = frozenset({"neg", "negative", "negated"})


@dataclass(frozen=True)
class Metric:
    """The task metric, computed from model outputs (numpy) and the dataset's targets."""

    name: str  # "accuracy", "rmse", "perplexity", "mean_return" ...
    #: (outputs over a dataset split, targets) -> value; for models measured on a dataset.
    compute: Callable[[Mapping[str, np.ndarray], np.ndarray], float] | None = None
    #: the direction that selects the best epoch, checks `Recipe.target` and gates
    #: `metric_drop`. None (unset): from the name, as Keras's `mode="auto"` does: a name
    #: with a word of LOWER_IS_BETTER ("rmse", "val_loss", "word_error_rate") is lower-is-better
    #: unless it is negated ("neg_rmse", scikit-learn's scorers), any other higher.
    higher_is_better: bool | None = None
    #: (a runner-like callable, numpy in and out) -> value; for metrics measured by
    #: running the model, e.g. greedy episodes in a Gymnasium environment.
    evaluate: Callable[[Callable[[Mapping[str, np.ndarray]], Mapping[str, Any]]], float] | None = None

    def __post_init__(self) -> None:
        if (self.compute is None) == (self.evaluate is None):
            raise ZooError(f"metric {self.name!r} needs exactly one of `compute` (over a dataset) or `evaluate`")
        if self.higher_is_better is None:
            words = set(re.split(r"[^a-z0-9]+", str(self.name).lower()))
            # scikit-learn's scorers negate errors to keep higher-is-better: "neg_mean_squared_error"
            object.__setattr__(self, "higher_is_better", not words & LOWER_IS_BETTER or bool(words & NEGATED))
        elif not isinstance(self.higher_is_better, bool):
            raise ZooError(f"metric {self.name!r}: higher_is_better={self.higher_is_better!r}; expected True or False "
                           f"(or None: from the name)")

    def value(self, model: str, where: str, *args: Any) -> float:
        """`compute(outputs, targets)` or `evaluate(fn)`, as one number: the plugin's failure,
        a value that is not one number, or NaN is an error naming the model and the metric
        (where: "the validation split", "the test split", ...)."""
        function = self.compute if self.compute is not None else self.evaluate
        try:
            result = function(*args)
        except ZooError:
            raise
        except Exception as exc:  # the plugin's code: one line naming it, not an internal error
            raise ZooError(f"model {model}: its metric {self.name!r} failed on {where}: "
                           f"{type(exc).__name__}: {str(exc)[:300]}") from None
        try:
            number = float(result)
        except (TypeError, ValueError):
            shape = getattr(result, "shape", None)
            raise ZooError(f"model {model}: its metric {self.name!r} returned {type(result).__name__}"
                           f"{f' of shape {tuple(shape)}' if shape is not None else ''} on {where}, not one "
                           f"number") from None
        if math.isnan(number):
            raise ZooError(f"model {model}: its metric {self.name!r} returned NaN on {where} (a metric of an "
                           f"empty selection, or of NaN outputs?)")
        return number


@dataclass(frozen=True)
class Dataset:
    """A dataset that ships with a package or that the plugin generates: never downloaded."""

    name: str  # human description, e.g. "scikit-learn digits, 1797 8x8 images"
    #: split ("train" | "test") -> (inputs by name, targets); deterministic.
    load: Callable[[str], tuple[dict[str, np.ndarray], np.ndarray]]
    #: optional train-time augmentation of one batch (torch tensors, seeded generator).
    augment: Callable[[dict[str, "torch.Tensor"], "torch.Generator"], dict[str, "torch.Tensor"]] | None = None


#: seeds run: torch.manual_seed takes 0 to 2**64 - 1 (a negative one is read modulo 2**64)
SEEDS = 2 ** 64


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
    #: seeds the quality tier (`make quality`) trains it over: three where a run is short
    quality_seeds: int = 3
    #: the layout a convolutional model trains in: channels-last (NHWC) or not in every
    #: precision, where it was measured faster one way; None: channels-last with autocast only
    channels_last: bool | None = None

    def __post_init__(self) -> None:
        # optimizer and schedule names, and whether lr 0 means anything, are the trainer's:
        # the supervised loop checks its own, a plugin's trainer (spec.trainer) may differ
        problems = [f"{name} must be {what}, got {value!r}" for name, value, ok, what in (
            ("epochs", self.epochs, _is_int(self.epochs) and self.epochs >= 1, "an integer of at least 1"),
            ("batch_size", self.batch_size, _is_int(self.batch_size) and self.batch_size >= 1,
             "an integer of at least 1"),
            ("lr", self.lr, _is_number(self.lr) and 0 <= self.lr < math.inf, "a number of at least 0"),
            ("weight_decay", self.weight_decay, _is_number(self.weight_decay) and 0 <= self.weight_decay < math.inf,
             "a number of at least 0"),
            ("val_fraction", self.val_fraction, _is_number(self.val_fraction) and 0 <= self.val_fraction < 1,
             "in [0, 1)"),
            ("seed", self.seed, _is_int(self.seed) and 0 <= self.seed < SEEDS, "an integer from 0 to 2**64 - 1"),
            ("channels_last", self.channels_last, self.channels_last is None or isinstance(self.channels_last, bool),
             "True, False or None"))
            if not ok]
        if problems:
            raise ZooError(f"training recipe: {'; '.join(problems)}")

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


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
    #: per precision; a precision with no entry is not offered for this model (int8 only
    #: where the plugin measured what quantization costs and bounds it).
    tolerances: Mapping[str, Tolerance] = field(default_factory=_default_tolerances)
    #: the int8 method that fits this architecture (one of QUANTIZATIONS), required with an
    #: "int8" tolerance; `zoo export --quantization` overrides it for one export, which is
    #: then written as `<model>.<backend>.int8-<method>` beside this method's `...int8`.
    quantization: str | None = None
    #: returns a state dict of real pretrained weights shipped by a package; None: none.
    pretrained: Callable[[], Mapping[str, "torch.Tensor"]] | None = None
    #: a training loop of the plugin's own (reinforcement learning) instead of the core's
    #: supervised loop: (spec, run: zoo.training.Run) -> (state dict, metrics). The `Run`
    #: gives seed, epochs, device and options, the progress bar, TensorBoard scalars and
    #: resume points; the core writes the checkpoint, so every model checkpoints the same way.
    trainer: Callable[..., tuple[Mapping[str, "torch.Tensor"], dict[str, Any]]] | None = None
    #: a domain check run after parity on every export and `zoo verify`:
    #: (reference, runner, precision="fp32") -> JSON-able report; raises `ToleranceError`
    #: when it fails (e.g. a policy's actions must agree with PyTorch's on recorded
    #: observations). `precision` (keyword) picks its threshold: int8 is held to a looser one.
    domain_check: Callable[..., dict[str, Any]] | None = None
    #: domain-native inputs (`zoo predict`, the server's BYTES tensors): the kind of item
    #: (a name the plugin chooses, matching RAW_KIND), items (bytes) -> model inputs, and
    #: outputs -> one JSON-able result per item. `preprocess` raises `InputError` naming a
    #: bad item. `raw_binary`: items are binary (an image, a recording): `zoo predict`
    #: reads each from a file named on its command line; otherwise items are UTF-8 text,
    #: given on the command line and checked as UTF-8 before `preprocess` sees them.
    raw_kind: str | None = None
    raw_binary: bool = False
    preprocess: Callable[[Sequence[bytes]], dict[str, np.ndarray]] | None = None
    postprocess: Callable[[Mapping[str, np.ndarray]], list[Any]] | None = None
    #: language models: token ids -> text, for `zoo generate` (ids come from `preprocess`).
    detokenize: Callable[[Sequence[int]], str] | None = None
    #: language models: token ids that end a generation (an end-of-sequence token); `zoo
    #: generate` stops at the first it generates, which is not part of the text
    stop_tokens: tuple[int, ...] = ()
    plugin: str = ""  # filled in by the registry: the plugin that registered it

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ZooError(f"model name {self.name!r} must be lowercase `arch.tag` (letters, digits, _ and -)")
        self._check_fields()
        if "batch" not in self.axes:
            raise ZooError(f"model {self.name}: axes must include 'batch'")
        if self.axes["batch"].min < 1:
            raise ZooError(f"model {self.name}: the batch axis starts at 1, a request of one row; here "
                           f"{self.axes['batch']}")
        if (self.preprocess is None) != (self.raw_kind is None):
            raise ZooError(f"model {self.name}: `preprocess` and `raw_kind` go together")
        if self.raw_kind is not None and not RAW_KIND.match(self.raw_kind):
            raise ZooError(f"model {self.name}: raw_kind {self.raw_kind!r} must be a lowercase name (letters, "
                           f"digits and _, starting with a letter): it names the server's BYTES input")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ZooError(f"model {self.name}: quantization {self.quantization!r} is not one of "
                           f"{', '.join(QUANTIZATIONS)}")
        if "int8" in self.tolerances and self.quantization is None:
            raise ZooError(f"model {self.name} states an int8 tolerance but no `quantization` method "
                           f"({' or '.join(QUANTIZATIONS)})")
        for kind, tensors in (("input", self.inputs), ("output", self.outputs)):
            if not tensors:  # nothing to trace, serve or compare: every exporter fails on it, each its own way
                raise ZooError(f"model {self.name}: the spec declares no {kind}s; declare at least one "
                               f"zoo.TensorSpec in `{kind}s`")
            names = [t.name for t in tensors]
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ZooError(f"model {self.name}: {kind} names must be unique; {twice} appear more than once")
        both = sorted({t.name for t in self.inputs} & {t.name for t in self.outputs})
        if both:
            raise ZooError(f"model {self.name}: {both} name both an input and an output; a graph (ONNX, Triton's "
                           f"config) names each tensor once: rename the output")
        outputs = {t.name for t in self.outputs}
        for precision, tol in self.tolerances.items():
            unknown = sorted(set(tol.compare or ()) - outputs)
            if unknown or tol.compare == ():
                raise ZooError(f"model {self.name}: the {precision} tolerance compares outputs {unknown or '()'}; "
                               f"name at least one of its outputs {sorted(outputs)}")
        # 0-d tensors do not survive the whole path: numpy's ascontiguousarray (the torch
        # runners) makes them shape [1], Triton needs dims [1] with an empty reshape, whose
        # clients then send [1] where zoo serve expects []. One value is shape (1,).
        for kind, t in [("input", t) for t in self.inputs] + [("output", t) for t in self.outputs]:
            if t.shape == ():
                raise ZooError(f"model {self.name}: {kind} {t.name!r} has shape (), and 0-d tensors are not "
                               f"supported end to end (Triton and the torch runners send them as shape [1]); "
                               f"declare shape (1,) for one value per request, or ('batch',) for one per row")
        labelled = [t.name for t in self.inputs if t.labels is not None]
        if labelled:
            raise ZooError(f"model {self.name}: input {labelled[0]!r} has labels; labels name the classes of an "
                           f"output")
        for t in self.inputs:
            missing = [a for a in t.dynamic_axes.values() if a not in self.axes]
            if missing:
                raise ZooError(f"model {self.name}: input {t.name} uses axes {missing} with no range in `axes`")
            empty = [a for a in t.dynamic_axes.values() if self.axes[a].min == 0]
            if empty:
                r = self.axes[empty[0]]
                raise ZooError(f"model {self.name}: input {t.name!r} has axis {empty[0]!r}, whose range starts at 0; "
                               f"an input's axis starts at 1 (0 is for an axis only outputs have, as the boxes a "
                               f"detector keeps): AxisRange(1, {max(r.opt, 1)}, {r.max})")
        sized = {a for t in self.inputs for a in t.dynamic_axes.values()}
        for t in self.outputs:  # Triton's config would say -1 there, and nothing would check the size
            unsized = [a for a in t.dynamic_axes.values() if a not in sized and a not in self.axes]
            if unsized:
                raise ZooError(f"model {self.name}: output {t.name!r} has axes {unsized}, which no input has and "
                               f"which have no range in `axes`: give the size where it is fixed (as "
                               f"(\"batch\", 3)), or a range in `axes` where it varies with the inputs' values "
                               f"(the boxes a detector keeps)")

        used = {a for t in self.inputs + self.outputs for a in t.dynamic_axes.values()}
        unused = sorted(set(self.axes) - used - {"batch"})
        if unused:  # a range nothing reads: a fixed size written where the axis was meant, most likely
            raise ZooError(f"model {self.name}: `axes` gives a range to {unused}, which no input or output has in "
                           f"its shape: name the axis in the shapes where its size varies (as (\"batch\", "
                           f"\"{unused[0]}\")), or remove it from `axes`")

    def _check_fields(self) -> None:
        """`inputs` and `outputs` are sequences of TensorSpec (a list is kept as a tuple),
        `axes` maps axis names to AxisRange: each error names the model and the field."""
        for kind in ("inputs", "outputs"):
            tensors = getattr(self, kind)
            if isinstance(tensors, TensorSpec):
                raise ZooError(f"model {self.name}: `{kind}` is one zoo.TensorSpec; it takes a tuple of them: "
                               f"{kind}=(zoo.TensorSpec(...),), with the comma")
            if not isinstance(tensors, (tuple, list)) or not all(isinstance(t, TensorSpec) for t in tensors):
                raise ZooError(f"model {self.name}: `{kind}` must be a tuple of zoo.TensorSpec, got "
                               f"{type(tensors).__name__}: {str(tensors)[:200]}")
            object.__setattr__(self, kind, tuple(tensors))
        if not isinstance(self.tolerances, Mapping) or not all(
                isinstance(k, str) and isinstance(v, Tolerance) for k, v in self.tolerances.items()):
            raise ZooError(f"model {self.name}: `tolerances` must map each precision to a zoo.Tolerance, as "
                           f"{{\"fp32\": zoo.Tolerance(1e-4, 1e-4)}} (atol, rtol), got {str(self.tolerances)[:200]}")
        module = hasattr(self.build, "forward") and hasattr(self.build, "state_dict")
        if module and not isinstance(self.build, type):  # a module instance, not what makes one
            raise ZooError(f"model {self.name}: `build` is a module ({type(self.build).__name__}(...)), and it takes "
                           f"what makes one, called for each new module: the class (build={type(self.build).__name__}"
                           f") or a function returning a new module")
        if not callable(self.build):
            raise ZooError(f"model {self.name}: `build` must be the module's class or a function returning a new "
                           f"module, got {type(self.build).__name__}: {str(self.build)[:100]}")
        stops = self.stop_tokens
        if not isinstance(stops, (tuple, list)) or not all(
                isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 0 for t in stops):
            raise ZooError(f"model {self.name}: stop_tokens must be token ids (integers >= 0), as (50256,), got "
                           f"{str(stops)[:200]}")
        object.__setattr__(self, "stop_tokens", tuple(int(t) for t in stops))
        if not isinstance(self.axes, Mapping) or not all(
                isinstance(k, str) and isinstance(v, AxisRange) for k, v in self.axes.items()):
            raise ZooError(f"model {self.name}: `axes` must map each axis name to a zoo.AxisRange, as "
                           f"{{\"batch\": zoo.AxisRange(1, 8, 32)}}, got {str(self.axes)[:200]}")

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
            raise UsageError(f"model {self.name}: unknown config {unknown}; known: {sorted(self.config)}")
        for key, value in overrides.items():
            if (kind := _config_kind(self.config[key], value)) is not None:
                raise UsageError(f"model {self.name}: config {key} takes {kind} ({self.config[key]!r} here), got "
                                 f"{value!r}")
        if all(self.config[k] == v for k, v in overrides.items()):  # its own values: this spec, as it is
            return self
        if self.variant is None:
            changed = sorted(k for k, v in overrides.items() if self.config[k] != v)
            raise ZooError(f"model {self.name} has a fixed configuration (no `variant` to build another), so "
                           f"config {changed} cannot change: "
                           f"{', '.join(f'{k}={overrides[k]!r} (is {self.config[k]!r})' for k in changed)}")
        return replace(self.variant(**{**self.config, **overrides}), plugin=self.plugin)

    def tiny(self) -> "ModelSpec":
        """The small variant the test suite runs (same name, same signature kind)."""
        return self.configure(**self.tiny_config)

    def tolerance(self, precision: str) -> Tolerance:
        if precision not in self.tolerances:
            why = (": int8 is offered only where the model's plugin has measured what quantization costs it "
                   "and states how much may be lost" if precision == "int8" else "")
            if precision == "int8" and self.quantization is not None:  # the method without the bound it is held to
                why += (f" (it names quantization {self.quantization!r} and no int8 tolerance: add "
                        f"tolerances={{..., 'int8': zoo.Tolerance(atol, rtol, metric_drop=...)}} with the bound "
                        f"you measured)")
            raise UnsupportedError(f"model {self.name} states no tolerance for precision {precision}, so it "
                                   f"cannot be exported in {precision}{why}; its precisions: "
                                   f"{', '.join(self.tolerances)}")
        return self.tolerances[precision]

    @property
    def has_batch_axis(self) -> bool:
        """Whether an input has the "batch" axis. A model without one (a fixed-size matrix in;
        Triton's `max_batch_size: 0`) takes one shape, whatever batch size its sample is asked for."""
        return any("batch" in t.shape for t in self.inputs)

    def batch_sizes(self) -> tuple[int, ...]:
        """Smallest, typical and largest batch: where parity is checked. 1 alone for a model
        without a batch axis: its one shape, run once (at 8 and 32 it was the same run again)."""
        if not self.has_batch_axis:
            return (1,)
        r = self.axes["batch"]
        return tuple(sorted({r.min, r.opt, r.max}))

    def batch_notes(self) -> list[str]:
        """What the reports of the batch sizes run (`zoo check`, parity, test vectors) note:
        for a model without a batch axis, that there were none."""
        return [] if self.has_batch_axis else [f"{self.name} has no batch axis: its inputs have one shape, run once"]

    def matches(self, pattern: str | None) -> bool:
        return name_matches(self.name, pattern)

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
            "tolerances": {p: t.to_json() for p, t in self.tolerances.items()},
            "quantization": self.quantization,
            "pretrained": self.pretrained is not None,
            "raw_input": self.raw_kind,
            "raw_binary": self.raw_binary,
        }


def _config_kind(default: Any, value: Any) -> str | None:
    """What a config value must be, where `value` is not that: the kind of the key's
    default (an int for an int, a number for a float, a bool, a string, a list for a list
    or tuple; None, or any other default, takes anything). A `--config width=abc` reached
    the plugin's build as a string and failed there, inside the plugin's code."""
    if default is None:
        return None
    if isinstance(default, bool):
        return None if isinstance(value, bool) else "a bool"
    if isinstance(default, numbers.Integral):
        return None if isinstance(value, numbers.Integral) and not isinstance(value, bool) else "an int"
    if isinstance(default, numbers.Real):
        return None if isinstance(value, numbers.Real) and not isinstance(value, bool) else "a number"
    if isinstance(default, str):
        return None if isinstance(value, str) else "a string"
    if isinstance(default, (list, tuple)):
        return None if isinstance(value, (list, tuple)) else "a list"
    return None

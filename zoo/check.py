"""`zoo check`: does the PyTorch module do what its spec says, before any backend sees it.

Everything an export writes is derived from the spec: the exporters trace the module
with the spec's dynamic axes, `config.pbtxt` and the server's checks are written from
its signature, and parity samples it at the smallest, typical and largest batch. A
module whose output is (batch, 3) under a spec saying (batch, 2) would otherwise export
with a configuration that says [-1, 2]; a `sample` that ignores its batch size would
make parity claim batches it never ran. So `check` draws the sample and runs the module
as an export does, at each of those batch sizes, and collects every departure from the
spec, one line each naming the model, the field and what was expected:

- sample: every input present, with the spec's dtype and rank, fixed sizes exact, the
  batch axis the size asked for, other dynamic axes within their range and the same in
  every input that names them, values within `value_range`;
- forward: the module takes the spec's inputs by name and returns exactly its outputs
  (`zoo.tensors.call_module` binds and flattens them, and names what is missing or extra);
- outputs: dtypes as declared (a "float32" output is float32: the reference is fp32),
  fixed sizes exact, each symbolic size equal to that axis's size in the inputs, and
  every floating value finite.

Every run gets its own copy of the inputs; at the typical batch a forward that modifies an
input in place (`x -= self.mean`) fails the check naming it (the reference runs on the
caller's arrays: parity's samples, the server's request buffers), and a second run that
answers otherwise fails it as nondeterministic (dropout left on, sampling) unless the
forward changed the module's state, which the state check names.
After the last batch, the module's parameters and buffers must be as they were before
the first (a forward that updates them in place answers differently on every call, which no
export can capture; they are put back). On the CPU, an integer input without `value_range`
that the module indexes a table with (an id out of it raises IndexError) is a warning
naming the range to declare: without it, ONNX Runtime and OpenVINO answer such an id with
an engine error, a row of zeros or the last row, and only the declared range has every
runner and the server refuse it by name. An integer input with `value_range` is run at both
ends of it (every such input at its low end, then at its high end, at the smallest batch):
a forward that raises there (ids up to 100 into a table of 100 rows) fails the check,
naming the input, the value and the error, since the server takes every value in range;
one that runs there is held to the outputs' spec as a sample's run is (`k` at 10 had
`torch.topk` answer 10 columns where the spec declares at most 5).
Likewise each dynamic axis but the batch is run one and three past its sampled size (the
sample grown along it: padded where an input masks the axis, else repeated): a forward that takes only some sizes of its range (a U-Net's
skip connections, a reshape into pairs) fails the check there. A module with attention is
run again with PyTorch's fast path off: nn.TransformerEncoder given a padding mask answers 0
at padded positions on it (nested tensors) where every export computes values, and that
difference fails the check with the fix (enable_nested_tensor=False). The forward is run once
more with every operator it dispatches recorded: one that no exporter captures
(`pack_padded_sequence`) fails the check with what to write instead; so do TorchScript
modules, and a non-persistent buffer two builds give different values (no export saves it).

It also warns when an output's magnitude at the typical batch is so small against the
precision's `atol` that parity holds it relative to its scale instead
(`zoo.verify.effective_atol`), and when zero-padding a dynamic axis changes its outputs
(`zoo.padding`: the server will not batch its requests of different lengths together).
`zoo export` runs it before any backend work and refuses with the same lines (`SpecError`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from .errors import SpecError, ZooError, first_line
from .spec import ModelSpec, TensorSpec
from .arrays import as_numpy
from .checkpoint import built
from .tensors import TORCH_DTYPES, call_module, to_torch
from .train import ieee_fp32
from .inputs import dataset_splits, load_split
from .padding import PAD, padding_safe, ragged_axes, rows_independent
from .triton import rows_batched
from .vectors import INTEGER, check_ends, filled, range_ends
from .verify import RELATIVE_BELOW


@dataclass
class Check:
    """One check at one batch size: what it is and what was wrong (nothing: it passed)."""

    name: str  # "sample" | "forward" | "outputs" | "state" | "value_range" | "dataset train" | "dataset test"
    batch: int | None  # None: a check of no one batch size (a dataset split)
    problems: list[str] = field(default_factory=list)
    skipped: str | None = None  # why it did not run (the sample it needs is wrong)

    @property
    def passed(self) -> bool:
        return not self.problems and self.skipped is None

    def to_json(self) -> dict[str, Any]:
        return {"check": self.name, "batch": self.batch, "passed": self.passed, "problems": self.problems,
                "skipped": self.skipped}


@dataclass
class Report:
    model: str
    precision: str
    checks: list[Check] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # facts about what ran, neither problems nor warnings
    rows_dependent: str | None = None  # why a row's outputs change batched with others (`_rows_dependent`)

    @property
    def failures(self) -> list[str]:
        return [p for c in self.checks for p in c.problems]

    @property
    def passed(self) -> bool:
        return not self.failures

    def raise_for_failures(self) -> None:
        if self.failures:
            raise SpecError("\n".join(self.failures))

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "precision": self.precision, "passed": self.passed,
                "checks": [c.to_json() for c in self.checks], "warnings": self.warnings, "notes": self.notes}


def check(spec: ModelSpec, module: torch.nn.Module, precision: str = "fp32", device: str = "cpu",
          seed: int = 0) -> Report:
    """Run `module` (eval mode, on `device`) as an export will, and report every departure from `spec`.

    The samples are drawn as parity draws them (the same seed, the same batch sizes), so
    what is checked here is what parity will compare."""
    report = Report(spec.name, precision, notes=spec.batch_notes())
    scripted = _scripted(spec, module)
    if scripted:  # TorchScript runs none of what follows as a module does (and has no get_submodule)
        report.checks.append(Check("forward", None, scripted))
        return report
    rng = np.random.default_rng(seed)
    typical = spec.axes["batch"].opt if spec.has_batch_axis else 1

    def at(batch: int) -> int | None:  # the batch size a row names: none, for a model without a batch axis
        return batch if spec.has_batch_axis else None

    state = _state(module)
    for batch in spec.batch_sizes():
        sample = Check("sample", at(batch))
        report.checks.append(sample)
        try:
            inputs = spec.sample(batch, rng)
        except Exception as exc:  # the plugin's code: say whose sample failed, and how
            sample.problems.append(f"{spec.name}: sample({batch}, rng) raised {type(exc).__name__}: {first_line(exc)}")
            inputs = None
        sizes = _check_sample(spec, inputs, batch, sample.problems) if not sample.problems else None
        forward, outputs = Check("forward", at(batch)), Check("outputs", at(batch))
        report.checks += [forward, outputs]
        if sizes is None:
            forward.skipped = outputs.skipped = f"the sample at batch {batch} does not meet the spec"
            continue
        try:
            result = _run(module, spec, inputs, device)
        except ZooError as exc:  # call_module's: the names the forward and the spec disagree on
            forward.problems.append(f"{spec.name}: at batch {batch}: {exc}")
        except Exception as exc:
            forward.problems.append(f"{spec.name}: forward at batch {batch} raised {type(exc).__name__}: "
                                    f"{first_line(exc)}")
        if forward.problems:
            outputs.skipped = f"the forward at batch {batch} failed"
            continue
        _check_outputs(spec, result, batch, sizes, outputs.problems)
        if batch == typical:
            forward.problems += _writes_inputs(spec, module, inputs, batch, device)
        if batch == typical and not outputs.problems:
            outputs.problems += _nondeterministic(spec, module, inputs, result, batch, device, state)
        if batch == typical and not outputs.problems:
            outputs.problems += _fast_path(spec, module, inputs, result, batch, device)
        if batch == typical and not outputs.problems:
            forward.problems += _uncapturable(spec, module, inputs, batch, device)
        if batch == typical and precision in spec.tolerances:
            report.warnings += _small_outputs(spec, result, batch, precision)
    stateful = Check("state", at(typical), _state_changed(spec, module, state) + _unsaved_buffers(spec, module))
    report.checks.append(stateful)
    integer = [t for t in spec.inputs if t.dtype in INTEGER]
    bounded = [t for t in integer if t.value_range is not None]
    if report.passed and bounded and device == "cpu":  # on CUDA an id out of range is a device-side assert
        report.checks.append(Check("value_range", at(spec.axes["batch"].min), _range_ends(spec, module, bounded, seed)))
    if report.passed and len(bounded) < len(integer) and device == "cpu":
        report.warnings += _unbounded_ids(spec, module, [t for t in integer if t.value_range is None], seed)
    if report.passed and rows_batched(spec):
        report.rows_dependent = _rows_dependent(spec, module, device, precision, report.warnings)
    if report.passed and ragged_axes(spec):
        report.checks.append(Check("sizes", at(spec.axes["batch"].min), _other_sizes(spec, module, device, seed)))
    if report.passed and ragged_axes(spec) and rows_batched(spec):  # else the server never pads: no batches
        safe, why = padding_safe(spec, lambda x: _run(module, spec, x, device), spec.sample(2, rng))
        if not safe:
            report.warnings.append(f"{spec.name}: {why}: `zoo serve` will batch its requests only with requests of "
                                   f"the same length (docs/serving.md, ragged batching)")
    ungated = [p for p, t in spec.tolerances.items() if t.metric_drop is not None]
    if ungated and spec.metric is None:  # exports passed, the bound never applied, and nothing said so
        report.warnings.append(f"{spec.name}: its {ungated[0]} tolerance bounds the task metric's drop (metric_drop="
                               f"{spec.tolerances[ungated[0]].metric_drop:g}), and it has no `metric` to measure it: "
                               f"the bound is not applied (give it a metric and a dataset, or leave metric_drop out)")
    return report


def _rows_dependent(spec: ModelSpec, module: torch.nn.Module, device: str, precision: str,
                    warnings: list[str]) -> str | None:
    """Why a row's outputs change when it runs batched with other rows (a statistic over the
    batch: `x - x.mean(0)`), with a warning; None where they do not. `zoo serve` runs such a
    model's requests alone, and the export's config.pbtxt has no dynamic batching, which
    would merge Triton's requests into one execution and change each answer by the others."""
    rows = min(max(4, 2 * spec.axes["batch"].min), spec.axes["batch"].max)  # two parts of at least batch.min
    if rows < 2 * spec.axes["batch"].min:
        return None
    try:
        independent, why = rows_independent(spec, lambda x: _run(module, spec, x, device),
                                             spec.sample(rows, np.random.default_rng(1)), precision)
    except Exception:  # noqa: BLE001 - the forward's own failures are the forward check's to report
        return None
    if independent:
        return None
    warnings.append(f"{spec.name}: rows are not independent ({why}): `zoo serve` runs each request alone, and the "
                    f"export's config.pbtxt has no dynamic batching, so Triton does not merge requests either")
    return why


def check_model(spec: ModelSpec, checkpoint: str | Path | None = None, random_init: bool = False,
                precision: str = "fp32", device: str = "cpu") -> tuple[Report, str]:
    """`zoo check`: the report for the module an export would use, and where its weights
    came from. A trainable model without a checkpoint is checked at random init: the
    signature does not depend on training."""
    from .checkpoint import default_path
    from .export import reference_module  # export imports this module

    if checkpoint is None and spec.trainable and not default_path(spec.name).exists():
        random_init = True
    module, source = reference_module(spec, checkpoint, random_init)  # a failing build: `checkpoint.built`'s error
    module = module.to(device)
    report = check(spec, module, precision, device)
    if report.passed and len(spec.axes) > 1:  # export records test vectors at every axis's ends (zoo.vectors)
        report.checks.append(Check("axis ends", None, check_ends(spec, lambda x: _run(module, spec, x, device))))
    report.checks += check_dataset(spec)
    return report, source


def check_dataset(spec: ModelSpec) -> list[Check]:
    """The dataset's splits as `zoo train` and `zoo verify` take them (`check_split`): the
    train split, and the test split where the task metric is scored on it. Not part of
    `check`, which every export runs: an export does not read the dataset."""
    if spec.dataset is None:
        return []
    checks = []
    for split in dataset_splits(spec):
        found = Check(f"dataset {split}", None)
        try:
            load_split(spec, split)
        except SpecError as exc:
            found.problems.append(str(exc))
        checks.append(found)
    return checks


def _run(module: torch.nn.Module, spec: ModelSpec, inputs: Mapping[str, Any], device: str) -> dict[str, Any]:
    """One forward on its own copy of `inputs` (`to_torch` shares a numpy array's memory): a
    forward that writes into its inputs changes neither the sample nor the next run's."""
    with torch.inference_mode(), ieee_fp32(device):
        return call_module(module, spec, {n: t.clone() for n, t in to_torch(inputs, spec, device).items()})


def _writes_inputs(spec: ModelSpec, module: torch.nn.Module, inputs: Mapping[str, Any], batch: int,
                   device: str) -> list[str]:
    """Inputs the forward modifies in place (`x -= self.mean`), compared after a run with a
    copy taken before. The reference runs on the caller's arrays (`zoo.train.module_fn`, the
    server's request buffers): such a forward changed parity's sample under every runner it
    was compared with, and had `check` blame dropout for a second run that read changed inputs."""
    with torch.inference_mode(), ieee_fp32(device):
        given = {n: t.clone() for n, t in to_torch(inputs, spec, device).items()}  # the sample stays as drawn
        before = {n: t.clone() for n, t in given.items()}
        try:
            call_module(module, spec, given)
        except Exception:  # noqa: BLE001 - the forward ran on this sample: the run that checked it says
            return []
    return [f"{spec.name}: at batch {batch}: the forward modifies its input {name!r} in place ({name} -= ..., "
            f"{name}.mul_(...)): the arrays it is given are the caller's (the server's request buffers, parity's "
            f"samples, which every runner is then compared on changed), so write {name} = {name} - ... (a new "
            f"tensor), or start the forward with {name} = {name}.clone()"
            for name, t in given.items() if not _same(t.detach().cpu(), before[name].cpu())]


def _scripted(spec: ModelSpec, module: torch.nn.Module) -> list[str]:
    """A TorchScript module (torch.jit.script or torch.jit.trace), whole or inside: the
    check passed a scripted submodule and every export then failed with PyTorch's words
    ("Gate.forward() takes 2 positional arguments but 3 were given", "State dict entry for
    parameter ... is not an instance of torch.nn.Parameter"); a scripted whole was an
    internal error. torch.export, which every exporter starts from, takes Python modules."""
    found = [name for name, m in module.named_modules() if isinstance(m, torch.jit.ScriptModule)]
    if not found:
        return []
    where = "the module" if found[0] == "" else f"submodule {found[0]!r}"
    return [f"{spec.name}: {where} is TorchScript (torch.jit.script or torch.jit.trace), which torch.export and "
            f"so every exporter cannot take: build the plain nn.Module, without torch.jit.script or trace"]


def _unsaved_buffers(spec: ModelSpec, module: torch.nn.Module) -> list[str]:
    """State no checkpoint or export saves that differs between two builds: non-persistent
    buffers (`register_buffer(..., persistent=False)`), tensors and numbers kept as plain
    attributes (`self.scale = torch.rand(1)`). `zoo verify`'s rebuilt reference drew its own
    (a random projection) and blamed a changed forward; a model trained with one draw was
    exported with another, and the export's metric, measured against a reference with that
    same other draw, said nothing. Built once more only where the module has such state."""
    saved = set(module.state_dict())
    unsaved = {name: ("buffer", b) for name, b in module.named_buffers() if name not in saved}
    unsaved.update({name: ("tensor" if isinstance(v, torch.Tensor) else "number", v)
                    for name, v in _plain_attributes(module).items() if name not in saved})
    if not unsaved:
        return []
    try:
        with torch.random.fork_rng(devices=[]):  # the caller's random state as it was
            again = built(spec)
    except Exception:  # noqa: BLE001 - the plugin's build: the check that built it first reports on it
        return []
    other = {**dict(again.named_buffers()), **_plain_attributes(again)}
    problems = []
    for name, (kind, value) in unsaved.items():
        if name not in other or _equal(value, other[name]):
            continue
        if kind == "buffer":
            problems.append(f"{spec.name}: buffer {name!r} is not persistent (register_buffer(..., persistent=False)), "
                            f"so no export saves it, and two builds of the module give it different values: every "
                            f"rebuilt reference computes something else. Register it persistent, or compute it the "
                            f"same on every build (a seeded torch.Generator, or a formula)")
        else:
            problems.append(f"{spec.name}: attribute {name!r} is a {kind} held as a plain attribute (not a parameter "
                            f"or a buffer), so no checkpoint or export saves it, and two builds of the module give it "
                            f"different values: the weights trained with one draw are exported with another. Register "
                            f"it as a buffer (self.register_buffer({name.rpartition('.')[2]!r}, ...)), or compute it "
                            f"the same on every build (a seeded torch.Generator, or a formula)")
    return problems


def _plain_attributes(module: torch.nn.Module) -> dict[str, Any]:
    """The tensors and floats the model's own submodules hold as plain attributes: not a
    library's (torch.nn's `in_features`, `eps`, a quantized Linear's `scale`, which its
    state dict saves), not a module's that saves its state through `get_extra_state`, and
    no ints (sizes, counters, ids, which differ between builds without changing outputs)."""
    found = {}
    for prefix, sub in module.named_modules():
        kind = type(sub)
        if kind.__module__.split(".")[0] in ("torch", "transformers") or \
                kind.get_extra_state is not torch.nn.Module.get_extra_state:
            continue
        for attr, value in vars(sub).items():
            if not attr.startswith("_") and attr != "training" and isinstance(value, (torch.Tensor, float)):
                found[f"{prefix}.{attr}" if prefix else attr] = value
    return found


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return _same(a.detach().cpu(), b.detach().cpu())
    return type(a) is type(b) and (a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)))


def _state(module: torch.nn.Module) -> dict[str, tuple[Any, Any]]:
    """Everything the module keeps between calls, by name: parameters, buffers (persistent
    or not), and the plain tensors and numbers its submodules hold as attributes (a cache
    tensor, a call counter); each with a copy of its value (CPU for a tensor)."""
    found: dict[str, Any] = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    for prefix, sub in module.named_modules():
        for attr, value in vars(sub).items():
            if not attr.startswith("_") and attr != "training" and isinstance(value, (torch.Tensor, int, float)):
                found.setdefault(f"{prefix}.{attr}" if prefix else attr, value)
    return {name: (v, v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v)
            for name, v in found.items()}


def _place(module: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    """The submodule holding the state `name` names, and its attribute there."""
    prefix, _, leaf = name.rpartition(".")
    return module.get_submodule(prefix), leaf


def _changed(module: torch.nn.Module, before: Mapping[str, tuple[Any, Any]]) -> list[str]:
    """The names of the state `_state` took that has changed since."""
    return [name for name, (kept, saved) in before.items() if _moved(getattr(*_place(module, name), None), kept, saved)]


def _state_changed(spec: ModelSpec, module: torch.nn.Module, before: Mapping[str, tuple[Any, Any]]) -> list[str]:
    """A forward that updates its own state (a call counter, a running mean kept in eval, a
    cache tensor) answers differently on every call, and an export captures one call of it:
    the torch artifact then drifts call by call and the others bake in one state, so parity
    cannot say what is wrong. Each changed value is put back as it was."""
    changed = _changed(module, before)
    with torch.no_grad():
        for name in changed:
            kept, saved = before[name]
            setattr(*_place(module, name), kept if isinstance(saved, torch.Tensor) else saved)
            if isinstance(saved, torch.Tensor) and kept.shape == saved.shape:
                kept.copy_(saved)
    if not changed:
        return []
    params, buffers = {n for n, _ in module.named_parameters()}, {n for n, _ in module.named_buffers()}
    kinds = [f"{kind} {', '.join(names)}" for kind, names in
             (("buffers", [n for n in changed if n in buffers]), ("parameters", [n for n in changed if n in params]),
              ("attributes", [n for n in changed if n not in buffers and n not in params])) if names]
    return [f"{spec.name}: forward changes {' and '.join(kinds)}: an exported model must not keep state "
            f"between calls (compute such values without assigning them to the module, or fix them at build)"]


def _moved(now: Any, kept: Any, saved: Any) -> bool:
    if isinstance(saved, torch.Tensor):
        return now is not kept or not _same(kept.detach().cpu(), saved)
    return type(now) is not type(saved) or (now != saved and not (now != now and saved != saved))  # NaN stays NaN


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and (
        torch.equal(a, b) or (a.is_floating_point() and bool(torch.isclose(a, b, 0, 0, equal_nan=True).all())))


def _other_sizes(spec: ModelSpec, module: torch.nn.Module, device: str, seed: int) -> list[str]:
    """Sizes of each dynamic axis but the batch that the samples do not have, inside the
    spec's range: one and PAD past the sampled size, the sample at the smallest batch
    grown along the axis (`at_length`: padded where an input masks it, else repeated). A forward
    that takes only some sizes (a U-Net's skip connections: multiples of its downsampling;
    a reshape into pairs: even lengths) passed every sample and every end of the range, and
    then failed the request of another size the server let through. One line per axis."""
    from .bench.measure import at_length, lengths_of

    batch = spec.axes["batch"].min
    inputs = spec.sample(batch, np.random.default_rng(seed))
    problems = []
    for axis, size in lengths_of(spec, inputs).items():
        r = spec.axes[axis]
        tried = sorted({n for n in (size + 1, size + PAD) if n <= r.max})  # longer only: grown content keeps
        # every length or index into the axis valid (cut, it may not be: `zoo check`'s axis ends do that)
        for n in tried:
            try:
                _run(module, spec, at_length(spec, inputs, axis, n), device)
            except Exception as exc:  # noqa: BLE001 - the plugin's forward at a size inside the range
                error = f"{type(exc).__name__}: {first_line(exc).rstrip('.')}"
                problems.append(f"{spec.name}: the forward fails at {axis} = {n}, inside the spec's range {r.min} to "
                                f"{r.max} ({error}; the sample at batch {batch} grown along {axis} from {size}): "
                                f"the server takes every size in the range, so let the forward take each (pad the "
                                f"input inside forward to a size it takes and cut the output back), or declare the "
                                f"axis static, AxisRange(n, n, n)")
                break
    return problems


def _unbounded_ids(spec: ModelSpec, module: torch.nn.Module, integer: list[TensorSpec], seed: int) -> list[str]:
    """Integer inputs without `value_range` that the module indexes a table with (or that
    otherwise fail for an id out of range: one_hot, EmbeddingBag): an id
    out of the table is an error in PyTorch, but on ONNX Runtime and OpenVINO a raw
    Gather error, a row of zeros or the last row (-1), silently. With a range declared,
    every runner and the server refuse such ids by name. Probed at the smallest batch with
    the input set to one past the largest table (every first dimension of the module's
    tensors: large enough for any table, small enough to allocate) and to -1."""
    problems: list[str] = []
    tables = _tables(module)
    past = max([t.shape[0] for t in module.state_dict().values() if t.ndim] + [2 ** 16])
    for t in integer:
        for value in (min(past, int(np.iinfo(t.dtype).max)), -1)[:1 if t.dtype == "uint8" else 2]:
            exc = _raises(spec, module, seed, {t.name: value})
            if exc is not None:
                indexed = _not_a_table(exc, tables)
                if indexed is not None:
                    rows = (f"value_range=(0, {indexed - 1}) on it if it indexes {indexed} entries of something "
                            f"fixed; if it is a length or a position along an input's axis, clamp it to that axis "
                            f"in the forward (a value_range cannot follow an axis's size)")
                elif len(tables) == 1:
                    rows = f"value_range=(0, {tables[0] - 1}) on it (its nn.Embedding has {tables[0]} rows)"
                else:
                    rows = "value_range=(0, N-1) on it, N the rows of the table it indexes"
                problems.append(f"{spec.name}: input {t.name!r} has no value_range, and the forward raises "
                                f"{type(exc).__name__} for id {value} ({first_line(exc)}): declare {rows}, so that "
                                "every runner and the server refuse ids out of the table; without it ONNX Runtime "
                                "and OpenVINO answer one with an engine error, zeros or the last row")
                break
    return problems


def _not_a_table(exc: BaseException, tables: list[int]) -> int | None:
    """The size an index error says was indexed ("index 9 is out of bounds for dimension 1
    with size 4": 4) where it is none of the module's tables (a length or a position along
    an axis, say), else None."""
    found = re.search(r"out of bounds for dimension \d+ with size (\d+)", str(exc))
    return int(found[1]) if found and int(found[1]) not in tables else None


def _raises(spec: ModelSpec, module: torch.nn.Module, seed: int, values: Mapping[str, int]) -> Exception | None:
    """What the forward raises on `filled`'s sample (None: it ran)."""
    try:
        _run(module, spec, filled(spec, seed, values), "cpu")
    except Exception as exc:  # noqa: BLE001 - the sample ran: only these values changed
        return exc
    return None


def _tables(module: torch.nn.Module) -> list[int]:
    """The rows of each table the module indexes (nn.Embedding, nn.EmbeddingBag)."""
    return [m.num_embeddings for m in module.modules() if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag))]


def _range_ends(spec: ModelSpec, module: torch.nn.Module, bounded: list[TensorSpec], seed: int) -> list[str]:
    """Integer inputs the forward fails at an end of their declared `value_range` (ids up to
    100 into a table of 100 rows): the server and every runner take such a value, and
    PyTorch raises for it where ONNX Runtime and OpenVINO answer an engine error, zeros or
    the last row. Two forwards at the smallest batch, every such input at its low end, then
    at its high end; where several fail together, each is tried alone to name it. What a
    forward that runs there returns is held to the spec as the samples' outputs are: k = 10,
    the end of its range, had `torch.topk` answer 10 columns where the spec declares at most 5."""
    tables = _tables(module)
    for which, ends in range_ends(spec):  # the values `zoo.vectors.record` stores a set at, for every backend
        inputs = filled(spec, seed, ends)
        try:
            result = _run(module, spec, inputs, "cpu")
        except Exception as exc:  # noqa: BLE001 - the sample ran: only these values changed
            alone = [(t, e) for t in bounded
                     if (e := _raises(spec, module, seed, {t.name: ends[t.name]}) if len(bounded) > 1 else exc)]
            named = alone or [(t, exc) for t in bounded]
            return [f"{spec.name}: input {t.name!r} at {ends[t.name]}, the {which} end of its value_range "
                    f"({_number(t.value_range[0])}, {_number(t.value_range[1])}): the forward raises "
                    f"{type(e).__name__} ({first_line(e)}); declare the range the forward takes{_rows(e, tables)}, "
                    f"so that every runner and the server refuse values it cannot take" for t, e in named]
        problems = _outputs_at(spec, inputs, result, f"the {which} end of", ends)
        if problems:
            return problems
    return []


def _outputs_at(spec: ModelSpec, inputs: Mapping[str, Any], result: Mapping[str, Any], which: str,
                values: Mapping[str, int]) -> list[str]:
    """`_check_outputs` on a run of `filled`'s sample, each line naming the values it had."""
    batch, problems = spec.axes["batch"].min, []
    where = (f"{spec.name}: {f'at batch {batch} ' if spec.has_batch_axis else ''}with "
             + ", ".join(f"{name} = {value}" for name, value in values.items())
             + f" ({which} {'its' if len(values) == 1 else 'their'} value_range)")
    _check_outputs(spec, result, batch, _check_sample(spec, inputs, batch, []) or {}, problems, where)
    return problems


def _rows(exc: BaseException, tables: list[int]) -> str:
    """What the range should be, where the error and the module say: the one table's rows,
    unless the error indexed something else (a length along an axis: then clamp it)."""
    indexed = _not_a_table(exc, tables)
    if indexed is not None:
        return (f" (it indexes {indexed} entries; a length or a position along an input's axis is clamped to that "
                f"axis in the forward instead: a value_range cannot follow an axis's size)")
    return f" (its nn.Embedding has {tables[0]} rows: value_range=(0, {tables[0] - 1}))" if len(tables) == 1 else ""


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _shape(t: TensorSpec) -> str:
    return "(" + ", ".join(map(str, t.shape)) + ("," if len(t.shape) == 1 else "") + ")"


def _check_sample(spec: ModelSpec, inputs: Any, batch: int, problems: list[str]) -> dict[str, int] | None:
    """The size of every dynamic axis in a sample that meets the spec; else None, with `problems`."""
    where = f"{spec.name}: sample({batch})"
    if not isinstance(inputs, Mapping):
        problems.append(f"{where} returned {type(inputs).__name__}; the spec expects a dict of arrays by input name")
        return None
    want = [t.name for t in spec.inputs]
    missing, extra = [n for n in want if n not in inputs], sorted(set(inputs) - set(want))
    if missing or extra:
        problems.append(f"{where} has inputs {sorted(inputs)}; the spec names {want} (missing {missing}, "
                        f"unexpected {extra})")
    sizes: dict[str, tuple[int, str]] = {"batch": (batch, "the batch size asked for")}
    for t in spec.inputs:
        if t.name not in inputs:
            continue
        array = as_numpy(inputs[t.name])
        if not _dtype_matches(array.dtype, t.dtype):
            problems.append(f"{where}: input {t.name!r} has dtype {array.dtype}; the spec declares {t.dtype}")
        if array.ndim != len(t.shape):
            problems.append(f"{where}: input {t.name!r} has shape {list(array.shape)}; the spec declares "
                            f"{_shape(t)}, rank {len(t.shape)}")
            continue
        for d, (got, dim) in enumerate(zip(array.shape, t.shape)):
            if isinstance(dim, int):
                if got != dim:
                    problems.append(f"{where}: input {t.name!r} has shape {list(array.shape)}; the spec declares "
                                    f"{_shape(t)}, so dimension {d} must be {dim}")
                continue
            size, first = sizes.setdefault(dim, (got, f"input {t.name!r}"))
            r = spec.axes[dim]
            if got != size:
                problems.append(f"{where}: input {t.name!r} has {dim} = {got} (dimension {d}); expected {size}, "
                                f"as in {first}" + (": a sample must honour the batch size it is given"
                                                    if dim == "batch" else ""))
            elif not r.min <= got <= r.max:
                problems.append(f"{where}: input {t.name!r} has {dim} = {got} (dimension {d}); the spec's range "
                                f"for {dim!r} is {r.min} to {r.max}")
        if t.dtype != "string" and array.size and (reason := t.out_of_range(array)) is not None:
            problems.append(f"{where}: {reason}")
    return None if problems else {axis: size for axis, (size, _) in sizes.items()}


def _dtype_matches(got: np.dtype, declared: str) -> bool:
    if declared == "string":
        return got.kind in "OSU"
    if declared == "bfloat16":  # numpy has none: such inputs travel as float32 (as on the wire)
        return got == np.float32
    return got == np.dtype(declared)


def _check_outputs(spec: ModelSpec, result: Mapping[str, Any], batch: int, sizes: Mapping[str, int],
                   problems: list[str], where: str | None = None) -> None:
    """`result`'s departures from the spec's outputs, onto `problems`, each line starting
    with `where` (by default the model and the batch)."""
    where = where or f"{spec.name}: at batch {batch}"
    for t in spec.outputs:
        value = result[t.name]
        if not isinstance(value, torch.Tensor):
            problems.append(f"{where}: output {t.name!r} is a {type(value).__name__}; the spec declares a "
                            f"{t.dtype} tensor {_shape(t)}")
            continue
        want_dtype = TORCH_DTYPES.get(t.dtype)
        if want_dtype is not None and value.dtype != want_dtype:
            fp32 = " (the PyTorch reference is fp32)" if t.dtype == "float32" else ""
            problems.append(f"{where}: output {t.name!r} has dtype {str(value.dtype).removeprefix('torch.')}; "
                            f"the spec declares {t.dtype}{fp32}")
        shape = list(value.shape)
        expected = [d if isinstance(d, int) else sizes.get(d) for d in t.shape]
        if len(shape) != len(t.shape) or any(w is not None and g != w for g, w in zip(shape, expected)):
            known = ", ".join(f"{a} = {sizes[a]}" for a in dict.fromkeys(d for d in t.shape if d in sizes))
            problems.append(f"{where}: output {t.name!r} has shape {shape}; the spec declares {_shape(t)}"
                            + (f" with {known}" if known else "") + ", i.e. "
                            + str([w if w is not None else d for w, d in zip(expected, t.shape)]).replace("'", ""))
        for dim, axis in t.dynamic_axes.items():  # an output's own axis (the boxes a detector keeps)
            if axis not in sizes and dim < value.dim() and value.shape[dim] > spec.axes[axis].max:
                problems.append(f"{where}: output {t.name!r} has {axis} = {value.shape[dim]}, past the largest size "
                                f"the spec's axes give it ({spec.axes[axis].max}): widen its range, or cap the "
                                f"output in forward")
        if value.is_floating_point():
            bad = int((~torch.isfinite(value)).sum())
            if bad:
                problems.append(f"{where}: output {t.name!r} has {bad} non-finite values (NaN or infinity) "
                                f"of {value.numel()}")


def _nondeterministic(spec: ModelSpec, module: torch.nn.Module, inputs: Mapping[str, Any],
                      result: Mapping[str, Any], batch: int, device: str,
                      state: Mapping[str, tuple[Any, Any]]) -> list[str]:
    """The outputs a second run of the same inputs changes beyond the fp32 tolerance (dropout
    left on, sampling in the forward): parity compares an artifact's run with another run of
    the reference, so such a model fails every backend's parity, each blamed on the backend.
    Nothing where the forward has changed the module's `state` since the first batch (an EMA
    buffer): the state check names that cause, and it is not dropout."""
    differs = _differs(spec, result, _run(module, spec, inputs, device))
    if differs is None or _changed(module, state):
        return []
    name, worst, atol = differs
    return [f"{spec.name}: at batch {batch}: output {name!r} differs by up to {worst:.3g} between two runs of the "
            f"same inputs (fp32 atol {atol:g}): the forward is not deterministic in eval mode (dropout called with "
            f"training=True, random sampling, or state kept outside the module: a global or class attribute it "
            f"updates); no export can match it"]


def _differs(spec: ModelSpec, a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[str, float, float] | None:
    """The first gated float output on which two runs differ beyond the fp32 atol: (its
    name, the largest difference, the atol); None where none does."""
    tol = spec.tolerance("fp32")
    for t in spec.outputs:
        x, y = a[t.name], b[t.name]
        if not (x.is_floating_point() and x.shape == y.shape) or not tol.compares(t.name):
            continue
        worst = float((x.double() - y.double()).abs().max()) if x.numel() else 0.0
        if worst > tol.atol:
            return t.name, worst, tol.atol
    return None


def _fast_path(spec: ModelSpec, module: torch.nn.Module, inputs: Mapping[str, Any], result: Mapping[str, Any],
               batch: int, device: str) -> list[str]:
    """Outputs PyTorch's fast path for attention changes: in eval mode, nn.TransformerEncoder
    with a padding mask runs as nested tensors and answers 0 at padded positions, where the
    standard path, and every exported graph (ONNX, torch.export), compute values there.
    Parity then failed on every backend ("differs from PyTorch fp32 by up to 2.46"), naming
    neither the cause nor the fix. Run again with the fast path off where the module has
    attention, and compared."""
    if not any(isinstance(m, torch.nn.MultiheadAttention) for m in module.modules()):
        return []
    was = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        standard = _run(module, spec, inputs, device)
    finally:
        torch.backends.mha.set_fastpath_enabled(was)
    differs = _differs(spec, result, standard)
    if differs is None:
        return []
    name, worst, atol = differs
    return [f"{spec.name}: at batch {batch}: output {name!r} differs by up to {worst:.3g} (fp32 atol {atol:g}) "
            f"between PyTorch's fast path for attention (eval mode's default) and its standard path, which exports "
            f"compute: nn.TransformerEncoder with a padding mask answers 0 at padded positions on the fast path. "
            f"Build it with enable_nested_tensor=False, or set the padded positions in forward (torch.where on the "
            f"mask), so that PyTorch and every export agree"]


# Operators no exporter captures, with what to write instead. torch.export traces with
# symbolic sizes and ONNX's exporters through it or TorchScript: an op whose output's
# structure comes from its inputs' values fails there with the tracer's internals ("zeros():
# argument 'size' failed to unpack ... FakeTensor", "vector::_M_range_check"), after `zoo
# check` had passed.
_UNCAPTURABLE = {
    "aten._pack_padded_sequence": (
        "packs its sequences by their lengths (torch.nn.utils.rnn.pack_padded_sequence): a PackedSequence's "
        "batch sizes are computed from the lengths' values, which neither torch.export nor ONNX export can "
        "capture. Run the recurrent layer on the padded batch and read each row at its last real step "
        "(out.gather(1, (lengths - 1).view(-1, 1, 1).expand(-1, 1, out.shape[2])) for a unidirectional one), "
        "or mask the padded steps"),
}


def _uncapturable(spec: ModelSpec, module: torch.nn.Module, inputs: Mapping[str, Any], batch: int,
                  device: str) -> list[str]:
    """The forward run once more, every operator it dispatches recorded: one no exporter
    captures (`_UNCAPTURABLE`) fails the check with what to write instead, before any
    backend meets it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: set[str] = set()

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    try:
        with Record():
            _run(module, spec, inputs, device)
    except Exception:  # a forward the recording itself upsets: the exporters will say what they find
        return []
    return [f"{spec.name}: at batch {batch}: the forward {why}" for op, why in _UNCAPTURABLE.items() if op in seen]


def _small_outputs(spec: ModelSpec, result: Mapping[str, Any], batch: int, precision: str) -> list[str]:
    """Warnings for gated float outputs too small for the precision's `atol` to mean anything."""
    tol, warnings = spec.tolerances[precision], []
    for t in spec.outputs:
        value = result[t.name]
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()) or not tol.compares(t.name):
            continue
        finite = value[torch.isfinite(value)]
        scale = float(finite.abs().max()) if finite.numel() else 0.0
        if scale >= RELATIVE_BELOW * tol.atol or precision == "int8":  # int8: see `zoo.verify.parity`
            continue
        how = ("parity holds it to the absolute atol alone, which any output near 0 passes" if scale == 0 else
               f"parity holds it to {1 / RELATIVE_BELOW:g} of its magnitude instead (relative)")
        warnings.append(f"{spec.name}: output {t.name!r} has magnitude {scale:.3g} at batch {batch}, under "
                        f"{RELATIVE_BELOW:g}x the {precision} atol {tol.atol:g}; {how}")
    return warnings

"""The supervised loop every trainable spec without its own trainer goes through.

Deterministic on CPU for a fixed seed and a fixed number of intra-op threads (torch's
kernels split their sums by thread count, and another summation order ends elsewhere):
initialization, the shuffle (one seeded permutation per epoch, as torch's
DistributedSampler draws it), the augmentation generator and dropout all draw from seeded
generators, and their states are part of the resume point, so an interrupted and resumed
run reaches the same weights as one that was not.

Validation: the dataset's own validation split where it has one (`own_validation`), else
a fixed fraction of the training split (chosen with the recipe's seed, so runs with
different seeds select on the same examples) held out; after each epoch the task metric
on it (or the loss, for models without one) selects the best weights (a tie goes to the
later epoch) and drives early stopping. The test split is used once, at the end, on the
selected weights.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from ..checkpoint import Checkpoint, built, changed_config, state_mismatch
from ..errors import CheckpointError, SpecError, ZooError, first_line
from ..inputs import check_split, dataset_splits, load_split
from ..spec import ModelSpec
from ..tensors import call_module, cpu_state_dict, to_torch
from .distributed import check_batch_size
from .run import Run, Throughput
from .state import TrainingState, capture_rng, merge_ranks, restore_rng

log = logging.getLogger("zoo.train")  # `zoo train` prints its warnings, one line each
#: the split a dataset with a validation split of its own gives it as (`own_validation`)
VALID = "valid"


def fit(spec: ModelSpec, run: Run) -> Checkpoint:
    """Train `spec` by its recipe within `run`; returns the selected, evaluated checkpoint."""
    assert spec.recipe is not None and spec.dataset is not None and spec.loss is not None
    recipe, opts, world, device = spec.recipe, run.options, run.world, run.device
    _check_recipe(spec)
    torch.manual_seed(run.seed)
    inputs, targets = _training_split(spec)
    train_idx, held = _validation(spec, run, inputs, targets)
    val_idx = held[2]
    batch_size = run.facts["batch_size"]
    check_batch_size(batch_size, world)
    if batch_size > len(train_idx) and world.main:
        log.warning("%s: batch size %d is more than its %d training examples: each epoch is one step over all "
                    "of them", spec.name, batch_size, len(train_idx))
    micro_per_epoch = math.ceil(len(train_idx) / batch_size)
    steps_per_epoch = math.ceil(micro_per_epoch / opts.accumulate)
    run.facts.update(train_examples=len(train_idx), val_examples=len(val_idx), optimizer=recipe.optimizer,
                     schedule=recipe.schedule, lr=recipe.lr, weight_decay=recipe.weight_decay)

    module, memory_format = _build(spec, opts, device)
    run.facts["channels_last"] = memory_format is not None
    optimizer = _optimizer(module, recipe.optimizer, recipe.lr, recipe.weight_decay)
    scheduler = _scheduler(optimizer, recipe.schedule, recipe.lr, run.epochs * steps_per_epoch)
    scaler = opts.scaler(device)
    data_gen = torch.Generator().manual_seed(run.seed + world.rank)  # augmentation
    epoch, step, progress = _resume(run, module, optimizer, scheduler, scaler, data_gen)

    model: torch.nn.Module = DistributedDataParallel(module) if world.distributed else module
    if opts.compile:
        model = torch.compile(model)
    monitor, higher = _monitor(spec)
    throughput = Throughput(**progress.setdefault("throughput", {"samples": 0, "seconds": 0.0}))
    steps = _Steps(spec, run, model, module, optimizer, scheduler, scaler, inputs, targets, batch_size,
                   micro_per_epoch, data_gen, memory_format, throughput)
    # resumed at --max-steps already: no step more (the resume point, inside an epoch or not, stays)
    done = opts.max_steps is not None and step >= opts.max_steps
    cut = None if done else progress.pop("partial", None)  # a resume point inside an epoch (--max-steps)
    with run.progress(run.epochs * micro_per_epoch) as update, run.profiler() as profiler_step:
        update(advance=epoch * micro_per_epoch + (cut["position"] if cut else 0))
        while epoch < run.epochs and not progress["stopped_early"] and not done:
            order = train_idx[epoch_order(len(train_idx), run.seed, epoch)]
            model.train()
            throughput.start()
            step, total, seen, cut = steps.epoch(order, epoch, step, cut, update, profiler_step,
                                                 _last(progress, monitor))
            rate = throughput.stop(int(world.all_reduce_sum(seen)))  # every process's samples
            total, seen = world.all_reduce_sum(total), world.all_reduce_sum(seen)
            if cut is not None:  # --max-steps inside the epoch: resume at the next micro-batch
                progress["partial"] = {"position": cut, "total": total, "seen": seen}
                steps.save_last(epoch, step, progress)
                break
            train_loss = total / seen
            epoch += 1
            val = validate(spec, module, *held, device) if len(val_idx) else {}
            _select(spec, run, module, progress, epoch, train_loss, val, monitor, higher)
            scalars = {"train/loss_epoch": train_loss, "train/samples_per_second": rate,
                       **{f"val/{k}": v for k, v in val.items()}}
            run.log(step, scalars)
            update(status=f"epoch {epoch}/{run.epochs} loss {train_loss:.4f} {rate:,.0f} samples/s"
                          f"{_last(progress, monitor)}")
            steps.save_last(epoch, step, progress)
            if run.on_epoch_end is not None:
                run.on_epoch_end(epoch, scalars)
            if opts.max_steps is not None and step >= opts.max_steps:
                break

    if progress["best_epoch"] is not None and (progress["best_epoch"] != epoch or "partial" in progress):
        module.load_state_dict(run.saved_model().state)  # the selected epoch's weights
    module.eval()
    return Checkpoint(spec.name, dict(spec.config), cpu_state_dict(module),
                      _metrics(progress, monitor, epoch, run.epochs, step, throughput))


def _check_recipe(spec: ModelSpec) -> None:
    """What `Recipe` leaves to the trainer: the names and learning rate this loop takes."""
    recipe = spec.recipe
    problems = [f"{name} {value!r} is not one of {', '.join(known)}" for name, value, known in (
        ("optimizer", recipe.optimizer, OPTIMIZERS), ("schedule", recipe.schedule, SCHEDULES)) if value not in known]
    if not recipe.lr > 0:
        problems.append(f"lr {recipe.lr} trains nothing: it must be positive")
    if problems:
        raise SpecError(f"{spec.name}: training recipe: {'; '.join(problems)}")


#: what validation runs on: inputs, targets, and the indices of its examples in them
Examples = tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]


def _validation(spec: ModelSpec, run: Run, inputs: dict[str, torch.Tensor],
                targets: torch.Tensor) -> tuple[torch.Tensor, Examples]:
    """The training examples' indices, and what validation runs on: (inputs, targets,
    indices), the dataset's own validation split (`own_validation`) where it has one, else
    `val_fraction` of the train split held out; none at val_fraction 0. The run's facts say
    which (`val_split`: "valid", "train" or None)."""
    fraction = run.facts["val_fraction"]
    own = own_validation(spec) if fraction else None
    run.facts["val_split"] = VALID if own is not None else "train" if fraction else None
    if own is not None:
        if run.options.val_fraction is not None and run.world.main:
            log.warning("%s: validation is the dataset's own %r split (%d examples); --val-fraction %g is not "
                        "used", spec.name, VALID, len(own[1]), fraction)
        return torch.arange(len(targets)), (*own, torch.arange(len(own[1])))
    train_idx, val_idx = holdout(len(targets), fraction, spec.recipe.seed)
    if not len(train_idx):
        raise ZooError(f"{spec.name}: dataset 'train' has {len(targets)} examples and validation holds out "
                       f"{len(val_idx)} of them (val_fraction {fraction:g}), leaving none to train on")
    if fraction and not len(val_idx):
        least = math.ceil(1e4 / len(targets)) / 1e4  # a fraction that holds one example out
        raise ZooError(f"{spec.name}: val_fraction {fraction:g} of the {len(targets)} training examples holds out "
                       f"none; give at least {least:g} (--val-fraction), or 0 for no validation")
    return train_idx, (inputs, targets, val_idx)


def own_validation(spec: ModelSpec) -> tuple[dict[str, torch.Tensor], torch.Tensor] | None:
    """The dataset's own validation split as tensors, checked as the train split is
    (`check_split`), or None where it has none.

    A dataset with a validation split of its own gives it as `load("valid")` (FreeSolv's
    80/10/10 split, as MoleculeNet made it: selecting on train examples held out of the
    train split instead left its 64 validation molecules unused and trained on 462 of its
    513). `Dataset` declares no splits, so one that has none is told by its answer: an
    error (an unknown split), no examples, or the examples of its train or test split (a
    load that gives the test split for every name but "train": selecting on it would leak
    the test split into the model chosen)."""
    try:
        x, y = spec.dataset.load(VALID)
        rows, names = len(y), set(x)
    except Exception:  # noqa: BLE001 - the plugin's load, which knows no such split
        return None
    # an answer that is no split of the spec's inputs is none: "valid" was never asked before
    if not rows or not {t.name for t in spec.inputs} <= names:
        return None
    if any(_same_split(x, y, spec, split) for split in ("train", "test")):
        return None
    check_split(spec, VALID, x, y)
    return to_torch(x, spec), torch.from_numpy(np.asarray(y))


def _same_split(x: Any, y: Any, spec: ModelSpec, split: str) -> bool:
    """Whether (x, y) are the examples of the dataset's `split` (False where it has none)."""
    try:
        other_x, other_y = spec.dataset.load(split)
    except Exception:  # noqa: BLE001 - no such split (a dataset scored by its own evaluation)
        return False
    return (np.shape(y) == np.shape(other_y) and np.array_equal(np.asarray(y), np.asarray(other_y))
            and all(np.array_equal(np.asarray(x[k]), np.asarray(other_x.get(k))) for k in x))


def _training_split(spec: ModelSpec) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The dataset's train split as tensors, checked against the spec (`check_split`); the
    test split, which the run is scored on at its end, is checked now too."""
    x, y = load_split(spec, "train")
    if "test" in dataset_splits(spec):
        load_split(spec, "test")
    return to_torch(x, spec), torch.from_numpy(np.asarray(y))


@dataclass
class _Steps:
    """The optimizer steps of an epoch, and the resume point after them."""

    spec: ModelSpec
    run: Run
    model: torch.nn.Module  # what the forward runs (DDP-wrapped, compiled)
    module: torch.nn.Module  # the parameters
    optimizer: Any
    scheduler: Any
    scaler: Any
    inputs: dict[str, torch.Tensor]
    targets: torch.Tensor
    batch_size: int
    micro_per_epoch: int
    data_gen: torch.Generator
    memory_format: Any
    throughput: Throughput  # over every process of the run: the resume point carries it on

    def epoch(self, order: torch.Tensor, epoch: int, step: int, cut: dict[str, Any] | None, update,
              profiler_step, last: str) -> tuple[int, float, int, int | None]:
        """Run the epoch's steps from its start, or from `cut` (a resume point inside it).
        (step, loss total, examples, where --max-steps cut the epoch or None)."""
        spec, run, opts, world, device = self.spec, self.run, self.run.options, self.run.world, self.run.device
        start = cut["position"] if cut else 0
        total, seen = (float(cut["total"]), int(cut["seen"])) if cut and world.main else (0.0, 0)
        for group_start in range(start, self.micro_per_epoch, opts.accumulate):
            group = range(group_start, min(group_start + opts.accumulate, self.micro_per_epoch))
            for micro, share in zip(group, _shares(order, group, self.batch_size)):
                idx, weight = shard(order[micro * self.batch_size:(micro + 1) * self.batch_size], world)
                batch = {k: v[idx] for k, v in self.inputs.items()}
                if spec.dataset.augment is not None:
                    batch = spec.dataset.augment(batch, self.data_gen)
                batch = {k: _to(v, device, self.memory_format) for k, v in batch.items()}
                sync = micro == group[-1] or not world.distributed
                with contextlib.nullcontext() if sync else self.model.no_sync():
                    value = _micro_step(spec, self.model, opts, device, self.scaler, batch, self.targets[idx],
                                        weight * share)
                total += value * len(idx) * (weight > 0)
                seen += len(idx) * (weight > 0)
                update(status=f"epoch {epoch + 1}/{run.epochs} loss {value:.4f}{last}")
            _optimizer_step(spec.name, self.module, self.optimizer, self.scheduler, self.scaler,
                            opts.clip_grad_norm, world.distributed)
            step += 1
            profiler_step()
            run.log(step, {"train/loss": value, "train/lr": self.scheduler.get_last_lr()[0]})
            if opts.max_steps is not None and step >= opts.max_steps:
                position = group[-1] + 1
                return step, total, seen, position if position < self.micro_per_epoch else None
        return step, total, seen, None

    def save_last(self, epoch: int, step: int, progress: dict[str, Any]) -> None:
        spec, scaler, weights = self.spec, self.scaler, cpu_state_dict(self.module)
        _check_finite(spec.name, "weights", {k: v for k, v in weights.items() if v.is_floating_point()})
        progress["throughput"] = {"samples": self.throughput.samples, "seconds": self.throughput.seconds}
        self.run.save_last(TrainingState(
            Checkpoint(spec.name, dict(spec.config), weights, {"epoch": epoch}), epoch, step,
            self.optimizer.state_dict(), self.scheduler.state_dict(), scaler.state_dict() if scaler.is_enabled() else None,
            merge_ranks(self.run.world.gather(capture_rng(self.data_gen))), {"progress": progress}))


def _shares(order: torch.Tensor, group: range, batch_size: int) -> list[float]:
    """Each micro-batch's weight in its accumulation group: its share of the group's
    examples, so the group's step is the mean over them, as one batch of them gives, also
    where the epoch's last group is uneven (1 / len(group) exactly where sizes are equal)."""
    sizes = [len(order[micro * batch_size:(micro + 1) * batch_size]) for micro in group]
    return [1 / len(group) if len(set(sizes)) == 1 else size / sum(sizes) for size in sizes]


def _build(spec: ModelSpec, opts, device: str) -> tuple[torch.nn.Module, Any]:
    """The module on `device`, with gradient checkpointing and channels-last as asked. A
    build that fails (a config value out of the model's range) is the model's failure,
    named with its config (`built`), before any step."""
    module = built(spec).to(device)
    if opts.grad_checkpointing:
        if not hasattr(module, "set_grad_checkpointing"):
            raise ZooError(f"model {spec.name} does not support gradient checkpointing "
                           f"(its module has no set_grad_checkpointing)")
        module.set_grad_checkpointing(True)
    memory_format = torch.channels_last if opts.wants_channels_last(module, spec.recipe.channels_last) else None
    if memory_format is not None:
        module = module.to(memory_format=memory_format)
    return module, memory_format


def _resume(run: Run, module, optimizer, scheduler, scaler, data_gen) -> tuple[int, int, dict[str, Any]]:
    """(epoch, step, progress): from the run's resume point where it has one, else a fresh start."""
    resumed = run.resume_state()
    if resumed is None:
        return 0, 0, {"history": [], "val_history": [], "best": None, "best_epoch": None, "stale_epochs": 0,
                      "stopped_early": False}
    mismatch = state_mismatch(module.state_dict(), resumed.checkpoint.state)
    if mismatch:
        raise CheckpointError(f"resume point {run.files['last']} does not fit this run's model ({mismatch}); "
                              f"start without --resume")
    try:
        module.load_state_dict(resumed.checkpoint.state)
        optimizer.load_state_dict(resumed.optimizer)
        if resumed.scheduler is not None:
            scheduler.load_state_dict(resumed.scheduler)
        if resumed.scaler:
            scaler.load_state_dict(resumed.scaler)
        restore_rng(resumed.rng, data_gen, run.world.rank)
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise CheckpointError(f"resume point {run.files['last']} does not fit this run's model, optimizer or "
                              f"schedule ({type(exc).__name__}: {first_line(exc)}); start without --resume") from None
    return resumed.epoch, resumed.step, resumed.run["progress"]


def _micro_step(spec: ModelSpec, model, opts, device: str, scaler, batch: dict[str, torch.Tensor],
                target: torch.Tensor, scale: float) -> float:
    """Forward, loss and backward of one micro-batch; its loss. The model's own failure
    (its forward, its loss) is a SpecError naming the model, not an internal error."""
    try:
        with opts.autocast(device):
            loss = spec.loss(call_module(model, spec, batch), target.to(device))
        _check_loss(spec.name, loss)
        scaler.scale(loss * scale).backward()
    except (RuntimeError, ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        if isinstance(exc, torch.OutOfMemoryError):
            raise
        shapes = ", ".join(f"{k}{list(v.shape)}" for k, v in batch.items())
        alone = ("; that batch holds one example, the remainder of the training examples after the full batches, "
                 "and batch statistics (BatchNorm) need two: choose a --batch-size that leaves another remainder"
                 if len(target) == 1 and "more than 1 value per channel" in str(exc) else "")
        raise SpecError(f"{spec.name}: a training step ({shapes}) raised {type(exc).__name__}: "
                        f"{first_line(exc)}{alone}{changed_config(spec)}") from exc
    value = loss.detach().float().item()
    if not math.isfinite(value):  # NaN weights from here on: stop while `last/` still holds finite ones
        bad = [k for k, v in {**batch, "target": target}.items() if v.is_floating_point() and not v.isfinite().all()]
        raise ZooError(f"{spec.name}: the training loss is {value} at this step"
                       + (f"; non-finite values in the batch's {', '.join(bad)}: clean the dataset" if bad else
                          "; lower the learning rate, or clip gradients with --clip-grad-norm")
                       + " (the run stops before writing anything of this epoch)")
    return value


def _check_loss(name: str, loss: Any) -> None:
    """A loss backward can start from: torch's own words for the two usual slips name
    neither the loss nor the model ("grad can be implicitly created only for scalar
    outputs", "element 0 of tensors does not require grad")."""
    if not isinstance(loss, torch.Tensor):  # `.item()`, a numpy value: no graph to differentiate
        raise SpecError(f"{name}: its loss returned a {type(loss).__name__}, not a tensor: it must be a torch scalar "
                        f"that depends on the parameters (leave out .item(), float(), numpy)")
    if loss.numel() != 1:
        raise SpecError(f"{name}: its loss returned a tensor of shape {list(loss.shape)}; it must be a scalar, one "
                        f"number per batch (reduce it: reduction='mean', or .mean() over the examples)")
    if not loss.requires_grad:
        raise SpecError(f"{name}: its loss does not depend on any trainable parameter through autograd: a forward "
                        f"run under torch.no_grad or torch.inference_mode, outputs detached (.detach(), .item(), "
                        f"numpy), or every parameter frozen (requires_grad=False); training needs the gradient")


def _optimizer_step(name: str, module, optimizer, scheduler, scaler, clip_grad_norm: float | None,
                    distributed: bool) -> None:
    """Clip, step, schedule. A gradient that is NaN or infinite stops the run before the step
    (as fp16's GradScaler skips such a step, except that without loss scaling it is no
    overflow to retry but a fault of the model), so no weights after it are saved."""
    if distributed and not scheduler.last_epoch:  # the first step: DDP would fail at the next one
        unused = [k for k, p in module.named_parameters() if p.requires_grad and p.grad is None]
        if unused:
            raise SpecError(f"{name}: parameters {', '.join(unused[:5])} get no gradient under DDP, which needs "
                            f"every trainable parameter in the loss of each step: use them, freeze them "
                            f"(requires_grad=False), or train with one process")
    if clip_grad_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(module.parameters(), clip_grad_norm)
    if not scaler.is_enabled():
        _check_finite(name, "gradient", {k: p.grad for k, p in module.named_parameters() if p.grad is not None})
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()


def _check_finite(name: str, what: str, tensors: dict[str, torch.Tensor]) -> None:
    """Stop the run, naming the parameters, where any of `tensors` holds a NaN or an infinity."""
    if not tensors or torch.stack([t.isfinite().all() for t in tensors.values()]).all():
        return
    bad = [k for k, t in tensors.items() if not t.isfinite().all()]
    raise ZooError(f"{name}: non-finite {what} (NaN or infinity) in {', '.join(bad[:5])}"
                   f"{' ...' if len(bad) > 5 else ''} while the loss is finite: an operation without a finite "
                   f"derivative at its input (sqrt or log at 0, ...), or a learning rate too high; the run stops "
                   f"here, its last resume point and selected checkpoint hold the last finite weights")


def _select(spec: ModelSpec, run: Run, module, progress: dict[str, Any], epoch: int, train_loss: float,
            val: dict[str, float], monitor: str, higher: bool) -> None:
    """Record the epoch; save the model when validation improved or tied the best; count
    epochs without a strict improvement for --patience.

    A tie goes to the later epoch: a coarse metric (accuracy on 144 held-out digits moves in
    steps of 0.7%) often reaches its best early, at a high learning rate, and stays there;
    the later weights have trained longer at a lower one. resnet8.digits selected this way
    reached 0.981-0.997 test accuracy over seeds 0-5, against 0.978-0.989 over seeds 0-2
    when the earliest of tied epochs was kept (one thread, one machine)."""
    progress["history"].append(train_loss)
    value = run.world.from_main(val.get(monitor))  # one decision for every rank: rank 0's
    progress["val_history"].append(value)
    improved = _improved(value, progress["best"], higher)
    if improved or (value is not None and value == progress["best"]):
        progress.update(best=value, best_epoch=epoch)
        run.save_model(Checkpoint(spec.name, dict(spec.config), cpu_state_dict(module),
                                  {"epoch": epoch, f"val_{monitor}": value}))
    if improved:
        progress["stale_epochs"] = 0
    elif val:
        progress["stale_epochs"] += 1
        patience = run.options.patience
        progress["stopped_early"] = patience is not None and progress["stale_epochs"] >= patience


def _metrics(progress: dict[str, Any], monitor: str, epoch: int, epochs: int, step: int,
             throughput: Throughput) -> dict[str, Any]:
    """The run's figures. A run cut inside an epoch by --max-steps ends with the weights
    selected among the epochs it completed, as any run (`best_epoch`), or, where it
    completed none, with its last step's (`best_epoch` None); `cut_in_epoch` is the epoch
    it stopped in and `train_loss` that epoch's mean loss so far. `stopped_early` only
    where patience left epochs untrained: one whose patience ran out on its last epoch ran
    them all ("stopped early after 8 of 8 epochs" was said)."""
    cut = progress.get("partial")
    return {"train_loss": cut["total"] / cut["seen"] if cut else progress["history"][-1] if progress["history"] else None,
            "loss_history": progress["history"], f"val_{monitor}_history": progress["val_history"],
            "best_epoch": progress["best_epoch"] if cut else progress["best_epoch"] or epoch, "epochs_run": epoch,
            "cut_in_epoch": epoch + 1 if cut else None, "steps": step,
            "stopped_early": progress["stopped_early"] and epoch < epochs,
            "samples_per_second": round(throughput.rate, 1) if throughput.samples else None,
            "train_seconds": round(throughput.seconds, 2)}  # every process of the run's, resumed or not


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The epoch's shuffle: one permutation, the same in every process (as torch's
    DistributedSampler draws it: a generator seeded with seed + epoch)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))


def shard(batch: torch.Tensor, world) -> tuple[torch.Tensor, float]:
    """This process's part of a global batch, and the weight of its mean loss.

    Process r takes examples r, r + N, r + 2N ...; its mean loss is weighted by
    len(part) * N / len(batch), so DDP's average of the processes' gradients is the
    gradient of the global batch's mean loss even when the batch does not split evenly
    (the last one of an epoch). A process left with no example runs one with weight 0,
    because every process must take part in DDP's gradient all-reduce.
    """
    part = batch[world.rank::world.size]
    if len(part) == 0:
        return batch[:1], 0.0
    return part, len(part) * world.size / len(batch)


def holdout(n: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (train, validation): a fixed random `fraction` of n held out."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    k = int(round(n * fraction))
    return perm[k:].sort().values, perm[:k].sort().values


@torch.inference_mode()
def validate(spec: ModelSpec, module: torch.nn.Module, inputs, targets, idx: torch.Tensor, device: str) -> dict[str, float]:
    """Loss and task metric (fp32, eval mode) on the held-out examples."""
    module.eval()
    step = spec.axes["batch"].max
    parts: dict[str, list[torch.Tensor]] = {}
    loss_sum = 0.0
    for i in range(0, len(idx), step):
        part = idx[i:i + step]
        outputs = call_module(module, spec, {k: _to(v[part], device, None) for k, v in inputs.items()})
        loss_sum += spec.loss(outputs, targets[part].to(device)).item() * len(part)
        for k, v in outputs.items():
            parts.setdefault(k, []).append(v.float().cpu() if v.is_floating_point() else v.cpu())
    result = {"loss": loss_sum / len(idx)}
    if spec.metric is not None and spec.metric.compute is not None:
        outputs_np = {k: torch.cat(v).numpy() for k, v in parts.items()}
        result[spec.metric.name] = spec.metric.value(spec.name, "the validation split", outputs_np,
                                                     targets[idx].numpy())
    return result


def _monitor(spec: ModelSpec) -> tuple[str, bool]:
    if spec.metric is not None and spec.metric.compute is not None:
        return spec.metric.name, spec.metric.higher_is_better
    return "loss", False


def _improved(value: float | None, best: float | None, higher: bool) -> bool:
    if value is None or not math.isfinite(value):
        return False
    return best is None or (value > best if higher else value < best)


def _last(progress: dict[str, Any], monitor: str) -> str:
    values = [v for v in progress["val_history"] if v is not None]
    return f" val {monitor} {values[-1]:.4f}" if values else ""


def _to(v: torch.Tensor, device: str, memory_format) -> torch.Tensor:
    """A batch tensor on `device`, an image batch in the run's layout. Without channels-last
    it is made row-major whatever strides it came with: (N, 1, H, W) strides that also read
    as channels-last (padding or slicing one can leave them) make every convolution after
    it channels-last, and DDP warns that the 1x1 kernels' gradients do not fit its buckets."""
    v = v.to(device)
    if v.dim() != 4:
        return v
    if memory_format is not None:
        return v.contiguous(memory_format=memory_format)
    return v if v.stride() == torch.empty(v.shape, device="meta").stride() else v.clone(
        memory_format=torch.contiguous_format)


OPTIMIZERS = ("adamw", "sgd")
SCHEDULES = ("onecycle", "cosine", "constant")


def _optimizer(module: torch.nn.Module, name: str, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    if name == "adamw":
        return torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=weight_decay)
    raise ZooError(f"unknown optimizer {name!r} in recipe (adamw | sgd)")


def _scheduler(optimizer: torch.optim.Optimizer, name: str, lr: float, total_steps: int):
    if name == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=total_steps)
    if name == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
    if name == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    raise ZooError(f"unknown schedule {name!r} in recipe (onecycle | cosine | constant)")

"""`zoo train`: train a spec by its recipe into a run directory.

    checkpoints/resnet8.digits/     (--out; `zoo export` and `zoo predict` read it)
        model/          the selected checkpoint: best validation metric (safetensors)
        last/           the resume point: weights, optimizer, scheduler, RNG (--resume)
        metrics.json    final metrics, also in model/checkpoint.json
        tensorboard/    event files (`tensorboard --logdir checkpoints`)
        trace.json      with --profile: a torch.profiler Chrome trace of a few steps

One process, or several under `torchrun` (DDP, see `zoo.training.distributed`). Models
with a supervised recipe go through `zoo.training.loop`; a plugin with its own loop
(`spec.trainer`, e.g. PPO) gets the same `Run`, so checkpoints, resume, logs and
device handling are the same for every model.
"""

from __future__ import annotations

import contextlib
import logging
import numbers
import platform
from pathlib import Path
from typing import Any, Callable

import torch

from .arguments import check_device
from .checkpoint import Checkpoint, check_replaceable, default_path
from .errors import UsageError, ZooError
from .fsutil import check_destination
from .registry import get_model
from .spec import ModelSpec
from .arrays import to_numpy
from .tensors import call_module, to_torch
from .training import distributed
from .training.loop import fit
from .training.options import TrainOptions, check_seed, run_files
from .training.run import Run, prepare_run_directory, restore_set_aside
from .training.state import check_resume_destination
from .verify import evaluate

log = logging.getLogger("zoo.train")


def train(model: str | ModelSpec, *, out: str | Path | None = None, seed: int | None = None,
          epochs: int | None = None, device: str = "cpu", progress: bool = True,
          options: TrainOptions | None = None,
          on_epoch_end: Callable[[int, dict[str, Any]], None] | None = None) -> Checkpoint:
    """Train `model` by its recipe into the run directory `out` (default checkpoints/<model>).

    Returns the selected checkpoint (in `out/model`). `on_epoch_end(epoch, scalars)` is
    called after every epoch; raising from it interrupts the run like Ctrl-C would. A spec
    configured away from its registered default needs `out`, as `zoo train --config` needs
    `--out`: checkpoints/<model> holds the default model.
    """
    spec = get_model(model)
    options = options or TrainOptions()
    if not isinstance(options, TrainOptions):
        raise UsageError(f"options must be a zoo.TrainOptions, got {type(options).__name__}")
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, numbers.Integral)):
        raise UsageError(f"epochs must be a whole number, got {epochs!r}")
    if isinstance(out, str) and not out.strip():
        raise UsageError(f"out must name a directory, got {out!r}")
    if out is None:
        _check_default_config(spec)
    if not spec.trainable:
        raise ZooError(f"model {spec.name} has no training recipe here "
                       f"({'pretrained weights ship with it' if spec.pretrained else 'random init only'})")
    recipe = spec.recipe
    assert recipe is not None
    seed = recipe.seed if seed is None else seed
    check_seed(seed)
    epochs = recipe.epochs if epochs is None else int(epochs)
    if epochs < 1:
        raise ZooError(f"epochs must be at least 1, got {epochs}")
    if check_device(device).startswith("cuda") and not torch.cuda.is_available():
        raise ZooError("device cuda asked for, but no CUDA device is available")
    options.check_device(device)
    val_fraction = recipe.val_fraction if options.val_fraction is None else options.val_fraction
    if options.patience is not None and not val_fraction and spec.trainer is None:
        raise ZooError(f"--patience stops when the validation metric stops improving, and {spec.name} holds no "
                       f"examples out for validation (its recipe's val_fraction is 0): add --val-fraction, e.g. "
                       f"0.1, or leave --patience out")
    out = Path(out) if out is not None else default_path(spec.name)
    check_destination(out, "--out")  # before training, so that no epoch is lost to it
    check_replaceable(run_files(out)["model"])
    check_resume_destination(run_files(out)["last"])
    prepare_run_directory(spec.name, out, options.resume)
    try:
        return _run(spec, out, options, seed, epochs, device, progress, on_epoch_end)
    except BaseException:
        restore_set_aside(out)
        raise


def _check_default_config(spec: ModelSpec) -> None:
    """Refuse to train `spec` into its default run directory where its config is not the
    registered model's (a spec not registered under its name has no default to keep)."""
    try:
        default = get_model(spec.name)
    except ZooError:
        return
    changed = {k: v for k, v in spec.config.items() if default.config.get(k, v) != v or k not in default.config}
    if changed:
        raise UsageError(f"{spec.name} with config {changed} is not its default: pass out=DIR, so "
                         f"{default_path(spec.name)} keeps the default model")


def _run(spec: ModelSpec, out: Path, options: TrainOptions, seed: int, epochs: int, device: str, progress: bool,
         on_epoch_end: Callable[[int, dict[str, Any]], None] | None) -> Checkpoint:
    recipe = spec.recipe
    assert recipe is not None
    world = distributed.init(device)
    threads = torch.get_num_threads()
    if options.threads is not None:
        torch.set_num_threads(options.threads)
    try:
        run = Run(spec, out, options, world, seed, epochs, world.device(device), progress, on_epoch_end)
        run.facts.update(seed=seed, epochs=epochs, accumulate=options.accumulate, precision=options.precision,
                         batch_size=options.batch_size or recipe.batch_size,
                         val_fraction=recipe.val_fraction if options.val_fraction is None else options.val_fraction)
        if spec.trainer is not None:
            state, metrics = spec.trainer(spec, run)
            ckpt = Checkpoint(spec.name, dict(spec.config), {k: v.detach().cpu() for k, v in state.items()}, metrics)
        else:
            ckpt = fit(spec, run)
            if world.main and spec.metric is not None:
                metric = evaluate(spec, module_fn(ckpt.module(spec).to(run.device), spec, run.device))
                ckpt.metrics[f"test_{spec.metric.name}"] = metric
        ckpt.metrics.update(_facts(run))
        reached = target_report(spec, ckpt.metrics)
        if reached is not None:
            ckpt.metrics["target"] = reached
            if not reached["met"] and world.main:
                log.warning("%s reached test %s %.4g, short of its recipe's target %g (seed %d, %s)",
                            spec.name, reached["metric"], reached["value"], reached["target"], seed,
                            _length(ckpt.metrics, epochs))
        return run.finish(ckpt)
    finally:
        torch.set_num_threads(threads)
        distributed.shutdown(world)


def _length(metrics: dict[str, Any], epochs: int) -> str:
    """How long the run scored against its target was: its epochs, or where --max-steps or
    early stopping ended it sooner, that (the target is stated for the whole recipe)."""
    run, steps = metrics.get("epochs_run"), metrics.get("steps")
    if metrics.get("cut_in_epoch") is not None or (isinstance(run, int) and run < epochs and
                                                   not metrics.get("stopped_early")):
        return f"a run cut by --max-steps after {steps} step{'s' * (steps != 1)} of {epochs} epochs"
    if metrics.get("stopped_early"):
        return f"stopped early after {run} of {epochs} epochs"
    return f"{epochs} epochs"


def target_report(spec: ModelSpec, metrics: dict[str, Any]) -> dict[str, Any] | None:
    """Whether a run reached its recipe's stated quality (`Recipe.target`) on the test split:
    {"metric", "value", "target", "met"}; None where the recipe states none."""
    if spec.recipe is None or spec.recipe.target is None or spec.metric is None:
        return None
    value = metrics.get(f"test_{spec.metric.name}")
    if not isinstance(value, (int, float)):
        return None
    target = spec.recipe.target
    met = value >= target if spec.metric.higher_is_better else value <= target
    return {"metric": spec.metric.name, "value": float(value), "target": target, "met": bool(met)}


def _facts(run: Run) -> dict[str, Any]:
    """How the run was made: recorded beside its metrics."""
    return {"seed": run.seed, "epochs": run.epochs, "device": run.device, "precision": run.options.precision,
            "world_size": run.world.size, "threads_per_process": torch.get_num_threads(),
            "options": run.options.to_json(), "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
            **{k: v for k, v in run.facts.items() if k not in ("seed", "epochs")}}


def module_fn(module: torch.nn.Module, spec: ModelSpec, device: str = "cpu"):
    """A runner-like callable (numpy in, numpy out) around an eval-mode module.

    It is the fp32 reference every artifact is held to, so on CUDA it computes in IEEE
    fp32: cuDNN convolutions default to TF32 on Ampere and later (`torch.backends.cudnn.
    allow_tf32` is True), whose 10-bit mantissas alone exceed the fp32 tolerances.
    """

    @torch.inference_mode()
    def run(inputs):
        with ieee_fp32(device):
            return to_numpy(call_module(module, spec, to_torch(inputs, spec, device)))

    return run


@contextlib.contextmanager
def ieee_fp32(device: str):
    """TF32 off for CUDA matmuls and convolutions inside the block (nothing on CPU)."""
    if not device.startswith("cuda"):
        yield
        return
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn

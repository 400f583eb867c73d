"""`zoo train`: the supervised training loop every trainable spec goes through.

Deterministic on CPU for a fixed seed: the shuffle order, augmentation and
initialization all draw from generators seeded from the recipe, so two runs give the
same weights. The checkpoint is written atomically at the end.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from .checkpoint import Checkpoint, default_path
from .errors import ZooError
from .registry import get_model
from .spec import ModelSpec
from .tensors import call_module, to_numpy, to_torch
from .verify import evaluate


def train(model: str | ModelSpec, *, out: str | Path | None = None, seed: int | None = None,
          epochs: int | None = None, device: str = "cpu", progress: bool = True) -> Checkpoint:
    """Train `model` by its recipe and write a checkpoint (default `checkpoints/<model>`)."""
    spec = get_model(model)
    if not spec.trainable:
        raise ZooError(f"model {spec.name} has no training recipe here "
                       f"({'pretrained weights ship with it' if spec.pretrained else 'random init only'})")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ZooError("device cuda asked for, but no CUDA device is available")
    recipe = spec.recipe
    assert recipe is not None
    seed = recipe.seed if seed is None else seed
    epochs = recipe.epochs if epochs is None else epochs
    if epochs < 1:
        raise ZooError(f"epochs must be at least 1, got {epochs}")
    if spec.trainer is not None:
        state, metrics = spec.trainer(spec, seed=seed, epochs=epochs, device=device, progress=progress)
        ckpt = Checkpoint(spec.name, dict(spec.config), {k: v.detach().cpu() for k, v in state.items()},
                          {"seed": seed, "epochs": epochs, "device": device, **metrics})
        ckpt.save(out if out is not None else default_path(spec.name))
        return ckpt
    assert spec.dataset is not None and spec.loss is not None

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    x, y = spec.dataset.load("train")
    inputs = to_torch(x, spec)
    targets = torch.from_numpy(np.asarray(y))
    n = len(targets)
    steps_per_epoch = math.ceil(n / recipe.batch_size)

    module = spec.build().to(device)
    optimizer = _optimizer(module, recipe.optimizer, recipe.lr, recipe.weight_decay)
    scheduler = _scheduler(optimizer, recipe.schedule, recipe.lr, epochs * steps_per_epoch)

    start = time.perf_counter()
    history = []
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[status]}"),
                  TimeElapsedColumn(), disable=not progress, transient=False) as bar:
        task = bar.add_task(f"train {spec.name}", total=epochs * steps_per_epoch, status="")
        for epoch in range(epochs):
            module.train()
            order = torch.randperm(n, generator=gen)
            total = 0.0
            for i in range(steps_per_epoch):
                idx = order[i * recipe.batch_size:(i + 1) * recipe.batch_size]
                batch = {k: v[idx] for k, v in inputs.items()}
                if spec.dataset.augment is not None:
                    batch = spec.dataset.augment(batch, gen)
                batch = {k: v.to(device) for k, v in batch.items()}
                loss = spec.loss(call_module(module, spec, batch), targets[idx].to(device))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                scheduler.step()
                value = loss.detach().item()
                total += value * len(idx)
                bar.update(task, advance=1, status=f"epoch {epoch + 1}/{epochs} loss {value:.4f}")
            history.append(total / n)
    seconds = time.perf_counter() - start

    module.eval()
    metric = evaluate(spec, module_fn(module, spec, device))
    metrics: dict[str, Any] = {"train_loss": history[-1], "loss_history": history, "epochs": epochs,
                               "seed": seed, "train_seconds": round(seconds, 2), "device": device,
                               "samples_per_second": round(epochs * n / seconds, 1)}
    if spec.metric is not None:
        metrics[f"test_{spec.metric.name}"] = metric
    ckpt = Checkpoint(spec.name, dict(spec.config), {k: v.cpu() for k, v in module.state_dict().items()},
                      metrics)
    ckpt.save(out if out is not None else default_path(spec.name))
    return ckpt


def module_fn(module: torch.nn.Module, spec: ModelSpec, device: str = "cpu"):
    """A runner-like callable (numpy in, numpy out) around an eval-mode module."""

    @torch.inference_mode()
    def run(inputs):
        return to_numpy(call_module(module, spec, to_torch(inputs, spec, device)))

    return run


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

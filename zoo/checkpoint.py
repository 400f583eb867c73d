"""Checkpoints: a directory with weights in safetensors and a JSON sidecar.

    model.safetensors   the weights (never a pickle)
    checkpoint.json     model name and config, weights sha256, recipe, metrics

Written atomically (temporary directory, fsync, rename), so a crash while saving never
replaces a good checkpoint with a half one. `zoo train` writes a run directory that
holds the selected checkpoint in `model/` (and the resume point in `last/`, see
`zoo.training.state`); everything that reads a checkpoint also accepts the run directory.

    checkpoints/resnet8.digits/         the run directory (`zoo train --out`)
        model/                          the selected weights: best validation metric
        last/                           the resume point: weights, optimizer, scheduler, RNG
        metrics.json  tensorboard/  trace.json
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .errors import CheckpointError, PluginError, ZooError, first_line
from .fsutil import atomic_directory
from .spec import ModelSpec
from .tensors import state_dict_sha256

WEIGHTS = "model.safetensors"
META = "checkpoint.json"
DEFAULT_ROOT = Path("checkpoints")
RUN_MODEL = "model"  # the selected checkpoint inside a run directory
PREVIOUS = "previous"  # inside a run directory: the finished run a new one set aside
PENDING = ".previous.pending"  # the same until the new run writes its first checkpoint


@dataclass
class Checkpoint:
    model: str  # the spec name
    config: dict[str, Any]  # the architecture config the weights belong to
    state: dict[str, torch.Tensor]
    metrics: dict[str, Any] = field(default_factory=dict)  # training and test metrics
    path: Path | None = None

    def __repr__(self) -> str:  # the dataclass's would print every weight tensor
        path = None if self.path is None else str(self.path)
        return f"Checkpoint(model={self.model!r}, path={path!r}, config={self.config!r}, tensors={len(self.state)})"

    @property
    def sha256(self) -> str:
        return state_dict_sha256(self.state)

    def save(self, path: str | Path) -> Path:
        """Write the checkpoint directory `path`, atomically. It may exist only as an empty
        directory or a checkpoint (its two files and nothing else), which is replaced:
        anything else there (a run directory, a resume point, a user's files) is refused,
        never deleted."""
        path = Path(path)
        check_replaceable(path)
        with atomic_directory(path) as tmp:
            self.write_into(tmp)
        self.path = path
        return path

    def write_into(self, directory: Path) -> None:
        """Write the two files into `directory` (the caller makes that atomic)."""
        meta = {"model": self.model, "config": self.config, "weights_sha256": self.sha256,
                "metrics": self.metrics, "saved": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        # safetensors refuses shared or non-contiguous storage: store plain copies
        save_file({k: v.detach().contiguous().cpu().clone() for k, v in self.state.items()}, str(directory / WEIGHTS))
        (directory / META).write_text(json.dumps(meta, indent=2))

    def module(self, spec: ModelSpec) -> torch.nn.Module:
        """The spec's module with these weights, in eval mode."""
        if spec.name != self.model:
            raise CheckpointError(f"checkpoint {self.path} holds weights for {self.model}, not {spec.name}")
        module = built(spec.configure(**{k: v for k, v in self.config.items() if k in spec.config}))
        try:
            module.load_state_dict(self.state, strict=True)
        except RuntimeError as exc:
            raise CheckpointError(f"checkpoint {self.path} does not fit {spec.name} with config {self.config}: "
                                  f"{state_mismatch(module.state_dict(), self.state) or first_line(exc)}") from None
        return module.eval()


def whose(spec: ModelSpec) -> str:
    """The model and the plugin it comes from, as a failure in the plugin's code names them."""
    return f"{spec.name} (plugin {spec.plugin})" if spec.plugin else spec.name


def built(spec: ModelSpec) -> torch.nn.Module:
    """`spec.build()`, the plugin's code: what fails in it is said as the model's and its
    plugin's failure (`PluginError`, one line), not as a line of torch or of the plugin,
    with the config values changed from the registered model's, the likely cause (`-c
    width=-4`: "negative dimension -4"). Exit status 1, not a usage error's 2: the core
    cannot tell a value out of the model's range from a fault of the plugin; a plugin that
    checks its ranges raises its own `UsageError`, which passes through as it is."""
    try:
        module = spec.build()
    except ZooError:
        raise
    except Exception as exc:
        raise PluginError(f"model {whose(spec)} failed to build: {first_line(exc)}{changed_config(spec)}") from exc
    if not isinstance(module, torch.nn.Module):
        raise PluginError(f"model {whose(spec)} failed to build: build() returned "
                          f"{type(module).__name__}, not a torch.nn.Module")
    return module


def changed_config(spec: ModelSpec) -> str:
    """"; config width=-4 (registered: width=32)": the config values of `spec` that differ
    from the registered model's, to name beside a failure of its build; "" where none do
    (or where `spec` is registered under no name)."""
    from .registry import get_model  # the registry imports the plugins, which import this module

    try:
        registered = dict(get_model(spec.name).config)
    except Exception:  # noqa: BLE001 - naming the config must not hide the failure it is named beside
        return ""
    changed = {k: v for k, v in spec.config.items() if k not in registered or registered[k] != v}
    if not changed:
        return ""
    was = ", ".join(f"{k}={registered[k]!r}" for k in changed if k in registered)
    return f"; config {', '.join(f'{k}={v!r}' for k, v in changed.items())}" + (f" (registered: {was})" if was else "")


def state_mismatch(model: Mapping[str, torch.Tensor], saved: Mapping[str, torch.Tensor]) -> str | None:
    """How the weights `saved` differ from the `model`'s state dict in names and shapes, in
    one line (None where they do not): the missing and unexpected names, the first shape
    that differs."""
    missing_names = [k for k in model if k not in saved]
    unexpected = [k for k in saved if k not in model]
    shapes = [(k, list(saved[k].shape), list(v.shape)) for k, v in model.items()
              if k in saved and saved[k].shape != v.shape]
    parts = [f"{what} {', '.join(names[:5])}{f' and {len(names) - 5} more' if len(names) > 5 else ''}"
             for what, names in (("missing", missing_names), ("unexpected", unexpected)) if names]
    if shapes:
        name, theirs, ours = shapes[0]
        more = f" ({len(shapes) - 1} more shapes differ)" if len(shapes) > 1 else ""
        parts.append(f"{name} has shape {theirs} in the checkpoint, {ours} in the model{more}")
    return "; ".join(parts) or None


def check_replaceable(path: Path) -> None:
    """Refuse `path` as a checkpoint's destination unless it is missing, an empty
    directory or a checkpoint (what `Checkpoint.save` may replace)."""
    if not path.exists():
        return
    if not path.is_dir():
        raise CheckpointError(f"cannot save a checkpoint to {path}: it exists and is not a directory")
    held = sorted(p.name for p in path.iterdir())
    if held and held != sorted((META, WEIGHTS)):
        shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
        run = f" (a run directory: its checkpoint is {path / RUN_MODEL})" if RUN_MODEL in held else ""
        raise CheckpointError(f"cannot save a checkpoint to {path}: it holds {shown}, which saving would delete{run}; "
                              f"save to a new or empty directory, or over a checkpoint (a directory of only {META} "
                              f"and {WEIGHTS})")


def default_path(model: str) -> Path:
    return DEFAULT_ROOT / model


def missing(model: str, untrained: str, other: str = "--checkpoint DIR") -> CheckpointError:
    """No checkpoint at `model`'s default path: what to run instead, `untrained` saying how
    the command that asked takes untrained weights and `other` how it takes a checkpoint
    (a Python function's message names its argument beside the flag)."""
    return CheckpointError(f"no checkpoint for {model} at {default_path(model)}: run `zoo train {model}` first, "
                           f"pass {other}, or {untrained}")


def _what_is_there(path: Path, model: str) -> str:
    """Where the checkpoint asked for is instead: the finished run that a new run, which then
    failed or was stopped, set aside (`previous`), and the stopped run's resume point
    (`last`, where it saved no model: a run without validation saves it at the end); else
    how to make one there."""
    from .training.state import resume_command  # the resume point's own module, which imports this one

    resume = f"`zoo {shlex.join(resume_command(model, path))}` continues the run stopped there"
    for aside in (PENDING, PREVIOUS):  # the latest finished run first (`load_checkpoint` reads a pending one)
        if (path / aside / RUN_MODEL / META).is_file():
            return (f"the finished run set aside when a new run started there is in {path / aside}: "
                    f"--checkpoint {path / aside}" + (f"; {resume}" if (path / "last").is_dir() else ""))
    if (path / "last").is_dir():
        return resume
    return f"train one with `zoo train {model} --out {path}`"


def load_checkpoint(path: str | Path, expect_model: str | None = None) -> Checkpoint:
    """Read and validate a checkpoint directory (or its model.safetensors file)."""
    path = Path(path)
    if path.is_file() and path.name == WEIGHTS:
        path = path.parent
    if (path / RUN_MODEL / META).is_file():
        path = path / RUN_MODEL  # a run directory: its selected checkpoint
    elif not (path / META).is_file() and not (path / "last").exists() and (path / PENDING / RUN_MODEL / META).is_file():
        # a new run stopped before its first checkpoint by a kill that left its finished run set aside
        # (the next `zoo train` there puts it back): that run is still the directory's latest
        path = path / PENDING / RUN_MODEL
    if not (path / META).is_file() or not (path / WEIGHTS).is_file():
        raise CheckpointError(f"no checkpoint at {path} (expected {META} and {WEIGHTS}); "
                              + _what_is_there(path, expect_model or "MODEL"))
    try:
        meta = json.loads((path / META).read_text())
        state = load_file(str(path / WEIGHTS))
    except (json.JSONDecodeError, UnicodeDecodeError, SafetensorError, OSError) as exc:
        raise CheckpointError(f"checkpoint {path} is corrupted: {exc}") from None
    if not isinstance(meta, Mapping) or not isinstance(meta.get("model"), str):
        raise CheckpointError(f"checkpoint {path}: {META} does not name a model")
    for name in ("config", "metrics"):
        if not isinstance(meta.get(name, {}), Mapping):
            raise CheckpointError(f"checkpoint {path}: {META} field {name} must be an object, got "
                                  f"{type(meta[name]).__name__}")
    ckpt = Checkpoint(meta["model"], dict(meta.get("config") or {}), state, dict(meta.get("metrics") or {}), path)
    if meta.get("weights_sha256") != ckpt.sha256:
        raise CheckpointError(f"checkpoint {path} is corrupted: its weights do not match the recorded sha256")
    if expect_model is not None and ckpt.model != expect_model:
        raise CheckpointError(f"checkpoint {path} holds weights for {ckpt.model}, not {expect_model}")
    return ckpt

"""The resume point of a run: everything needed to continue bit-for-bit, and no pickle.

    last/
        model.safetensors, checkpoint.json   a complete checkpoint (exportable as is)
        training.safetensors                 optimizer tensors, RNG states
        training.json                        epoch, step, optimizer hyper-parameters,
                                             scheduler and scaler state, run history,
                                             the sha256 of training.safetensors

PyTorch's own `torch.save(optimizer.state_dict())` would pickle; here tensors go to
safetensors and everything else must be plain JSON (the scheduler and optimizer states
of the recipes are; anything that is not raises instead of being pickled). The directory
is replaced atomically, so a crash while saving leaves the previous resume point.
"""

from __future__ import annotations

import json
import logging
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..checkpoint import META, WEIGHTS, Checkpoint, load_checkpoint
from ..errors import CheckpointError
from ..fsutil import atomic_directory, sha256_file
from .options import run_files

TENSORS = "training.safetensors"
STATE = "training.json"
TENSORS_SHA256 = "tensors_sha256"  # training.json's record of training.safetensors
FORMAT = 1


@dataclass
class TrainingState:
    """What `save_state` writes and `load_state` reads back."""

    checkpoint: Checkpoint  # the model weights at the end of `epoch`
    epoch: int  # epochs completed
    step: int  # optimizer steps taken
    optimizer: dict[str, Any]  # an optimizer state_dict, tensors included
    scheduler: dict[str, Any] | None
    scaler: dict[str, Any] | None
    rng: dict[str, torch.Tensor]  # "torch", "cuda", "data": generator states (see `merge_ranks`)
    run: dict[str, Any]  # history, best metric, patience counter, options: JSON


def check_resume_destination(path: Path) -> None:
    """Refuse `path` (a run's `last/`) unless it is missing, empty or a resume point, which
    a run replaces: a user's own folder there would be deleted by the first epoch's save."""
    if not path.exists():
        return
    held = sorted(p.name for p in path.iterdir()) if path.is_dir() else None
    if held is None or held and not set(held) <= {META, WEIGHTS, STATE, TENSORS}:
        what = "is not a directory" if held is None else f"holds {', '.join(held[:5])}"
        raise CheckpointError(f"{path} {what}, which the run's resume point would replace: move it, or train "
                              f"into another --out")


def save_state(path: Path, state: TrainingState) -> Path:
    tensors: dict[str, torch.Tensor] = {f"rng.{k}": v.detach().cpu().contiguous() for k, v in state.rng.items()}
    opt_scalars: dict[str, dict[str, Any]] = {}
    for index, entry in state.optimizer["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optimizer.{index}.{key}"] = value.detach().cpu().contiguous().clone()
            else:
                opt_scalars.setdefault(str(index), {})[key] = value
    meta = {"format": FORMAT, "model": state.checkpoint.model, "epoch": state.epoch, "step": state.step,
            "optimizer": {"param_groups": state.optimizer["param_groups"], "scalars": opt_scalars},
            "scheduler": state.scheduler, "scaler": state.scaler, "run": state.run}
    try:
        json.dumps(meta)
    except TypeError as exc:
        raise CheckpointError(f"training state is not plain JSON ({exc}); the zoo does not pickle it") from None
    with atomic_directory(path) as tmp:
        state.checkpoint.write_into(tmp)
        save_file(tensors, str(tmp / TENSORS))
        meta[TENSORS_SHA256] = sha256_file(tmp / TENSORS)  # a flipped bit there would load, and steer the run
        (tmp / STATE).write_text(json.dumps(meta, indent=1))
    return path


def check_resume_point(path: Path) -> None:
    if not (path / STATE).is_file() or not (path / TENSORS).is_file():
        raise CheckpointError(f"no resume point at {path} (expected {STATE} and {TENSORS}): "
                              f"start the run without --resume")


def interrupted(out: Path, argv: list[str]) -> str:
    """What an interrupted run kept, and the command that continues it (Ctrl-C said nothing:
    the progress bar stopped where it was)."""
    files = run_files(out)
    last = files["last"]
    if files["metrics"].is_file() and "--resume" not in argv:  # the finished run it had set aside, put back
        return (f"interrupted before the run's first resume point (written after each epoch): nothing of it was "
                f"kept, and the finished run in {out} is as it was")
    try:
        epoch = int(json.loads((last / STATE).read_text())["epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"interrupted before the run's first resume point (written after each epoch): nothing in {out} to resume"
    again = argv if "--resume" in argv else [*argv, "--resume"]
    return (f"interrupted: the resume point {last} holds the run after epoch {epoch} (the one in progress is "
            f"lost); `zoo {shlex.join(again)}` continues it from there")


#: the settings a resume point records that `zoo train` takes as options, by their flags
FLAGS = {"seed": "--seed", "epochs": "--epochs", "batch_size": "--batch-size", "accumulate": "--accumulate",
         "val_fraction": "--val-fraction", "precision": "--precision", "clip_grad_norm": "--clip-grad-norm",
         "patience": "--patience", "threads": "--threads"}


def resume_command(model: str, out: Path) -> list[str]:
    """The `zoo train` arguments that continue the run stopped in `out`: its config and the
    settings it was trained with that are not its recipe's defaults. A bare `zoo train MODEL
    --out DIR --resume` was refused for another epoch count or batch, and without --threads
    1 continued other than bit for bit."""
    last = run_files(out)["last"]
    try:
        meta = json.loads((last / STATE).read_text())
        settings, model = dict(meta["run"].get("settings") or {}), str(meta.get("model") or model)
        config = dict(json.loads((last / META).read_text()).get("config") or {})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return ["train", model, "--out", str(out), "--resume"]
    registered, defaults = _defaults(model)
    args = ["train", model, "--out", str(out)]
    for key, value in config.items():
        if key not in registered or registered[key] != value:
            args += ["-c", f"{key}={_config_value(value)}"]
    for key, flag in FLAGS.items():
        value = settings.get(key)
        if value is not None and (key not in defaults or defaults[key] != value):
            args += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return [*args, "--resume"]


def _defaults(model: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The registered model's config, and what `zoo train` takes without options: the
    recipe's seed, epochs, batch and validation fraction only where `model` is registered
    here (else they are spelled out)."""
    from ..errors import ZooError
    from ..registry import get_model

    options = {"accumulate": 1, "precision": "fp32"}
    try:
        spec = get_model(model)
    except ZooError:
        return {}, options
    recipe = spec.recipe
    if recipe is None:
        return dict(spec.config), options
    return dict(spec.config), {**options, "seed": recipe.seed, "epochs": recipe.epochs,
                               "batch_size": recipe.batch_size, "val_fraction": recipe.val_fraction}


def _config_value(value: Any) -> str:
    """A config value as `--config KEY=VALUE` reads it back (JSON where it parses, else a string)."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return value
    return json.dumps(value)


def load_state(path: Path, model: str) -> TrainingState:
    """Read a resume point written for `model`; a clear error for anything else."""
    check_resume_point(path)
    checkpoint = load_checkpoint(path, expect_model=model)
    try:
        meta = json.loads((path / STATE).read_text())
        _check_tensors_sha256(path, meta)
        tensors = load_file(str(path / TENSORS))
    except (json.JSONDecodeError, SafetensorError, OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"resume point {path} is corrupted: {exc}") from None
    if not isinstance(meta, Mapping) or meta.get("format") != FORMAT or meta.get("model") != model:
        raise CheckpointError(f"resume point {path} was not written for {model} by this version of zoo")
    try:
        state: dict[int, dict[str, Any]] = {}
        for name, value in tensors.items():
            kind, _, rest = name.partition(".")
            if kind == "optimizer":
                index, _, key = rest.partition(".")
                state.setdefault(int(index), {})[key] = value
        for index, scalars in meta["optimizer"]["scalars"].items():
            state.setdefault(int(index), {}).update(scalars)
        rng = {name[len("rng."):]: value for name, value in tensors.items() if name.startswith("rng.")}
        return TrainingState(checkpoint, int(meta["epoch"]), int(meta["step"]),
                             {"state": state, "param_groups": meta["optimizer"]["param_groups"]},
                             meta.get("scheduler"), meta.get("scaler"), rng, dict(meta["run"]))
    except (KeyError, ValueError, TypeError) as exc:
        raise CheckpointError(f"resume point {path} is corrupted: missing or malformed {exc}") from None


def _check_tensors_sha256(path: Path, meta: Any) -> None:
    """Refuse a resume point whose training.safetensors is not the file its training.json
    recorded: a flipped bit of the optimizer or generator state loads, and the run diverges."""
    if not isinstance(meta, Mapping):
        return  # refused below as not a resume point of this zoo's
    if TENSORS_SHA256 not in meta:  # written before resume points recorded it (the format is the same)
        logging.getLogger("zoo").warning("resume point %s was written by an earlier zoo, which recorded no sha256 of "
                                         "%s: its optimizer and generator state are taken unchecked", path, TENSORS)
        return
    recorded = meta.get(TENSORS_SHA256)
    if not isinstance(recorded, str):
        raise CheckpointError(f"resume point {path} is corrupted: {STATE}'s {TENSORS_SHA256} is no sha256")
    if recorded != sha256_file(path / TENSORS):
        raise CheckpointError(f"resume point {path} is corrupted: {TENSORS} does not match the sha256 recorded in "
                              f"{STATE}")


def capture_rng(data: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state()
    if data is not None:
        rng["data"] = data.get_state()
    return rng


def merge_ranks(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Every process's `capture_rng` in one mapping: rank 0's by name ("torch", "data"), rank
    r's as "rank<r>.<name>": each process draws its own augmentation, so a resumed run
    continues exactly only where each restores its own."""
    merged = dict(states[0])
    for rank, state in enumerate(states[1:], start=1):
        merged.update({f"rank{rank}.{k}": v for k, v in state.items()})
    return merged


def restore_rng(rng: Mapping[str, torch.Tensor], data: torch.Generator | None = None, rank: int = 0) -> None:
    """Restore process `rank`'s generators (a resume point from fewer processes has none for
    the others, which keep their seeded start)."""
    if rank:
        prefix = f"rank{rank}."
        rng = {k[len(prefix):]: v for k, v in rng.items() if k.startswith(prefix)}
        if not rng:
            return
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    if data is not None and "data" in rng:
        data.set_state(rng["data"])

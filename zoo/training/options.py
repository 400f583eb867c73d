"""How a run trains, beyond the model's recipe: precision, memory levers, logging.

The recipe (`spec.recipe`) says what reaches the stated quality; `TrainOptions` says how
this machine gets there. Every option is checked against the device before the first
step, so a precision the device cannot do is an error up front, not a silent fp32 run.
PyTorch is imported where a device is met, not by the usage checks `zoo train` runs first.
"""

from __future__ import annotations

import contextlib
import numbers
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..arguments import check_device
from ..errors import UnsupportedError, UsageError, ZooError

if TYPE_CHECKING:
    import torch

PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class TrainOptions:
    precision: str = "fp32"  # "fp32" | "bf16" (autocast) | "fp16" (autocast + gradient scaling, CUDA)
    batch_size: int | None = None  # global batch per optimizer micro-step; None: the recipe's
    accumulate: int = 1  # micro-batches per optimizer step (effective batch = batch_size * accumulate)
    clip_grad_norm: float | None = None  # clip the global gradient norm to this value
    grad_checkpointing: bool = False  # recompute activations in backward: the model's own `set_grad_checkpointing`
    channels_last: bool | None = None  # NHWC activations for convolutional models; None: the recipe's
    compile: bool = False  # torch.compile the training module
    val_fraction: float | None = None  # train examples held out for validation; None: the recipe's
    patience: int | None = None  # stop after this many epochs without a better validation metric
    max_steps: int | None = None  # stop after this many optimizer steps (smoke tests, throughput runs)
    resume: bool = False  # continue from <out>/last
    profile: bool = False  # write a torch.profiler Chrome trace of a few steps to <out>/trace.json
    tensorboard: bool = True  # write event files to <out>/tensorboard
    threads: int | None = None  # intra-op threads per process; None: torch's default (or cores / processes)

    def __post_init__(self) -> None:
        self._check_types()
        if self.precision not in PRECISIONS:
            raise UsageError(f"unknown precision {self.precision!r} for training (one of {', '.join(PRECISIONS)})")
        if self.accumulate < 1:
            raise UsageError(f"--accumulate must be at least 1, got {self.accumulate}")
        if self.batch_size is not None and self.batch_size < 1:
            raise UsageError(f"--batch-size must be at least 1, got {self.batch_size}")
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise UsageError(f"--clip-grad-norm must be positive, got {self.clip_grad_norm}")
        if self.val_fraction is not None and not 0 <= self.val_fraction < 1:
            raise UsageError(f"--val-fraction must be in [0, 1), got {self.val_fraction}")
        if self.patience is not None and self.patience < 1:
            raise UsageError(f"--patience must be at least 1 epoch, got {self.patience}")
        if self.max_steps is not None and self.max_steps < 1:
            raise UsageError(f"--max-steps must be at least 1, got {self.max_steps}")
        if self.threads is not None and self.threads < 1:
            raise UsageError(f"--threads must be at least 1, got {self.threads}")

    def _check_types(self) -> None:
        """Refuse a value of the wrong kind before the range checks compare it (a str) or a
        run takes it (a float batch size or step count): counts are whole numbers (an int, or
        numpy's, made an int; not a bool), fractions and norms numbers, switches bools."""
        for name in ("batch_size", "accumulate", "patience", "max_steps", "threads"):
            value = getattr(self, name)
            if value is None and name != "accumulate":
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise UsageError(f"--{name.replace('_', '-')} must be a whole number, got {value!r}")
            object.__setattr__(self, name, int(value))
        for name in ("clip_grad_norm", "val_fraction"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
                raise UsageError(f"--{name.replace('_', '-')} must be a number, got {value!r}")
        for name in ("grad_checkpointing", "compile", "resume", "profile", "tensorboard", "channels_last"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (value is None and name == "channels_last"):
                raise UsageError(f"{name} must be True or False, got {value!r}")
        if not isinstance(self.precision, str):
            raise UsageError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def check_device(self, device: str) -> None:
        """Refuse a device the zoo does not know, and a precision it cannot compute natively."""
        import torch

        kind = torch.device(check_device(device)).type
        if self.precision == "fp16" and kind == "cpu":
            raise UnsupportedError("fp16 training needs a CUDA device (gradient scaling for fp16 is a GPU "
                                   "technique); on CPU train with --precision bf16 or fp32")
        if self.precision == "bf16":
            if kind == "cpu" and not _cpu_has_bf16():
                raise UnsupportedError("this CPU has no native bf16 (AVX512-BF16 or AMX): bf16 autocast would be "
                                       "emulated and slower than fp32; train with --precision fp32")
            if kind == "cuda" and not torch.cuda.is_bf16_supported():
                raise UnsupportedError(f"{torch.cuda.get_device_name(device)} has no bf16: train with --precision fp16")

    def autocast(self, device: str):
        """The autocast context of a forward pass (a no-op in fp32)."""
        import torch

        if self.precision == "fp32":
            return contextlib.nullcontext()
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[self.precision]
        return torch.autocast(torch.device(device).type, dtype=dtype)

    def scaler(self, device: str) -> torch.amp.GradScaler:
        """fp16's loss scaling (disabled, and a pass-through, at other precisions)."""
        import torch

        return torch.amp.GradScaler(torch.device(device).type, enabled=self.precision == "fp16")

    def wants_channels_last(self, module: torch.nn.Module, recipe: bool | None = None) -> bool:
        """Channels-last for this run: as asked, else as the recipe says (`Recipe.channels_last`),
        else with autocast only."""
        import torch

        has_conv = any(isinstance(m, torch.nn.Conv2d) for m in module.modules())
        if self.channels_last is None:
            return has_conv and (self.precision != "fp32" if recipe is None else recipe)
        if self.channels_last and not has_conv:
            raise ZooError("--channels-last is for convolutional models; this one has no Conv2d")
        return self.channels_last


def check_usage(spec, options: TrainOptions, epochs: int | None, seed: int | None = None) -> None:
    """Refuse, as usage errors (exit status 2), command-line values no run of `spec` can take:
    `zoo train` checks them before it starts a process (or torchrun's several)."""
    if epochs is not None and epochs < 1:
        raise UsageError(f"--epochs must be at least 1, got {epochs}")
    if seed is not None:  # as zoo.train says it, under --nproc too (exit 2, not 1)
        check_seed(seed)
    if spec.recipe is None or spec.trainer is not None:
        return
    held = spec.recipe.val_fraction if options.val_fraction is None else options.val_fraction
    if options.patience is not None and not held:
        raise UsageError(f"--patience stops when the validation metric stops improving, and {spec.name} holds "
                         f"no examples out for validation (val_fraction 0): add --val-fraction, e.g. 0.1, or "
                         f"leave --patience out")


def check_seed(seed: object) -> None:
    """A seed torch's generators take: an integer from 0 to 2**64 - 1."""
    from ..spec import SEEDS

    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEEDS:
        raise UsageError(f"seed must be an integer from 0 to 2**64 - 1, got {seed!r}")


def _cpu_has_bf16() -> bool:
    import torch

    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def run_files(out: Path) -> dict[str, Path]:
    """Where a run keeps its parts inside the run directory `out`."""
    return {"model": out / "model", "last": out / "last", "metrics": out / "metrics.json",
            "tensorboard": out / "tensorboard", "trace": out / "trace.json"}

"""The training engine behind `zoo train`: options, the run directory, the supervised
loop, resume points and DDP. `zoo.train.train` is the entry point.

`Run` and `TrainOptions` are imported when first used, so that `zoo train`'s usage checks
(`training.options`) import no PyTorch."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .options import TrainOptions
    from .run import Run

__all__ = ["Run", "TrainOptions"]


def __getattr__(name: str):
    if name == "Run":
        from .run import Run

        return Run
    if name == "TrainOptions":
        from .options import TrainOptions

        return TrainOptions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

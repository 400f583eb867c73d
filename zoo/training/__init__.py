"""The training engine behind `zoo train`: options, the run directory, the supervised
loop, resume points and DDP. `zoo.train.train` is the entry point."""

from .options import TrainOptions
from .run import Run

__all__ = ["Run", "TrainOptions"]

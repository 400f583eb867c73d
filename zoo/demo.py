"""`zoo demo`: the main job on the embedded default, on CPU with no server.

Trains resnet8.digits, exports it through every backend that can run on this CPU,
re-verifies each artifact, and benchmarks them side by side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from .bench import benchmark
from .export import export
from .registry import backends
from .train import train
from .verify import verify_artifact

MODEL = "resnet8.digits"


def run(repository: Path, min_time: float = 1.0, batch_sizes=(1, 32), console: Console | None = None) -> dict[str, Any]:
    console = console or Console()
    ckpt = train(MODEL)
    console.print(f"trained {MODEL}: test accuracy {ckpt.metrics['test_accuracy']:.4f} "
                  f"in {ckpt.metrics['train_seconds']:.1f} s -> {ckpt.path}")
    names = []
    for name, be in backends().items():
        probe = be.probe("cpu")
        if not probe.ok or "fp32" not in be.precisions.get("cpu", ()):
            console.print(f"skipping backend {name}: {probe.reason or 'no fp32 on cpu'}")
            continue
        art = export(MODEL, name, "fp32", "cpu", repository, checkpoint=ckpt)
        report = verify_artifact(art.path)
        console.print(f"exported and verified {art.path}: max |error| {report['parity']['max_abs_error']:.2g}, "
                      f"accuracy {report['metric']['artifact']:.4f}")
        names.append(name)
    return benchmark(MODEL, names, batch_sizes, repository=repository, checkpoint=ckpt.path, min_time=min_time)

"""`zoo demo`: the main job on the embedded default, on CPU with no server.

Trains resnet8.digits, exports it through every backend that can run on this CPU,
re-verifies each artifact, and benchmarks them side by side. Backends whose export
compiles native code (`Backend.compiles`: Inductor, AOTInductor, engine builders) take
a minute or more each on a small CPU, so they run only when named (`--backends all`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from .bench import benchmark
from .export import export
from .registry import backends, probe as probe_backend
from .train import train
from .verify import verify_artifact

MODEL = "resnet8.digits"


def choose(only: list[str] | None = None) -> tuple[list[str], list[str]]:
    """The backends the demo exports and measures, and one line per backend it skips.

    `only`: None for every backend that runs on this CPU at fp32 and does not compile;
    ["all"] for every one that runs here; else those names."""
    from .errors import UnknownBackendError

    known = backends()
    unknown = [n for n in only or () if n != "all" and n not in known]
    if unknown:
        raise UnknownBackendError(f"unknown backend {unknown[0]!r}; `zoo backends` lists them")
    chosen, skipped = [], []
    for name, be in known.items():
        if only is not None and "all" not in only and name not in only:
            continue
        probe = probe_backend(be, "cpu")
        if not probe.ok or "fp32" not in be.precisions.get("cpu", ()):
            skipped.append(f"skipping backend {name}: {probe.reason or 'no fp32 on cpu'}")
        elif only is None and be.compiles:
            skipped.append(f"skipping backend {name}: its export compiles native code for a minute or more; "
                           f"`zoo demo --backends all` includes it")
        else:
            chosen.append(name)
    return chosen, skipped


def run(repository: Path, min_time: float = 1.0, batch_sizes=(1, 32), console: Console | None = None,
        only: list[str] | None = None) -> dict[str, Any]:
    """Train, export to the backends `choose(only)` picks, verify each, benchmark them."""
    console = console or Console()
    chosen, skipped = choose(only)  # an unknown name fails before the training
    ckpt = train(MODEL)
    console.print(f"trained {MODEL}: test accuracy {ckpt.metrics['test_accuracy']:.4f} "
                  f"in {ckpt.metrics['train_seconds']:.1f} s -> {ckpt.path}")
    for line in skipped:
        console.print(line)
    for name in chosen:
        art = export(MODEL, name, "fp32", "cpu", repository, checkpoint=ckpt)
        report = verify_artifact(art.path)
        console.print(f"exported and verified {art.path}: max |error| {report['parity']['max_abs_error']:.2g}, "
                      f"accuracy {report['metric']['artifact']:.4f}")
    return benchmark(MODEL, chosen, batch_sizes, repository=repository, checkpoint=ckpt.path, min_time=min_time)

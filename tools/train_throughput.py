"""Training throughput of every trainable model: fp32 vs bf16, 1 process vs 2 (DDP).

    .venv/bin/python tools/train_throughput.py [--steps 30] [--models 'resnet8*,mpnn*']
    .venv/bin/python tools/train_throughput.py --layouts [--repeats 3] [--models ...]

`--layouts` measures the convolutional models in fp32 row-major against channels-last
instead, the two runs alternating `--repeats` times (the median of each): the figures
behind a recipe's `channels_last`.

Each measurement is its own `zoo train ... --max-steps N` process (so no run warms up
another's caches or threads), run one after another on an otherwise idle machine; the
samples/s it reports is the run's own (validation excluded). Prints a markdown table
for docs/benchmarks.md. PPO is measured in environment steps per second over its
iterations (it trains in fp32 in one process only).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import zoo

SETTINGS = {"fp32": [], "bf16": ["--precision", "bf16"], "fp32 DDP x2": ["--nproc", "2"]}
LAYOUTS = {"row-major": ["--no-channels-last"], "channels-last": ["--channels-last"]}


def measure(model: str, args: list[str], steps: int, out: Path) -> float | str:
    spec = zoo.get_model(model)
    limit = ["--epochs", "3"] if spec.trainer is not None else ["--max-steps", str(steps), "--val-fraction", "0"]
    command = [sys.executable, "-m", "zoo", "train", model, "--out", str(out), "--no-tensorboard", *limit, *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        return "n/a: " + (done.stderr.strip().splitlines() or ["failed"])[-1].removeprefix("error: ")[:80]
    metrics = json.loads((out / "metrics.json").read_text())
    return metrics["samples_per_second"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per measurement")
    parser.add_argument("--models", default="*", help="comma-separated name patterns")
    parser.add_argument("--layouts", action="store_true", help="fp32 row-major against channels-last")
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs of each layout (--layouts)")
    args = parser.parse_args()
    patterns = args.models.split(",")
    models = [m for m in zoo.list_models() if zoo.get_model(m).trainable
              and any(fnmatch.fnmatch(m, p) for p in patterns)]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; torch {torch.__version__}; "
          f"{args.steps} optimizer steps per run\n")
    if args.layouts:
        return layouts([m for m in models if zoo.get_model(m).domain == "vision"], args.steps, args.repeats)
    print("| model | batch | " + " | ".join(f"{s} samples/s" for s in SETTINGS) + " | bf16 / fp32 | DDP x2 / x1 |")
    print("|---|---|" + "---|" * (len(SETTINGS) + 2))
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            rates = {name: measure(model, extra, args.steps, Path(tmp) / f"{model}-{i}")
                     for i, (name, extra) in enumerate(SETTINGS.items())}

            def ratio(a: str, b: str) -> str:
                x, y = rates[a], rates[b]
                return f"{x / y:.2f}x" if isinstance(x, float) and isinstance(y, float) else "-"

            cells = [f"{v:,.0f}" if isinstance(v, float) else v for v in rates.values()]
            batch = zoo.get_model(model).recipe.batch_size
            print(f"| {model} | {batch} | " + " | ".join(cells) + f" | {ratio('bf16', 'fp32')} | "
                  f"{ratio('fp32 DDP x2', 'fp32')} |", flush=True)


def layouts(models: list[str], steps: int, repeats: int) -> None:
    print("| model | batch | recipe | row-major samples/s | channels-last samples/s | channels-last / row-major |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in models:
            rates: dict[str, list] = {name: [] for name in LAYOUTS}
            for i in range(repeats):
                for name, extra in LAYOUTS.items():
                    rates[name].append(measure(model, extra, steps, Path(tmp) / f"{model}-{name}-{i}"))
            median = {name: sorted(v)[len(v) // 2] if all(isinstance(x, float) for x in v) else v[0]
                      for name, v in rates.items()}
            row, last = median["row-major"], median["channels-last"]
            ratio = f"{last / row:.2f}x" if isinstance(row, float) and isinstance(last, float) else "-"
            recipe = {True: "channels-last", False: "row-major", None: "row-major (autocast: channels-last)"}[
                zoo.get_model(model).recipe.channels_last]
            cells = " | ".join(f"{v:,.0f}" if isinstance(v, float) else v for v in (row, last))
            print(f"| {model} | {zoo.get_model(model).recipe.batch_size} | {recipe} | {cells} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()

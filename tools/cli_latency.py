"""How long `zoo` command lines take to answer, in fresh processes, side by side for two trees.

    .venv/bin/python tools/cli_latency.py [--rounds N] [--before DIR]

Each command line runs `--rounds` times in this checkout and, with `--before DIR` (another
checkout of the project, e.g. `git worktree add /tmp/old REV`), as many times in that tree,
the two alternating within each round so that a noisy machine affects both alike. Prints
one Markdown row per command: the median wall seconds of each tree and their ratio. Only
exit codes and timings are read; the commands need no server (the `--url` one has none to
reach, and answers with its connection error).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = [
    ["export", "resnet8.digits", "-b", "nosuch", "--random-init"],
    ["bench", "resnet8.digits", "--device", "CPU"],
    ["verify", "no-such-artifact"],
    ["predict", "resnet8.digits.onnxruntime.fp32", "--tensor", "image=x.npy", "--url", "http://127.0.0.1:1"],
    ["train", "resnet8.digits", "--epochs", "0"],
    ["list", "--json"],
]


def run(tree: Path, args: list[str], cwd: Path) -> float:
    """Wall seconds of `python -m zoo ARGS` with `tree`'s zoo and torch backend first on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_PLUGINS", "ZOO_DEBUG")}
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(tree / "backends" / "torch")])
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "zoo", *args], cwd=cwd, env=env, capture_output=True, timeout=300)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--before", type=Path, help="another checkout of the project, measured beside this one")
    args = parser.parse_args()
    trees = [ROOT] + ([args.before.resolve()] if args.before else [])
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        np.save(cwd / "x.npy", np.zeros((1, 1, 8, 8), np.float32))
        for tree in trees:  # warm the page cache and bytecode of both trees before timing
            run(tree, ["--help"], cwd)
        print("| command | " + " | ".join(["this tree, s"] + (["before, s", "before / this"] if args.before else []))
              + " |")
        print("|---" * (2 + 2 * bool(args.before)) + "|")
        for command in COMMANDS:
            times: dict[Path, list[float]] = {tree: [] for tree in trees}
            for i in range(args.rounds):
                for tree in trees if i % 2 == 0 else trees[::-1]:
                    times[tree].append(run(tree, command, cwd))
            medians = [statistics.median(times[tree]) for tree in trees]
            cells = [f"{m:.2f}" for m in medians] + ([f"{medians[1] / medians[0]:.1f}x"] if args.before else [])
            print(f"| `zoo {' '.join(command)}` | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

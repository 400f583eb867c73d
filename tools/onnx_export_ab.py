"""ONNX exports in one process, with and without reusing ONNX Script's op list.

    .venv/bin/python tools/onnx_export_ab.py [--models resnet8.digits,minilm-l6.all-v2] [--exports 6] [--rounds 3]

Each round starts one fresh process per variant (alternating which goes first) that exports
each model at tiny size through `zoo_onnx.export.export_onnx` once to warm up, then
`--exports` more times, timing each. The "rebuilt" variant marks ONNX Script's
`get_torchlib_ops` as already handled, so `export_onnx` leaves torch's exporter rebuilding
its op list on every call, as before `_reuse_torchlib_ops`. Prints the median seconds per
export after the first (and their range), per model and variant, and the ratio of medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, tempfile, time
from pathlib import Path
import zoo
from zoo.tensors import example_inputs
from zoo_onnx.export import export_onnx, torchlib_api
if sys.argv[1] == "rebuilt":  # leave torch's exporter as it is
    torchlib_api().get_torchlib_ops.zoo_reused = True
out = {}
for name in sys.argv[3].split(","):
    spec = zoo.get_model(name).tiny()
    module = spec.build().eval()
    example = example_inputs(spec, "cpu")
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(int(sys.argv[2]) + 1):
            start = time.perf_counter()
            export_onnx(module, spec, example, Path(tmp) / f"{i}.onnx")
            times.append(time.perf_counter() - start)
    out[name] = times[1:]
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet8.digits,minilm-l6.all-v2")
    parser.add_argument("--exports", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    times: dict[tuple[str, str], list[float]] = {}
    for round_ in range(args.rounds):
        variants = ("rebuilt", "reused") if round_ % 2 == 0 else ("reused", "rebuilt")
        for variant in variants:
            done = subprocess.run([sys.executable, "-c", CHILD, variant, str(args.exports), args.models],
                                  check=True, capture_output=True, text=True)
            for model, seconds in json.loads(done.stdout.strip().splitlines()[-1]).items():
                times.setdefault((model, variant), []).extend(seconds)
    print("| model | exports per variant | rebuilt, s per export | reused, s per export | reused / rebuilt |")
    print("|---|---|---|---|---|")
    for model in args.models.split(","):
        before = statistics.median(times[model, "rebuilt"])
        after = statistics.median(times[model, "reused"])
        count = len(times[model, "reused"])
        print(f"| {model} | {count} | {before:.2f} ({_spread(times[model, 'rebuilt'])}) "
              f"| {after:.2f} ({_spread(times[model, 'reused'])}) | {after / before:.2f}x |")


def _spread(seconds: list[float]) -> str:
    return f"{min(seconds):.2f}-{max(seconds):.2f}"


if __name__ == "__main__":
    main()

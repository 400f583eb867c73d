"""ONNX exports in one process: with and without reusing ONNX Script's op list, or with
and without the ONNX cache.

    .venv/bin/python tools/onnx_export_ab.py [--models resnet8.digits,minilm-l6.all-v2] [--exports 6] [--rounds 3]
                                             [--compare oplist|cache] [--full]

Each round starts one fresh process per variant (alternating which goes first) that exports
each model (at tiny size, or full size with `--full`) through
`zoo_onnx.export.export_onnx` once to warm up, then `--exports` more times, timing each.
`--compare oplist` (the default): the "rebuilt" variant marks ONNX Script's
`get_torchlib_ops` as already handled, so `export_onnx` leaves torch's exporter rebuilding
its op list on every call, as before `_reuse_torchlib_ops`; "reused" is as shipped (both
with the ONNX cache off). `--compare cache`: "off" has `ZOO_ONNX_CACHE=0`; "cached" has a
fresh cache directory, which the warm-up export fills, so every timed export is a hit.
Prints the median seconds per export after the first (and their range), per model and
variant, and the ratio of medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

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
    spec = zoo.get_model(name) if sys.argv[4] == "full" else zoo.get_model(name).tiny()
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
    parser.add_argument("--compare", choices=("oplist", "cache"), default="oplist")
    parser.add_argument("--full", action="store_true", help="full-size models instead of tiny ones")
    args = parser.parse_args()
    old, new = ("rebuilt", "reused") if args.compare == "oplist" else ("off", "cached")
    times: dict[tuple[str, str], list[float]] = {}
    for round_ in range(args.rounds):
        for variant in ((old, new) if round_ % 2 == 0 else (new, old)):
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "ZOO_ONNX_CACHE_DIR": cache,
                       "ZOO_ONNX_CACHE": "1" if variant == "cached" else "0"}
                done = subprocess.run([sys.executable, "-c", CHILD, variant, str(args.exports), args.models,
                                       "full" if args.full else "tiny"],
                                      check=True, capture_output=True, text=True, env=env)
            for model, seconds in json.loads(done.stdout.strip().splitlines()[-1]).items():
                times.setdefault((model, variant), []).extend(seconds)
    print(f"| model | exports per variant | {old}, s per export | {new}, s per export | {new} / {old} |")
    print("|---|---|---|---|---|")
    for model in args.models.split(","):
        before, after = statistics.median(times[model, old]), statistics.median(times[model, new])
        print(f"| {model} | {len(times[model, new])} | {before:.2f} ({_spread(times[model, old])}) "
              f"| {after:.2f} ({_spread(times[model, new])}) | {after / before:.2f}x |")


def _spread(seconds: list[float]) -> str:
    return f"{min(seconds):.2f}-{max(seconds):.2f}"


if __name__ == "__main__":
    main()

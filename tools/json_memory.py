"""Peak memory of parsing one JSON inference request body, as `zoo serve` parses it
(`zoo.serve.protocol.decode_request`): an FP32 tensor of N numbers written as JSON, parsed
in a fresh process per size; the peak resident set over the parse (ru_maxrss), less the
process's before it, per MiB of body.

    .venv/bin/python tools/json_memory.py [--mib 16,64] [--code DIR]

`--code DIR`: import zoo from DIR instead (a worktree of another commit), to compare two
versions side by side on one machine."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time
from zoo.serve.protocol import decode_request
n = int(sys.argv[1])
body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [n], "data": [0.125] * n}]}).encode()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
decode_request(body, None)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"body_mib": len(body) / 2**20, "peak_mb": peak / 1024, "seconds": seconds}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", default="16,64", help="body sizes in MiB, comma-separated")
    parser.add_argument("--code", default=None, help="a directory to import zoo from (another commit's tree)")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.code:
        env["PYTHONPATH"] = args.code
    rows = []
    for mib in (float(m) for m in args.mib.split(",")):
        n = int(mib * 2**20 / 7)  # "0.125, " is 7 bytes
        out = subprocess.run([sys.executable, "-c", CHILD, str(n)], env=env, capture_output=True, text=True,
                             check=True, cwd=args.code or os.getcwd()).stdout  # `-c` imports from its cwd first
        row = json.loads(out)
        row["peak_per_body"] = row["peak_mb"] / row["body_mib"]
        rows.append(row)
        print(f"{row['body_mib']:.0f} MiB body: peak +{row['peak_mb']:.0f} MB ({row['peak_per_body']:.1f}x), "
              f"{row['seconds']:.2f} s")


if __name__ == "__main__":
    main()

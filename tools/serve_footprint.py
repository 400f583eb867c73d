"""What `zoo serve` costs to start and to hold, at two revisions of the project, side by side.

    .venv/bin/python tools/serve_footprint.py BASE_REV REPOSITORY [--rounds 5] [--json FILE]

Checks BASE_REV out into a temporary git worktree and starts `zoo serve REPOSITORY` from it
(its `zoo` package, plugins and backends first on the path) and from this working tree,
alternating which goes first every round. For each start: seconds until /v2/health/ready
answers, resident memory then (idle), resident memory after one domain-native request per
model that takes them (images, SMILES, text, observations, as `tests/serve_support.py`
makes them), and whether libtorch is in the process's memory map. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
sys.path.insert(0, str(ROOT / "tests"))


def package_path(tree: Path) -> str:
    """Every package directory of `tree` (core, plugins, backends, libs), for PYTHONPATH."""
    dirs = [tree] + sorted(p.parent.parent for p in tree.glob("*/*/zoo_*/__init__.py"))
    return ":".join(str(d) for d in dirs)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def requests(url: str, repository: Path) -> None:
    """One domain-native request (3 items) to every artifact whose model takes them."""
    import numpy as np
    import tritonclient.http as triton_http

    import zoo
    from serve_support import sample_items

    client = triton_http.InferenceServerClient(url)
    for path in sorted(p for p in repository.iterdir() if (p / "zoo.json").exists()):
        spec = zoo.Artifact.open(path).spec()
        if not spec.raw_kind:
            continue
        items = sample_items(spec, 3)
        tensor = triton_http.InferInput(spec.raw_kind, [len(items)], "BYTES")
        tensor.set_data_from_numpy(np.array(items, dtype=object), binary_data=True)
        client.infer(path.name, [tensor])
    client.close()


def measure(tree: Path, repository: Path) -> dict:
    port = free_port()
    env = {"PYTHONPATH": package_path(tree), "PATH": "/usr/bin:/bin"}
    start = time.perf_counter()
    proc = subprocess.Popen([PYTHON, "-m", "zoo", "serve", str(repository), "--port", str(port), "--grpc-port", "0"],
                            cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"zoo serve from {tree} exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.05)
        ready = time.perf_counter() - start
        time.sleep(1.0)
        idle = rss_mib(proc.pid)
        requests(f"127.0.0.1:{port}", repository)
        served = rss_mib(proc.pid)
        torch = "libtorch" in Path(f"/proc/{proc.pid}/maps").read_text()
        return {"ready_s": round(ready, 2), "idle_mib": round(idle, 1), "after_requests_mib": round(served, 1),
                "libtorch_mapped": torch}
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base")
    parser.add_argument("repository", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    repository = args.repository.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.base], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            rounds = []
            for k in range(args.rounds):
                order = [("base", base), ("head", ROOT)][:: 1 if k % 2 == 0 else -1]
                result = {name: measure(tree, repository) for name, tree in order}
                rounds.append(result)
                print(f"round {k + 1}: " + "; ".join(f"{n} {r}" for n, r in sorted(result.items())), flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    summary = {side: {key: statistics.median(r[side][key] for r in rounds)
                      for key in ("ready_s", "idle_mib", "after_requests_mib")} for side in ("base", "head")}
    for side in summary:
        summary[side]["libtorch_mapped"] = sorted({r[side]["libtorch_mapped"] for r in rounds})
    print("medians:", json.dumps(summary))
    if args.json:
        args.json.write_text(json.dumps({"base": args.base, "rounds": rounds, "medians": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""What fault isolation costs `zoo serve`: requests/s at one concurrency, before and after,
in one run on one machine, with and without poisoned requests.

    .venv/bin/python tools/serve_isolation.py [--before REV] [--concurrency 16] [--passes 5]

`--before` (default: the commit before fault isolation) is checked out in a temporary git
worktree; each version exports its own repository (resnet8.digits at random init, the
real all-MiniLM-L6-v2 weights, and the test plugin's `ragged.test`, all ONNX Runtime fp32)
and serves it with `zoo serve --threads 1`. Passes alternate between the two servers so
that drift on a shared machine hits both alike; each figure is the median of the passes.

Poisoned requests: one body in 100. MiniLM's carries a token id past the vocabulary,
which the new server refuses by its declared value range before the engine; ragged.test
declares none, so its poisoned body reaches ONNX Runtime, which fails the batch it rides
in. For each point the tool counts the answers that were not 200 among the *valid*
bodies: requests that a bad one cost their answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from serve_support import free_port  # noqa: E402

from zoo.serve.perf import closed_loop  # noqa: E402
from zoo.serve.protocol import encode_request  # noqa: E402

PLUGIN = ROOT / "tests" / "serve_plugin.py"
PACKAGES = ["", "plugins/vision", "plugins/nlp", "plugins/rl", "plugins/drug", "backends/torch",
            "backends/onnxruntime", "backends/openvino", "backends/tensorrt"]
#: served name -> (model, export options)
MODELS = {"resnet8.digits.onnxruntime.fp32": ("resnet8.digits", ["--random-init"]),
          "minilm-l6.all-v2.onnxruntime.fp32": ("minilm-l6.all-v2", []),
          "ragged.test.onnxruntime.fp32": ("ragged.test", ["--random-init"])}
DISTINCT = 100  # bodies per model; the poisoned run replaces one of them


def environment(source: Path) -> dict[str, str]:
    """Run `zoo` from `source` (as the working directory too, which `python -m` puts first
    on sys.path): its core and plugins ahead of the editable installs."""
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_PLUGINS", "ZOO_DEBUG")}
    env["PYTHONPATH"] = os.pathsep.join(str(source / p) for p in PACKAGES)
    return env


def export_all(source: Path, repository: Path) -> None:
    for model, options in MODELS.values():
        subprocess.run([sys.executable, "-m", "zoo", "--plugin", str(PLUGIN), "export", model, "-b", "onnxruntime",
                        "-r", str(repository), *options], env=environment(source), cwd=source, check=True,
                       stdout=subprocess.DEVNULL)


def start(source: Path, repository: Path, log: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "zoo", "--plugin", str(PLUGIN), "serve", str(repository),
                                 "--port", str(port), "--threads", "1"], env=environment(source), cwd=source,
                                stdout=out, stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server from {source} did not start:\n{log.read_text()[-3000:]}")


def bodies(model: str, poisoned: bool) -> list:
    import zoo

    spec = zoo.get_model(model)
    rng = np.random.default_rng(0)
    samples = [spec.sample(1, rng) for _ in range(DISTINCT)]
    if poisoned:
        ids = "input_ids" if "input_ids" in samples[0] else "tokens"
        bad = samples[DISTINCT // 2][ids].copy()
        bad[0, 0] = 999_999 if ids == "input_ids" else 999
        samples[DISTINCT // 2] = {**samples[DISTINCT // 2], ids: bad}
    return [encode_request(x) for x in samples]


def measure(port: int, served: str, payload: list, concurrency: int, duration: float, poisoned: bool) -> dict:
    path = f"/v2/models/{served}/infer"
    asyncio.run(closed_loop("127.0.0.1", port, path, payload, concurrency, 0.5))
    statuses: Counter = Counter()
    latencies, _, elapsed = asyncio.run(closed_loop("127.0.0.1", port, path, payload, concurrency, duration,
                                                    statuses))
    bad = DISTINCT // 2 if poisoned else -1
    return {"requests_per_s": len(latencies) / elapsed,
            "answered_per_s": sum(n for (_, status), n in statuses.items() if status == 200) / elapsed,
            "valid_failed": sum(n for (i, status), n in statuses.items() if i != bad and status != 200),
            "poisoned_sent": sum(n for (i, _), n in statuses.items() if i == bad)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="31081a5", help="the revision to compare with (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per pass")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "serve-isolation.json")
    args = parser.parse_args()
    import zoo
    from zoo import registry

    registry.register_plugin(__import__("serve_plugin"))
    work = Path(tempfile.mkdtemp(prefix="zoo-isolation-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(work / "before"), args.before],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    servers = {}
    try:
        for version, source in (("before", work / "before"), ("after", ROOT)):
            export_all(source, work / f"repo-{version}")
            servers[version] = start(source, work / f"repo-{version}", work / f"{version}.log")
        rows: dict[tuple, list[dict]] = {}
        for _ in range(args.passes):
            for served, (model, _) in MODELS.items():
                for poisoned in (False, True) if model != "resnet8.digits" else (False,):
                    payload = bodies(model, poisoned)
                    for version, (_, port) in servers.items():
                        rows.setdefault((served, poisoned, version), []).append(
                            measure(port, served, payload, args.concurrency, args.duration, poisoned))
        report = {"command": " ".join(sys.argv), "before": args.before, "concurrency": args.concurrency,
                  "passes": args.passes, "duration_s": args.duration, "cpu": platform.processor() or platform.machine(),
                  "cores": os.cpu_count(), "zoo": zoo.__version__, "rows": []}
        for (served, poisoned, version), runs in rows.items():
            report["rows"].append({"model": served, "poisoned": "1 in 100" if poisoned else "none", "server": version,
                                   "requests_per_s": statistics.median(r["requests_per_s"] for r in runs),
                                   "answered_per_s": statistics.median(r["answered_per_s"] for r in runs),
                                   "valid_failed": sum(r["valid_failed"] for r in runs),
                                   "poisoned_sent": sum(r["poisoned_sent"] for r in runs)})
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        print(f"| model | poisoned | server | answers/s | 200 answers/s | valid requests failed | poisoned sent |\n"
              "|---|---|---|---|---|---|---|")
        for r in report["rows"]:
            print(f"| {r['model']} | {r['poisoned']} | {r['server']} | {r['requests_per_s']:.0f} | "
                  f"{r['answered_per_s']:.0f} | {r['valid_failed']} | {r['poisoned_sent']} |")
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / "before")], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

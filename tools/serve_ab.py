"""`zoo serve` at two revisions of the project, side by side: did a change make serving faster?

    .venv/bin/python tools/serve_ab.py BASE_REV REPOSITORY MODEL [--rounds 9] [--protocols http,grpc]

Checks BASE_REV out into a temporary git worktree and starts `zoo serve REPOSITORY` from it
and from this working tree (same virtualenv, same defaults; each runs its own tree's `zoo`
package, backends and model plugins, first on its path), then loads both with `zoo bench --url`
at one concurrency, alternating which goes first every round, each point after the
other's, so that the machine's load drifts over both alike. Prints each round's requests/s,
the medians, and the median of the per-round ratios (this tree over BASE_REV); the same
for the server process's CPU time (user + system, from /proc) per answered request, which
other work on the machine moves far less than requests/s; `--json` writes them. On a
shared 2-core machine single rounds' requests/s vary by 30% and more: read the paired
medians, over enough rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
sys.path.insert(0, str(ROOT / "tools"))
from serve_bench import server_cpu, served_requests  # noqa: E402


def serve(cwd: Path, repository: Path, http: int, grpc: int) -> subprocess.Popen:
    """`python -m zoo serve` with `cwd` first on the path: that tree's `zoo` package, and its
    backends' and model plugins' packages (ahead of the virtualenv's editable installs of
    this tree's, whose finders come after the path)."""
    packages = [str(d) for group in ("backends", "libs", "plugins")
                for d in sorted((cwd / group).iterdir()) if d.is_dir()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), *packages])}
    return subprocess.Popen([PYTHON, "-m", "zoo", "serve", str(repository), "--port", str(http),
                             "--grpc-port", str(grpc)], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def wait_ready(port: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"the server on port {port} did not become ready in {timeout:.0f} s")


def load(model: str, pid: int, http: int, grpc: int, protocol: str, concurrency: int,
         seconds: float) -> tuple[float, float]:
    """(requests/s, server CPU ms per answered request) of one load point."""
    url = f"http://127.0.0.1:{http}" if protocol == "http" else f"grpc://127.0.0.1:{grpc}"
    extra = ["--metrics-url", f"http://127.0.0.1:{http}"] if protocol.startswith("grpc") else []
    extra += ["--streaming"] if protocol == "grpc-stream" else []
    metrics = f"http://127.0.0.1:{http}"
    cpu, requests = server_cpu(pid), served_requests(metrics, model)
    out = subprocess.run([PYTHON, "-m", "zoo", "bench", model, "--url", url, *extra, "--concurrency",
                          str(concurrency), "--min-time", str(seconds), "--json"], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    count = served_requests(metrics, model) - requests
    if not count:  # /metrics counts requests by the artifact's name: an alias answers, but is not counted
        raise SystemExit(f"/metrics counted no request of {model!r}: give the artifact's Triton name "
                         f"(e.g. resnet8.digits.onnxruntime.fp32)")
    return float(json.loads(out.stdout)["results"][0]["requests_per_s"]), (server_cpu(pid) - cpu) * 1e3 / count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="the git revision to compare this working tree against")
    parser.add_argument("repository", type=Path)
    parser.add_argument("model", help="the artifact's Triton name, e.g. resnet8.digits.onnxruntime.fp32")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--protocols", default="http,grpc", help="of http, grpc, grpc-stream")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", type=Path, help="write the rounds and summaries here")
    parser.add_argument("--base-repository", type=Path, help="the repository the base serves (default: the same), "
                        "for a change to what an export writes (config.pbtxt) as well as to the server")
    args = parser.parse_args()
    protocols = args.protocols.split(",")
    with tempfile.TemporaryDirectory(prefix="zoo-serve-ab-") as tmp:
        base_tree = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base_tree), args.base], cwd=ROOT, check=True)
        servers = {"base": (base_tree, 8301, 8311), "this": (ROOT, 8302, 8312)}
        repositories = {"base": (args.base_repository or args.repository).resolve(), "this": args.repository.resolve()}
        procs = [serve(cwd, repositories[side], h, g) for side, (cwd, h, g) in servers.items()]
        try:
            for _, h, _ in servers.values():
                wait_ready(h)
            rounds: dict[str, dict[str, list[float]]] = {p: {"base": [], "this": []} for p in protocols}
            cpus: dict[str, dict[str, list[float]]] = {p: {"base": [], "this": []} for p in protocols}
            pids = dict(zip(servers, (p.pid for p in procs)))
            for i in range(args.rounds):
                order = ("base", "this") if i % 2 == 0 else ("this", "base")
                for protocol in protocols:
                    for side in order:
                        _, h, g = servers[side]
                        rate, cpu = load(args.model, pids[side], h, g, protocol, args.concurrency, args.seconds)
                        rounds[protocol][side].append(rate)
                        cpus[protocol][side].append(cpu)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=60)
            subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, check=False)
    summary = {}
    for protocol, sides in rounds.items():
        ratios = [t / b for t, b in zip(sides["this"], sides["base"])]
        cpu = cpus[protocol]
        cpu_ratios = [t / b for t, b in zip(cpu["this"], cpu["base"])]
        summary[protocol] = {"base_median": statistics.median(sides["base"]),
                             "this_median": statistics.median(sides["this"]),
                             "paired_ratio_median": statistics.median(ratios), "rounds": sides,
                             "cpu_ms_per_request": {"base_median": statistics.median(cpu["base"]),
                                                    "this_median": statistics.median(cpu["this"]),
                                                    "paired_ratio_median": statistics.median(cpu_ratios),
                                                    "rounds": cpu}}
        c = summary[protocol]["cpu_ms_per_request"]
        print(f"{protocol}: {args.base} {summary[protocol]['base_median']:.0f} req/s "
              f"{[round(x) for x in sides['base']]}; this tree {summary[protocol]['this_median']:.0f} req/s "
              f"{[round(x) for x in sides['this']]}; paired ratio median {summary[protocol]['paired_ratio_median']:.3f}")
        print(f"{protocol}: server CPU ms/request {args.base} {c['base_median']:.3f} "
              f"{[round(x, 3) for x in cpu['base']]}; this tree {c['this_median']:.3f} "
              f"{[round(x, 3) for x in cpu['this']]}; paired ratio median {c['paired_ratio_median']:.3f}")
    if args.json:
        base = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, capture_output=True, text=True)
        args.json.write_text(json.dumps({"base": base.stdout.strip() or args.base, "model": args.model, "concurrency": args.concurrency,
                                         "seconds": args.seconds, "summary": summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

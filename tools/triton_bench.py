"""`zoo serve` against a real NVIDIA Triton server on the same artifacts: one run, one machine.

    .venv/bin/python tools/triton_bench.py OUT.json [--rounds 5] [--duration 3] [--protocols http,grpc,grpc-stream]
        [--client zoo|perf_analyzer] [--quick]

Needs `make triton` (tritonserver 2.51 from the nvidia-pytriton wheel, CPU).

One repository, exported here in Triton's python form (`zoo export --triton python`):
resnet8.digits (from checkpoints/ when there is one, else random init) and
all-MiniLM-L6-v2 (the weights its pip package ships), ONNX Runtime fp32. Both servers load
it at once: `zoo serve` (its default threads and the batching `config.pbtxt` asks for) and
`tritonserver`, whose Python backend runs the same artifact through the same zoo runner
(`zoo/triton_backend.py`) under Triton's dynamic batcher with the same `config.pbtxt`. The
ONNX Runtime session is built the same way in both, with its default threads.

The load is `zoo bench --url`'s (`zoo.serve.perf.sweep`): closed-loop clients on
pre-encoded requests of one row, binary tensors over HTTP and raw tensors over gRPC (unary
ModelInfer calls, and `grpc-stream`: one ModelStreamInfer stream per client, as
`zoo bench --url --streaming` and perf_analyzer's --streaming), at concurrency 1 and 16. Every point alternates between the two servers within each round, so
drift on a shared machine hits both alike; each figure is the median of the rounds. Beside
requests/s, each server's CPU time (user + system, from /proc; Triton's with its Python
stub processes) per request it answered (its statistics extension's success count, warm-up
included): what a request costs each server, whatever the load generator costs the machine.
Also: each server's resident memory, idle, after loading (Triton's with its Python stubs).
The load generator shares the machine's cores with the servers. `--client perf_analyzer`
measures with Triton's own perf_analyzer (C++, the same one-row requests as JSON input
data) instead: the Python client's CPU no longer competes with the servers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from serve_bench import environment, f, free_port, server_cpu  # noqa: E402
from tritonserver import Tritonserver, children, unavailable_reason  # noqa: E402

MODELS = ("resnet8.digits", "minilm-l6.all-v2")
CONCURRENCY = (1, 16)
PROTOCOLS = ("http", "grpc", "grpc-stream")


def served(model: str) -> str:
    return f"{model}.onnxruntime.fp32"


def export_all(repository: Path) -> dict[str, str]:
    import zoo
    from zoo.checkpoint import default_path

    sources = {}
    for model in MODELS:
        spec = zoo.get_model(model)
        checkpoint = default_path(model) if spec.trainable and default_path(model).exists() else None
        random_init = spec.pretrained is None and checkpoint is None
        sources[model] = ("pretrained (shipped in its package)" if spec.pretrained is not None and not random_init
                          else f"checkpoint {checkpoint}" if checkpoint else "random init")
        zoo.export(spec, "onnxruntime", repository=repository, checkpoint=checkpoint, random_init=random_init,
                   triton="python")
    return sources


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@contextlib.contextmanager
def zoo_serve(repository: Path, log: Path):
    """`zoo serve REPOSITORY` with its defaults on free ports: (http URL, grpc URL, pid)."""
    port, grpc_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_PLUGINS", "ZOO_DEBUG")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "zoo", "serve", str(repository), "--port", str(port),
                                 "--grpc-port", str(grpc_port)], env=env, cwd=ROOT, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"zoo serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"zoo serve was not ready after 300 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield url, f"grpc://127.0.0.1:{grpc_port}", proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def answered(http: str, model: str) -> int:
    """Requests the server says it answered for `model` (the statistics extension, which
    both servers implement)."""
    stats = httpx.get(f"{http}/v2/models/{served(model)}/stats", timeout=30).json()
    return sum(s["inference_stats"]["success"]["count"] for s in stats["model_stats"])


def perf_analyzer_data(url: str, model: str, path: Path, distinct: int = 64) -> Path:
    """perf_analyzer's --input-data: the same one-row requests `zoo.serve.perf` makes
    (`request_maker`, same seed), each tensor with its shape (the sequence axes vary)."""
    import numpy as np

    from zoo.serve.perf import model_metadata, request_maker, target

    meta, info = model_metadata(target(url), served(model))
    make, rng = request_maker(meta, info, model), np.random.default_rng(0)
    rows = []
    for _ in range(distinct):
        # without the batch axis, which perf_analyzer adds (-b 1)
        rows.append({k: {"content": np.asarray(v)[0].ravel().tolist(), "shape": list(np.shape(v)[1:])}
                     for k, v in make(1, rng).items()})
    path.write_text(json.dumps({"data": rows}))
    return path


def perf_analyzer_point(urls: dict[str, str], model: str, protocol: str, concurrency: int, duration: float,
                        data: Path) -> dict[str, Any]:
    """One point measured by Triton's perf_analyzer (C++): three windows of duration/3 s,
    taken as they come (stability 1000 %), after its own warm-up; its CSV's figures."""
    from tritonserver import perf_analyzer

    grpc = protocol != "http"
    url = urls["grpc" if grpc else "http"].split("://")[1]
    csv = data.with_name(f"pa-{os.getpid()}-{time.monotonic_ns()}.csv")
    args = ["-m", served(model), "-u", url, "-i", "grpc" if grpc else "http", "--concurrency-range", str(concurrency),
            "-p", str(max(int(duration * 1000 / 3), 100)), "-s", "1000", "--max-trials", "3", "--input-data",
            str(data), "-f", str(csv), *(["--streaming"] if protocol == "grpc-stream" else [])]
    try:
        done = perf_analyzer(args, timeout=60 + 10 * duration)
        failure = None if done.returncode == 0 else done.stdout[-2000:]
    except subprocess.TimeoutExpired as exc:  # a response that never came: the point failed, the sweep goes on
        failure = f"perf_analyzer did not finish within {exc.timeout:.0f} s"
    if failure is not None:
        print(f"{model} {protocol} c{concurrency} at {url}: {failure}", file=sys.stderr)
        return {"requests_per_s": None, "p50_ms": None, "p99_ms": None, "requests": 0, "errors": 1,
                "failure": failure}
    header, row = csv.read_text().splitlines()[:2]
    values = dict(zip(header.split(","), row.split(",")))
    csv.unlink()
    count = [line for line in done.stdout.splitlines() if "Request count:" in line]
    return {"requests_per_s": float(values["Inferences/Second"]), "p50_ms": float(values["p50 latency"]) / 1e3,
            "p99_ms": float(values["p99 latency"]) / 1e3,
            "requests": int(count[-1].split(":")[1]) if count else 0, "errors": 0}


def point(urls: dict[str, str], pids: list[int], model: str, protocol: str, concurrency: int, duration: float,
          warmup: float, data: Path | None = None) -> dict[str, Any]:
    """One point by `zoo.serve.perf`, or by perf_analyzer when `data` (its input data) is given."""
    from zoo.serve.perf import sweep

    cpu, requests = sum(map(server_cpu, pids)), answered(urls["http"], model)
    if data is not None:
        result = perf_analyzer_point(urls, model, protocol, concurrency, duration, data)
    else:
        report = sweep(urls["http" if protocol == "http" else "grpc"], served(model), model, [concurrency], [1],
                       duration=duration, warmup=warmup, distinct=64, metrics_url=urls["http"],
                       streaming=protocol == "grpc-stream")
        result = report["results"][0]
    count = answered(urls["http"], model) - requests
    result["server_cpu_ms_per_request"] = (sum(map(server_cpu, pids)) - cpu) * 1e3 / count if count else None
    return result


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    def median(key: str) -> float | None:
        values = [r[key] for r in runs if r.get(key) is not None]
        return statistics.median(values) if values else None

    return {"requests_per_s": median("requests_per_s"), "p50_ms": median("p50_ms"), "p99_ms": median("p99_ms"),
            "server_cpu_ms_per_request": median("server_cpu_ms_per_request"),
            "requests": sum(r["requests"] for r in runs), "errors": sum(r["errors"] for r in runs), "runs": runs}


def markdown(report: dict[str, Any]) -> str:
    lines = ["| model | protocol | concurrency | zoo serve req/s | Triton req/s | zoo/Triton | zoo p50 / p99 ms | "
             "Triton p50 / p99 ms | server CPU ms/request, zoo / Triton | errors |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["points"]:
        z, t = r["zoo"], r["triton"]
        ratio = z["requests_per_s"] / t["requests_per_s"] if z["requests_per_s"] and t["requests_per_s"] else None
        lines.append(f"| {r['model']} | {r['protocol']} | {r['concurrency']} | {f(z['requests_per_s'], 1)} | "
                     f"{f(t['requests_per_s'], 1)} | {f(ratio)}x | {f(z['p50_ms'])} / {f(z['p99_ms'])} | "
                     f"{f(t['p50_ms'])} / {f(t['p99_ms'])} | {f(z.get('server_cpu_ms_per_request'))} / "
                     f"{f(t.get('server_cpu_ms_per_request'))} | {z['errors'] + t['errors']} |")
    m = report["memory_mib"]
    lines += ["", f"Idle resident memory after loading: zoo serve {m['zoo']:.0f} MiB, "
                  f"Triton {m['triton']:.0f} MiB (server {m['triton_server']:.0f} + Python stubs)."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="write the JSON report here")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every point (default %(default)s)")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per point (default %(default)s)")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds of warm-up per point (default %(default)s)")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS),
                        help="comma-separated, of http, grpc, grpc-stream (default %(default)s)")
    parser.add_argument("--client", choices=("zoo", "perf_analyzer"), default="zoo",
                        help="the load generator: zoo bench --url's (Python, default) or Triton's perf_analyzer (C++, "
                        "from `make triton`), which leaves the servers more of the machine")
    parser.add_argument("--quick", action="store_true", help="one round of very short points: proves the script "
                        "works, measures nothing")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.duration, args.warmup = 1, 0.3, 0.1
    protocols = [p for p in args.protocols.split(",") if p]
    if not protocols or set(protocols) - set(PROTOCOLS):
        sys.exit(f"--protocols: choose from {', '.join(PROTOCOLS)}")
    reason = unavailable_reason()
    if reason:
        sys.exit(reason)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="zoo-triton-bench-"))
    repository = work / "repository"
    try:
        sources = export_all(repository)
        variants = [(m, p, c) for m in MODELS for c in CONCURRENCY for p in protocols]
        runs: dict[tuple, dict[str, list]] = {v: {"zoo": [], "triton": []} for v in variants}
        triton = Tritonserver(repository, log=work / "tritonserver.log").wait_live()
        try:
            index = triton.index()
            if any(index.get(served(m), {}).get("state") != "READY" for m in MODELS):
                raise RuntimeError(f"Triton did not load every model: {index}")
            with zoo_serve(repository, work / "zoo.log") as (http, grpc, pid):
                time.sleep(2)
                memory = {"zoo": rss(pid) / 2**20, "triton": triton.rss_bytes() / 2**20,
                          "triton_server": rss(triton.proc.pid) / 2**20}
                pids = {"zoo": [pid], "triton": [triton.proc.pid, *children(triton.proc.pid)]}
                data = {m: perf_analyzer_data(http, m, work / f"{m}.json") if args.client == "perf_analyzer" else None
                        for m in MODELS}
                urls = {"zoo": {"http": http, "grpc": grpc},
                        "triton": {"http": f"http://{triton.http_url}", "grpc": f"grpc://{triton.grpc_url}"}}
                for k in range(args.rounds):
                    print(f"round {k + 1} of {args.rounds} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
                    for model, protocol, c in variants:
                        order = ("zoo", "triton") if k % 2 == 0 else ("triton", "zoo")
                        for server in order:
                            runs[model, protocol, c][server].append(
                                point(urls[server], pids[server], model, protocol, c, args.duration, args.warmup,
                                      data[model]))
        finally:
            triton.stop()
        report = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "client": args.client,
                  "environment": {**environment(), "tritonserver": "2.51 (nvidia-pytriton 0.7.0 wheel)"},
                  "servers": {"zoo": "zoo serve (defaults: ONNX Runtime default threads, config.pbtxt batching)",
                              "triton": "tritonserver, Python backend running the same artifact through "
                                        "zoo.triton_backend (same runner, same config.pbtxt batching)"},
                  "weights": sources, "rounds": args.rounds, "duration_s": args.duration, "warmup_s": args.warmup,
                  "quick": args.quick, "memory_mib": memory,
                  "points": [{"model": m, "protocol": p, "concurrency": c, "zoo": summary(runs[m, p, c]["zoo"]),
                              "triton": summary(runs[m, p, c]["triton"])} for m, p, c in variants]}
        report["seconds"] = round(time.perf_counter() - started, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        print(markdown(report))
        print(f"\n{report['seconds']:.0f} s; report: {args.out}", file=sys.stderr)
        if any(r["zoo"]["errors"] or r["triton"]["errors"] for r in report["points"]):
            sys.exit("some requests failed: see the errors column")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

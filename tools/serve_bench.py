"""`zoo serve` over HTTP against gRPC, with and without system shared memory: one run on one machine.

    .venv/bin/python tools/serve_bench.py OUT.json [--rounds 3] [--large-concurrency 1,4] [--no-large]
        [--repository DIR] [--quick]

One `zoo serve --threads 1 --shared-memory system` subprocess serves an ONNX Runtime fp32
repository exported here at full size: resnet8.digits and resnet18 at random init (or
from a checkpoint in checkpoints/ when there is one), and all-MiniLM-L6-v2 with the
weights its pip package ships (nothing is downloaded). The load is `zoo bench --url`'s
(`zoo.serve.perf.sweep`): closed-loop clients on pre-encoded requests, binary tensors
over HTTP, pre-serialized raw tensors over gRPC (one channel for all clients), and the
server's own view from its /metrics.

(a) small requests: resnet8.digits and MiniLM, one row per request, HTTP against gRPC
    (unary ModelInfer calls, and `grpc-stream`: one ModelStreamInfer stream per client, as
    `zoo bench --url --streaming`) at concurrency 1 and 16: requests/s, p50/p99 latency, the
    server's overhead per request and the server process's CPU time per request.
(b) large requests: resnet18 at 224x224, 32 rows (19 MB of input) per request, over HTTP
    (binary), HTTP with shared memory, gRPC, and gRPC with shared memory, at concurrency 1
    (`--large-concurrency 1,4` adds 4: on 2 cores a round of it takes about a minute more,
    since four such requests batch into 128 rows that take ~6 s).

With the defaults the whole run takes about 5 minutes on 2 cores (1.5 of them exporting).

The variants alternate in rounds (each once per round, the two transports of a pair back
to back), so drift on a shared machine hits all alike; each figure is the median of the
rounds, errors their sum. Writes the JSON report to OUT and prints markdown tables. The
load generator shares the machine's cores with the server.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
SMALL = ("resnet8.digits", "minilm-l6.all-v2")
LARGE = "resnet18"
LARGE_ROWS = 32
SMALL_CONCURRENCY = (1, 16)
#: (label, protocol, shared memory) of the large-request variants
TRANSPORTS = (("HTTP binary", "http", False), ("HTTP + shared memory", "http", True),
              ("gRPC", "grpc", False), ("gRPC + shared memory", "grpc", True))


def served(model: str) -> str:
    return f"{model}.onnxruntime.fp32"


def export_all(repository: Path, models: list[str]) -> dict[str, str]:
    """Export each model (ONNX Runtime fp32, full size) unless the repository has it; where its weights came from."""
    import zoo
    from zoo.checkpoint import default_path

    sources = {}
    for model in models:
        spec = zoo.get_model(model)
        checkpoint = default_path(model) if spec.trainable and default_path(model).exists() else None
        random_init = spec.pretrained is None and checkpoint is None
        sources[model] = ("pretrained (shipped in its package)" if spec.pretrained is not None and not random_init
                          else f"checkpoint {checkpoint}" if checkpoint else "random init")
        if (repository / served(model)).exists():
            print(f"{served(model)}: already in {repository}", file=sys.stderr)
            continue
        start = time.perf_counter()
        zoo.export(spec, "onnxruntime", repository=repository, checkpoint=checkpoint, random_init=random_init)
        print(f"exported {served(model)} ({sources[model]}) in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return sources


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(repository: Path, log: Path):
    """`zoo serve REPOSITORY --threads 1 --shared-memory system` on free HTTP and gRPC ports: (http URL, grpc URL)."""
    port, grpc_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_PLUGINS", "ZOO_DEBUG")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "zoo", "serve", str(repository), "--port", str(port),
                                 "--grpc-port", str(grpc_port), "--threads", "1", "--shared-memory", "system"],
                                env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
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


def server_cpu(pid: int) -> float:
    """CPU seconds (user + system) the server process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def served_requests(http: str, model: str) -> float:
    text = httpx.get(f"{http}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("zoo_inference_requests_total") and f'model="{model}"' in line)


def point(http: str, grpc: str, pid: int, model: str, protocol: str, shared_memory: bool, concurrency: int,
          rows: int, duration: float, warmup: float, distinct: int) -> dict[str, Any]:
    """One load point; with the server's CPU time per request over it (warm-up included):
    what each transport costs the server, whatever the load generator costs the machine.
    `protocol`: http, grpc (unary calls) or grpc-stream (one stream per client)."""
    from zoo.serve.perf import sweep

    cpu, requests = server_cpu(pid), served_requests(http, served(model))
    report = sweep(http if protocol == "http" else grpc, served(model), model, [concurrency], [rows],
                   duration=duration, warmup=warmup, distinct=distinct, metrics_url=http, shared_memory=shared_memory,
                   streaming=protocol == "grpc-stream")
    result = report["results"][0]
    answered = served_requests(http, served(model)) - requests
    result["server_cpu_ms_per_request"] = (server_cpu(pid) - cpu) * 1e3 / answered if answered else None
    return result


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds (errors and requests summed), and every run."""
    def median(get) -> float | None:
        values = [v for v in (get(r) for r in runs) if v is not None]
        return statistics.median(values) if values else None

    return {"requests_per_s": median(lambda r: r["requests_per_s"]),
            "samples_per_s": median(lambda r: r["samples_per_s"]),
            "p50_ms": median(lambda r: r["p50_ms"]), "p99_ms": median(lambda r: r["p99_ms"]),
            "server_ms": median(lambda r: r["server"].get("request_ms")),
            "queue_ms": median(lambda r: r["server"].get("queue_ms")),
            "model_ms": median(lambda r: r["server"].get("compute_ms")),
            "overhead_ms": median(lambda r: r["server"].get("overhead_ms")),
            "mean_batch": median(lambda r: r["server"].get("mean_batch")),
            "server_cpu_ms": median(lambda r: r.get("server_cpu_ms_per_request")),
            "requests": sum(r["requests"] for r in runs), "errors": sum(r["errors"] for r in runs), "runs": runs}


def f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(report: dict[str, Any]) -> str:
    lines = ["(a) one row per request", "",
             "| model | protocol | concurrency | requests/s | p50 ms | p99 ms | server overhead ms | "
             "server CPU ms/request | errors |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in report["small"]:
        lines.append(f"| {r['model']} | {r['protocol']} | {r['concurrency']} | {f(r['requests_per_s'], 1)} | "
                     f"{f(r['p50_ms'])} | {f(r['p99_ms'])} | {f(r['overhead_ms'])} | {f(r['server_cpu_ms'])} | "
                     f"{r['errors']} |")
    if not report["large"]:
        return "\n".join(lines)
    lines += ["", f"(b) {LARGE}, {report['large_rows']} rows (224x224) per request", "",
              "| transport | concurrency | requests/s | images/s | p50 ms | p99 ms | server ms | model ms | "
              "server overhead ms | server CPU ms/request | errors |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["large"]:
        lines.append(f"| {r['transport']} | {r['concurrency']} | {f(r['requests_per_s'])} | {f(r['samples_per_s'], 1)} "
                     f"| {f(r['p50_ms'], 1)} | {f(r['p99_ms'], 1)} | {f(r['server_ms'], 1)} | {f(r['model_ms'], 1)} "
                     f"| {f(r['overhead_ms'])} | {f(r['server_cpu_ms'], 1)} | {r['errors']} |")
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    import grpc
    import onnxruntime

    import zoo

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "zoo": zoo.__version__,
            "onnxruntime": onnxruntime.__version__, "grpcio": grpc.__version__,
            "date": datetime.date.today().isoformat()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="write the JSON report here")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every variant (default %(default)s)")
    parser.add_argument("--duration", type=float, default=3.0,
                        help="seconds per point, one-row requests (default %(default)s)")
    parser.add_argument("--large-duration", type=float, default=4.0,
                        help=f"seconds per point, {LARGE} requests (default %(default)s)")
    parser.add_argument("--large-concurrency", default="1",
                        help=f"concurrencies of the {LARGE} variants, comma-separated (default %(default)s)")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds of warm-up per point (default %(default)s)")
    parser.add_argument("--no-large", action="store_true", help=f"only (a): no {LARGE} export or requests")
    parser.add_argument("--repository", type=Path, help="export into (and reuse exports from) this directory "
                        "(default: a temporary one, removed at the end)")
    parser.add_argument("--quick", action="store_true", help="one round of very short points: proves the script "
                        "works, measures nothing")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.duration, args.large_duration, args.warmup = 1, 0.3, 0.3, 0.1
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="zoo-serve-bench-"))
    repository = args.repository or work / "repository"
    try:
        sources = export_all(repository, [*SMALL, *([] if args.no_large else [LARGE])])
        small = [(model, protocol, c) for model in SMALL for c in SMALL_CONCURRENCY
                 for protocol in ("http", "grpc", "grpc-stream")]
        large = [] if args.no_large else [(label, protocol, shm, int(c)) for c in args.large_concurrency.split(",")
                                          for label, protocol, shm in TRANSPORTS]
        small_runs: dict[tuple, list] = {v: [] for v in small}
        large_runs: dict[tuple, list] = {v: [] for v in large}
        with serving(repository, work / "server.log") as (http, grpc, pid):
            for k in range(args.rounds):
                print(f"round {k + 1} of {args.rounds} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
                for model, protocol, c in small:
                    small_runs[model, protocol, c].append(
                        point(http, grpc, pid, model, protocol, False, c, 1, args.duration, args.warmup, 64))
                for label, protocol, shm, c in large:
                    # 2 distinct bodies of 19 MB each; with shared memory, one pair of regions per client
                    large_runs[label, protocol, shm, c].append(
                        point(http, grpc, pid, LARGE, protocol, shm, c, LARGE_ROWS, args.large_duration, args.warmup,
                              2))
        report = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "environment": environment(),
                  "server": "zoo serve --threads 1 --shared-memory system (ONNX Runtime fp32, default batching)",
                  "weights": sources, "rounds": args.rounds, "duration_s": args.duration,
                  "large_duration_s": args.large_duration, "warmup_s": args.warmup, "quick": args.quick,
                  "large_rows": LARGE_ROWS,
                  "small": [{"model": m, "protocol": p, "concurrency": c, **summary(small_runs[m, p, c])}
                            for m, p, c in small],
                  "large": [{"model": LARGE, "transport": label, "protocol": p, "shared_memory": shm, "concurrency": c,
                             "batch": LARGE_ROWS, **summary(large_runs[label, p, shm, c])}
                            for label, p, shm, c in large]}
        report["seconds"] = round(time.perf_counter() - started, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        print(markdown(report))
        print(f"\n{report['seconds']:.0f} s; report: {args.out}", file=sys.stderr)
        if any(r["errors"] for r in report["small"] + report["large"]):
            sys.exit("some requests failed: see the errors column")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

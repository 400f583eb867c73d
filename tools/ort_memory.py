"""What ONNX Runtime's memory parameters cost a served model, side by side.

    .venv/bin/python tools/ort_memory.py OUT.json [--model minilm-l6.all-v2] [--rounds 3]

Exports MODEL through onnxruntime three times, with the config.pbtxt `parameters` that
Triton's ONNX Runtime backend documents (`zoo export --triton-parameter`): none (ONNX
Runtime's defaults), `enable_mem_arena=0`, and `memory.enable_memory_arena_shrinkage=cpu:0`.
Each round starts `zoo serve` on each variant in turn (the order rotates every round) and
measures, through tritonclient's HTTP client:
- its resident memory when ready, and after requests of mixed sizes (batch x sequence
  from the spec's axes, up to their maxima: what a server of varied traffic holds on to);
- the requests/s and the server's CPU ms per request of a fixed load after that (one
  client, requests of the spec's typical size, for `--seconds`).
Prints the medians over rounds and writes every measure to OUT.json. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from serve_bench import environment  # noqa: E402
VARIANTS = {"default": {}, "enable_mem_arena=0": {"enable_mem_arena": "0"},
            "shrinkage cpu:0": {"memory.enable_memory_arena_shrinkage": "cpu:0"}}


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def inputs(spec, batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every input at (batch, seq): ids drawn within their value range, the rest ones."""
    found = {}
    for t in spec.inputs:
        low, high = t.value_range or (0, 1)
        found[t.name] = (rng.integers(max(low, 1), high, (batch, seq)) if high > 1 else
                         np.ones((batch, seq))).astype(t.dtype)
    return found


def infer(client, name: str, arrays: dict[str, np.ndarray]) -> None:
    import tritonclient.http as http

    tensors = []
    for key, value in arrays.items():
        tensor = http.InferInput(key, list(value.shape), http.np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    client.infer(name, tensors)


def measure(repository: Path, spec, name: str, seconds: float) -> dict[str, float]:
    import tritonclient.http as http

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "zoo", "serve", str(repository), "--port", str(port),
                             "--grpc-port", "0"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = http.InferenceServerClient(f"127.0.0.1:{port}")
        deadline = time.monotonic() + 120
        while True:
            try:
                if client.is_server_ready():
                    break
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"zoo serve {repository} did not become ready")
            time.sleep(0.3)
        ready = rss_mb(proc.pid)
        axes, rng = spec.axes, np.random.default_rng(0)
        b, s = axes["batch"], axes["seq"]
        sizes = [(b.min, s.min), (b.max, s.opt), (b.opt, s.max), (b.min, s.opt), (b.max, s.max)]
        for batch, seq in sizes * 4:
            infer(client, name, inputs(spec, batch, seq, rng))
        mixed = rss_mb(proc.pid)
        typical = inputs(spec, b.opt, s.opt, rng)
        count, cpu, start = 0, cpu_s(proc.pid), time.perf_counter()
        while time.perf_counter() - start < seconds:
            infer(client, name, typical)
            count += 1
        elapsed, cpu = time.perf_counter() - start, cpu_s(proc.pid) - cpu
        client.close()
        return {"rss_ready_mb": ready, "rss_after_mixed_mb": mixed, "rss_after_load_mb": rss_mb(proc.pid),
                "requests_per_s": count / elapsed, "server_cpu_ms_per_request": cpu * 1e3 / count}
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", default="minilm-l6.all-v2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    import zoo

    spec = zoo.get_model(args.model)
    with tempfile.TemporaryDirectory(prefix="zoo-ort-memory-") as tmp:
        repos, names = {}, {}
        for label, parameters in VARIANTS.items():
            repos[label] = Path(tmp) / label.replace(" ", "_").replace(":", "").replace("=", "_")
            art = zoo.export(spec, "onnxruntime", repository=repos[label], random_init=not spec.pretrained,
                             triton_parameters=parameters)
            names[label] = art.name
        runs: dict[str, list[dict[str, float]]] = {label: [] for label in VARIANTS}
        labels = list(VARIANTS)
        for i in range(args.rounds):
            for label in labels[i % len(labels):] + labels[:i % len(labels)]:
                runs[label].append(measure(repos[label], spec, names[label], args.seconds))
                print(label, {k: round(v, 2) for k, v in runs[label][-1].items()}, flush=True)
    medians = {label: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for label, rows in runs.items()}
    report = {"command": " ".join(["tools/ort_memory.py", *sys.argv[1:]]), "model": args.model,
              "environment": environment(),
              "variants": VARIANTS, "runs": runs, "medians": medians}
    args.out.write_text(json.dumps(report, indent=2))
    for label, m in medians.items():
        print(f"{label:>20}: " + ", ".join(f"{k} {v:.2f}" for k, v in m.items()))


if __name__ == "__main__":
    main()

"""Where a gRPC request's time goes in `zoo serve`: its gRPC and HTTP front ends against a
bare grpc.aio server that answers every ModelInfer with a fixed response.

    .venv/bin/python tools/grpc_ceiling.py OUT.json [--rounds 3] [--seconds 4] [--repository DIR]

The bare server is grpcio's asyncio server with Triton's service definition and nothing
else (no decoding, batching, model or metrics): the most requests/s grpcio and this load
generator reach on this machine, so the distance from it to `zoo serve`'s gRPC is what the
zoo's own request path costs. The load is `zoo bench --url`'s (`zoo.serve.perf.sweep`),
resnet8.digits (ONNX Runtime fp32, random init, `zoo serve --threads 1`), one row per
request, concurrency 16; each server's CPU seconds per answered request come from /proc,
and `zoo serve`'s mean rows per execution from its /metrics. The three variants alternate
in rounds; the table gives medians. The load generator shares the machine's cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_bench import environment, export_all, free_port, served, server_cpu, serving  # noqa: E402

MODEL = "resnet8.digits"
BARE = r"""
import asyncio, sys
import grpc
from tritonclient.grpc import service_pb2 as pb, service_pb2_grpc
ANSWER = pb.ModelInferResponse(model_name=sys.argv[2], model_version="1", raw_output_contents=[bytes(40)],
    outputs=[pb.ModelInferResponse.InferOutputTensor(name="logits", datatype="FP32", shape=[1, 10])])
class Bare(service_pb2_grpc.GRPCInferenceServiceServicer):
    async def ModelInfer(self, request, context):
        return ANSWER
async def main():
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Bare(), server)
    server.add_insecure_port("127.0.0.1:" + sys.argv[1])
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()
asyncio.run(main())
"""


def load(url: str, metrics_url: str | None, seconds: float) -> dict:
    from zoo.serve.perf import grpc_closed_loop, grpc_request, sweep

    if metrics_url is not None:  # a zoo server: its own view of the load too
        return sweep(url, served(MODEL), MODEL, [16], [1], duration=seconds, warmup=0.5, metrics_url=metrics_url)["results"][0]
    import asyncio

    import grpc
    import numpy as np

    import zoo

    spec = zoo.get_model(MODEL)
    messages = [grpc_request(served(MODEL), spec.sample(1, np.random.default_rng(i)), {"image": "FP32"})
                for i in range(8)]

    async def run() -> tuple:
        async with grpc.aio.insecure_channel(url.removeprefix("grpc://")) as channel:
            await grpc_closed_loop(channel, messages, 16, 0.5)
            return await grpc_closed_loop(channel, messages, 16, seconds)

    latencies, errors, took = asyncio.run(run())
    return {"requests_per_s": len(latencies) / took, "requests": len(latencies), "errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--repository", type=Path)
    args = parser.parse_args()
    repository = args.repository or Path(tempfile.mkdtemp(prefix="grpc-ceiling-"))
    export_all(repository, [MODEL])
    port = free_port()
    bare = subprocess.Popen([sys.executable, "-c", BARE, str(port), served(MODEL)], stdout=subprocess.PIPE, text=True)
    rows: dict[str, list[dict]] = {"bare grpc.aio": [], "zoo serve, gRPC": [], "zoo serve, HTTP": []}
    try:
        assert bare.stdout is not None and bare.stdout.readline().strip() == "ready"
        with serving(repository, repository / "serve.log") as (http, grpc_url, pid):
            for round_ in range(args.rounds):
                order = list(rows) if round_ % 2 == 0 else list(reversed(rows))
                for variant in order:
                    target, server = {"bare grpc.aio": (f"grpc://127.0.0.1:{port}", bare.pid),
                                      "zoo serve, gRPC": (grpc_url, pid), "zoo serve, HTTP": (http, pid)}[variant]
                    cpu = server_cpu(server)
                    result = load(target, None if variant.startswith("bare") else http, args.seconds)
                    # the zoo's sweep also counts its warm-up: CPU per request over the timed part is a bound
                    result["server_cpu_ms_per_request"] = (server_cpu(server) - cpu) * 1e3 / max(1, result["requests"])
                    rows[variant].append(result)
                    print(f"round {round_ + 1} {variant}: {result['requests_per_s']:.0f} req/s", file=sys.stderr)
    finally:
        bare.terminate()
        bare.wait(30)

    def median(variant: str, get) -> float | None:
        values = [v for v in (get(r) for r in rows[variant]) if v is not None]
        return statistics.median(values) if values else None

    table = ["| server | requests/s | server CPU ms per request (upper bound) | rows per execution | errors |",
             "|---|---|---|---|---|"]
    for variant in rows:
        batch = median(variant, lambda r: r.get("server", {}).get("mean_batch"))
        table.append(f"| {variant} | {median(variant, lambda r: r['requests_per_s']):.0f} | "
                     f"{median(variant, lambda r: r['server_cpu_ms_per_request']):.2f} | "
                     f"{'-' if batch is None else f'{batch:.1f}'} | {sum(r['errors'] for r in rows[variant])} |")
    args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "environment": environment(),
                                    "rounds": args.rounds, "seconds": args.seconds, "runs": rows}, indent=2,
                                   default=str))
    print("\n".join(table))


if __name__ == "__main__":
    main()

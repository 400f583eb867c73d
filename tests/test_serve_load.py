"""A bounded load test on loopback: many concurrent clients for a fixed time, zero
errors, every response matched to its own request (by id and by value), and the
server's memory stable once warm."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest

import zoo
from zoo.serve.protocol import HEADER_LENGTH, decode_response, encode_request

pytest.register_assert_rewrite("serve_support")
from serve_support import ONNX, RAGGED, plugin_registered  # noqa: E402

pytest_plugins = ["serve_support"]
CLIENTS, SECONDS = 32, 6.0


def test_many_clients_for_a_fixed_time(server, serve_repo):
    with plugin_registered():
        models = {name: (zoo.Artifact.open(serve_repo / name).spec(), zoo.load(serve_repo / name, threads=1))
                  for name in (ONNX, RAGGED)}
    done, errors, mismatched = [0], [], []
    rss: list[int] = []

    async def client(k: int, http: httpx.AsyncClient, stop_at: float) -> None:
        rng = np.random.default_rng(k)
        n = 0
        while time.monotonic() < stop_at:
            name = (ONNX, RAGGED)[(k + n) % 2]
            spec, runner = models[name]
            inputs = spec.sample(int(rng.integers(1, 4)), rng)
            request_id = f"client{k}-request{n}"
            n += 1
            body, headers = encode_request(inputs, binary=n % 3 != 0, request_id=request_id)
            try:
                r = await http.post(f"{server.url}/v2/models/{name}/infer", content=body, headers=headers)
            except httpx.HTTPError as exc:
                errors.append(f"{request_id}: {exc!r}")
                continue
            if r.status_code != 200:
                errors.append(f"{request_id}: {r.status_code} {r.text[:200]}")
                continue
            doc, outputs = decode_response(r.content, r.headers.get(HEADER_LENGTH))
            want = runner(inputs)
            tol = spec.tolerance("fp32")
            if doc.get("id") != request_id or any(
                    outputs[key].shape != want[key].shape or
                    not np.allclose(outputs[key], want[key], atol=tol.atol, rtol=tol.rtol) for key in want):
                mismatched.append(request_id)
            done[0] += 1

    async def watch_memory(stop_at: float) -> None:
        while time.monotonic() < stop_at:
            await asyncio.sleep(0.5)
            rss.append(server.rss_bytes())

    async def main() -> None:
        stop_at = time.monotonic() + SECONDS
        limits = httpx.Limits(max_connections=CLIENTS)
        async with httpx.AsyncClient(timeout=30, limits=limits) as http:
            await asyncio.gather(watch_memory(stop_at), *(client(k, http, stop_at) for k in range(CLIENTS)))

    asyncio.run(main())
    assert not errors, errors[:5]
    assert not mismatched, mismatched[:5]
    assert done[0] > 4 * CLIENTS, f"only {done[0]} requests completed in {SECONDS} s"
    warm = rss[len(rss) // 3]  # after the first third, buffers and batch shapes have been seen
    assert rss[-1] - warm < 64 << 20, f"server memory grew from {warm >> 20} MiB to {rss[-1] >> 20} MiB"
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200

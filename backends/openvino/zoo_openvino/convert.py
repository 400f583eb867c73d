"""Export a zoo module to OpenVINO IR (`model.xml` + `model.bin` beside it).

The IR is read from the ONNX file that zoo-onnx's exporter writes, not converted
from the torch module directly. That exporter already gives every model in the registry
its spec's input/output names and each symbolic axis (batch, seq, atoms) as a dynamic
dimension, with fixed dimensions kept fixed; `openvino.convert_model` on a
`torch.export` program instead names tensors after graph nodes (`inputs_0`,
`linear:0`), leaves every dimension dynamic, and cannot convert the GRU model.

`Core.read_model` runs the same ONNX frontend as `openvino.convert_model` but without
the model-conversion tool's usage telemetry, so exporting contacts no network.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Mapping

import torch

from zoo.errors import ExportError, first_line
from zoo.spec import ModelSpec


def export_ir(module: torch.nn.Module, spec: ModelSpec, example: Mapping[str, torch.Tensor], path: Path,
              precision: str) -> dict[str, Any]:
    """Write `module` as IR at `path` (the weights go to `path` with suffix .bin).

    `precision` "int8" quantizes the graph with NNCF (see `.quantize`); "fp32" and
    "bf16" write the same float32 IR, bf16 being an inference hint applied at load.
    Returns the ONNX exporter's facts, plus the quantization's for int8.
    """
    from zoo.errors import signals_held

    with signals_held():  # a SIGTERM inside a native library's initialization crashed the process
        import openvino as ov
        from zoo_onnx.export import export_onnx

    with tempfile.TemporaryDirectory(prefix="zoo-openvino-") as tmp:
        onnx_path = Path(tmp) / "model.onnx"
        info: dict[str, Any] = {"onnx": export_onnx(module, spec, example, onnx_path)}
        try:
            model = ov.Core().read_model(onnx_path)
        except RuntimeError as exc:  # OpenVINO reports unsupported ops as RuntimeError
            raise ExportError(f"OpenVINO cannot read the ONNX export of {spec.name}: {reason(exc)}") from exc
        if precision == "int8":
            from .quantize import quantize

            model, info["quantization"] = quantize(model, spec)
        # compress_to_fp16 defaults to True and would store the weights as float16,
        # so an "fp32" artifact would not hold the fp32 weights it was verified against.
        ov.save_model(model, str(path), compress_to_fp16=False)
    return info


def reason(exc: BaseException, limit: int = 400) -> str:
    """OpenVINO's error without its source locations: its first line is only "Exception
    from src/inference/src/cpp/core.cpp:84:", and what failed ("Model wasn't fully
    converted ... ReduceMean-18 ...") follows on the next ones."""
    lines = [line.strip() for line in str(exc).splitlines()]
    said = [line for line in lines if line and not line.startswith(("Exception from ", "Check '"))
            and not line.endswith((".cpp:", ".hpp:"))]
    text = "; ".join(said) or first_line(exc)
    return text if len(text) <= limit else text[:limit - 3] + "..."

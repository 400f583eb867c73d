"""The `Runner` over an ONNX Runtime `InferenceSession`.

On CPU it feeds numpy arrays and returns numpy arrays. On CUDA it uses IO binding: the
inputs are bound by address where the torch tensors already live, the outputs are
allocated by ONNX Runtime on the same device and handed to torch through DLPack, so
no tensor crosses to the host and back (ONNX Runtime docs, "I/O Binding": "if the
output is not pre-allocated on the device, ORT assumes that the output is requested on
the CPU and copies it").

Streams: ONNX Runtime computes on the runner's own torch stream, given to it as the
provider's `user_compute_stream` (see `OnnxRuntimeBackend.load`). Before each run that
stream waits, on the GPU, for the caller's current stream, where the inputs were
written; the host does not block, and nothing device-wide is synchronized (the
binding's `synchronize_inputs()` would call the CUDA provider's `Sync()`, a
`cudaDeviceSynchronize`). ONNX Runtime synchronizes its compute stream before
`run_with_iobinding` returns (unless the run option
`disable_synchronize_execution_providers` is set, which we do not), so the outputs are
complete when handed back, and the caller may use them on any stream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, NamedTuple

import sys

import numpy as np

from zoo.arrays import to_numpy
from zoo.errors import ArtifactError, BackendUnavailableError, ZooError
from zoo.inputs import check_names
from zoo.spec import ModelSpec

if TYPE_CHECKING:
    import onnxruntime
    import torch


class _Type(NamedTuple):
    numpy: Any  # numpy dtype, or None where numpy has none (bfloat16)
    torch: str  # the torch dtype's name (IO binding only: the numpy path imports no torch)
    onnx: int  # onnx.TensorProto element type, what IO binding takes when numpy has no dtype


#: the session's type strings ("tensor(float)") for the tensor types a zoo spec can name.
_TYPES = {
    "tensor(float)": _Type(np.float32, "float32", 1),
    "tensor(uint8)": _Type(np.uint8, "uint8", 2),
    "tensor(int8)": _Type(np.int8, "int8", 3),
    "tensor(int32)": _Type(np.int32, "int32", 6),
    "tensor(int64)": _Type(np.int64, "int64", 7),
    "tensor(bool)": _Type(np.bool_, "bool", 9),
    "tensor(float16)": _Type(np.float16, "float16", 10),
    "tensor(double)": _Type(np.float64, "float64", 11),
    "tensor(bfloat16)": _Type(None, "bfloat16", 16),
}


class OnnxRuntimeRunner:
    """`runner({name: array}) -> {name: array}` for one session.

    `bind` selects IO binding (torch tensors in and out, kept on `device`); it defaults
    to on for CUDA, where it avoids host copies, and off for CPU, where the contract is
    numpy out. `stream` is the torch CUDA stream the session computes on (the one given
    to its provider as `user_compute_stream`); without one the caller's stream is
    synchronized before each run instead. PyTorch is imported only for IO binding: a CPU
    session fed numpy arrays runs without it.
    """

    def __init__(self, session: "onnxruntime.InferenceSession", spec: ModelSpec, device: str = "cpu",
                 bind: bool | None = None, stream: "torch.cuda.Stream | None" = None,
                 run_options: "onnxruntime.RunOptions | None" = None) -> None:
        self.session = session
        self.run_options = run_options  # every run's (the served model's configuration: `serving_options`)
        self.spec = spec
        self.device_type, _, index = str(device).partition(":")
        self.device_index = int(index or 0)
        self.bind = self.device_type != "cpu" if bind is None else bind
        if self.bind:
            import torch

            self.device = torch.device(device)
        self.stream = stream  # referenced here for as long as the session runs on it
        self.input_names = tuple(t.name for t in spec.inputs)
        self.output_names = tuple(t.name for t in spec.outputs)
        inputs = {i.name: i.type for i in session.get_inputs()}
        outputs = {o.name: o.type for o in session.get_outputs()}
        # The exporter names the graph after the spec; anything else is another model's file.
        if set(inputs) != set(self.input_names) or set(outputs) != set(self.output_names):
            raise ArtifactError(
                f"the ONNX model's signature (inputs {sorted(inputs)}, outputs {sorted(outputs)}) does not "
                f"match model {spec.name} (inputs {list(self.input_names)}, outputs {list(self.output_names)}); "
                "re-export it with `zoo export --force`")
        unknown = sorted({t for t in (*inputs.values(), *outputs.values()) if t not in _TYPES})
        if unknown:
            raise ArtifactError(f"the ONNX model for {spec.name} uses tensor types zoo does not handle: {unknown}")
        self._input_types = {name: _TYPES[t] for name, t in inputs.items()}
        self._output_types = {name: _TYPES[t] for name, t in outputs.items()}

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        check_names(inputs, self.spec, self.spec.name)  # the rest: `Artifact.load`'s runner (`zoo.inputs`)
        return self._run_bound(inputs) if self.bind else self._run_numpy(inputs)

    def _run_numpy(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        feeds = {name: self._numpy(name, inputs[name]) for name in self.input_names}
        outputs = self.session.run(list(self.output_names), feeds, self.run_options)
        return dict(zip(self.output_names, outputs, strict=True))

    def _numpy(self, name: str, value: Any) -> np.ndarray:
        want = self._input_types[name].numpy
        if want is None:
            raise ZooError(f"input {name} is bfloat16, which numpy cannot hold; load the model on cuda")
        torch = sys.modules.get("torch")  # a torch tensor comes only from a process that imported it
        if torch is not None and isinstance(value, torch.Tensor):
            value = value.detach().cpu()
            # numpy has no bfloat16; widen first, the cast below narrows to what the session wants.
            value = (value.float() if value.dtype == torch.bfloat16 else value).numpy()
        return np.ascontiguousarray(value, dtype=want)

    def _run_bound(self, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        import torch

        binding = self.session.io_binding()
        ort_device = "cuda" if self.device_type == "cuda" else "cpu"
        index = self.device_index
        # ONNX Runtime reads these addresses during run(): keep the tensors referenced until then.
        tensors = {name: self._tensor(name, inputs[name]) for name in self.input_names}
        for name, tensor in tensors.items():
            kind = self._input_types[name]
            binding.bind_input(name, ort_device, index, kind.numpy if kind.numpy is not None else kind.onnx,
                               tuple(tensor.shape), tensor.data_ptr())
        for name in self.output_names:
            # No buffer: ONNX Runtime allocates each output on the device at its run-time shape.
            binding.bind_output(name, ort_device, index)
        if self.device_type == "cuda":
            # The inputs may still be being written on the caller's stream.
            caller = torch.cuda.current_stream(self.device)
            if self.stream is not None:
                self.stream.wait_stream(caller)  # ordered on the GPU; the host goes on
                for tensor in tensors.values():  # freed by the caller, reused only after our stream's use
                    tensor.record_stream(self.stream)
            else:  # the session computes on a stream of its own, unknown to torch
                caller.synchronize()
        self.session.run_with_iobinding(binding, self.run_options)  # returns once its compute stream is done
        if self.device_type == "cuda" and self.stream is not None:
            # ordered both ways even where a run returned before its stream finished
            # (issue 17, finding 4); after a synchronized run this costs nothing
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
        # get_outputs() is in binding order, which is ours.
        outputs = {name: to_torch(value, getattr(torch, self._output_types[name].torch))
                   for name, value in zip(self.output_names, binding.get_outputs(), strict=True)}
        if any(isinstance(v, torch.Tensor) for v in inputs.values()):
            return outputs  # tensors in, tensors out: device outputs stay on the device
        # arrays in, arrays out, as every runner does (a plugin's metric or domain check
        # reads them with numpy: found on the first CUDA run, issue 17)
        return to_numpy(outputs)

    def _tensor(self, name: str, value: Any) -> torch.Tensor:
        import torch

        if not isinstance(value, torch.Tensor):
            # A numpy input has to reach the device once; that copy is the caller's choice.
            value = torch.from_numpy(np.ascontiguousarray(value))
        dtype = getattr(torch, self._input_types[name].torch)
        return value.detach().to(device=self.device, dtype=dtype).contiguous()


def to_torch(value: "onnxruntime.OrtValue", dtype: torch.dtype) -> torch.Tensor:
    """An OrtValue as a torch tensor sharing its memory (DLPack), on the same device."""
    import torch

    if hasattr(value, "__dlpack__"):
        tensor = torch.from_dlpack(value)
    elif hasattr(getattr(value, "_ortvalue", None), "to_dlpack"):
        # onnxruntime releases before the Python OrtValue spoke DLPack expose it one level down.
        tensor = torch.utils.dlpack.from_dlpack(value._ortvalue.to_dlpack())
    else:
        raise BackendUnavailableError("this onnxruntime cannot hand device outputs to torch without a host "
                                      "copy (no DLPack support); upgrade onnxruntime-gpu")
    # ONNX Runtime exports bool tensors as uint8 through DLPack; reinterpret, do not copy.
    return tensor.view(torch.bool) if dtype == torch.bool and tensor.dtype == torch.uint8 else tensor

"""Running a deserialized TensorRT engine on torch CUDA tensors, with no host copies.

TensorRT 10's execution API is name-based: per call, `set_input_shape` for every input,
then the output shapes follow (`infer_shapes`, `get_tensor_shape`); `set_tensor_address`
binds device pointers for inputs and outputs; `execute_async_v3(stream_handle)`
enqueues the work ("Working with Dynamic Shapes" and `IExecutionContext`, TensorRT
Python API). Memory is torch's: inputs that are already CUDA tensors of the engine's
dtype are bound in place, numpy inputs are moved to the GPU once, outputs are allocated
by torch's caching allocator. The work goes on a stream the runner owns, ordered both
ways with the caller's current stream: it waits for the caller's queued work before it
starts, and the caller's later work waits for it, so tensors freed after the call are only
reused once the engine is done. `enqueueV3` on the legacy default stream (torch's current
stream unless the caller set one) "adds additional device synchronizations" (TensorRT's
`IExecutionContext::enqueueV3`), which a stream of its own avoids (issue 17, finding 3).
Every bound address is 256-byte aligned, as `setTensorAddress` requires: an input that
is a view at an unaligned offset is copied first (finding 4).
"""

from __future__ import annotations

import threading
from typing import Any, Mapping

from zoo.errors import ArtifactError, UnsupportedError, ZooError
from zoo.spec import ModelSpec
from zoo_onnx import engines

from . import library

#: the alignment `IExecutionContext::setTensorAddress` requires of every address, in bytes
ALIGNMENT = 256


def aligned(tensor: Any) -> Any:
    """`tensor`, or a copy of it where its address is not `ALIGNMENT`-aligned (a view at an
    offset: `x[1:]`); torch's CUDA caching allocator hands out blocks aligned to 512."""
    return tensor if tensor.data_ptr() % ALIGNMENT == 0 else tensor.clone()


class TensorRTRunner:
    """A loaded engine: `runner({name: array}) -> {name: torch CUDA tensor}`."""

    def __init__(self, plan: bytes, spec: ModelSpec, profile: engines.Profile, device: str) -> None:
        import torch

        trt = library.import_tensorrt()
        self.spec, self.profile = spec, profile
        self.device = torch.device(device)
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        with torch.cuda.device(self.device):  # TensorRT uses the current CUDA device
            self._runtime = trt.Runtime(library.logger())
            library.clear_errors()
            self._engine = self._runtime.deserialize_cuda_engine(plan)
            if self._engine is None:
                raise ArtifactError("TensorRT could not deserialize the engine: "
                                    + ("; ".join(library.recent_errors()) or "the plan file is corrupt"))
            self._context = self._engine.create_execution_context()
            self._stream = torch.cuda.Stream(self.device)  # the runner's own (module docstring)
        engine = self._engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        is_input = {n: engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        # Spec order first (what users and the verifier expect), then anything else.
        order = [t.name for t in (*spec.inputs, *spec.outputs)]
        names.sort(key=lambda n: order.index(n) if n in order else len(order))
        self.input_names = tuple(n for n in names if is_input[n])
        self.output_names = tuple(n for n in names if not is_input[n])
        dtypes = _torch_dtypes(trt, torch)
        self._dtypes = {}
        for n in names:
            trt_dtype = engine.get_tensor_dtype(n)
            if trt_dtype not in dtypes:
                raise UnsupportedError(f"engine tensor {n!r} has type {trt_dtype}, which torch cannot hold")
            self._dtypes[n] = dtypes[trt_dtype]
        # One context holds one set of shapes and addresses: calls from several threads
        # take turns binding and enqueueing (the GPU work itself still overlaps).
        self._lock = threading.Lock()

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        import torch

        missing = [n for n in self.input_names if n not in inputs]
        if missing:
            raise ZooError(f"missing inputs {missing}; this model takes {list(self.input_names)}")
        with self._lock, torch.cuda.device(self.device):
            caller, stream = torch.cuda.current_stream(self.device), self._stream
            context = self._context
            library.clear_errors()
            bound = []  # referenced until enqueued
            for name in self.input_names:
                tensor = self._on_device(inputs[name], self._dtypes[name])
                engines.check_shape(self.spec, self.profile, name, tuple(tensor.shape))
                if not context.set_input_shape(name, tuple(tensor.shape)):
                    raise UnsupportedError(f"TensorRT refused shape {tuple(tensor.shape)} for input {name!r}: "
                                           + "; ".join(library.recent_errors()))
                self._bind(name, tensor)
                bound.append(tensor)
            unresolved = context.infer_shapes()  # names still insufficiently specified
            if unresolved:
                raise ZooError(f"TensorRT cannot infer output shapes; unspecified: {list(unresolved)}")
            outputs = {}
            for name in self.output_names:
                shape = tuple(context.get_tensor_shape(name))
                if any(d < 0 for d in shape):  # would need an IOutputAllocator
                    raise UnsupportedError(f"output {name!r} has a data-dependent shape {shape}, "
                                           f"which this runner does not support")
                outputs[name] = torch.empty(shape, dtype=self._dtypes[name], device=self.device)
                self._bind(name, outputs[name])
            stream.wait_stream(caller)  # the inputs and outputs are written in the caller's order
            if not context.execute_async_v3(stream.cuda_stream):
                raise ZooError("TensorRT failed to enqueue the engine: "
                               + ("; ".join(library.recent_errors()) or "no detail was given"))
            caller.wait_stream(stream)  # the caller's later work, frees included, after the engine
        if any(isinstance(v, torch.Tensor) for v in inputs.values()):
            return outputs  # tensors in, tensors out: device outputs stay on the device
        from zoo.arrays import to_numpy

        return to_numpy(outputs)  # arrays in, arrays out, as every runner does

    def _bind(self, name: str, tensor: Any) -> None:
        if not self._context.set_tensor_address(name, tensor.data_ptr()):  # e.g. misaligned memory
            raise ZooError(f"TensorRT refused the memory of tensor {name!r}: "
                           + ("; ".join(library.recent_errors()) or "no detail was given"))

    def _on_device(self, value: Any, dtype: Any) -> Any:
        """`value` as a contiguous CUDA tensor of `dtype`: as is when it already is one."""
        import numpy as np
        import torch

        tensor = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))
        return aligned(tensor.to(device=self.device, dtype=dtype).contiguous())


def _torch_dtypes(trt: Any, torch: Any) -> dict[Any, Any]:
    """TensorRT I/O data types -> torch dtypes (the types an engine's I/O can have here)."""
    return {
        trt.float32: torch.float32, trt.float16: torch.float16, trt.bfloat16: torch.bfloat16,
        trt.int8: torch.int8, trt.int32: torch.int32, trt.int64: torch.int64,
        trt.uint8: torch.uint8, trt.bool: torch.bool,
    }

"""The `Runner` over an OpenVINO `CompiledModel`: numpy (or torch) in, numpy out.

One `InferRequest` per runner, made once: creating a request allocates its buffers, so
a request per call would cost more than a small model's inference. Inputs are set as
tensors over the caller's arrays and outputs read from the request's tensors, which
costs a policy MLP ~35 us a call against ~55 us through `InferRequest.infer(dict)` and
its result dictionary. A request is not reentrant, so calls are serialized by a lock;
the server gives each worker thread its own runner, so the lock is only ever contended
when a caller shares one runner.

The model is compiled with dynamic dimensions (batch, seq, atoms), so each call simply
infers at the shape it is given (OpenVINO reshapes the request's tensors itself; see
"Dynamic Shapes" in the OpenVINO runtime guide).
"""

from __future__ import annotations

import threading
from typing import Any, Mapping

import numpy as np
import openvino  # this module is imported by `OpenVinoBackend.load` only

from zoo.errors import ArtifactError
from zoo.inputs import check_names
from zoo.spec import ModelSpec
from zoo.arrays import as_numpy


class OpenVinoRunner:
    """`runner({name: array}) -> {name: numpy array}` for one compiled model."""

    def __init__(self, compiled: "openvino.CompiledModel", spec: ModelSpec) -> None:
        self.compiled = compiled
        self.spec = spec
        self.input_names = tuple(t.name for t in spec.inputs)
        self.output_names = tuple(t.name for t in spec.outputs)
        # The IR keeps the ONNX graph's tensor names, which the exporter took from the spec.
        inputs = _ports(compiled.inputs, self.input_names)
        outputs = _ports(compiled.outputs, self.output_names)
        if inputs is None or outputs is None:
            have_in = sorted(n for p in compiled.inputs for n in p.get_names())
            have_out = sorted(n for p in compiled.outputs for n in p.get_names())
            raise ArtifactError(
                f"the OpenVINO model's signature (inputs {have_in}, outputs {have_out}) does not match model "
                f"{spec.name} (inputs {list(self.input_names)}, outputs {list(self.output_names)}); "
                "re-export it with `zoo export --force`")
        self._inputs = {name: (port, port.get_element_type().to_dtype()) for name, port in inputs.items()}
        self._outputs = outputs
        self._request = compiled.create_infer_request()
        self._lock = threading.Lock()

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
        check_names(inputs, self.spec, self.spec.name)  # the rest: `Artifact.load`'s runner (`zoo.inputs`)
        shared = []  # shared_memory: the request reads these arrays in place; they must live until infer returns
        with self._lock:
            for name, (port, dtype) in self._inputs.items():
                array = np.ascontiguousarray(as_numpy(inputs[name]), dtype=dtype)
                if not array.flags.writeable:  # a view of a request's bytes: OpenVINO shares only writeable memory
                    array = array.copy()
                shared.append(array)
                self._request.set_tensor(port, openvino.Tensor(array, shared_memory=True))
            self._request.infer()
            # Copied out: the next call overwrites the request's output buffers.
            return {name: self._request.get_tensor(port).data.copy() for name, port in self._outputs.items()}


def _ports(ports: list, names: tuple[str, ...]) -> dict[str, Any] | None:
    """The port carrying each name, or None when the ports are not exactly these names."""
    found = {}
    for name in names:
        match = [p for p in ports if name in p.get_names()]
        if len(match) != 1:
            return None
        found[name] = match[0]
    return found if len(ports) == len(names) else None

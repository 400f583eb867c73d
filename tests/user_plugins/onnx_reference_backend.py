"""A user's backend plugin: ONNX's own reference evaluator (`onnx.reference`), a pure
Python runtime, behind the zoo's Backend interface. It exports through the same ONNX
exporter as the ONNX backends (`zoo_onnx.export`) and runs the file with another engine."""

from pathlib import Path

import numpy as np

import zoo


class OnnxReference(zoo.Backend):
    name = "onnx-reference"
    description = "the ONNX reference evaluator (pure Python, for checking graphs)"
    precisions = {"cpu": ("fp32",)}
    filename = "model.onnx"
    triton = {"platform": "onnxruntime_onnx"}

    def versions(self):
        import onnx

        return {"onnx": onnx.__version__}

    def probe(self, device):
        if device != "cpu":
            return zoo.Availability(False, "the reference evaluator runs on the CPU only")
        return zoo.Availability(True)

    def export(self, module, spec, example, path, precision, device):
        from zoo_onnx.export import export_onnx

        return export_onnx(module, spec, example, Path(path))

    def load(self, path, spec, precision, device, threads=None, info=None):
        from onnx.reference import ReferenceEvaluator

        session = ReferenceEvaluator(str(path))
        names = [t.name for t in spec.outputs]

        def run(inputs):
            feeds = {t.name: np.asarray(inputs[t.name], dtype=t.dtype) for t in spec.inputs}
            return dict(zip(names, session.run(names, feeds)))

        return run


@zoo.hookimpl
def zoo_register_backends(register):
    register(OnnxReference())

"""Backends with the slips their authors make, each a subclass of one that works (ONNX
Runtime on the ONNX exporter's file). `SLIPPED_BACKENDS` (comma-separated names) picks
which register: a plugin that registers one undeclarable backend is left out whole."""

import os
from pathlib import Path

import numpy as np

import zoo


class Works(zoo.Backend):
    name = "slip-none"
    precisions = {"cpu": ("fp32",)}
    filename = "model.onnx"

    def versions(self):
        import onnxruntime

        return {"onnxruntime": onnxruntime.__version__}

    def probe(self, device):
        return zoo.Availability(True)

    def export(self, module, spec, example, path, precision, device):
        from zoo_onnx.export import export_onnx

        export_onnx(module, spec, example, Path(path))

    def load(self, path, spec, precision, device, threads=None, info=None):
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [t.name for t in spec.outputs]

        def run(inputs):
            feeds = {t.name: np.asarray(inputs[t.name], dtype=t.dtype) for t in spec.inputs}
            return dict(zip(names, session.run(names, feeds)))

        return run


class SaysDone(Works):
    name = "slip-export-says-done"

    def export(self, *args):
        super().export(*args)
        return "done"


class KeepsPaths(Works):
    name = "slip-export-keeps-paths"

    def export(self, module, spec, example, path, precision, device):
        super().export(module, spec, example, path, precision, device)
        return {"file": Path(path)}


class Crashes(Works):
    name = "slip-export-crashes"

    def export(self, *args):
        raise RuntimeError("my compiler crashed in pass 3")


class ForgetsRunner(Works):
    name = "slip-load-forgets-runner"

    def load(self, *args, **kwargs):
        super().load(*args, **kwargs)


class ListRunner(Works):
    name = "slip-runner-list"

    def load(self, path, spec, precision, device, threads=None, info=None):
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return lambda inputs: session.run(None, {t.name: np.asarray(inputs[t.name]) for t in spec.inputs})


class VersionsRaise(Works):
    name = "slip-versions-raise"

    def versions(self):
        import mylib  # noqa: F401  (not installed)


class VersionNumbers(Works):
    name = "slip-version-numbers"

    def versions(self):
        return {"mylib": 3}


class Fp8(Works):
    name = "slip-fp8"
    precisions = {"cpu": ("fp32", "fp8")}


class Nested(Works):
    name = "slip-nested-file"
    filename = "onnx/model.onnx"


@zoo.hookimpl
def zoo_register_backends(register):
    chosen = os.environ.get("SLIPPED_BACKENDS", "").split(",")
    for backend in (Works, SaysDone, KeepsPaths, Crashes, ForgetsRunner, ListRunner, VersionsRaise, VersionNumbers,
                    Fp8, Nested):
        if backend.name in chosen:
            register(backend())

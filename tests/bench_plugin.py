"""Backends that fail the way real ones can, for the benchmark's isolation tests. A file
plugin (not an object registered in the test process) so the benchmark's worker
processes load it too."""

import ctypes
import time
from pathlib import Path

from zoo_torch import TorchBackend

import zoo


class BrokenExport(TorchBackend):
    """The exporter hits a library error."""

    name = "broken-test"

    def export(self, module, spec, example, path, precision, device):
        raise RuntimeError("the exporter met an operator it cannot lower")


class CrashingLoad(TorchBackend):
    """The engine segfaults while loading, taking its process down. Its export writes a
    placeholder at once: the crash, not a capture on a loaded machine, is what the 10 s
    timeout of the test that runs it must see."""

    name = "crash-test"

    def export(self, module, spec, example, path, precision, device):
        Path(path).write_bytes(b"an engine that crashes its loader")
        return {"exporter": "placeholder"}

    def load(self, path, spec, precision, device, threads=None, info=None):
        ctypes.string_at(0)  # reads address 0: SIGSEGV


class HangingExport(TorchBackend):
    """The builder never returns."""

    name = "hang-test"

    def export(self, module, spec, example, path, precision, device):
        time.sleep(3600)


class WrongAnswers(TorchBackend):
    """Exports and runs, but its engine answers 1.5 times the right output: verification
    must refuse the artifact."""

    name = "wrong-test"

    def load(self, path, spec, precision, device, threads=None, info=None):
        runner = super().load(path, spec, precision, device, threads, info)
        outputs = runner.outputs
        runner.outputs = lambda raw: {k: v * 1.5 for k, v in outputs(raw).items()}
        return runner


@zoo.hookimpl
def zoo_register_backends(register):
    for backend in (BrokenExport(), CrashingLoad(), HangingExport(), WrongAnswers()):
        register(backend)

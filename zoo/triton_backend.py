"""Serving an artifact inside NVIDIA Triton's Python backend, through zoo's own runner.

An artifact in the python Triton form (`zoo.triton`) has `1/model.py`, which imports
`TritonPythonModel` from here. Triton's Python stub runs it in its own process:

- `initialize` opens the artifact directory Triton passes (`args["model_repository"]`)
  with `Artifact.open`, so every file is checked against the manifest's sha256 as
  `zoo.load` does, loads the runner on the instance's device (`KIND_GPU` -> `cuda:N`),
  and runs the stored test vectors through it: a model that does not reproduce its
  PyTorch reference never becomes READY (its status reason says why).
- `execute` receives what Triton's dynamic batcher gathered. Requests whose tensors agree
  past the batch axis are concatenated along it, run as one call and split back by rows
  (Triton keeps the sum within `max_batch_size`); requests of other shapes (another
  sequence length) run as their own group. A failing group answers each of its requests
  with the error; the other groups are unaffected.

This module imports `triton_python_backend_utils` only inside the Triton stub, which
provides it; the rest of zoo never imports this module.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("zoo")


class TritonPythonModel:
    """The class Triton's Python backend instantiates once per model instance."""

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils

        _utf8_locale()

        from .artifact import Artifact
        from .vectors import check

        self.pb = pb_utils
        config = json.loads(args["model_config"])
        device = "cpu"
        if args.get("model_instance_kind") == "GPU":
            device = f"cuda:{args.get('model_instance_device_id', '0')}"
        art = Artifact.open(Path(args["model_repository"]))
        self.runner = art.load(device=device)
        sets = art.test_vectors()
        if sets:
            check(art.spec(), self._numpy_runner, sets, art.precision)
        self.batched = int(config.get("max_batch_size", 0)) > 0
        self.inputs = [entry["name"] for entry in config["input"]]
        self.outputs = [(entry["name"], pb_utils.triton_string_to_numpy(entry["data_type"]))
                        for entry in config["output"]]

    def _numpy_runner(self, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        return {name: _to_numpy(value) for name, value in self.runner(inputs).items()}

    def execute(self, requests: list) -> list:
        pb = self.pb
        responses: list = [None] * len(requests)
        groups: dict[tuple, list[tuple[int, dict[str, np.ndarray]]]] = {}
        for i, request in enumerate(requests):
            try:
                feed = {name: self._input(request, name) for name in self.inputs}
            except ValueError as exc:
                responses[i] = pb.InferenceResponse(error=pb.TritonError(str(exc)))
                continue
            key = tuple((a.shape[1:] if self.batched else a.shape, a.dtype.str) for a in feed.values())
            groups.setdefault(key if self.batched else (i,), []).append((i, feed))
        for members in groups.values():
            try:
                for i, outputs in zip((i for i, _ in members), self._run([feed for _, feed in members])):
                    responses[i] = pb.InferenceResponse(output_tensors=[
                        pb.Tensor(name, np.ascontiguousarray(outputs[name], dtype=dtype))
                        for name, dtype in self.outputs])
            except Exception as exc:  # the runner's or library's error goes back to the callers
                log.error("inference failed for %d request(s)", len(members), exc_info=exc)
                for i, _ in members:
                    responses[i] = pb.InferenceResponse(error=pb.TritonError(f"inference failed: {exc}"))
        return responses

    def _input(self, request, name: str) -> np.ndarray:
        tensor = self.pb.get_input_tensor_by_name(request, name)
        if tensor is None:
            raise ValueError(f"request has no input {name!r}")
        return tensor.as_numpy()

    def _run(self, feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """One runner call for all `feeds` (rows concatenated), split back per feed."""
        if len(feeds) == 1:
            return [self._numpy_runner(feeds[0])]
        rows = [len(next(iter(feed.values()))) for feed in feeds]
        merged = {name: np.concatenate([feed[name] for feed in feeds]) for name in self.inputs}
        outputs = self._numpy_runner(merged)
        bounds = np.cumsum(rows)[:-1]
        split = {name: np.split(value, bounds) for name, value in outputs.items()}
        return [{name: parts[k] for name, parts in split.items()} for k in range(len(feeds))]

    def finalize(self) -> None:
        self.runner = None


def _utf8_locale() -> None:
    """Triton's Python stub starts its interpreter in the C locale, where `open()` decodes
    ASCII (PYTHONUTF8 and LC_ALL do not reach it): Inductor's kernel templates, read when
    torch-compile and torch-aoti compile, hold UTF-8. The stub is this model's own process."""
    import contextlib
    import locale

    if locale.getpreferredencoding(False).lower().replace("-", "") != "utf8":
        with contextlib.suppress(locale.Error):
            locale.setlocale(locale.LC_CTYPE, "C.UTF-8")


def _to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a CUDA runner returns torch tensors on the device
        return value.detach().cpu().numpy()
    return np.asarray(value)

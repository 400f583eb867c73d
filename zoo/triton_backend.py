"""Serving an artifact inside NVIDIA Triton's Python backend, through zoo's own runner.

An artifact in the python Triton form (`zoo.triton`) has `1/model.py`, which imports
`TritonPythonModel` from here. Triton's Python stub runs it in its own process:

- `initialize` opens the artifact directory Triton passes (`args["model_repository"]`)
  with `Artifact.open`, so every file is checked against the manifest's sha256 as
  `zoo.load` does, loads the runner on the instance's device (`KIND_GPU` -> `cuda:N`),
  and runs the stored test vectors through it: a model that does not reproduce its
  PyTorch reference never becomes READY (its status reason says why).
  Before any of that, the configuration Triton loads (config.pbtxt, or one given at load
  time through model control) must agree with the artifact's spec: the same input and
  output names, data types and dims, and a `max_batch_size` within the spec's batch axis.
  A configuration that does not is refused with the list of differences, so the model is
  UNAVAILABLE with that reason instead of READY and answering wrong types or failing
  every large batch.
- `execute` receives what Triton's dynamic batcher gathered. Each request's inputs are
  checked alone, as `zoo serve` checks them (`zoo.inputs.check_arrays`: every dynamic
  axis within its range, values within the spec's `value_range`); a request that fails
  is answered with its own error (indices within that request), as INVALID_ARG (HTTP
  400, gRPC INVALID_ARGUMENT), and never joins a batch. The others, whose tensors agree
  past the batch axis, are concatenated along it, run as one call of the unchecked
  runner and split back by rows (Triton keeps the sum within `max_batch_size`); requests
  of other shapes (another sequence length) run as their own group. A group whose run
  fails answers each of its requests with the error (INTERNAL); the other groups are
  unaffected.

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

        from .backend import for_serving, prepare_serving_process

        prepare_serving_process()  # the stub process serves: before the artifact's engine is imported
        from .artifact import Artifact
        from .errors import ZooError
        from .inputs import unchecked
        from .vectors import check

        self.pb = pb_utils
        config = json.loads(args["model_config"])
        device = "cpu"
        if args.get("model_instance_kind") == "GPU":
            device = f"cuda:{args.get('model_instance_device_id', '0')}"
        art = Artifact.open(Path(args["model_repository"]))
        self.spec, self.name = art.spec(), args.get("model_name") or art.name
        departures = config_departures(config, self.spec)
        if departures:  # before the runner loads: the reason Triton gives for UNAVAILABLE
            raise ZooError(f"model {self.name}: its Triton configuration does not match the artifact's spec "
                           f"(the exported config.pbtxt does): " + "; ".join(departures))
        parameters = {key: str(value.get("string_value", "")) for key, value in (config.get("parameters") or {}).items()
                      if isinstance(value, dict)}
        with for_serving(parameters):  # the same runner as `zoo serve`'s, loaded the same way
            self.runner = art.load(device=device)
        self.run = unchecked(self.runner)  # each request is checked alone in execute, before it is grouped
        sets = art.test_vectors()
        if sets:
            check(self.spec, self._numpy_runner, sets, art.precision)
        self.max_batch_size = int(config.get("max_batch_size", 0))
        self.batched = self.max_batch_size > 0
        self.inputs = [entry["name"] for entry in config["input"]]
        self.outputs = [(entry["name"], pb_utils.triton_string_to_numpy(entry["data_type"]))
                        for entry in config["output"]]

    def _numpy_runner(self, inputs: dict[str, Any], checked: bool = True) -> dict[str, np.ndarray]:
        runner = self.runner if checked else self.run
        return {name: _to_numpy(value) for name, value in runner(inputs).items()}

    def execute(self, requests: list) -> list:
        from .errors import InputError
        from .inputs import check_arrays

        pb = self.pb
        responses: list = [None] * len(requests)
        groups: dict[tuple, list[tuple[int, dict[str, np.ndarray]]]] = {}
        batch_max = self.max_batch_size if self.batched else None
        for i, request in enumerate(requests):
            try:  # each request alone, as zoo serve checks it: its error names its own rows
                feed = {name: self._input(request, name) for name in self.inputs}
                check_arrays(feed, self.spec, self.name, batch_max)
            except InputError as exc:
                responses[i] = pb.InferenceResponse(error=self._error(str(exc), invalid=True))
                continue
            key = tuple((a.shape[1:] if self.batched else a.shape, a.dtype.str) for a in feed.values())
            groups.setdefault(key if self.batched else (i,), []).append((i, feed))
        for members in groups.values():
            try:
                for i, outputs in zip((i for i, _ in members), self._run([feed for _, feed in members])):
                    responses[i] = pb.InferenceResponse(output_tensors=[
                        pb.Tensor(name, np.ascontiguousarray(outputs[name], dtype=dtype))
                        for name, dtype in self.outputs])
            except InputError as exc:  # not expected of an unchecked runner; still the caller's error
                for i, _ in members:
                    responses[i] = pb.InferenceResponse(error=self._error(str(exc), invalid=True))
            except Exception as exc:  # the runner's or library's error goes back to the callers
                log.error("inference failed for %d request(s)", len(members), exc_info=exc)
                for i, _ in members:
                    responses[i] = pb.InferenceResponse(error=self._error(f"inference failed: {exc}"))
        return responses

    def _error(self, message: str, invalid: bool = False):
        """A `TritonError`: INVALID_ARG for the caller's inputs (HTTP 400, gRPC INVALID_ARGUMENT, as
        zoo serve answers them), else Triton's default, INTERNAL. A Python backend older than
        the error codes (before 23.xx) has only the latter."""
        code = getattr(self.pb.TritonError, "INVALID_ARG", None) if invalid else None
        return self.pb.TritonError(message) if code is None else self.pb.TritonError(message, code)

    def _input(self, request, name: str) -> np.ndarray:
        from .errors import InputError

        tensor = self.pb.get_input_tensor_by_name(request, name)
        if tensor is None:
            raise InputError(f"model {self.name}: request has no input {name!r}")
        return tensor.as_numpy()

    def _run(self, feeds: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """One runner call for all `feeds` (rows concatenated), split back per feed."""
        if len(feeds) == 1:
            return [self._numpy_runner(feeds[0], checked=False)]
        rows = [len(next(iter(feed.values()))) for feed in feeds]
        merged = {name: np.concatenate([feed[name] for feed in feeds]) for name in self.inputs}
        outputs = self._numpy_runner(merged, checked=False)
        bounds = np.cumsum(rows)[:-1]
        split = {name: np.split(value, bounds) for name, value in outputs.items()}
        return [{name: parts[k] for name, parts in split.items()} for k in range(len(feeds))]

    def finalize(self) -> None:
        self.runner = None


def config_departures(config: dict[str, Any], spec: Any) -> list[str]:
    """How Triton's model configuration (`config`, as the Python backend hands it over: JSON
    of `ModelConfig`) departs from what the artifact's `spec` takes and gives, one line
    each; [] when it agrees. Inputs and outputs: the same names, and for each the data type
    and dims (after the batch axis when `max_batch_size` > 0) and the reshape of a per-row
    scalar that `zoo.triton` writes. `max_batch_size`: from 1 to the spec's batch axis
    maximum where every tensor leads with the batch axis, else 0. The batch axis may be
    kept in the dims with `max_batch_size: 0` (Triton then runs each request whole)."""
    from .triton import batched, tensor_config

    found: list[str] = []
    try:
        max_batch = int(config.get("max_batch_size", 0))
    except (TypeError, ValueError):
        return [f"max_batch_size is {config.get('max_batch_size')!r}, not a number"]
    batch_axis = spec.axes.get("batch")
    if max_batch > 0:
        if not batched(spec):
            found.append(f"max_batch_size is {max_batch}; the spec's tensors do not all lead with the batch "
                         f"axis, so it must be 0")
        elif batch_axis is not None and max_batch > batch_axis.max:
            found.append(f"max_batch_size is {max_batch}; the artifact takes batches of {batch_axis.min} to "
                         f"{batch_axis.max}")
    elif max_batch < 0:
        found.append(f"max_batch_size is {max_batch}")
    drop_batch = max_batch > 0 and batched(spec)
    for kind, tensors in (("input", spec.inputs), ("output", spec.outputs)):
        entries = {e.get("name"): e for e in config.get(kind) or []}
        want = {t.name: t for t in tensors}
        missing, extra = [n for n in want if n not in entries], [n for n in entries if n not in want]
        if missing or extra:
            found.append(f"{kind}s are {sorted(entries)}; the artifact's are {[t.name for t in tensors]} "
                         f"(missing {missing}, unexpected {extra})")
        for name, t in want.items():
            if name not in entries:
                continue
            got, expected = entries[name], tensor_config(t, drop_batch)
            if got.get("data_type") != expected["data_type"]:
                found.append(f"{kind} {name!r} has data_type {got.get('data_type')}; the artifact's is "
                             f"{expected['data_type']} ({t.dtype})")
            dims = _ints(got.get("dims"))
            if dims != expected["dims"]:
                found.append(f"{kind} {name!r} has dims {dims if dims is not None else got.get('dims')}; the "
                             f"artifact's are {expected['dims']} (shape {list(t.shape)}"
                             f"{', after the batch axis' if drop_batch else ''})")
            reshape = _ints(got["reshape"].get("shape")) if isinstance(got.get("reshape"), dict) else None
            want_reshape = expected["reshape"]["shape"] if "reshape" in expected else None
            if reshape != want_reshape:  # zoo.triton writes `reshape: { shape: [ ] }` for a per-row scalar only
                found.append(f"{kind} {name!r} has reshape {reshape if reshape is not None else 'none'}; the "
                             f"artifact's is {want_reshape if want_reshape is not None else 'none'}")
    return found


def _ints(values: Any) -> list[int] | None:
    """A configuration's dims as ints (Triton's JSON may give int64 fields as strings); None
    where they are not numbers."""
    try:
        return [int(v) for v in values or []]
    except (TypeError, ValueError):
        return None


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

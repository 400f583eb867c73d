"""What the HTTP and gRPC front ends share: the served models and every operation on them.

Both transports decode their own wire format into a `protocol.InferRequest` and call
`Server.infer`; both list, load, unload and report on models through the methods here.
So one request gets the same checks, batching, queue limit, timeout, metrics,
statistics and error (type and message) whichever way it came; the front ends only map
the error to their status (`errors.STATUS`, `grpc.CODES`).

Every request counted in `zoo_inference_requests_total` ends as a success or a failure,
in the metrics and the statistics alike: also one the client abandons (a cancelled gRPC
call, reason "cancelled"; an HTTP client gone before its body arrived, "disconnected").
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import math
import re
import time
from typing import Any, Awaitable, Callable

import numpy as np

from . import datatypes as dt
from . import repository
from ..artifact import VERSION_DIR
from ..inputs import wire_shape
from .classify import classify
from .errors import (
    InputMismatchError,
    ModelControlDisabledError,
    ModelLoadError,
    ModelNotFoundError,
    ProtocolError,
    named,
    reason_for,
)
from .metrics import Metrics
from .model import READY, ServedModel
from .protocol import InferRequest, Region, Tensor, tensor_from_bytes
from . import shm
from .stats import ModelStats

log = logging.getLogger("zoo.serve")
OFFLOAD_BYTES = 1 << 16  # shared-memory copies larger than this run in a worker thread, off the event loop
JSON_PARSES = 2  # JSON request bodies over OFFLOAD_BYTES parsed at once, at most (`Server.json_parses`)
#: a requested model version as Triton reads it (std::stol): leading whitespace, a sign, decimal digits
VERSION_NUMBER = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")


class Disconnected(Exception):
    """The client went away before its request arrived whole: nobody is left to answer.
    A failure of reason "disconnected", not an error of the server."""


class Heap:
    """The serving process's cyclic garbage collector. What startup loads (modules, models,
    runners) lives as long as the process: frozen out of the collector's sight
    (`gc.freeze`), so full collections no longer walk it, and young collections ten times
    rarer (a request allocates many short-lived containers that reference counting frees
    anyway): 3% less server CPU per small request (docs/benchmarks.md). A model loaded or
    unloaded later settles it again (unfreeze, collect, freeze), so an unloaded model's
    reference cycles are freed; `release` gives the collector back as it was."""

    THRESHOLD = (7000, 10, 10)

    def __init__(self) -> None:
        self.previous: tuple[int, int, int] | None = None

    def hold(self) -> None:
        self.previous = self.previous or gc.get_threshold()
        self.settle()
        gc.set_threshold(*self.THRESHOLD)

    def settle(self) -> None:
        if self.previous is not None:
            gc.unfreeze()
            gc.collect()
            gc.freeze()

    def release(self) -> None:
        if self.previous is not None:
            gc.unfreeze()
            gc.set_threshold(*self.previous)
            self.previous = None


class Server:
    """The served models, their aliases, what was skipped and why, metrics, statistics
    and the registered shared-memory regions."""

    def __init__(self, settings) -> None:
        self.settings = settings
        self.models: dict[str, ServedModel] = {}
        self.aliases: dict[str, str] = {}
        self.skipped: list[repository.Skipped] = []
        self.metrics = Metrics()
        self.stats: dict[str, ModelStats] = {}
        self.regions = shm.Regions(enabled=settings.shared_memory)
        #: one lock per artifact name: a load or unload waits for another of the same name
        #: only, so that models load side by side (as Triton's model control does)
        self.control: collections.defaultdict[str, asyncio.Lock] = collections.defaultdict(asyncio.Lock)
        self.heap = Heap()
        #: large JSON bodies parsed at once, at most: a parse holds the GIL (two at a time lose no
        #: speed) and costs about 4.5x its body in Python objects (three clients each sending a
        #: 64 MiB JSON tensor took the server to 2.3 GB); binary bodies cost their size, not held back
        self.json_parses = asyncio.Semaphore(JSON_PARSES)
        #: called when shutdown begins (SIGTERM), before the HTTP side drains: the gRPC front
        #: end stops taking calls then too, so both transports drain side by side
        self.on_shutdown: list[Callable[[], None]] = []

    def begin_shutdown(self) -> None:
        for hook in self.on_shutdown:
            hook()

    # ------------------------------------------------------------ models

    def add(self, model: ServedModel, runners: list) -> None:
        stats = self.stats[model.name] = ModelStats(model.name, model.version)

        def on_batch(works, rows: int, m: ServedModel = model) -> None:
            self.metrics.observe_batch(m.name, m.version, rows)
            w = works[0]
            stats.execution(rows, (w.compute_input, w.compute, w.compute_output))

        model.on_batch = on_batch
        model.start(runners)
        self.models[model.name] = model
        self._alias()
        log.info("serving %s (%s, %s, %s; batching %s)", model.name, model.artifact.backend, model.artifact.precision,
                 model.artifact.device, model.policy.to_json())

    def _alias(self) -> None:
        """A bare model name (`resnet8.digits`) names its artifact when exactly one is loaded."""
        by_model: dict[str, list[str]] = {}
        for m in self.models.values():
            by_model.setdefault(m.spec.name, []).append(m.name)
        self.aliases = {model: names[0] for model, names in by_model.items() if len(names) == 1}

    def model(self, name: str, version: str | None = None) -> ServedModel:
        number = None if version is None else version_number(version)
        model = self.models.get(name) or self.models.get(self.aliases.get(name, ""))
        if model is None:
            several = sorted(m.name for m in self.models.values() if m.spec.name == name)
            if several:
                raise ModelNotFoundError(f"model {name} is served by several artifacts, name one: {several}")
            skipped = next((s for s in self.skipped if s.name == name), None)
            if skipped is not None:  # in the repository, but not served: say why, as the index does
                raise ModelNotFoundError(f"model {name} is in the repository but not served (UNAVAILABLE): "
                                         f"{skipped.reason}")
            raise ModelNotFoundError(f"unknown model {name[:200]!r}; loaded: {sorted(self.models) or 'none'}")
        if number is not None and number != int(model.version):
            raise ModelNotFoundError(f"model {model.name} has no version {version[:20]!r} (versions: {model.version})")
        return model

    def extensions(self) -> list[str]:
        """The protocol extensions this server offers, as `GET /v2` and gRPC ServerMetadata list them."""
        offered = ["binary_tensor_data", "classification", "model_repository", "model_configuration", "statistics"]
        return offered + (["system_shared_memory"] if self.settings.shared_memory else [])

    def ready(self) -> tuple[bool, str]:
        if not self.models and not self.settings.model_control:  # nothing to serve, and nothing can be loaded
            return False, (f"no artifact in the model repository can run here ({len(self.skipped)} skipped: "
                           "POST /v2/repository/index says why)")
        for m in self.models.values():
            if not m.ready:
                return False, f"model {m.name} is not ready: {m.reason}"
        return True, ""

    async def index(self, ready_only: bool = False) -> list[dict]:
        """Every artifact in the repository with its state and reason (Triton's index)."""
        skipped = {s.name: s.reason for s in self.skipped}
        rows = []
        for name in await asyncio.to_thread(repository.artifact_names, self.settings.repository):
            model = self.models.get(name)
            if model is not None:
                rows.append({"name": name, "version": model.version, "state": model.state, "reason": model.reason})
            else:  # an unloaded model keeps its version in the row, as in Triton's index
                reason = skipped.get(name, "not loaded")
                rows.append({"name": name, **({"version": VERSION_DIR} if reason == "unloaded" else {}),
                             "state": "UNAVAILABLE", "reason": reason})
        listed = {r["name"] for r in rows}  # a loaded model whose directory was removed since is still listed
        rows += [{"name": m.name, "version": m.version, "state": m.state, "reason": m.reason}
                 for m in self.models.values() if m.name not in listed]
        if ready_only:
            rows = [r for r in rows if r["state"] == "READY"]
        return sorted(rows, key=lambda r: r["name"])

    def check_control(self) -> None:
        """Loading and unloading over the API must be on (`--model-control`)."""
        if not self.settings.model_control:
            raise ModelControlDisabledError("loading and unloading models over the API is off; "
                                            "start the server with --model-control to allow it")

    async def _refuse_model_name(self, name: str) -> None:
        """Refuse a bare model name (`resnet8.digits`) that names served artifacts' model and no
        artifact: load and unload take artifact names (as Triton's model control takes the
        repository's directory names), and an unload of one answered OK would leave the model
        it names serving. NOT_FOUND, in the words load refuses any other name with, and which
        artifacts to name instead."""
        served = sorted(m.name for m in self.models.values() if m.spec.name == name)
        if name in self.models or not served:
            return
        if name not in await asyncio.to_thread(repository.artifact_names, self.settings.repository):
            raise ModelNotFoundError(f"no artifact named {name!r} in the model repository; model {name} is served "
                                     f"by {', '.join(served)}: load or unload an artifact by its name")

    async def load(self, name: str) -> None:
        await self._refuse_model_name(name)
        path = repository.find_artifact(self.settings.repository, name)
        async with self.control[name]:
            served = self.models.get(name)
            if served is not None and served.state == READY and served.files is not None and (
                    await asyncio.to_thread(repository.fingerprint, path)) == served.files:
                # as Triton answers it: a load of a model served and unchanged on disk does
                # nothing (its statistics go on); an edited, touched or re-exported one reloads
                log.info("load of %s: served and unchanged, not reloaded", name)
                return
            try:
                model, runners = await asyncio.to_thread(repository.open_model, path, self.settings.options)
            except Exception as exc:
                raise self._load_failed(name, exc) from None
            old = self.models.get(name)
            # The new model takes the name before the old one stops, as Triton swaps a
            # reloaded version in once it is ready: no request finds the name unserved. The
            # old one finishes what it had queued; its statistics end with it.
            self.add(model, runners)
            self.skipped = [s for s in self.skipped if s.name != name]
            if old is not None:
                await old.stop(self.settings.shutdown_timeout)
                del old
            self.heap.settle()

    def _load_failed(self, name: str, exc: Exception) -> ModelLoadError:
        """A load that failed, as Triton answers it (400, the reason): the artifact's fault
        (corrupted, unsigned, a backend that cannot run here), not the server's. A model that
        is served keeps serving; one that is not is UNAVAILABLE in the index with the reason."""
        skipped = repository.failure(name, exc)
        log.warning("load of %s failed: %s", name, skipped.reason)
        if name not in self.models:
            self.skipped = [*(s for s in self.skipped if s.name != name), skipped]
        return ModelLoadError(f"failed to load {name}: {skipped.reason}" + ("; the loaded one keeps serving"
                                                                           if name in self.models else ""))

    async def unload(self, name: str) -> None:
        await self._refuse_model_name(name)
        async with self.control[name]:
            model = self.models.pop(name, None)
            # as Triton answers a name it does not serve, even one it never heard of (model_repository_manager.cc:
            # nothing to unload is done, OK); Model Analyzer unloads to clean up
            if model is None:
                return
            self._alias()
            # requests that arrive while the queued ones finish are told why, as the index says
            self._mark_unavailable(name, "unloading")
            await model.stop(self.settings.shutdown_timeout)
            del model
            self.heap.settle()
            self._mark_unavailable(name, "unloaded")

    def _mark_unavailable(self, name: str, reason: str) -> None:
        self.skipped = [*(s for s in self.skipped if s.name != name), repository.Skipped(name, reason)]

    def statistics(self, name: str = "", version: str = "") -> list[dict]:
        """Triton's `model_stats`: of one model (and version), or of every loaded one."""
        if not name:
            return [self.stats[m].to_json() for m in sorted(self.models) if m in self.stats]
        model = self.model(name, version or None)
        return [self.stats[model.name].to_json()]

    async def stop(self) -> None:
        await asyncio.gather(*(m.stop(self.settings.shutdown_timeout) for m in self.models.values()))
        self.regions.close()

    # ------------------------------------------------------------ inference

    async def infer(self, name: str, version: str | None, decode: Callable[[ServedModel], Awaitable[InferRequest]],
                    encode: Callable[[ServedModel, InferRequest, list[Tensor]], Any] | None = None) -> \
            tuple[ServedModel, InferRequest, Any]:
        """Run one request: `decode(model)` gives it from the wire; the model, the request
        and its outputs (classified and written to shared memory as it asked) come back, or
        what `encode(model, request, outputs)` makes of them (the answer's body: an output
        it cannot carry, NaN in JSON, fails the request). Metrics and statistics count it,
        answered or failed."""
        start = time.perf_counter()
        model = self.model(name, version)
        labels = (model.name, model.version)
        stats = self.stats[model.name]
        self.metrics.child(self.metrics.requests, *labels).inc()
        try:
            request = await decode(model)
            if not model.ready and self.models.get(model.name) is not model:
                # reloaded (or unloaded) while the body arrived: the name's model now answers, as
                # Triton looks a model up once the request is whole (or the name is not served)
                model = self.model(name, version)
                stats = self.stats[model.name]
            held = self.regions.take(_parts(request))  # every part checked against its region before the model runs
            try:
                await self._read_regions(model, request, held)
                outputs, work = await model.infer(request, self.settings.request_timeout)
                outputs = [await self._deliver(model, t, (request.outputs or {}).get(t.name), held) for t in outputs]
                if encode is not None:
                    outputs = encode(model, request, outputs)
            finally:
                self.regions.release(held)
        except (Exception, asyncio.CancelledError) as exc:  # cancelled: the client cancelled the call, or shutdown
            reason = "cancelled" if isinstance(exc, asyncio.CancelledError) else \
                "disconnected" if isinstance(exc, Disconnected) else reason_for(exc)
            self.metrics.child(self.metrics.failures, *labels, reason).inc()
            stats.request(False, time.perf_counter() - start)
            raise
        total, queue = time.perf_counter() - start, work.started - work.enqueued
        self.metrics.observe_request(*labels, total, queue, work.compute)
        stats.request(True, total, work.rows, queue, (work.compute_input, work.compute, work.compute_output))
        return model, request, outputs

    async def _read_regions(self, model: ServedModel, request: InferRequest, held: dict[str, shm.Region]) -> None:
        for t in request.inputs:
            if t.region is None:
                continue
            r = t.region
            size = dt.element_size(t.datatype)
            expected = None if size is None else size * math.prod(t.shape)
            if expected is not None and r.byte_size != expected:  # before reading what may be a large region
                raise InputMismatchError(f"input {t.name!r} of shape {list(t.shape)} ({t.datatype}) is {expected} "
                                         f"bytes; its shared memory part (shared_memory_byte_size) is {r.byte_size}",
                                         request.id)
            self._check_region_size(model, t)
            region = held[r.name]
            raw = (await asyncio.to_thread(self.regions.read, region, r.offset, r.byte_size)
                   if r.byte_size > OFFLOAD_BYTES else self.regions.read(region, r.offset, r.byte_size))
            try:
                t.data = tensor_from_bytes(t.name, t.datatype, t.shape, raw).data
            except InputMismatchError as exc:  # BYTES items that do not fill the part: as Triton's core, named
                raise named(exc, request.id) from None

    def _check_region_size(self, model: ServedModel, t: Tensor) -> None:
        """Refuse a shared-memory input larger than the model can take before it is read
        (a sparse region costs the client nothing; a copy of it, the server its memory):
        at most every axis of the spec's input at its largest; a BYTES input or one the
        spec does not name (domain-native items), at most what a request body may be."""
        spec = next((s for s in model.spec.inputs if s.name == t.name), None)
        size = dt.element_size(t.datatype)
        if spec is None or size is None:
            if t.region.byte_size > self.settings.max_request_bytes:
                raise ProtocolError(f"input {t.name!r}: its shared memory part (shared_memory_byte_size "
                                    f"{t.region.byte_size}) exceeds the request size limit, "
                                    f"{self.settings.max_request_bytes} bytes")
            return
        batch_max = model.policy.max_batch_size if model.rows_batched else None  # as the model's shape check
        largest = [d if isinstance(d, int) else batch_max if d == "batch" and batch_max is not None
                   else model.spec.axes[d].max for d in spec.shape]
        if t.region.byte_size > size * math.prod(largest):
            raise ProtocolError(f"input {t.name!r} has shape {list(t.shape)}; model {model.name} takes "
                                f"{wire_shape(spec.shape)}, at most {largest}")

    async def _deliver(self, model: ServedModel, t: Tensor, wanted, held: dict[str, shm.Region]) -> Tensor:
        """An output as the request asked for it: the top classes, and/or in shared memory (a region the request
        holds, found as it was when the request started)."""
        if wanted is None:
            return t
        if wanted.classification is not None:
            spec = next((o for o in model.spec.outputs if o.name == t.name), None)
            items = classify(t.data, wanted.classification, model.batched, getattr(spec, "labels", None),
                             name=t.name, datatype=t.datatype)
            t = Tensor(t.name, "BYTES", items.shape, items)
        if wanted.region is not None:
            raw = dt.to_bytes(t.datatype, np.ascontiguousarray(t.data))
            if len(raw) > wanted.region.byte_size:
                raise ProtocolError(f"output {t.name!r} needs {len(raw)} bytes; its shared memory part "
                                    f"(shared_memory_byte_size) has {wanted.region.byte_size}")
            region = held[wanted.region.name]
            if len(raw) > OFFLOAD_BYTES:
                await asyncio.to_thread(self.regions.write, region, wanted.region.offset, raw)
            else:
                self.regions.write(region, wanted.region.offset, raw)
            t = Tensor(t.name, t.datatype, t.shape, None, Region(wanted.region.name, wanted.region.offset, len(raw)))
        return t


def version_number(version: str) -> int:
    """A requested model version, read as Triton reads it (std::stol, refusing a negative
    one): `01` and ` 1` are version 1. Unlike std::stol, nothing may follow the digits
    (Triton reads `1abc` and `1.5` as 1). Anything else is the request's fault (400 /
    INVALID_ARGUMENT, as Triton answers), not an unknown version."""
    found = VERSION_NUMBER.fullmatch(version) if len(version) <= 100 else None  # int() refuses thousands of digits
    number = int(found[1]) if found else -1
    if not 0 <= number < 1 << 63:  # std::stol's range
        raise ProtocolError(f"{version[:20]!r} is not a model version (a non-negative integer)")
    return number


def _parts(request: InferRequest) -> list[tuple[str, int, int]]:
    """The shared-memory parts a request names, inputs and outputs: (region, offset, byte size)."""
    wanted = [w.region for w in (request.outputs or {}).values()]
    return [(r.name, r.offset, r.byte_size) for r in [t.region for t in request.inputs] + wanted if r is not None]

"""One served artifact: request validation against its signature, the domain-native
BYTES path (preprocess -> batch -> postprocess), metadata, and recovery after a backend
failure.

Wire name: the artifact's directory name (`resnet8.digits.onnxruntime.fp32`), version
"1" (the artifact's Triton version directory).

Rows: a request's rows are the size of the batch axis of its inputs, and its answer has
as many. Inputs without the batch axis are side inputs of the request (they apply to all
its rows); such a model is still batched along the other inputs, only with requests
whose side inputs are identical. A model whose outputs lack the batch axis is run one
request at a time, and its outputs are returned whole.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from typing import Any, Callable, Sequence

import numpy as np

from ..artifact import VERSION_DIR, Artifact
from ..errors import InputError, ZooError
from ..arguments import check_text_items
from ..inputs import (check_arrays, check_names, datatype_error, encoded_results, preprocessed, unchecked,
                      wire_shape)
from ..spec import ModelSpec
from ..triton import PYTHON_RUNTIME, batched, rows_batched, tensor_config
from . import datatypes as dt
from .batcher import Batcher, BatchPolicy, Work
from .errors import InputMismatchError, ModelNotReadyError, ProtocolError, RequestTimeoutError, named
from .protocol import InferRequest, Tensor, raw_request

log = logging.getLogger("zoo.serve")
#: the backend tritonserver fills in for a config.pbtxt that names only a platform
TRITON_BACKENDS = {"onnxruntime_onnx": "onnxruntime", "tensorrt_plan": "tensorrt", "pytorch_libtorch": "pytorch"}
#: the model file tritonserver fills in for a config.pbtxt that names none, by backend
TRITON_FILES = {"python": "model.py", "onnxruntime": "model.onnx", "tensorrt": "model.plan",
                "openvino": "model.xml", "pytorch": "model.pt"}
RESULT = "result"  # the BYTES output of the domain path: one JSON document per item
READY, RECOVERING, UNAVAILABLE = "READY", "RECOVERING", "UNAVAILABLE"


class ServedModel:
    def __init__(self, artifact: Artifact, spec: ModelSpec, policy: BatchPolicy,
                 load_runners: Callable[[], list[Callable]]) -> None:
        self.artifact, self.spec, self.policy = artifact, spec, policy
        self.name, self.version = artifact.name, VERSION_DIR
        self.load_runners = load_runners
        self.files: tuple | None = None  # `repository.fingerprint` of the artifact as loaded
        self.batched = batched(spec)  # Triton's notion: every tensor leads with the batch axis
        self.side_inputs = tuple(t.name for t in spec.inputs if t.shape[:1] != ("batch",))
        self.rows_batched = rows_batched(spec)  # the server's notion: side inputs allowed
        #: inputs the model's Triton configuration reshapes (a per-row scalar: dims [1], reshape []),
        #: so that Triton's clients send them as [batch, 1]
        self.row_scalars = tuple(t.name for t in spec.inputs if "reshape" in tensor_config(t, self.batched))
        self.state, self.reason = READY, ""
        self.batcher: Batcher | None = None
        self.on_batch: Callable[[Sequence[Work], int], None] = lambda works, rows: None
        input_axes = {a for t in spec.inputs for d, a in t.dynamic_axes.items() if d > 0}
        self._ragged_dims = {t.name: {d: a for d, a in t.dynamic_axes.items() if d > 0 and a in input_axes}
                             for t in spec.outputs}
        self._recovery: asyncio.Task | None = None

    # ------------------------------------------------------------ life cycle

    def start(self, runners: list[Callable]) -> None:
        """Begin taking requests (inside the running event loop). Requests are checked
        here, so the batcher calls the backend's runners without `Artifact.load`'s check."""
        self.batcher = Batcher(self.name, [unchecked(r) for r in runners], self.policy,
                               [t.name for t in self.spec.inputs], self._ragged_dims, known_good=self._sample, side_inputs=self.side_inputs,
                               on_batch=lambda works, rows: self.on_batch(works, rows), on_failure=self._failed)

    def _sample(self) -> dict[str, np.ndarray]:
        """The model's own sample at its smallest batch: the health probe until a request succeeds."""
        return self._typed(self.spec.sample(self.spec.axes["batch"].min, np.random.default_rng(0)))

    def _typed(self, inputs) -> dict[str, np.ndarray]:
        """A plugin's arrays (sample, preprocess) as the arrays a request of the wire types gives."""
        return {t.name: np.asarray(inputs[t.name], dtype=dt.numpy_of(dt.v2_name(t.dtype))) for t in self.spec.inputs}

    async def stop(self, timeout: float) -> None:
        self.state, self.reason = UNAVAILABLE, "unloading"
        if self._recovery is not None:
            self._recovery.cancel()
        if self.batcher is not None:
            await self.batcher.stop(timeout)

    @property
    def ready(self) -> bool:
        return self.state == READY

    def _failed(self, exc: BaseException) -> None:
        if self.state == READY:
            self.state, self.reason = RECOVERING, "reloading after a backend failure"
            self._recovery = asyncio.get_running_loop().create_task(self._recover())

    async def _recover(self, attempts: int = 3) -> None:
        for attempt in range(attempts):
            try:
                runners = await asyncio.to_thread(self.load_runners)
            except Exception as exc:
                log.error("model %s: reload %d of %d failed: %s", self.name, attempt + 1, attempts, exc)
                await asyncio.sleep(2 ** attempt)
                continue
            self.batcher.swap([unchecked(r) for r in runners])
            self.state, self.reason = READY, ""
            log.warning("model %s recovered after a backend failure", self.name)
            return
        self.state, self.reason = UNAVAILABLE, "it failed and could not be reloaded (see the server log)"

    # ------------------------------------------------------------ inference

    async def infer(self, request: InferRequest, timeout: float) -> tuple[list[Tensor], Work]:
        if not self.ready:
            raise ModelNotReadyError(f"model {self.name} is not ready: {self.reason}")
        if request.timeout is not None:
            timeout = min(timeout, request.timeout)
        raw = self._raw_input(request)
        if raw is not None:
            inputs = await self._preprocess(raw)
        else:
            inputs = self._tensor_inputs(request)
        wanted = self._wanted_outputs(request, raw is not None)
        sizes = self._checked(inputs, request.id, tensors=raw is None)
        rows = sizes.pop("batch", 1) if self.rows_batched else 1
        self._check_output_regions(request, wanted, {**sizes, "batch": rows} if self.rows_batched else sizes)
        loop = self.batcher.loop
        work = Work(inputs, rows, sizes, loop.create_future(), side=self._side_digest(inputs))
        # a timer on the request's own future, not asyncio.wait_for: wait_for costs a second
        # future, a done callback and one more event-loop pass per request (and a getpid
        # syscall per get_running_loop on Python 3.11)
        future = self.batcher.submit(work)
        expiry = loop.call_later(timeout, self._expire, future, timeout)
        try:
            outputs = await future
        except asyncio.CancelledError:  # the client went away: the batch it held back may go now
            self.batcher.abandoned()
            raise
        finally:
            expiry.cancel()
        if raw is not None and self.spec.postprocess is not None:
            try:
                results = await asyncio.to_thread(self.spec.postprocess, outputs)
            except Exception as exc:
                log.error("model %s: postprocess failed: %s", self.name, exc, exc_info=exc)
                raise ZooError(f"model {self.name} could not postprocess its outputs") from None
            items = dt.bytes_array(encoded_results(self.spec, len(raw), results))
            return [Tensor(RESULT, "BYTES", (len(items),), items)], work
        return [self._output(name, outputs[name]) for name in wanted], work

    def _expire(self, future: asyncio.Future, timeout: float) -> None:
        if not future.done():  # the batcher skips it from now on, as an abandoned request
            future.set_exception(RequestTimeoutError(f"request timeout expired: model {self.name} did not answer "
                                                     f"within {timeout:g} s"))
            self.batcher.abandoned()

    def raw_request(self, body: bytes) -> InferRequest:
        """A raw binary request's body as the request for this model's only input (Triton's rules;
        its core refuses one it cannot deduce, naming the request, which has no id)."""
        if len(self.spec.inputs) != 1:
            raise InputMismatchError(f"a raw binary request (Inference-Header-Content-Length: 0) is for models with "
                                     f"one input; model {self.name} takes {[t.name for t in self.spec.inputs]}")
        t = self.spec.inputs[0]
        dims = [1 if d == "batch" and self.rows_batched else d if isinstance(d, int) else -1 for d in t.shape]
        try:
            return raw_request(body, t.name, dt.v2_name(t.dtype), dims)
        except ProtocolError as exc:
            raise InputMismatchError(str(exc)) from None

    def _raw_input(self, request: InferRequest) -> list[bytes] | None:
        """The items of a domain-native request (one BYTES input named for the raw kind), else None."""
        kind = self.spec.raw_kind
        if kind is None:
            self._refuse_items_without_plugin(request)
            return None
        if len(request.inputs) != 1 or request.inputs[0].name != kind:
            return None
        if self._a_tensor_of_its_own(request):
            return None
        datatype = request.inputs[0].datatype
        if datatype != "BYTES":  # its items as another datatype: not "missing [the tensors]"
            raise InputError(f"input {kind!r} has datatype {datatype}; model {self.name} takes one BYTES input "
                             f"{kind!r} of {kind} items, or its tensors {[t.name for t in self.spec.inputs]}")
        t = request.inputs[0]
        limit = self.max_items
        if len(t.shape) != 1 or not 1 <= t.shape[0] <= limit:
            raise InputError(f"input {kind!r}: give a shape [n] list of 1 to {limit} {kind} items, got shape "
                             f"{list(t.shape)}")
        items = [bytes(x) for x in t.data]
        return items if self.spec.raw_binary else check_text_items(kind, items)

    def _a_tensor_of_its_own(self, request: InferRequest) -> bool:
        """Whether the request's one input, named as the model's items are, is the model's own
        tensor of that name (a BYTES tensor, or one of another type sent as that type): the
        tensor path takes it. BYTES sent for a numeric tensor of the items' name are items."""
        given = request.inputs[0]
        own = next((t for t in self.spec.inputs if t.name == given.name), None)
        return own is not None and (own.dtype == "string" or given.datatype != "BYTES")

    def _refuse_items_without_plugin(self, request: InferRequest) -> None:
        """Items of the kind the artifact's model takes through its plugin (its manifest says
        which), sent to a server without that plugin: say what to install, not which tensors
        are missing."""
        model = self.artifact.manifest["model"]
        recorded = model.get("raw_input")
        if not recorded or len(request.inputs) != 1 or request.inputs[0].name != recorded:
            return
        if self._a_tensor_of_its_own(request):
            return
        raise InputError(f"{self._without_plugin()}, so send the tensors {[t.name for t in self.spec.inputs]} "
                         f"instead (GET /v2/models/{self.name})")

    def _without_plugin(self) -> str | None:
        """Why this server takes no domain-native items for a model whose artifact records
        that it takes some (its plugin, which preprocesses them, is not loaded here); None
        where it takes them or the model never did."""
        model = self.artifact.manifest["model"]
        recorded = model.get("raw_input")
        if not recorded or self.spec.raw_kind:
            return None
        from ..standalone import needs_plugin

        return f"{needs_plugin(model, f'send it {recorded} items')}; this server has not loaded it"

    @property
    def max_items(self) -> int:
        """The most domain-native items one request may carry (metadata's `max_items`)."""
        return self.policy.max_batch_size if self.rows_batched else self.spec.axes["batch"].max

    async def _preprocess(self, items: list[bytes]) -> dict[str, np.ndarray]:
        try:
            inputs = await asyncio.to_thread(self.spec.preprocess, items)
        except ZooError:
            raise
        except Exception as exc:  # a plugin bug, not the client's fault: details go to the log
            log.error("model %s: preprocess failed: %s", self.name, exc, exc_info=exc)
            raise ZooError(f"model {self.name} could not preprocess the request") from None
        return self._typed(preprocessed(self.spec, len(items), inputs))

    def _tensor_inputs(self, request: InferRequest) -> dict[str, np.ndarray]:
        given = {t.name: t for t in request.inputs}
        kind = self.spec.raw_kind
        try:
            check_names(given, self.spec, self.name, f" (or one BYTES input {kind!r} of {kind} items)" if kind else "")
        except InputError as exc:  # Triton's core counts the inputs (naming the request), then its names (not)
            if len(given) != len(self.spec.inputs):
                raise InputMismatchError(str(exc), request.id) from None
            raise
        for t in self.spec.inputs:  # the wire's datatype exactly, as Triton: a client casts, not the server
            if given[t.name].datatype != dt.v2_name(t.dtype):
                error = datatype_error(t.name, given[t.name].datatype, dt.v2_name(t.dtype), self.name)
                raise InputMismatchError(str(error), request.id)
        arrays = {t.name: given[t.name].data for t in self.spec.inputs}
        for name in self.row_scalars:  # [batch, 1] as Triton takes it, or [batch] as the spec says
            if arrays[name].ndim == 2 and arrays[name].shape[1] == 1:
                arrays[name] = arrays[name].reshape(-1)
        return arrays

    def _checked(self, inputs: dict[str, np.ndarray], request_id: str | None, tensors: bool) -> dict[str, int]:
        """The size of every dynamic axis (`check_arrays`). Where the inputs are refused, a refusal
        Triton's core makes before a model runs comes first, naming the request (for a request of
        tensors: preprocessed domain-native items are the plugin's, which Triton does not take)."""
        try:
            return check_arrays(inputs, self.spec, self.name, self.policy.max_batch_size if self.rows_batched else None)
        except InputError:
            mismatch = self._config_mismatch(inputs) if tensors else None
            if mismatch is None:
                raise
            raise named(mismatch, request_id) from None

    def _config_mismatch(self, arrays: dict[str, np.ndarray]) -> InputMismatchError | None:
        """What Triton's core refuses in these shapes, in `check_arrays`' words, or None: a rank or a
        fixed size other than config.pbtxt's dims and, for a model with Triton's batch axis
        (max_batch_size > 0), a batch size outside 1 to max_batch_size or one the inputs disagree
        on. The ranges of dynamic axes and of values are the model's own checks (Triton's Python
        backend makes them, and its core lets dims -1 through)."""
        batch = None
        for t in self.spec.inputs:
            shape, wants = list(arrays[t.name].shape), wire_shape(t.shape)
            if len(shape) != len(t.shape):
                return InputMismatchError(f"input {t.name!r} has shape {shape}; model {self.name} takes {wants}")
            for d, (got, dim) in enumerate(zip(shape, t.shape)):
                if isinstance(dim, int) and got != dim:
                    return InputMismatchError(f"input {t.name!r} has shape {shape}; model {self.name} takes {wants} "
                                              f"(dimension {d} must be {dim})")
            if not self.batched:
                continue
            if not 1 <= shape[0] <= self.policy.max_batch_size:
                return InputMismatchError(f"input {t.name!r}: axis 'batch' (dimension 0) is {shape[0]}; model "
                                          f"{self.name} takes {self.spec.axes['batch'].min} to "
                                          f"{self.policy.max_batch_size}")
            if batch is not None and shape[0] != batch:
                return InputMismatchError(f"inputs disagree on axis 'batch': {batch} and {shape[0]} "
                                          f"(input {t.name!r})")
            batch = shape[0]
        return None

    def _side_digest(self, inputs: dict[str, np.ndarray]) -> bytes:
        """What decides which requests may share a batch: their side inputs, byte for byte."""
        if not self.side_inputs:
            return b""
        digest = hashlib.blake2b(digest_size=16)
        for name in self.side_inputs:
            array = inputs[name]
            digest.update(repr((array.dtype.str, array.shape)).encode())
            digest.update(array.tobytes() if array.dtype != object else repr(array.tolist()).encode())
        return digest.digest()

    def _wanted_outputs(self, request: InferRequest, raw: bool) -> list[str]:
        # a model with preprocessing but no postprocessing (a language model) answers tensors
        names = [RESULT] if raw and self.spec.postprocess else [t.name for t in self.spec.outputs]
        if not request.outputs:  # absent or [] (as Triton): every output
            return names
        unknown = [n for n in request.outputs if n not in names]
        if unknown:
            raise ProtocolError(f"model {self.name} has no output {unknown[0]!r}; its outputs: {names}")
        return list(request.outputs)

    def _check_output_regions(self, request: InferRequest, wanted: list[str], axes: dict[str, int]) -> None:
        """Refuse an output whose shared-memory part cannot hold it before the model runs, where
        its size follows from the inputs' axes (Triton runs the model, then fails the request):
        no execution is spent on a request that cannot be answered. `_deliver` checks the rest."""
        for name in wanted:
            asked = (request.outputs or {}).get(name)
            spec = next((t for t in self.spec.outputs if t.name == name), None)
            if asked is None or asked.region is None or asked.classification is not None or spec is None:
                continue
            size = dt.element_size(dt.v2_name(spec.dtype))
            dims = [d if isinstance(d, int) else axes.get(d) for d in spec.shape]
            if size is None or None in dims:
                continue
            needed = size * math.prod(dims)
            if needed > asked.region.byte_size:
                raise ProtocolError(f"output {name!r} needs {needed} bytes; its shared memory part "
                                    f"(shared_memory_byte_size) has {asked.region.byte_size}")

    def _output(self, name: str, array: np.ndarray) -> Tensor:
        datatype = dt.v2_name(next(t.dtype for t in self.spec.outputs if t.name == name))
        array = np.asarray(array, dtype=dt.numpy_of(datatype))
        return Tensor(name, datatype, array.shape, array)

    # ------------------------------------------------------------ metadata

    def metadata(self) -> dict[str, Any]:
        """Open Inference Protocol model metadata, plus a `zoo` block: provenance, parity,
        batching, and the domain-native interface where the model has one."""
        m = self.artifact.manifest
        raw = None
        if self.spec.raw_kind:
            outputs = [{"name": RESULT, "datatype": "BYTES", "shape": [-1], "content": "one JSON document per item"}]
            raw = {"inputs": [{"name": self.spec.raw_kind, "datatype": "BYTES", "shape": [-1]}],
                   "outputs": outputs if self.spec.postprocess else "the tensor outputs", "kind": self.spec.raw_kind,
                   "binary": self.spec.raw_binary, "max_items": self.max_items}
        return {
            "name": self.name, "versions": [self.version], "platform": self.platform,
            "inputs": [{"name": t.name, "datatype": dt.v2_name(t.dtype), "shape": wire_shape(t.shape)}
                       for t in self.spec.inputs],
            "outputs": [{"name": t.name, "datatype": dt.v2_name(t.dtype), "shape": wire_shape(t.shape)}
                        for t in self.spec.outputs],
            "zoo": {"model": self.spec.name, "config": dict(self.spec.config), "domain": self.spec.domain,
                    "task": self.spec.task, "backend": self.artifact.backend, "precision": self.artifact.precision,
                    "device": self.artifact.device,
                    "axes": {k: [r.min, r.opt, r.max] for k, r in self.spec.axes.items()},
                    "parity": m.get("parity"), "domain_check": m.get("domain"), "metric": m.get("metric"),
                    "batching": self.policy.to_json(), "domain_native": raw,
                    **({"domain_native_unavailable": unavailable} if (unavailable := self._without_plugin()) else {}),
                    "state": self.state,
                    "value_ranges": {t.name: list(t.value_range) for t in self.spec.inputs if t.value_range}},
        }

    @property
    def runtime(self) -> dict[str, str]:
        """The Triton platform or backend the artifact's `config.pbtxt` names, as its
        manifest records it (`backend: "python"` for the Python-backend form)."""
        recorded = {k: v for k, v in (self.artifact.manifest.get("triton") or {}).items() if k != "form"}
        if recorded:
            return recorded
        from ..registry import get_backend  # a manifest from before the form was recorded

        return dict(get_backend(self.artifact.backend).triton) or dict(PYTHON_RUNTIME)

    @property
    def platform(self) -> str:
        return self.runtime.get("platform") or self.runtime.get("backend", "")

    def config(self) -> dict[str, Any]:
        """Triton's model configuration as JSON (`GET .../config`, gRPC ModelConfig), for Triton
        tooling: the artifact's config.pbtxt as this server runs it (batch size, instances,
        batching), with the defaults tritonserver fills in (its AutoCompleteBackendFields and
        NormalizeModelConfig): the backend of a platform, the model file, `version_policy`
        (one version, the latest), each instance group's name, and a dynamic batcher's preferred
        batch size (max_batch_size where none is set: the size zoo's batcher then sends at once).
        Not Triton's `optimization` (pinned memory): zoo serve has no such feature."""
        p = self.policy

        def tensors(specs):
            return [tensor_config(t, self.batched) for t in specs]

        runtime = dict(self.runtime)
        backend = runtime.setdefault("backend", TRITON_BACKENDS.get(runtime.get("platform", ""), ""))
        model_file = self.artifact.manifest.get("model_file")
        if backend != "python" and isinstance(model_file, str) and model_file:
            filename = model_file.rsplit("/", 1)[-1]  # as config.pbtxt names it
        else:
            filename = TRITON_FILES.get(backend, "")
        kind = "KIND_GPU" if self.artifact.device.startswith("cuda") else "KIND_CPU"
        config: dict[str, Any] = {"name": self.name, **{k: v for k, v in runtime.items() if v},
                                  "version_policy": {"latest": {"num_versions": 1}},
                                  "max_batch_size": p.max_batch_size if self.batched else 0,
                                  "input": tensors(self.spec.inputs), "output": tensors(self.spec.outputs),
                                  "instance_group": [{"name": f"{self.name}_0", "count": p.instances, "kind": kind}]}
        if filename:
            config["default_model_filename"] = filename
        if self.batched and p.batching:
            config["dynamic_batching"] = {"preferred_batch_size": list(p.preferred_batch_sizes) or [p.max_batch_size],
                                          "max_queue_delay_microseconds": int(p.max_queue_delay * 1e6)}
        parameters = (self.artifact.manifest.get("triton") or {}).get("parameters")
        if parameters:  # config.pbtxt's, which the backend was loaded under (`zoo export --triton-parameter`)
            config["parameters"] = {key: {"string_value": value} for key, value in parameters.items()}
        return config


def config_json(config: dict[str, Any]) -> dict[str, Any]:
    """`ServedModel.config()` as tritonserver's HTTP front end writes a configuration: every field
    of the ModelConfig message, at its default where unset (a client reads `input[0]["format"]`
    or `optional` without a check), 64-bit integers as JSON numbers."""
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2

    message = json_format.ParseDict(config, model_config_pb2.ModelConfig())
    try:
        doc = json_format.MessageToDict(message, preserving_proto_field_name=True,
                                        always_print_fields_with_no_presence=True)
    except TypeError:  # protobuf before 5.26 names the option so
        doc = json_format.MessageToDict(message, preserving_proto_field_name=True, including_default_value_fields=True)
    return _as_numbers(message.DESCRIPTOR, doc)


def _as_numbers(descriptor: Any, doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` (a message as protobuf's JSON) with its 64-bit integers as numbers, not strings."""
    from google.protobuf.descriptor import FieldDescriptor as F

    wide = (F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_SINT64, F.TYPE_FIXED64, F.TYPE_SFIXED64)
    for field in descriptor.fields:
        value = doc.get(field.name)
        if value is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            entry = field.message_type.fields_by_name["value"]
            if entry.message_type is not None:
                doc[field.name] = {k: _as_numbers(entry.message_type, v) for k, v in value.items()}
            elif entry.type in wide:
                doc[field.name] = {k: int(v) for k, v in value.items()}
        elif field.message_type is not None:
            doc[field.name] = ([_as_numbers(field.message_type, v) for v in value] if isinstance(value, list)
                               else _as_numbers(field.message_type, value))
        elif field.type in wide:
            doc[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
    return doc

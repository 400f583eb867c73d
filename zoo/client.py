"""A small client for `zoo serve` (and any Open Inference Protocol server, e.g. Triton).

    >>> from zoo.client import Client
    >>> c = Client("http://127.0.0.1:8000")
    >>> c.infer("resnet8.digits", {"image": np.zeros((2, 1, 8, 8), np.float32)})["logits"].shape
    (2, 10)
    >>> c.predict("resnet8.digits", [open("seven.png", "rb").read()])   # domain-native inputs
    [{"label": 7, "score": 0.98, ...}]

Tensors travel as binary data by default (the binary tensor data extension), which is
exact and compact; `binary=False` sends JSON. Errors come back as `ZooError`s carrying
the server's message (`InputError` for a 400).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence
from urllib.parse import quote

import httpx
import numpy as np

from .arguments import domain_items
from .arrays import as_numpy
from .errors import InputError, NoInputsError, UsageError, ZooError
from .inputs import check_type
from .serve import datatypes as dt
from .serve.protocol import HEADER_LENGTH, decode_response, encode_request

#: v2 datatype -> zoo dtype, for the datatypes a zoo runner casts to (`zoo.inputs.check_type`)
_ZOO_DTYPES = {v2: name for name, v2 in dt.V2_NAMES.items()}


def model_path(model: str, version: str | None = None) -> str:
    """`/v2/models/<model>[/versions/<version>]`, each name one escaped path segment: a name
    holding "?" or "#" would otherwise reach another endpoint, or none. A "/" is refused:
    servers decode an escaped one before routing (Starlette does), so no escape keeps it."""
    if not isinstance(model, str) or not model or "/" in model:
        raise UsageError(f"a model is named by a non-empty str without '/', not {model!r}")
    path = f"/v2/models/{quote(model, safe='')}"
    return path + (f"/versions/{quote(str(version), safe='')}" if version else "")


class Client:
    def __init__(self, url: str = "http://127.0.0.1:8000", timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        # answers as they are: httpx asks for gzip by default, which a server compressing binary
        # tensors (zoo serve and Triton both honour Accept-Encoding) pays for on every answer
        self.http = httpx.Client(base_url=self.url, timeout=timeout, headers={"Accept-Encoding": "identity"})
        self._metadata: dict[str, dict] = {}

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ZooError(f"no answer from {self.url}{path}: {exc}") from None
        if response.status_code >= 400:
            try:
                message = response.json().get("error") or response.text
            except ValueError:
                message = response.text[:500]
            cls = InputError if response.status_code == 400 else ZooError
            raise cls(f"server answered {response.status_code}: {message}")
        return response

    def live(self) -> bool:
        try:
            return self.http.get("/v2/health/live").status_code == 200
        except httpx.HTTPError:
            return False

    def ready(self, model: str | None = None) -> bool:
        path = f"{model_path(model)}/ready" if model is not None else "/v2/health/ready"
        try:
            return self.http.get(path).status_code == 200
        except httpx.HTTPError:
            return False

    def server_metadata(self) -> dict[str, Any]:
        return self._request("GET", "/v2").json()

    def metadata(self, model: str, version: str | None = None) -> dict[str, Any]:
        path = model_path(model, version)
        if path not in self._metadata:
            self._metadata[path] = self._request("GET", path).json()
        return self._metadata[path]

    def raw_kind(self, model: str) -> str | None:
        """The kind of domain-native item the model takes ("text", "image" ...), or None."""
        native = (self.metadata(model).get("zoo") or {}).get("domain_native")
        return native["kind"] if native else None

    def no_domain_native(self, model: str) -> str:
        """Why `model` on this server takes no domain-native items: it takes tensors (zoo serve
        says so), or the server does not advertise them (its metadata has no `zoo` block, as Triton's)."""
        metadata = self.metadata(model)
        if "zoo" in metadata:
            unavailable = metadata["zoo"].get("domain_native_unavailable")
            if unavailable:  # the artifact's model takes them, through a plugin that server lacks
                return (f"model {model} on {self.url} takes no domain-native inputs there: {unavailable}; send "
                        f"its tensors {[t['name'] for t in metadata.get('inputs', [])]} instead")
            return f"model {model} on {self.url} takes no domain-native inputs (it takes tensors)"
        return (f"server {self.url} does not advertise domain-native inputs for model {model}: zoo serve "
                f"advertises them in its model metadata, Triton and other servers do not; send the model's "
                f"tensors instead (zoo.client.Client.infer, tritonclient)")

    def raw_binary(self, model: str) -> bool:
        """Whether the model's domain-native items are binary (read from files), not text."""
        native = (self.metadata(model).get("zoo") or {}).get("domain_native") or {}
        return bool(native.get("binary"))

    def infer(self, model: str, inputs: Mapping[str, Any], outputs: Sequence[str] | str | None = None,
              binary: bool = True, version: str | None = None, request_id: str | None = None) -> dict[str, np.ndarray]:
        """Run `model` on tensors by name: numpy arrays, torch tensors or nested lists of numbers;
        lists of bytes/str for BYTES. Anything else is an `InputError` naming the input.

        An array goes as the datatype the model's metadata declares where a local runner
        (`zoo.load`) would cast it (float64 features to FP32, int32 ids to INT64), and is
        refused with the runner's message where it would not (floats for integer ids).
        `outputs`: the names of the outputs to return (one name as a str), default all."""
        if not isinstance(inputs, Mapping):
            raise InputError(f"inputs is a dict of tensors by input name, not {type(inputs).__name__}")
        path = model_path(model, version)
        datatypes = self._datatypes(model, version, inputs)
        # cast here, not only in the encoding: the JSON form writes the array's own values
        inputs = {name: np.asarray(as_numpy(value), dtype=dt.numpy_of(datatypes[name]))
                  if name in datatypes and hasattr(value, "dtype") else value for name, value in inputs.items()}
        body, headers = encode_request(inputs, binary=binary, outputs=[outputs] if isinstance(outputs, str) else outputs,
                                       request_id=request_id, datatypes=datatypes)
        response = self._request("POST", f"{path}/infer", content=body, headers=headers)
        _, arrays = decode_response(response.content, response.headers.get(HEADER_LENGTH))
        return arrays

    def _datatypes(self, model: str, version: str | None, inputs: Mapping[str, Any]) -> dict[str, str]:
        """The datatype each input goes as, by the model's metadata: a list of numbers has no
        dtype of its own, and an array is cast as the local runner casts it (`check_type`)."""
        try:
            declared = {t.get("name"): t.get("datatype") for t in self.metadata(model, version).get("inputs", [])}
        except ZooError:  # no metadata (an unknown model): the inference request's own answer says why
            return {}
        datatypes = {}
        for name, value in inputs.items():
            want = declared.get(name)
            if isinstance(value, (list, tuple)) and want is not None:
                datatypes[name] = want
            elif hasattr(value, "dtype") and want in _ZOO_DTYPES and want != "BYTES":
                check_type(name, _ZOO_DTYPES[want], value, model)
                datatypes[name] = want
        return datatypes

    def predict(self, model: str, items: Sequence[bytes | str] | bytes | str) -> list[Any]:
        """Domain-native items (text, SMILES, encoded images, JSON observations) -> one result each.

        A lone str or bytes is one item: its result comes back as a list of one. Binary
        kinds (images) take each item's bytes, never a path: a str item is refused, so pass
        the file's contents, `open(path, "rb").read()` (`zoo predict` on the command line
        reads its arguments as paths for these kinds)."""
        kind = self.raw_kind(model)
        if kind is None:
            raise ZooError(self.no_domain_native(model))
        items = _listed(items)
        if self.raw_binary(model) and any(isinstance(x, str) for x in items):
            raise InputError(f"model {model} takes {kind} inputs as bytes, not str (a path is not read): pass the "
                             f"file's bytes, open(path, 'rb').read()")
        raw = domain_items(items)
        if not raw:
            raise NoInputsError(f"give at least one {kind} input")
        if not isinstance(self.metadata(model)["zoo"]["domain_native"]["outputs"], list):
            raise ZooError(f"model {model} takes {kind} inputs but gives tensors, not domain results; use infer()")
        step = self.metadata(model)["zoo"]["domain_native"].get("max_items") or len(raw)  # in requests it admits
        results: list[Any] = []
        for i in range(0, len(raw), step):
            try:
                (result,) = self.infer(model, {kind: raw[i:i + step]}, outputs=["result"]).values()
            except InputError as exc:  # the server numbers items within the request it was sent
                raise exc.in_chunk(i, step, len(raw)) from None
            results.extend(json.loads(bytes(x)) for x in result)
        return results


def _listed(items: Any) -> list[Any]:
    """Items as a list (a lone str or bytes is one item; a generator is read once)."""
    if isinstance(items, (str, bytes, bytearray, memoryview)):
        return [items]
    try:
        return list(items)
    except TypeError:
        raise InputError(f"items is a list of str or bytes inputs, not {type(items).__name__}") from None

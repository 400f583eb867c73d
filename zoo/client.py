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

import httpx
import numpy as np

from .arguments import domain_items
from .errors import InputError, NoInputsError, ZooError
from .serve.protocol import HEADER_LENGTH, decode_response, encode_request


class Client:
    def __init__(self, url: str = "http://127.0.0.1:8000", timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, timeout=timeout)
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
        path = f"/v2/models/{model}/ready" if model else "/v2/health/ready"
        try:
            return self.http.get(path).status_code == 200
        except httpx.HTTPError:
            return False

    def server_metadata(self) -> dict[str, Any]:
        return self._request("GET", "/v2").json()

    def metadata(self, model: str, version: str | None = None) -> dict[str, Any]:
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "")
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
        if "zoo" in self.metadata(model):
            return f"model {model} on {self.url} takes no domain-native inputs (it takes tensors)"
        return (f"server {self.url} does not advertise domain-native inputs for model {model}: zoo serve "
                f"advertises them in its model metadata, Triton and other servers do not; send the model's "
                f"tensors instead (zoo.client.Client.infer, tritonclient)")

    def raw_binary(self, model: str) -> bool:
        """Whether the model's domain-native items are binary (read from files), not text."""
        native = (self.metadata(model).get("zoo") or {}).get("domain_native") or {}
        return bool(native.get("binary"))

    def infer(self, model: str, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None,
              binary: bool = True, version: str | None = None, request_id: str | None = None) -> dict[str, np.ndarray]:
        """Run `model` on tensors by name: numpy arrays, torch tensors or nested lists of numbers;
        lists of bytes/str for BYTES. Anything else is an `InputError` naming the input."""
        listed = [name for name, value in inputs.items() if isinstance(value, (list, tuple))]
        # a list of numbers has no dtype of its own: it goes as the datatype the model declares
        datatypes = {t["name"]: t["datatype"] for t in self.metadata(model, version).get("inputs", [])
                     if t.get("name") in listed} if listed else None
        body, headers = encode_request(inputs, binary=binary, outputs=outputs, request_id=request_id,
                                       datatypes=datatypes)
        path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
        response = self._request("POST", path, content=body, headers=headers)
        _, arrays = decode_response(response.content, response.headers.get(HEADER_LENGTH))
        return arrays

    def predict(self, model: str, items: Sequence[bytes | str] | bytes | str) -> list[Any]:
        """Domain-native items (text, SMILES, encoded images, JSON observations) -> one result each.

        A lone str or bytes is one item: its result comes back as a list of one."""
        kind = self.raw_kind(model)
        if kind is None:
            raise ZooError(self.no_domain_native(model))
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

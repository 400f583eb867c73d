"""Property-based testing of a real `zoo serve` with schemathesis, driven by the Open
Inference Protocol's own OpenAPI document (vendored in tests/oip/, see its README).

As published, the document cannot drive a test: its paths spell parameters `${NAME}`, it
lists only the versioned model routes, its generic request schema almost never names a
real model's inputs, and it declares few error responses. `adapt` fixes these in memory
(the reasons are next to each step). Then, for every operation, schemathesis' coverage
phase (one property at a time made invalid, missing, at a bound, ...) and a seeded random
sample of valid and invalid requests check that

* no answer is a 5xx (`not_a_server_error`): a malformed request is the client's fault;
* every answer has a declared status and matches its schema (`status_code_conformance`,
  `response_schema_conformance`), `inference_response` for a 200 of infer, and every
  non-2xx one is JSON with a string `error` (the protocol's error object);
* infer accepts (2xx) only valid `inference_request`s, and answers binary
  (application/octet-stream) only when asked to;
* a model or version that is not served is 404, and so is a version that is not digits
  (Triton's HTTP routes take digits only there), digits past std::stol's range are 400
  (as Triton reads versions), and the server is still live at the end.

schemathesis' pytest integration (`from_fixture(...).parametrize()`) fails under pytest 9.2
(it uses `Item._nodeid`), so this drives its Python API: `iter_coverage_cases`, `as_strategy`
with hypothesis, `case.call`, `case.validate_response`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import re
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from schemathesis import BaseSchema, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

pytest.register_assert_rewrite("serve_support")
from serve_support import ServerProcess  # noqa: E402

pytest_plugins = ["serve_support"]

Models = dict[str, dict[str, Any]]  # served model name -> its metadata
SPEC = Path(__file__).resolve().parent / "oip" / "open_inference_rest.yaml"
SEED = 20240601
MAX_EXAMPLES = 25  # random requests per operation (or per model), on top of the coverage phase's
DYNAMIC = 2  # the size of a dynamic (-1) axis in a typed request: every served model's axes take 2
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
#: the statuses besides 200 that the protocol lets each operation answer, by operationId
ERRORS = {"get-v2-health-ready": ["503"], "get-v2": ["400"], "get-v2-models-$-modelName-versions-$-modelVersion":
          ["400", "404"], "get-v2-models-$-modelName-versions-$-modelVersion-ready": ["400", "404", "503"],
          "post-v2-models-$-MODEL_NAME-versions-$-MODEL_VERSION-infer": ["400", "404", "413", "503"]}
#: JSON Schema of one finite element of each datatype, as JSON carries it
ELEMENT = {"BOOL": {"type": "boolean"}, "BYTES": {"type": "string"}, "FP64": {"type": "number"},
           "FP16": {"type": "number", "minimum": -65504, "maximum": 65504},
           **{t: {"type": "number", "minimum": -3.4e38, "maximum": 3.4e38} for t in ("FP32", "BF16")},
           **{f"INT{b}": {"type": "integer", "minimum": -(1 << b - 1), "maximum": (1 << b - 1) - 1}
              for b in (8, 16, 32, 64)},
           **{f"UINT{b}": {"type": "integer", "minimum": 0, "maximum": (1 << b) - 1} for b in (8, 16, 32, 64)}}


def typed_request(metadata: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema of a valid inference_request for the model `metadata` describes: exactly
    its inputs, each with its datatype, a concrete shape (dynamic axes DYNAMIC) and as many
    elements of that datatype as the shape holds; optionally some of its outputs."""
    inputs = []
    ranges = (metadata.get("zoo") or {}).get("value_ranges", {})  # the values each input takes, where declared
    for tensor in metadata["inputs"]:
        shape = [DYNAMIC if d == -1 else d for d in tensor["shape"]]
        element = dict(ELEMENT[tensor["datatype"]])
        if tensor["name"] in ranges:
            element["minimum"], element["maximum"] = ranges[tensor["name"]]
        inputs.append({"type": "object", "required": ["name", "datatype", "shape", "data"],
                       "additionalProperties": False, "properties": {
                           "name": {"const": tensor["name"]}, "datatype": {"const": tensor["datatype"]},
                           "shape": {"type": "array", "prefixItems": [{"const": d} for d in shape],
                                     "minItems": len(shape), "items": False},
                           "data": {"type": "array", "items": element,
                                    "minItems": math.prod(shape), "maxItems": math.prod(shape)},
                           "parameters": {"type": "object", "maxProperties": 0}}})
    outputs = {"type": "array", "maxItems": len(metadata["outputs"]), "uniqueItems": True, "items": {
        "type": "object", "required": ["name"], "additionalProperties": False, "properties": {
            "name": {"enum": [t["name"] for t in metadata["outputs"]]}, "parameters": flags("binary_data")}}}
    return {"type": "object", "required": ["inputs"], "additionalProperties": False, "properties": {
        "id": {"type": "string"}, "outputs": outputs, "parameters": flags("binary_data_output"),
        "inputs": {"type": "array", "prefixItems": inputs, "minItems": len(inputs), "items": False}}}


def flags(*names: str) -> dict[str, Any]:
    """JSON Schema of a `parameters` object that may hold the named booleans, nothing else."""
    return {"type": "object", "additionalProperties": False, "properties": {n: {"type": "boolean"} for n in names}}


def adapt(document: dict[str, Any], models: Models | None) -> dict[str, Any]:
    """The published document made testable against zoo serve. `models` restricts model
    names and versions to the served ones and types the request bodies; None leaves the
    names free, so that unknown ones are tried too."""
    doc = copy.deepcopy(document)
    # prefixItems (JSON Schema 2020-12, so OpenAPI 3.1) is the only way to say "exactly these
    # inputs"; the document uses nothing that 3.1 reads differently (no `nullable`).
    doc["openapi"] = "3.1.0"
    schemas = doc["components"]["schemas"]
    # The protocol's error object (its *_error_response schemas leave out `required`).
    schemas["error"] = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
    paths: dict[str, Any] = {}
    for path, item in doc["paths"].items():
        # `${MODEL_NAME}` is shell syntax; OpenAPI's templates are `{MODEL_NAME}`. And zoo serve
        # runs with redirect_slashes off, so the server metadata route `/v2/` is `/v2` there.
        path = path.replace("${", "{").rstrip("/")
        for operation in (op for method, op in item.items() if method != "parameters"):
            # Every error status the protocol allows here, so that its answer is checked too.
            for status in ERRORS.get(operation["operationId"], []):
                operation["responses"][status] = {"description": "error", "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/error"}}}}
            if "requestBody" in operation:
                # Outputs asked for as binary come back as application/octet-stream.
                operation["responses"]["200"]["content"]["application/octet-stream"] = {}
        paths[path] = item
        if "{MODEL_VERSION}" in path:
            # The protocol's text defines the versionless routes too; the document leaves them out.
            bare = copy.deepcopy(item)
            bare["parameters"] = [p for p in bare["parameters"] if p["name"] != "MODEL_VERSION"]
            for operation in (op for method, op in bare.items() if method != "parameters"):
                operation["operationId"] += "-versionless"
            paths[path.replace("/versions/{MODEL_VERSION}", "")] = bare
    doc["paths"] = paths
    if models is None:
        return doc
    versions = sorted({v for metadata in models.values() for v in metadata["versions"]})
    for item in paths.values():
        for parameter in item.get("parameters", []):
            # Served names and versions only, so that generated requests reach real models.
            parameter["schema"]["enum"] = sorted(models) if parameter["name"] == "MODEL_NAME" else versions
    for i, metadata in enumerate(models.values()):
        schemas[f"inference_request_{i}"] = typed_request(metadata)
    typed = [{"$ref": f"#/components/schemas/inference_request_{i}"} for i in range(len(models))]
    for item in (item for item in paths.values() if "post" in item):
        # anyOf, not oneOf: every typed request is a generic one too, and oneOf would exclude it.
        item["post"]["requestBody"]["content"]["application/json"]["schema"] = {
            "anyOf": [{"$ref": "#/components/schemas/inference_request"}, *typed]}
    return doc


def load(document: dict[str, Any]) -> BaseSchema:
    return schemathesis.openapi.from_dict(document, config=schemathesis.Config(seed=SEED))


PUBLISHED = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
#: the protocol's own inference_request: what infer may accept
REQUEST = jsonschema_rs.validator_for({"$ref": "#/components/schemas/inference_request",
                                       "components": PUBLISHED["components"]})
#: "METHOD /path" of every operation, known before the server is (only the enums need it)
LABELS = [f"{method.upper()} {path}" for path, item in adapt(PUBLISHED, None)["paths"].items()
          for method in item if method != "parameters"]


@pytest.fixture(scope="module")
def models(server: ServerProcess) -> Models:
    """Every model the repository index lists as READY, with its metadata."""
    index = httpx.post(f"{server.url}/v2/repository/index", timeout=30).json()
    names = [row["name"] for row in index if row["state"] == "READY"]
    assert names, index
    return {name: httpx.get(f"{server.url}/v2/models/{name}", timeout=30).json() for name in names}


def json_body(message: schemathesis.Case | schemathesis.Response) -> Any:
    """The body of a request or an answer as JSON; None where it is not JSON."""
    body = message.content if isinstance(message, schemathesis.Response) else message.body
    if isinstance(body, (bytes, bytearray)):
        with contextlib.suppress(ValueError):
            return json.loads(body)
        return None
    return body if isinstance(body, (dict, list, str, int, float, bool)) else None


def brief(value: Any) -> Any:
    """`value` with every list cut to its first 4 items, to show a request in a message."""
    if isinstance(value, list):
        return [brief(v) for v in value[:4]] + (["..."] if len(value) > 4 else [])
    return {k: brief(v) for k, v in value.items()} if isinstance(value, dict) else value


def version_number(version: str) -> int | None:
    """A model route's version as Triton reads it (std::stol: leading whitespace and zeros
    allowed), with nothing after the digits; None for anything else, or a negative one."""
    found = re.fullmatch(r"[ \t\n\v\f\r]*([+-]?[0-9]+)", version)
    return int(found[1]) if found and len(version) <= 100 and 0 <= int(found[1]) < 1 << 63 else None


def check(case: schemathesis.Case, server: ServerProcess, models: Models) -> None:
    """Send `case`; an AssertionError names the request, the answer and what is wrong with it."""
    response = case.call(base_url=server.url, timeout=60)
    problems = []
    try:
        case.validate_response(response, checks=CHECKS)
    except BaseExceptionGroup as group:  # schemathesis' FailureGroup: a Failure per failed check
        problems += [f"{f.title}: {(getattr(f, 'message', '') or '-').splitlines()[0]}" for f in group.exceptions]
    path = case.path_parameters or {}
    name, version = path.get("MODEL_NAME"), path.get("MODEL_VERSION")
    number = None if version is None else version_number(version)
    digits = version is None or version.isascii() and version.isdigit()  # else no route, as Triton's: 404
    if name is not None and case.method == case.operation.method.upper():
        if digits and version is not None and number is None:  # as Triton: refused before the model is looked up
            if response.status_code != 400:
                problems.append("not 400 for a version past std::stol's range")
        elif not digits or name not in models or number is not None and number not in map(
                int, models[name]["versions"]):
            if response.status_code != 404:
                problems.append("not 404 for a model or version that is not served, or a version not digits")
    if case.method == "POST" and response.status_code < 300 and not REQUEST.is_valid(json_body(case)):
        problems.append("accepted a body that is not an inference_request")
    answer, content_type = json_body(response), response.headers.get("content-type", [""])[0]
    if response.status_code >= 300 and not (isinstance(answer, dict) and isinstance(answer.get("error"), str)):
        problems.append('the error is not JSON {"error": string}')
    if content_type == "application/octet-stream":
        body = case.body if isinstance(case.body, dict) else {}
        asked = (body.get("parameters") or {}).get("binary_data_output") is True or any(
            (o.get("parameters") or {}).get("binary_data") is True for o in body.get("outputs") or [])
        if not (asked and "inference-header-content-length" in response.headers):
            problems.append("a binary answer not asked for, or without Inference-Header-Content-Length")
    if problems:
        sent = json.dumps(brief(json_body(case))) if json_body(case) is not None else repr(case.body)[:80]
        raise AssertionError(f"{case.method} {case.formatted_path} {sent}\n  -> {response.status_code} "
                             f"{response.text[:200]}\n  " + "\n  ".join(problems))


def exercise(schema: BaseSchema, label: str, server: ServerProcess, models: Models, **fixed: Any) -> None:
    """Every coverage-phase request of the operation, then MAX_EXAMPLES random valid and
    invalid ones (the same on every run; `fixed` path parameters are not generated); fails
    with every coverage failure and the random sample's shrunk one."""
    op = schema.find_operation_by_label(label)
    assert op is not None, label
    failures = []
    generation = schema.config.generation_for(operation=op, phase="coverage")
    for case in schema.iter_coverage_cases(op, generation_modes=list(GenerationMode), generation_config=generation):
        try:
            check(case, server, models)
        except AssertionError as exc:
            failures.append(str(exc))
    modes = list(GenerationMode) if op.path_parameters or op.body else [GenerationMode.POSITIVE]
    strategy = st.one_of(*(op.as_strategy(generation_mode=mode, path_parameters=fixed) for mode in modes))

    @seed(SEED)
    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def sample(case: schemathesis.Case) -> None:
        check(case, server, models)

    try:
        sample()
    except (AssertionError, BaseExceptionGroup) as exc:
        failures.append(f"random sample, shrunk: {exc}")
    if failures:
        pytest.fail(f"{label}: {len(failures)} failures\n" + "\n".join(failures), pytrace=False)


@pytest.mark.parametrize("label", LABELS)
def test_served_models(label: str, models: Models, server: ServerProcess) -> None:
    """Each operation, on the served models; infer with bodies typed for any of them."""
    exercise(load(adapt(PUBLISHED, models)), label, server, models)


def test_typed_inference(models: Models, server: ServerProcess, subtests: pytest.Subtests) -> None:
    """Each model's infer route with bodies typed for that model, so that most requests
    reach the model (above, a body mostly goes to a model it was not typed for)."""
    for name in models:
        with subtests.test(model=name):
            exercise(load(adapt(PUBLISHED, {name: models[name]})), "POST /v2/models/{MODEL_NAME}/infer", server,
                     models, MODEL_NAME=name)


@pytest.mark.parametrize("label", [label for label in LABELS if "{MODEL_NAME}" in label])
def test_unknown_models(label: str, models: Models, server: ServerProcess) -> None:
    """Each model operation with any model name: those that are not served are 404."""
    exercise(load(adapt(PUBLISHED, None)), label, server, models)


def test_still_live(server: ServerProcess) -> None:
    assert httpx.get(f"{server.url}/v2/health/live", timeout=30).status_code == 200

"""A content-addressed cache of the ONNX files torch's exporter writes.

Every backend that consumes an ONNX graph (ONNX Runtime, its CUDA and TensorRT providers,
OpenVINO, TensorRT), every precision built on the fp32 graph (int8 calibration, the fp16
conversion) and every `zoo bench` process exports the same module to the same graph.
Translating the captured program to ONNX and optimizing it is most of an export's time
(about 1.1 of 1.5 s for resnet8.digits on a 2-core machine); capturing the program is the
rest. So the cache is keyed by the captured `torch.export` program itself: the code of
each of its graph modules, each node's shapes, dtypes, source location and module path
(what the exporter writes into the graph), the graph signature and range constraints, the
bytes of every weight, buffer and constant, the export options (opset, input and output
names, dynamic shapes) and the versions of torch, onnxscript and onnx. Whatever code
produced the program, a hit is the graph a miss would write: the same nodes, attributes,
names and weights (only the number FX gives generated code in a source location, counted
per process, may differ); a change to the model's code, its weights, the spec's names or
axes or a library is a miss.

Where: `$ZOO_ONNX_CACHE_DIR`, else `zoo/onnx` under `$XDG_CACHE_HOME` or `~/.cache`,
beside the zoo's other caches (Inductor's, TensorRT's timing cache). `ZOO_ONNX_CACHE=0`
turns it off. It holds at most `$ZOO_ONNX_CACHE_MB` megabytes (default 2048): after a
store, the entries used least recently go first. A model whose weights go to external
data (over 1 GiB) is not cached. Each entry is the ONNX file and a JSON record of its
size and sha256, checked on every hit: a damaged entry is removed and the export runs.
The cache never holds anything but ONNX protobuf files this machine's exporter wrote, and
a failure to store (a full or read-only disk) is logged, never an export error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

import torch

log = logging.getLogger(__name__)

#: changes when what goes into a key changes, so older entries are never read as newer ones
_FORMAT = "zoo-onnx-cache-2"  # 2: graphs whose internal names clash with the spec's are renamed
_DEFAULT_MB = 2048
_LIBRARIES = ("torch", "onnxscript", "onnx")
#: FX names the code it generates `<eval_with_key>.N` with a per-process counter; a stack
#: trace through such code (a decomposition's subgraph) says the same thing whatever N is
_EVAL_KEY = re.compile(r"<eval_with_key>\.\d+")


def cache_dir() -> Path | None:
    """The cache's directory, or None where `ZOO_ONNX_CACHE=0` turns it off."""
    if os.environ.get("ZOO_ONNX_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    configured = os.environ.get("ZOO_ONNX_CACHE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "zoo" / "onnx"


def limit_bytes() -> int:
    raw = os.environ.get("ZOO_ONNX_CACHE_MB", str(_DEFAULT_MB))
    try:
        mb = float(raw)
    except ValueError:
        log.warning("ZOO_ONNX_CACHE_MB=%r is not a number; using %d", raw, _DEFAULT_MB)
        mb = _DEFAULT_MB
    return max(0, int(mb * (1 << 20)))


def program_key(program: torch.export.ExportedProgram, options: Mapping[str, Any]) -> str | None:
    """The hex key of `program` exported with `options`, or None where the program holds
    something the key cannot describe (a script object among its constants, a tensor whose
    bytes cannot be read as such): the export then runs uncached."""
    try:
        return _key(program, options)
    except Exception as exc:  # never an export error: the graph is exported as without a cache
        log.debug("no ONNX cache key for this program: %s", exc)
        return None


def _key(program: torch.export.ExportedProgram, options: Mapping[str, Any]) -> str | None:
    digest = hashlib.sha256()

    def add(value: Any) -> None:
        data = value if isinstance(value, bytes) else str(value).encode()
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)

    add(_FORMAT)
    for name in _LIBRARIES:
        add(name)
        add(_version(name))
    for name in sorted(options):
        add(name)
        add(options[name])
    for path, module in program.graph_module.named_modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        add(path)
        add(module.code)
        for node in module.graph.nodes:
            add(node.name)
            add(_describe(node.meta.get("val")))
            add(_EVAL_KEY.sub("<eval_with_key>", node.meta.get("stack_trace") or ""))
            add(node.meta.get("nn_module_stack"))
    add(program.graph_signature)
    add(sorted((str(k), str(v)) for k, v in program.range_constraints.items()))
    for kind, tensors in (("state", program.state_dict), ("constant", program.constants)):
        for name in sorted(tensors):
            value = tensors[name]
            if not isinstance(value, torch.Tensor):
                return None
            add(kind)
            add(name)
            add(_tensor_bytes(value))
    return digest.hexdigest()


def _describe(value: Any) -> str:
    """A node's example value as shapes and dtypes, without the tensor's identity."""
    if isinstance(value, torch.Tensor):
        return f"tensor({tuple(value.shape)}, {value.dtype}, {value.layout}, {value.device.type})"
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(_describe(v) for v in value)}]"
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    return type(value).__name__


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    t = tensor.detach().to("cpu").contiguous()
    header = f"{t.dtype}{tuple(t.shape)}".encode()
    return header + t.reshape(-1).view(torch.uint8).numpy().tobytes()


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def fetch(key: str, path: Path) -> bool:
    """Copy the entry `key` to `path`; False where there is none (or it was damaged, and is
    now removed)."""
    root = cache_dir()
    if root is None:
        return False
    onnx_file, record_file = _entry(root, key)
    try:
        record = json.loads(record_file.read_text())
        data = onnx_file.read_bytes()
    except (OSError, ValueError):
        return False
    if len(data) != record.get("bytes") or hashlib.sha256(data).hexdigest() != record.get("sha256"):
        log.warning("the ONNX cache entry %s is damaged (size or sha256 differs from its record); removed", key)
        _drop(onnx_file, record_file)
        return False
    path.write_bytes(data)
    try:
        os.utime(record_file)  # last used: what the size bound removes last
    except OSError:
        pass
    return True


def store(key: str, path: Path) -> None:
    """Keep a copy of the file at `path` as the entry `key`, then hold the size bound."""
    root = cache_dir()
    if root is None:
        return
    onnx_file, record_file = _entry(root, key)
    try:
        root.mkdir(parents=True, exist_ok=True)
        data, limit = path.read_bytes(), limit_bytes()
        if len(data) > limit:
            return
        _atomic_write(onnx_file, data)  # the file first: a record is written only for a whole file
        _atomic_write(record_file, json.dumps({"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                               **{n: _version(n) for n in _LIBRARIES}}).encode())
        _bound(root, limit)
    except OSError as exc:
        log.warning("could not store the ONNX graph in the cache at %s: %s", root, exc)


def _entry(root: Path, key: str) -> tuple[Path, Path]:
    if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
        raise ValueError(f"not a cache key: {key!r}")
    return root / f"{key}.onnx", root / f"{key}.json"


def _atomic_write(target: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _drop(*files: Path) -> None:
    for f in files:
        try:
            f.unlink(missing_ok=True)
        except OSError:
            pass


def _bound(root: Path, limit: int) -> None:
    """Remove the least recently used entries until the cache holds at most `limit` bytes."""
    entries = []
    for record in root.glob("*.json"):
        onnx_file = record.with_suffix(".onnx")
        try:
            entries.append((record.stat().st_mtime, onnx_file.stat().st_size, record, onnx_file))
        except OSError:
            continue
    total = sum(size for _, size, _, _ in entries)
    for _, size, record, onnx_file in sorted(entries, key=lambda e: e[0]):
        if total <= limit:
            break
        _drop(record, onnx_file)
        total -= size


def clear() -> None:
    """Remove every entry (the directory itself stays)."""
    root = cache_dir()
    if root is not None and root.is_dir():
        for f in list(root.glob("*.onnx")) + list(root.glob("*.json")):
            _drop(f)


__all__ = ["cache_dir", "clear", "fetch", "limit_bytes", "program_key", "store"]

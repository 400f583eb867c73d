"""What a backend plugin registers: a `Backend`, and the `Runner` it loads.

One backend per file behind this one interface (Ultralytics split its single
`autobackend.py` into per-backend classes for the same reason). A backend never
imports its library at module import time: `probe` imports it and says, in one human
sentence, why it cannot run when it cannot.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Protocol

from .errors import PluginError, StaleArtifactError, UnsupportedError, first_line

if TYPE_CHECKING:
    import torch

    from .spec import ModelSpec


@dataclass(frozen=True)
class Availability:
    """The answer of `Backend.probe`: can it run on this device here, and if not, why."""

    ok: bool
    reason: str = ""  # one sentence when not ok: "no CUDA device"


class Runner(Protocol):
    """A loaded artifact: a dict of arrays in, a dict of arrays out.

    Given numpy arrays or torch tensors in the dtypes the spec declares (a bfloat16 input
    as float32 numpy): zoo passes them so (`zoo.load`'s runner casts what it takes,
    `zoo.inputs.as_declared`), and a runner may hand them straight to its engine. Numpy
    arrays in, numpy arrays out, on every device (plugins' metrics and domain checks read
    outputs with numpy); on CUDA, device tensors in, device tensors out, kept on the device.
    """

    input_names: tuple[str, ...]
    output_names: tuple[str, ...]

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, Any]: ...


#: None outside `for_serving`; inside, the served model's Triton configuration parameters
_serving: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar("zoo_serving", default=None)


def serving() -> bool:
    """Whether the runner being loaded will serve requests (`zoo serve`, Triton's Python
    backend model). Between two runs of a served model the CPU belongs to the front end
    that reads, batches and answers requests, so a backend whose library busy-waits for
    the next run by default (ONNX Runtime's thread pool spins on after a run) should stop
    when a run returns: for resnet8.digits under 16 HTTP clients on 2 cores, the spinning
    cost `zoo serve` 1.8x the CPU per request and 12% of its requests/s
    (docs/benchmarks.md, "Serving: threads that stop spinning when a run returns").
    In-process benchmarks load without it."""
    return _serving.get() is not None


def serving_parameters() -> Mapping[str, str]:
    """The `parameters` of the served model's Triton configuration (its `config.pbtxt`,
    string values; empty when not serving). A backend honours the keys that Triton's own
    backend for its engine documents, so one configuration means the same under `zoo serve`
    and under Triton (ONNX Runtime's `enable_mem_arena`, for one), and refuses a value it
    cannot read with an error naming the key."""
    return _serving.get() or {}


#: what a serving process's environment says unless its user set it, before any engine is
#: imported (the OpenMP runtime reads it once, when it loads): PyTorch's intra-op OpenMP
#: threads sleep between parallel regions instead of spinning (`serving`'s reason; a served
#: `torch` artifact of resnet8.digits answered 2.8x the requests at 0.21x the CPU per
#: request under 16 clients on 2 shared cores: docs/benchmarks.md, "Serving: threads that
#: stop spinning when a run returns")
SERVING_ENVIRONMENT = {"OMP_WAIT_POLICY": "PASSIVE"}


def prepare_serving_process() -> None:
    """Set `SERVING_ENVIRONMENT`'s defaults in this process (`zoo serve`, and Triton's Python
    backend stub running `zoo.triton_backend`), leaving any value its user set."""
    for name, value in SERVING_ENVIRONMENT.items():
        os.environ.setdefault(name, value)


@contextlib.contextmanager
def for_serving(parameters: Mapping[str, str] | None = None):
    """Runners loaded inside this block serve requests (`serving`), under the served
    model's Triton configuration `parameters` (`serving_parameters`)."""
    token = _serving.set(dict(parameters or {}))
    try:
        yield
    finally:
        _serving.reset(token)


class Backend(abc.ABC):
    """Exports a PyTorch module to files and loads those files as a `Runner`."""

    name: ClassVar[str]  # "torch", "onnxruntime", ...
    #: precisions per device, e.g. {"cpu": ("fp32",), "cuda": ("fp32", "fp16")}
    precisions: ClassVar[Mapping[str, tuple[str, ...]]]
    filename: ClassVar[str]  # the model file inside the version directory: "model.onnx"
    #: Triton's native backend for the engine: {"platform": "onnxruntime_onnx"},
    #: {"backend": "openvino"}; empty where Triton has none, and its Python backend serves
    #: the artifact through this backend's runner (`zoo.triton`)
    triton: ClassVar[Mapping[str, str]] = {}
    description: ClassVar[str] = ""
    #: export compiles native code (Inductor, an engine builder): a minute or more per model
    #: on a small CPU. `zoo demo` leaves such backends to `--backends` so it stays quick.
    compiles: ClassVar[bool] = False
    #: the config.pbtxt `parameters` its runner reads when served (`serving_parameters`);
    #: an export given others warns that only Triton's own backend may read them
    parameters: ClassVar[tuple[str, ...]] = ()

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(self.precisions)

    @abc.abstractmethod
    def versions(self) -> dict[str, str]:
        """Versions of the libraries this backend uses; empty when they are not installed."""

    @abc.abstractmethod
    def probe(self, device: str) -> Availability:
        """Whether this backend can run on `device` here. Never raises."""

    @abc.abstractmethod
    def export(self, module: "torch.nn.Module", spec: "ModelSpec", example: Mapping[str, "torch.Tensor"],
               path: Path, precision: str, device: str) -> Mapping[str, Any] | None:
        """Write the model file at `path` (inside a temporary artifact directory).

        `module` is the fp32 reference in eval mode on `device`; `example` is a realistic
        input batch on `device` whose batch size is neither 1 nor the maximum. Further
        files may be written beside `path`. Returns facts to record in the manifest under
        ``backend.info`` (build time, engine provenance ...), or None.
        """

    @abc.abstractmethod
    def load(self, path: Path, spec: "ModelSpec", precision: str, device: str,
             threads: int | None = None, info: Mapping[str, Any] | None = None) -> Runner:
        """Load the model file at `path` as a runner.

        `threads` caps intra-op threads (None: the library's default); `info` is what
        `export` returned, read back from the manifest. A runner loaded while `serving()`
        should not busy-wait between runs.
        """

    def check_supported(self, precision: str, device: str) -> None:
        if device not in self.precisions:
            raise UnsupportedError(
                f"backend {self.name} does not run on {device} (devices: {', '.join(self.devices)})")
        if precision not in self.precisions[device]:
            raise UnsupportedError(
                f"backend {self.name} does not support {precision} on {device} "
                f"(supported: {', '.join(self.precisions[device])})")

    def check_compatible(self, recorded: Mapping[str, str], artifact: str) -> None:
        """Refuse an artifact written by other library versions than these.

        The default requires the same major.minor version of every library recorded;
        a backend whose artifacts run only with the exact build that wrote them overrides this.
        """
        current = library_versions(self)
        for lib, version in recorded.items():
            now = current.get(lib)
            if now is None or _major_minor(now) != _major_minor(version):
                raise StaleArtifactError(
                    f"artifact {artifact} was built with {lib} {version} but this machine has "
                    f"{lib} {now or '(not installed)'}; re-export it with `zoo export --force`")


def declared_wrong(backend: Backend) -> str | None:
    """Why a backend's declaration cannot work, or None: a `filename` that is not a plain
    file name (the version folder holds the model file; a path out of it is never
    followed), `precisions` that do not map devices to precisions zoo knows."""
    from .spec import PRECISIONS

    filename = getattr(backend, "filename", None)
    if not isinstance(filename, str) or filename in ("", ".", "..") or Path(filename).name != filename \
            or "\\" in filename:
        return (f"its filename {filename!r} is not a file name: it names the model file inside the artifact's "
                f"version folder, as \"model.onnx\"")
    precisions = getattr(backend, "precisions", None)
    if not isinstance(precisions, Mapping) or not all(
            isinstance(d, str) and isinstance(ps, (tuple, list)) and all(isinstance(x, str) for x in ps)
            for d, ps in precisions.items()):
        return (f"its precisions {str(precisions)[:100]} must map each device to the precisions it runs there, as "
                f"{{\"cpu\": (\"fp32\", \"int8\")}}")
    unknown = sorted({x for ps in precisions.values() for x in ps} - set(PRECISIONS))
    if unknown:
        return f"its precisions name {', '.join(unknown)}, which zoo does not know (it knows {', '.join(PRECISIONS)})"
    return None


def loaded(backend: Backend, runner: Any) -> Any:
    """What `backend.load` returned, if it is a runner (a callable): a plugin's slip (a load
    that returns nothing) is named as that backend's, not met later as "None is not callable"."""
    if not callable(runner):
        raise PluginError(f"backend {backend.name}: load() returned {str(runner)[:100]}, not a runner: a callable "
                          f"taking a dict of input arrays by name and returning a dict of output arrays by name")
    return runner


def library_versions(backend: Backend) -> dict[str, str]:
    """`backend.versions()`, checked: a plugin's code, whose failure or wrong answer is named
    as that backend's (a listing shows it against the backend; an export to it is refused),
    never as zoo's own "internal error" in a command about another backend."""
    try:
        answer = backend.versions()
    except Exception as exc:
        raise PluginError(f"backend {backend.name}: versions() raised {type(exc).__name__}: {first_line(exc)}") from exc
    if not isinstance(answer, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in answer.items()):
        raise PluginError(f"backend {backend.name}: versions() returned {str(answer)[:200]}; it returns a dict of "
                          f"library names to version strings, as {{\"onnxruntime\": onnxruntime.__version__}}")
    return dict(answer)


def device_kind(device: str) -> str:
    """`cuda` of "cuda:1": the key of `Backend.precisions`."""
    return device.split(":", 1)[0]


def release(version: str) -> tuple[int, int]:
    """The first two numbers of a version ("1.20.1", "1.21.0+cu124", "2026.4.1-22982-...")."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else (0, 0)


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split("+")[0].split(".")[:2])

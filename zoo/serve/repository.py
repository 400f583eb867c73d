"""Which artifacts of a model repository are served here, and why the others are not.

Every artifact directory is opened with `Artifact.open` (manifest validated, every file
hashed) and loaded only when its backend can run on this machine; the rest are skipped
with the reason, never silently. Batching settings come from the command line, else
from the artifact's `config.pbtxt` (`max_batch_size`, `dynamic_batching`,
`instance_group`), else from the model's batch axis.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from ..artifact import MANIFEST, Artifact, list_artifacts
from ..backend import for_serving
from ..errors import ArtifactError, ZooError, first_line
from ..padding import padding_safe, ragged_axes, rows_independent
from ..triton import rows_batched
from ..vectors import sampler
from .batcher import BatchPolicy
from .errors import ModelNotFoundError, scrub
from .model import ServedModel

log = logging.getLogger("zoo.serve")
#: an artifact name as `zoo export` writes it: no separators, no leading dot, no "..".
ARTIFACT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]*(\.[A-Za-z0-9_\-]+)*$")


@dataclass(frozen=True)
class ServeOptions:
    """Batching and execution settings from the command line; None: the artifact's own."""

    max_batch_size: int | None = None
    max_queue_delay_ms: float | None = None
    preferred_batch_sizes: tuple[int, ...] | None = None
    instances: int | None = None
    max_queue_size: int = 256
    batching: bool = True
    ragged: bool = True
    #: a ragged batch's executions: groups whose zero-padding stays within this fraction of
    #: their real elements (`batcher.padding_groups`); None: one execution per batch
    max_padding: float | None = 0.25
    threads: int | None = None  # intra-op threads per instance; None: cores / instances
    device: str | None = None  # None: the device the artifact was exported for
    #: a PEM public key: only artifacts whose signature it verifies load (`zoo.signing`)
    require_signature: Path | None = None


@dataclass(frozen=True)
class Skipped:
    name: str
    reason: str


def triton_settings(config_text: str) -> dict:
    """The batching fields of a `config.pbtxt` as `zoo.triton` writes them."""
    found: dict = {}
    if m := re.search(r"^max_batch_size:\s*(\d+)", config_text, re.M):
        found["max_batch_size"] = int(m[1])
    if m := re.search(r"preferred_batch_size:\s*\[([\d,\s]*)\]", config_text):
        found["preferred_batch_sizes"] = tuple(int(x) for x in m[1].replace(",", " ").split())
    if m := re.search(r"max_queue_delay_microseconds:\s*(\d+)", config_text):
        found["max_queue_delay_ms"] = int(m[1]) / 1e3
    if m := re.search(r"instance_group\s*\[\s*\{[^}]*count:\s*(\d+)", config_text):
        found["instances"] = int(m[1])
    found["dynamic_batching"] = "dynamic_batching" in config_text
    return found


def config_parameters(config_text: str) -> dict[str, str]:
    """A `config.pbtxt`'s model `parameters` (Triton's `ModelConfig.parameters`, string
    values), read with the `ModelConfig` message tritonclient ships: the backend that loads
    the artifact for serving honours the ones Triton's backend for its engine documents."""
    if "parameters" not in config_text:  # the common case: no protobuf import
        return {}
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    try:
        config = text_format.Parse(config_text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise ArtifactError(f"config.pbtxt is not a Triton model configuration: {first_line(exc)}") from None
    return {key: value.string_value for key, value in config.parameters.items()}


def policy_for(spec, options: ServeOptions, config_text: str) -> BatchPolicy:
    """The batching policy: the command line's settings, else the artifact's `config.pbtxt`'s."""
    config = triton_settings(config_text)
    axis_max = spec.axes["batch"].max
    can_batch = rows_batched(spec)
    max_batch = min(options.max_batch_size or config.get("max_batch_size") or axis_max, axis_max)
    if options.max_batch_size and options.max_batch_size > axis_max:  # one setting for every model served
        log.warning("model %s takes at most %d rows: --max-batch-size %d is %d for it", spec.name, axis_max,
                    options.max_batch_size, axis_max)
    preferred = options.preferred_batch_sizes
    if preferred is None:
        preferred = config.get("preferred_batch_sizes", ())
    dropped = [b for b in preferred if not 1 <= b <= max_batch]
    if dropped:
        log.warning("model %s batches at most %d rows: preferred batch sizes %s left out", spec.name, max_batch,
                    ", ".join(map(str, dropped)))
    delay = options.max_queue_delay_ms
    if delay is None:
        delay = config.get("max_queue_delay_ms", 0.0)  # Triton's default
    return BatchPolicy(max_batch_size=max(max_batch, 1), max_queue_delay=delay / 1e3,
                       preferred_batch_sizes=tuple(b for b in preferred if 1 <= b <= max_batch),
                       max_queue_size=options.max_queue_size,
                       instances=max(1, options.instances or config.get("instances") or 1),
                       batching=can_batch and options.batching and max_batch > 1, ragged=options.ragged,
                       max_padding=options.max_padding)


def open_model(path: Path, options: ServeOptions) -> tuple[ServedModel, list]:
    """Validate and load one artifact: the served model and its first runners."""
    files = fingerprint(path)  # before it is read: a change while it loads shows at the next load
    if options.require_signature is not None:
        from ..signing import verify_signature

        verify_signature(path, options.require_signature)
    art = Artifact.open(path)
    spec = art.spec()
    config = art.path / "config.pbtxt"
    config_text = config.read_text() if config.is_file() else ""  # read once: batching settings and parameters
    policy, parameters = policy_for(spec, options, config_text), config_parameters(config_text)
    threads = options.threads or (max(1, (os.cpu_count() or 1) // policy.instances) if policy.instances > 1 else None)

    def load_runners() -> list:
        with for_serving(parameters):
            return [art.load(threads=threads, device=options.device) for _ in range(policy.instances)]

    runners = load_runners()
    vectors = functools.cache(art.test_vectors)  # read once, for both probes
    policy = merged_if_rows_independent(art, spec, policy, runners[0], vectors)  # first: unmerged, no padding tried
    policy = ragged_if_padding_safe(art, spec, policy, runners[0], vectors)
    model = ServedModel(art, spec, policy, load_runners)
    model.files = files
    return model, runners


def fingerprint(path: Path) -> tuple[tuple[str, int, int, int], ...] | None:
    """What decides whether a load of a served model reloads it, as Triton decides it: every
    file and folder of the artifact (symbolic links not followed) with its inode, size and
    modification time. A re-export (a new directory renamed into place) or an edited or
    touched file changes it. None where a file went while it was read (a re-export's
    renames): a load then reloads, and says what it finds."""
    entries = []
    try:
        for top, dirs, names in os.walk(path):
            dirs.sort()
            for name in ["", *sorted(names), *dirs]:
                entry = Path(top, name) if name else Path(top)
                st = entry.lstat()
                entries.append((entry.relative_to(path).as_posix(), st.st_ino, st.st_size, st.st_mtime_ns))
    except OSError:
        return None
    return tuple(entries) or None


def ragged_if_padding_safe(art: Artifact, spec, policy: BatchPolicy, runner,
                           vectors: Callable[[], list] | None = None) -> BatchPolicy:
    """`policy`, with ragged batching only where zero-padding leaves this artifact's
    outputs unchanged (`zoo.padding`): tried once here, with the runner the server will
    call, on rows of the artifact's own test vectors at the typical sizes (the model's
    sample where it stores none: drawing one may load a plugin's dataset and its
    libraries). Otherwise requests of different lengths are batched only with their own
    length, as Triton batches them."""
    if not (policy.batching and policy.ragged and ragged_axes(spec)):
        return policy
    try:
        safe, why = padding_safe(spec, runner, probe_sample(art, spec, 2, vectors), art.precision)
    except Exception as exc:  # noqa: BLE001 - the engine refused padded shapes: not safe, and say why
        safe, why = False, f"the padded sample failed: {type(exc).__name__}: {first_line(exc)}"
    if safe:
        return policy
    log.warning("%s: requests of different lengths are batched only with requests of the same length: %s",
                art.name, why)
    return replace(policy, ragged=False)


def merged_if_rows_independent(art: Artifact, spec, policy: BatchPolicy, runner,
                               vectors: Callable[[], list] | None = None) -> BatchPolicy:
    """`policy`, with requests merged into one execution only where this artifact's rows are
    independent (`zoo.padding.rows_independent`): a model normalizing each row by the batch's
    mean answers a request merged with others otherwise than alone. Tried once here as
    `ragged_if_padding_safe` tries padding (three runs of up to 4 rows); where it fails, each
    request runs as its own batch, as with `--no-batching`."""
    if not policy.batching:
        return policy
    try:
        rows = max(4, 2 * spec.axes["batch"].min)  # two parts of at least batch.min (rows_independent)
        independent, why = rows_independent(spec, runner, probe_sample(art, spec, rows, vectors), art.precision)
    except Exception as exc:  # noqa: BLE001 - the sample fails as a request would: not a batching matter
        log.warning("%s: whether its rows are independent could not be tried (%s: %s): requests are merged",
                    art.name, type(exc).__name__, first_line(exc))
        return policy
    if independent:
        return policy
    log.warning("%s: rows are not independent (%s): requests are not merged, each runs as its own batch",
                art.name, why)
    return replace(policy, batching=False)


def probe_sample(art: Artifact, spec, rows: int, vectors: Callable[[], list] | None = None) -> dict[str, np.ndarray]:
    """Up to `rows` rows of the artifact's own test vectors (`vectors()`, else read here) at the
    typical sizes (the model's sample where it stores none: drawing one may load a plugin's
    dataset and its libraries)."""
    rows, rng = min(rows, spec.axes["batch"].max), np.random.default_rng(0)
    sets = (vectors or art.test_vectors)()
    return sampler(lambda: sets, spec.inputs, spec.axes)(rows, rng) if sets else spec.sample(rows, rng)


def scan(root: Path, options: ServeOptions) -> tuple[list[tuple[ServedModel, list]], list[Skipped]]:
    """Load every artifact in `root` that can run here; the others, with the reason."""
    if not root.is_dir():
        raise ZooError(f"no model repository at {root}: " + ("it is a file, not a directory" if root.exists()
                                                             else "export a model first (`zoo export MODEL -b BACKEND`)"))
    loaded, skipped = [], []
    for path in list_artifacts(root):
        try:
            loaded.append(open_model(path, options))
        except Exception as exc:  # the artifact is skipped, the server runs
            skipped.append(failure(path.name, exc))
    for s in skipped:
        log.warning("skipped %s: %s", s.name, s.reason)
    others = not_artifacts(root)
    if others:
        log.warning("not served: %s (directories without %s, so not zoo artifacts; an artifact whose copy was cut "
                    "short lacks it too; Triton would try to load them: move them out of the repository)",
                    ", ".join(others), MANIFEST)
    return loaded, skipped


def failure(name: str, exc: Exception) -> Skipped:
    """Why artifact `name` did not load, as the index and the log say it: a zoo error in its
    own words; a backend library's own error logged with its traceback."""
    if isinstance(exc, ZooError):
        return Skipped(name, scrub(str(exc)))
    log.error("artifact %s failed to load", name, exc_info=exc)
    return Skipped(name, scrub(f"failed to load: {exc}"))


def not_artifacts(root: Path) -> list[str]:
    """The directories of `root` that are not artifacts (hidden ones too: Triton loads those)."""
    names = set(artifact_names(root))
    return sorted(p.name for p in root.iterdir() if p.is_dir() and p.name not in names)


def artifact_names(root: Path) -> list[str]:
    """The names of the artifact directories in `root` (none if it is gone)."""
    return [path.name for path in list_artifacts(root)]


def find_artifact(root: Path, name: str) -> Path:
    """The artifact directory called `name` inside `root`: names only, no paths or URLs."""
    if not ARTIFACT_NAME.match(name) or len(name) > 200:
        raise ModelNotFoundError(f"{name[:80]!r} is not an artifact name; give the name of a directory "
                                 "in the model repository")
    for path in list_artifacts(root):
        if path.name == name and not path.is_symlink():
            return path
    raise ModelNotFoundError(f"no artifact named {name!r} in the model repository")

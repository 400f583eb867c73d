"""`zoo export`: PyTorch weights -> a backend's model file -> verified artifact.

The artifact is built in a temporary directory and renamed into place only after the
backend's runner has reproduced the PyTorch fp32 reference within the spec's tolerance
(and, where the spec has a dataset, after the task metric was measured through it), so
a failed or interrupted export never leaves a directory that loads. An int8 artifact is
also refused when its task metric falls further below fp32's than the spec allows
(`zoo.verify.metric_report`).

The artifact carries what it needs to run and be checked without the plugin that
defined its model: the spec's description in the manifest (`zoo.standalone`) and test
vectors, inputs with the PyTorch fp32 outputs at the smallest, typical and largest
sizes, which the runner reproduces before the artifact is written (`zoo.vectors`).

An artifact is reused when its provenance (weights sha256, model config, backend and
library versions, precision and int8 method, device) matches the request; otherwise it
is rebuilt. An int8 method other than the model's own is written under its own name
(`zoo.artifact.artifact_name`), so neither method's artifact replaces the other's.
"""

from __future__ import annotations

import json
import logging
import platform
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors.torch import save_file

from . import vectors
from .version import __version__
from .arguments import check_threads
from .backend import for_serving, library_versions, loaded
from .artifact import DEFAULT_REPOSITORY, FORMAT, MANIFEST, VERSION_DIR, WEIGHTS, Artifact, artifact_name
from .check import check
from .checkpoint import Checkpoint, built, default_path, load_checkpoint, missing, whose
from .errors import (ArtifactError, BackendUnavailableError, ExportError, PluginError, UnsupportedError, UsageError,
                     ZooError, first_line)
from .fsutil import atomic_directory, sha256_file
from .inputs import json_unfit
from .registry import backend_record, get_backend, get_model, probe
from .spec import QUANTIZATIONS, ModelSpec
from .signature import binding
from .signing import SIGNATURE
from .standalone import model_record, signature
from .tensors import cpu_state_dict, example_inputs, state_dict_sha256
from .train import module_fn
from .triton import check_parameters, triton_form, write_repository_files
from .verify import domain_report, metric_report, parity

log = logging.getLogger("zoo")


def reference_module(spec: ModelSpec, checkpoint: str | Path | Checkpoint | None = None,
                     random_init: bool = False, seed: int = 0) -> tuple[torch.nn.Module, str]:
    """The fp32 eval-mode module to export, and where its weights came from."""
    one_source(checkpoint, random_init)
    if isinstance(checkpoint, Checkpoint):
        return checkpoint.module(spec), f"checkpoint {checkpoint.path or '(in memory)'}"
    if checkpoint is not None:
        return load_checkpoint(checkpoint, spec.name).module(spec), f"checkpoint {checkpoint}"
    if spec.trainable and not random_init:
        path = default_path(spec.name)
        if not path.exists():
            # the same message reaches `zoo export` and `zoo.export(...)`: it names both forms
            raise missing(spec.name, "export untrained weights with --random-init (random_init=True)",
                          "--checkpoint DIR (checkpoint=DIR)")
        return load_checkpoint(path, spec.name).module(spec), f"checkpoint {path}"
    if spec.pretrained is not None and not random_init:
        module = built(spec)
        try:
            module.load_state_dict(dict(spec.pretrained()), strict=True)
        except ZooError:
            raise
        except Exception as exc:  # the plugin's weights: say whose, not where
            raise PluginError(f"model {whose(spec)}: its pretrained weights failed to load: "
                              f"{first_line(exc)}") from exc
        return module.eval(), "pretrained"
    torch.manual_seed(seed)
    return built(spec).eval(), f"random init (seed {seed})"


def one_source(checkpoint: str | Path | Checkpoint | None, random_init: bool) -> None:
    """Untrained weights and a checkpoint are two answers to one question: refused, where
    the checkpoint used to win silently."""
    if random_init and checkpoint is not None:
        raise UsageError(f"--random-init and --checkpoint {getattr(checkpoint, 'path', checkpoint)} name different "
                         "weights (random_init=True and checkpoint= in Python): give one")


def at_checkpoint_config(spec: ModelSpec, checkpoint: str | Path | Checkpoint | None,
                          random_init: bool) -> tuple[ModelSpec, Checkpoint | None]:
    """`spec` at the config of the checkpoint `reference_module` will load, and that
    checkpoint, read once here: weights trained at another config (`zoo train -c width=16`)
    are that config's model, and its manifest, description and metric data say so. None
    where the weights come from elsewhere (pretrained, random init, or a missing checkpoint
    that `reference_module` names)."""
    one_source(checkpoint, random_init)
    if isinstance(checkpoint, Checkpoint) or random_init and checkpoint is None:
        loaded = checkpoint
    elif checkpoint is not None:
        loaded = load_checkpoint(checkpoint, spec.name)
    elif spec.trainable and default_path(spec.name).exists():
        loaded = load_checkpoint(default_path(spec.name), spec.name)
    else:
        return spec, None
    changed = {k: v for k, v in (loaded.config if loaded else {}).items() if k in spec.config and spec.config[k] != v}
    return (spec.configure(**changed) if changed else spec), loaded


def device_facts(device: str) -> dict[str, Any]:
    if device.startswith("cuda") and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(device)
        return {"device_name": torch.cuda.get_device_name(device), "compute_capability": f"{major}.{minor}"}
    return {"device_name": platform.processor() or platform.machine(), "compute_capability": None}


def export(model: str | ModelSpec, backend: str = "onnxruntime", precision: str = "fp32", device: str = "cpu",
           repository: str | Path = DEFAULT_REPOSITORY, checkpoint: str | Path | Checkpoint | None = None,
           random_init: bool = False, force: bool = False, threads: int | None = None,
           quantization: str | None = None, triton: str | None = None, resign: bool = False,
           triton_parameters: Mapping[str, str] | None = None, keep_triton: bool = False) -> Artifact:
    """Export `model` through `backend` and write a verified artifact into `repository`.

    `model` is a registered name or a `ModelSpec`, registered or not: the artifact describes its
    model itself, so it loads and verifies where no plugin registers it. `quantization` ("static" |
    "dynamic") overrides the spec's int8 method for this export; backends read it as
    `spec.quantization`, so their interface does not change. A method other than the spec's is
    written as `<model>.<backend>.int8-<method>`. `triton` ("native" | "python") is the Triton form
    of its repository files (`zoo.triton`); by default native where Triton has a backend for the
    engine, else python. `resign`: the caller signs the new artifact (`zoo export --sign`): no warning.
    `triton_parameters` become the `parameters` of its `config.pbtxt`, which the backend honours
    where Triton's backend for the engine documents them (`zoo.backend.serving_parameters`): the
    artifact's runner, loaded as a server loads it, must reproduce the test vectors under them.
    `keep_triton`: those two of the artifact already there (`zoo bench` leaves what it deploys).
    """
    spec, threads = _checked(model, repository, threads)  # a bad argument is refused before any work
    declared, checkpoint = at_checkpoint_config(spec, checkpoint, random_init)
    spec = _quantized(declared, precision, quantization)
    be = get_backend(backend)
    be.check_supported(precision, device)
    form, parameters = _triton_settings(be, triton, triton_parameters)
    spec.tolerance(precision)
    if not (availability := probe(be, device)).ok:
        raise BackendUnavailableError(f"backend {be.name} cannot run on {device} here: {availability.reason}")

    module, source = reference_module(spec, checkpoint, random_init)
    module = module.to(device)
    state = cpu_state_dict(module)
    method = spec.quantization if precision == "int8" else None
    final = Path(repository) / artifact_name(spec.name, be.name, precision,
                                             method if method != declared.quantization else None)
    form, parameters = (keep_triton and _kept_triton(final, be)) or (form, parameters)
    provenance = _provenance(state, spec, be, precision, device, form, parameters)
    # the manifest's account of the model: compared with an existing artifact's, then written
    described = {"model": {**model_record(declared), "binding": binding(module, spec)}, "signature": signature(spec)}
    reused = None if force else _reusable(final, provenance, described, spec, module_fn(module, spec, device))
    if reused is not None:
        return reused

    dependent = _check_module(spec, module, precision, device)  # why rows are not independent, or None

    start = time.perf_counter()
    with _replacing(final, resign) as tmp:
        model_file = tmp / VERSION_DIR / be.filename
        model_file.parent.mkdir()
        example = example_inputs(spec, device)
        info = _backend_export(be, module, spec, example, model_file, precision, device)
        if not model_file.is_file():
            raise ArtifactError(f"backend {be.name} wrote no {VERSION_DIR}/{be.filename}")
        runner = loaded(be, be.load(model_file, spec, precision, device, threads, info))
        reference = module_fn(module, spec, device)
        report = parity(spec, reference, runner, precision)
        domain = domain_report(spec, reference, runner, precision)
        metric = metric_report(spec, reference, runner, precision)
        vector_sets, test_data = vectors.record(spec, reference, tmp)
        vectors.check(spec, runner, vector_sets, precision)  # so that `zoo verify` passes on what is written
        _check_served(be, (model_file, spec, precision, device, threads, info), parameters, vector_sets)
        save_file(state, str(tmp / WEIGHTS))
        name = final.name
        write_repository_files(tmp, name, spec, be.triton, be.filename, device, form, parameters, dependent)
        files = {p.relative_to(tmp).as_posix(): sha256_file(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        manifest = {
            "format": FORMAT, "name": name, "zoo_version": __version__,
            # how the module took its inputs ("keyword", or "positional" where its forward names none)
            "model": described["model"],
            "weights": {"sha256": provenance["weights_sha256"], "source": source, "file": WEIGHTS},
            "backend": {"name": be.name, "versions": provenance["versions"], "info": info, **backend_record(be.name)},
            "precision": precision, "quantization": provenance["quantization"], "device": device,
            "triton": _triton_record(be, form, parameters, dependent),
            "device_name": provenance["device_name"], "compute_capability": provenance["compute_capability"],
            "signature": described["signature"], "model_file": f"{VERSION_DIR}/{be.filename}", "files": files,
            "test_data": test_data,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "export_seconds": round(time.perf_counter() - start, 3),
            "parity": report, "domain": domain, "metric": metric}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return Artifact(final, manifest)


def _backend_export(be, module, spec: ModelSpec, example, model_file: Path, precision: str,
                    device: str) -> dict[str, Any]:
    """`be.export`, its failure and its answer named as the backend's: a library error inside
    it is this export's failure, not zoo's "internal error"; what it returns is kept in the
    manifest (`info`, given back to `load`), so it is a dict JSON holds, or None."""
    try:
        with torch.inference_mode(False), torch.no_grad():
            info = be.export(module, spec, example, model_file, precision, device)
    except ZooError:
        raise
    except Exception as exc:
        raise ExportError(f"backend {be.name} failed to export {spec.name} ({precision}, {device}): "
                          f"{type(exc).__name__}: {first_line(exc)}") from exc
    if info is None:
        return {}
    if not isinstance(info, dict):
        raise PluginError(f"backend {be.name}: export() returned a {type(info).__name__} ({str(info)[:100]}); it "
                          f"returns None or a dict, which the manifest keeps and load() gets back as `info`")
    if (why := json_unfit(info)) is not None:
        raise PluginError(f"backend {be.name}: export() returned an `info` the manifest cannot hold ({why}): keep "
                          f"to strings, numbers, booleans, None, lists and dicts with string keys")
    return info


def _check_module(spec: ModelSpec, module, precision: str, device: str) -> str | None:
    """What every step of an export relies on, before any backend work: one line per departure.
    Returns why the model's rows are not independent (None where they are)."""
    checked = check(spec, module, precision, device)
    for warning in checked.warnings:
        log.warning("%s", warning)
    checked.raise_for_failures()
    return checked.rows_dependent


def _triton_record(be, form: str, parameters: Mapping[str, str], rows_dependent: str | None = None) -> dict[str, Any]:
    """The manifest's `triton`: the form, Triton's platform or backend, the config's parameters,
    and why its config has no dynamic batching where the model's rows are not independent."""
    return {"form": form, **(dict(be.triton) if form == "native" else {"backend": "python"}),
            **({"parameters": dict(parameters)} if parameters else {}),
            **({"rows_dependent": rows_dependent} if rows_dependent is not None else {})}


def _provenance(state, spec: ModelSpec, be, precision: str, device: str, form: str,
                parameters: Mapping[str, str]) -> dict[str, Any]:
    """What an artifact was built from: an existing one is reused only where all of it is the same."""
    return {"weights_sha256": state_dict_sha256(state), "config": dict(spec.config),
            "backend": be.name, "versions": library_versions(be), "precision": precision, "device": device,
            "quantization": spec.quantization if precision == "int8" else None, **device_facts(device),
            "triton": form, **({"triton_parameters": dict(parameters)} if parameters else {})}


def _kept_triton(final: Path, be) -> tuple[str, dict[str, str]] | None:
    """The Triton form and parameters the artifact at `final` records, where they are ones this
    backend's export can write; None where there is none (or its manifest does not say)."""
    try:
        record = json.loads((final / MANIFEST).read_text()).get("triton")
        return triton_form(be.triton, record["form"]), check_parameters(record.get("parameters"))
    except (OSError, ValueError, RecursionError, AttributeError, KeyError, TypeError, ZooError):
        return None


#: the model configuration parameters Triton's Python backend itself reads (its README:
#: "Using Custom Python Execution Environments", "Input Tensor Device Placement")
PYTHON_BACKEND_PARAMETERS = ("EXECUTION_ENV_PATH", "FORCE_CPU_ONLY_INPUT_TENSORS")


def _triton_settings(be, triton: str | None, triton_parameters: Mapping[str, str] | None) -> tuple[str, dict]:
    """The Triton form and config.pbtxt parameters of the export. In the python form, both
    servers run zoo's runner: a parameter it does not read is read by no one, so it is refused
    rather than written (the native form's may be Triton's backend's)."""
    form, parameters = triton_form(be.triton, triton), check_parameters(triton_parameters)
    unread = sorted(set(parameters) - set(be.parameters) - set(PYTHON_BACKEND_PARAMETERS))
    if form == "python" and unread:
        raise UsageError(f"config.pbtxt parameter {', '.join(unread)}: in the python form neither backend {be.name}'s "
                         f"runner (it reads {', '.join(be.parameters) or 'none'}) nor Triton's Python backend (it "
                         f"reads {', '.join(PYTHON_BACKEND_PARAMETERS)}) reads it")
    return form, parameters


def _check_served(be, load_arguments: tuple, parameters: Mapping[str, str], vector_sets) -> None:
    """With `parameters` in its configuration, the runner a server loads (`for_serving`)
    reproduces the test vectors too: a value its backend refuses is refused here, at export."""
    if not parameters:
        return
    unread = sorted(set(parameters) - set(be.parameters))
    if unread:
        log.warning("backend %s does not read the config.pbtxt parameters %s when zoo serves the artifact (it reads "
                    "%s); Triton's own backend for the engine may", be.name, ", ".join(unread),
                    ", ".join(be.parameters) or "none")
    with for_serving(parameters):
        served = be.load(*load_arguments)
    spec, precision = load_arguments[1:3]
    vectors.check(spec, served, vector_sets, precision)


@contextmanager
def _replacing(final: Path, resign: bool):
    """`atomic_directory(final)`, then a warning where it replaced a signed artifact: the
    signature went with it (unless `resign`)."""
    unsigned_now = (final / SIGNATURE).is_file() and not resign
    with atomic_directory(final) as tmp:
        yield tmp
    if unsigned_now:
        log.warning("%s: the previous signature was removed; re-sign with --sign KEY or zoo sign", final.name)


def _checked(model: str | ModelSpec, repository: str | Path, threads: int | None) -> tuple[ModelSpec, int | None]:
    """`model`'s spec and `threads`, after the checks of `export`'s arguments that need
    no work: a model that is neither a name nor a spec, a repository where a file is (or
    under one), a thread count that is not a positive int."""
    from .fsutil import check_destination

    if not isinstance(model, (str, ModelSpec)):
        raise UsageError(f"model is a registered name or a zoo.ModelSpec, not {model!r}")
    if not isinstance(repository, (str, Path)) or not str(repository).strip():
        raise UsageError(f"repository must name a directory, not {repository!r}")  # "": the current one, unsaid
    repository = Path(repository)
    existing = next((p for p in (repository, *repository.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UsageError(f"repository {repository}: {existing} is a file, not a directory")
    check_destination(repository, "repository")  # one this user cannot write, before the export's work
    return get_model(model), check_threads(threads)


def _quantized(spec: ModelSpec, precision: str, quantization: str | None) -> ModelSpec:
    """`spec` with the int8 method this export uses."""
    if quantization is None:
        return spec
    if precision != "int8":
        raise UnsupportedError(f"--quantization {quantization} applies to int8 exports, not {precision}")
    if quantization not in QUANTIZATIONS:
        raise UnsupportedError(f"unknown quantization {quantization!r}; choose {' or '.join(QUANTIZATIONS)}")
    spec.tolerance(precision)  # a model that offers no int8: said as such, before its method is changed
    return replace(spec, quantization=quantization)


def _differences(recorded: Mapping[str, Any], wanted: Mapping[str, Any]) -> str:
    """What an existing artifact was built from that this export is not, in words."""
    said = []
    for key in wanted:
        old, new = recorded.get(key), wanted[key]
        if old == new:
            continue
        if key == "weights_sha256":
            said.append("other weights")
        elif key == "versions":
            old, new = old or {}, new or {}
            said.append("other library versions (" + ", ".join(
                f"{lib} {old.get(lib)} -> {new.get(lib)}" for lib in sorted({*old, *new})
                if old.get(lib) != new.get(lib)) + ")")
        elif key == "triton":
            said.append(f"Triton's {old} form (this export writes the {new} form, in its place)")
        else:
            said.append(f"{key} {old!r} (now {new!r})")
    return "; ".join(said) or "another record"


def _reusable(final: Path, provenance: Mapping[str, Any], described: Mapping[str, Any], spec: ModelSpec,
              reference) -> Artifact | None:
    """The existing artifact if it was built from exactly this model, else None (and why,
    logged). The same weights, configuration, backend, versions, precision and device;
    the same signature and model record (a changed spec: axes, shapes, tolerances); and the
    same outputs: the module now registered, run on the artifact's test vectors, gives
    the outputs stored there (a changed forward with unchanged weights)."""
    if not final.exists():
        return None
    try:
        art = Artifact.open(final)
    except ArtifactError as exc:
        log.warning("rebuilding %s: %s", final.name, exc)
        return None
    m = art.manifest
    recorded = {"weights_sha256": m["weights"]["sha256"], "config": m["model"].get("config"),
                "backend": m["backend"]["name"], "versions": m["backend"].get("versions"),
                "precision": m["precision"], "device": m["device"], "quantization": m.get("quantization"),
                "device_name": m.get("device_name"),
                "compute_capability": m.get("compute_capability"),
                "triton": (m.get("triton") or {}).get("form"),
                **({"triton_parameters": m["triton"]["parameters"]} if (m.get("triton") or {}).get("parameters")
                   else {})}
    if "test_data" not in m:  # artifacts from before test vectors: rebuilt
        return None
    if recorded != dict(provenance):
        log.warning("rebuilding %s, exported before with %s", final.name, _differences(recorded, provenance))
        return None

    def plain(record: Mapping[str, Any]) -> Any:  # as JSON holds it; where the plugin came from aside
        return json.loads(json.dumps({k: v for k, v in record.items() if k != "origin"}))

    if m.get("signature") != plain(described["signature"]) or plain(m["model"]) != plain(described["model"]):
        log.warning("rebuilding %s: the model's spec changed since it was exported", final.name)
        return None
    try:
        vectors.check(spec, reference, vectors.read(art), "fp32")
    except ZooError as exc:  # a VerificationError, or unreadable vectors
        log.warning("rebuilding %s: the model no longer computes what the artifact stores (%s)", final.name,
                    first_line(str(exc)))
        return None
    return art


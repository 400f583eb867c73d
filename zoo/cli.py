"""The `zoo` command. Every user-facing failure is a `ZooError`, printed as one line
on stderr with a non-zero exit; a traceback is shown only with ZOO_DEBUG=1."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.markup import escape

from . import registry
from .backend import Availability, library_versions
from .cli_common import JSON, REPOSITORY, _artifact_path, _emit_json, _table, app, err, given_options, out
from .errors import (PluginError, Terminated, UnknownModelError, UsageError, ZooError, debugging, raise_on_sigterm,
                     was_terminated)
from .fsutil import check_destination


def _version(value: bool) -> None:
    if value:
        from .version import __version__

        print(f"zoo {__version__}")
        raise typer.Exit()


@app.callback()
def _plugins(plugin: List[Path] = typer.Option([], "--plugin", help="Load a local plugin file (repeatable)."),
             version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                          help="Print zoo's version and exit.")) -> None:
    for file in plugin:  # a path typed on this command line that names no file is a typo: exit 2, before any work
        path = file.expanduser()
        if path.suffix != ".py" or not path.is_file():
            raise UsageError(f"--plugin {file}: {'not a .py file' if path.exists() else 'no such file'}"
                             f"; a plugin file is a Python module (README.md, \"Writing a model plugin\")")
    for file in plugin:
        registry.load_plugin_file(file, warn=True)  # one that fails to import must not hide the others


class _WarningLine(logging.Handler):
    """A plugin left out of the registry: one line on stderr, as an error is, and the command goes on."""

    def emit(self, record: logging.LogRecord) -> None:
        err.print(f"[yellow]warning:[/yellow] {escape(record.getMessage())}", highlight=False)


def _config(pairs: list[str]) -> dict[str, Any]:
    """KEY=VALUE pairs; values are JSON where they parse (64, 0.5, true), else strings."""
    config: dict[str, Any] = {}
    for key, value in _strings(pairs, "--config").items():
        try:
            config[key] = json.loads(value)
        except ValueError:
            config[key] = value
    return config


def _strings(pairs: list[str], flag: str) -> dict[str, str]:
    """KEY=VALUE pairs, values as given (a usage error for a pair without a key)."""
    found: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} takes KEY=VALUE, got {pair[:80]!r}")
        found[key] = value
    return found


def _signature(spec) -> str:
    return ", ".join(f"{t.name}[{','.join(map(str, t.shape))}]" for t in spec.inputs)


@app.command("list")
def list_(pattern: Optional[str] = typer.Argument(None, help="Wildcard filter, e.g. 'resnet*'."), as_json: bool = JSON):
    """Every registered model: name, domain, task, inputs, plugin (`zoo info` counts parameters)."""
    # Specs only: building every model would make one plugin's missing library, or a
    # large model's build time, every listing's problem.
    specs = [registry.get_model(n) for n in registry.list_models(pattern)]
    if pattern and not specs:  # nothing to list is a name that names no model: a usage error, as elsewhere
        if not any(c in pattern for c in "*?["):
            registry.get_model(pattern)  # unknown: its error names the close matches
        raise UnknownModelError(f"no model matches {pattern!r}; `zoo list` shows the models")
    rows = [{"name": s.name, "domain": s.domain, "task": s.task,
             "inputs": [t.to_json() for t in s.inputs], "plugin": s.plugin} for s in specs]
    if as_json:
        return _emit_json(rows)
    _table(["model", "domain", "task", "inputs", "plugin"],
           [[r["name"], r["domain"], r["task"], _signature(s), r["plugin"]] for r, s in zip(rows, specs)])


def _params(spec) -> int:
    from .checkpoint import built  # the plugin's build: a failure says whose model, not where

    return sum(p.numel() for p in built(spec).parameters())


@app.command()
def info(model: str, as_json: bool = JSON):
    """The full spec of MODEL: signature, dataset, recipe, metric, tolerances, parameters."""
    spec = registry.get_model(model)
    data = {**spec.to_json(), "parameters": _params(spec)}
    if as_json:
        return _emit_json(data)
    for key, value in data.items():
        out.print(f"[bold]{key}[/bold]: {json.dumps(value) if isinstance(value, (dict, list)) else value}")


@app.command()
def backends(device: Optional[str] = typer.Option(None, help="Only this device: cpu or cuda."), as_json: bool = JSON):
    """Every backend plugin: can it run here, library versions, devices, precisions; if not, why."""
    known = sorted({dev for be in registry.backends().values() for dev in be.devices})
    if device is not None and device not in known:  # "gpu", "cuda:0", "": a device no backend offers
        raise UsageError(f"--device: unknown {device!r}; the backends offer {', '.join(known)}")
    rows = []
    for be in registry.backends().values():
        try:  # a third-party backend's versions() or probe that raises must not take the listing down
            versions, broken = library_versions(be), None
        except PluginError as exc:
            versions, broken = {}, str(exc)
        for dev in [device] if device else list(be.devices):
            if dev not in be.precisions:
                rows.append({"backend": be.name, "device": dev, "available": False, "precisions": [],
                             "versions": versions, "reason": f"does not run on {dev}"})
                continue
            probe = Availability(False, broken) if broken else registry.probe(be, dev)
            rows.append({"backend": be.name, "device": dev, "available": probe.ok,
                         "precisions": list(be.precisions[dev]), "versions": versions, "reason": probe.reason})
    if as_json:
        return _emit_json(rows)
    _table(["backend", "device", "available", "precisions", "versions", "reason"],
           [[r["backend"], r["device"], "yes" if r["available"] else "no", ",".join(r["precisions"]),
             " ".join(f"{k} {v}" for k, v in r["versions"].items()) or "-", r["reason"]] for r in rows])


@app.command()
def train(model: str, out_dir: Optional[Path] = typer.Option(None, "--out", help="Run directory (default checkpoints/MODEL)."),
          seed: Optional[int] = None, epochs: Optional[int] = None, device: str = "cpu",
          config: List[str] = typer.Option([], "--config", "-c", help="Architecture/data config KEY=VALUE "
                                           "(repeatable), e.g. split=scaffold; needs --out."),
          precision: str = typer.Option("fp32", help="fp32 | bf16 (autocast; CPU with AVX512-BF16/AMX, or CUDA) "
                                        "| fp16 (autocast + gradient scaling; CUDA)."),
          batch_size: Optional[int] = typer.Option(None, help="Global batch size (default: the recipe's)."),
          accumulate: int = typer.Option(1, help="Micro-batches per optimizer step (gradient accumulation)."),
          clip_grad_norm: Optional[float] = typer.Option(None, help="Clip the global gradient norm."),
          grad_checkpointing: bool = typer.Option(False, help="Recompute activations in backward (saves memory)."),
          channels_last: Optional[bool] = typer.Option(None, "--channels-last/--no-channels-last",
                                                       help="NHWC for conv models (default: the recipe's, "
                                                       "else on with autocast)."),
          compile_: bool = typer.Option(False, "--compile", help="torch.compile the training module."),
          val_fraction: Optional[float] = typer.Option(None, help="Training examples held out for validation "
                                                       "(default: the recipe's)."),
          patience: Optional[int] = typer.Option(None, help="Early stopping: epochs without a better validation metric."),
          max_steps: Optional[int] = typer.Option(None, help="Stop after this many optimizer steps."),
          resume: bool = typer.Option(False, help="Continue the run in --out from its last epoch."),
          profile: bool = typer.Option(False, help="Write a torch.profiler Chrome trace of a few steps to OUT/trace.json."),
          tensorboard: bool = typer.Option(True, help="Write TensorBoard event files to OUT/tensorboard."),
          threads: Optional[int] = typer.Option(None, help="Intra-op threads per process."),
          nproc: Optional[int] = typer.Option(None, help="Run N processes on this host under torchrun (DDP).")):
    """Train MODEL by its recipe; writes the run directory checkpoints/MODEL (safetensors + JSON)."""
    from .training.options import TrainOptions, check_usage  # no PyTorch: usage errors answer at once

    overrides = _config(config)
    if overrides and out_dir is None:
        raise UsageError("a non-default --config needs --out DIR, so checkpoints/MODEL keeps the default model")
    options = TrainOptions(precision=precision, batch_size=batch_size, accumulate=accumulate,
                           clip_grad_norm=clip_grad_norm, grad_checkpointing=grad_checkpointing,
                           channels_last=channels_last, compile=compile_, val_fraction=val_fraction,
                           patience=patience, max_steps=max_steps, resume=resume, profile=profile, tensorboard=tensorboard, threads=threads)
    spec = registry.get_model(model)
    unknown = sorted(set(overrides) - set(spec.config))
    if unknown:
        raise UsageError(f"model {spec.name}: unknown config {unknown}; known: {sorted(spec.config)}")
    spec = registry.get_model(model, **overrides) if overrides else spec
    check_usage(spec, options, epochs, seed)
    from .checkpoint import default_path
    from .train import train as run
    from .training.distributed import LAUNCHED, PROGRESS_ON_STDOUT
    from .training.state import interrupted

    say_interrupted = lambda: err.print(interrupted(out_dir or default_path(spec.name), sys.argv[1:]),  # noqa: E731
                                        highlight=False, soft_wrap=True)
    if nproc is not None:
        _train_under_torchrun(spec, options, out_dir or default_path(spec.name), nproc, device, say_interrupted)
        return
    train_log = logging.getLogger("zoo.train")  # a missed target: one warning line, as the plugins' are
    if not any(isinstance(h, _WarningLine) for h in train_log.handlers):
        train_log.addHandler(_WarningLine())
        train_log.propagate = False
    try:
        ckpt = run(spec, out=out_dir, seed=seed, epochs=epochs, device=device, options=options,
                   progress=sys.stderr.isatty() or bool(os.environ.get(PROGRESS_ON_STDOUT)))
    except KeyboardInterrupt:
        if os.environ.get("RANK", "0") == "0" and not os.environ.get(LAUNCHED):  # said once, by the launcher
            say_interrupted()
        raise
    if ckpt.path is None:  # not rank 0 of a distributed run
        return
    out.print(f"checkpoint {ckpt.path}: " + ", ".join(  # one line, however long (a script reads it)
        f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in ckpt.metrics.items()
        if not isinstance(v, (list, dict))), soft_wrap=True, highlight=False)


def _train_under_torchrun(spec, options, run_dir: Path, nproc: int, device: str, say_interrupted) -> None:
    """`zoo train --nproc N`: what every process would refuse refused once, then the same
    command under torchrun; a finished run set aside for it is put back if it fails or is
    stopped before its first checkpoint."""
    from .training.distributed import check_launch, launch
    from .training.run import restore_set_aside

    options.check_device(device)
    check_launch(spec, options, run_dir, nproc)
    try:
        code, shown = launch(nproc, _without_option(sys.argv[1:], "--nproc"))
    except BaseException as exc:
        restore_set_aside(run_dir)
        if isinstance(exc, KeyboardInterrupt):
            say_interrupted()
        raise
    if code:
        restore_set_aside(run_dir)
    if code in (128 + signal.SIGINT, 128 + signal.SIGTERM):  # torchrun alone got it, and stopped the run
        say_interrupted()
        raise typer.Exit(code)
    if code and shown:  # the processes said why
        raise typer.Exit(code)
    if code:
        raise ZooError(f"torchrun exited with status {code}")


def _without_option(argv: list[str], name: str) -> list[str]:
    """argv without `name VALUE` / `name=VALUE` (to re-run a command under torchrun)."""
    result, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            result.append(arg)
    return result


@app.command()
def check(model: str, config: List[str] = typer.Option([], "--config", "-c", help="Architecture config KEY=VALUE "
                                                       "(repeatable), e.g. width=8."),
          precision: str = typer.Option("fp32", help="The precision whose tolerance the magnitude warning uses."),
          device: str = "cpu",
          checkpoint: Optional[Path] = typer.Option(None, help="Checkpoint directory (default checkpoints/MODEL "
                                                    "where it exists, else random init)."),
          random_init: bool = typer.Option(False, help="Check untrained weights even where a checkpoint exists."),
          as_json: bool = JSON):
    """Check MODEL against its spec as `zoo export` relies on it: samples, forward, output names, dtypes, shapes.

    Exits non-zero, with one line per problem, where `zoo export` would refuse."""
    from .check import check_model

    overrides = _config(config)
    spec = registry.get_model(model, **overrides)
    _check_check_choices(precision, device)
    if checkpoint is None and spec.config != registry.get_model(model).config:
        random_init = True  # checkpoints/MODEL holds the default config (`zoo train --config` needs --out)
    weights = _checkpoint_at_config(spec, overrides, checkpoint, random_init)
    report, source = check_model(spec, weights, random_init, precision, device)
    for warning in report.warnings:
        err.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False)
    if as_json:
        _emit_json({**report.to_json(), "weights": source})
    else:
        _table(["check", "batch", "result", "problems"],
               [[c.name, "" if c.batch is None else c.batch, "passed" if c.passed else "skipped" if c.skipped else "FAILED",
                 "\n".join(c.problems) or c.skipped] for c in report.checks],
               title=f"{spec.name} ({source}) against its spec")
        for note in report.notes:
            out.print(escape(note), highlight=False)
    report.raise_for_failures()
    if not as_json:
        out.print("[green]meets its spec[/green]")


def _check_check_choices(precision: str, device: str) -> None:
    """`zoo check`: a precision or device no export knows is a usage error (exit 2), as in
    `zoo export` and `zoo bench`; CUDA that this machine lacks, the machine's (exit 1)."""
    from .bench.matrix import check_names

    check_names([precision], [device])
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ZooError(f"--device {device}: CUDA is not available here (torch.cuda.is_available() is False); "
                           "check on cpu")


def _checkpoint_at_config(spec, overrides: dict[str, Any], checkpoint: Optional[Path], random_init: bool):
    """The checkpoint `zoo check` loads, read once (None: the default, or no checkpoint); a usage
    error where a `-c` override disagrees with the config it was trained at: its weights would
    build the checkpoint's model, and the check would pass for a model other than the one named."""
    if checkpoint is None or not overrides:
        return checkpoint
    from .export import at_checkpoint_config

    _, loaded = at_checkpoint_config(spec, checkpoint, random_init)
    trained = loaded.config if loaded is not None else {}
    differ = [k for k in overrides if k in trained and trained[k] != spec.config.get(k)]
    if differ:
        raise UsageError(f"--config {', '.join(f'{k}={spec.config.get(k)!r}' for k in differ)} disagrees with "
                         f"--checkpoint {checkpoint}, trained with {', '.join(f'{k}={trained[k]!r}' for k in differ)}: "
                         "drop --config to check the checkpoint's model, or check that config with --random-init "
                         "instead of --checkpoint")
    return loaded if loaded is not None else checkpoint


@app.command()
def export(model: str, backend: str = typer.Option(..., "--backend", "-b"),
           precision: str = "fp32", device: str = "cpu", repository: Path = REPOSITORY,
           checkpoint: Optional[Path] = typer.Option(None, help="Checkpoint directory (default checkpoints/MODEL)."),
           random_init: bool = typer.Option(False, help="Export untrained weights (for benchmarking)."),
           force: bool = typer.Option(False, help="Rebuild even if an identical artifact exists."),
           quantization: Optional[str] = typer.Option(
               None, help="int8 method, overriding the model's: static (calibrated Q/DQ, for CNNs) or dynamic "
                          "(int8 MatMul weights, for transformers, RNNs, MLPs)."),
           triton: Optional[str] = typer.Option(
               None, help="Triton form of the repository files: native (the engine's own Triton backend) or "
                          "python (Triton's Python backend runs the artifact through zoo's runner). Default: "
                          "native where Triton has a backend for the engine, else python."),
           triton_parameter: List[str] = typer.Option(
               [], help="KEY=VALUE, repeatable: a parameter of config.pbtxt that the backend honours when "
                          "served (by zoo serve or Triton), as Triton's backend for the engine documents it, "
                          "e.g. enable_mem_arena=0 for ONNX Runtime (docs/serving.md, Memory)."),
           sign_key: Optional[Path] = typer.Option(None, "--sign", help="Sign the artifact with this elliptic-curve "
                                                   "private key (PEM), as `zoo sign` does."),
           password_env: Optional[str] = typer.Option(None, help="With --sign: the environment variable holding an "
                                                      "encrypted key's password (without it, a terminal prompts).")):
    """Export MODEL through BACKEND, verify it against PyTorch, write the artifact.

    An int8 artifact is refused when its task metric (or domain check) falls further
    below PyTorch fp32's than the model's int8 tolerance allows."""
    if password_env is not None and sign_key is None:
        raise UsageError("--password-env goes with --sign: it unlocks the signing key")
    _check_export_choices(backend, precision, device, quantization, triton)
    parameters = _strings(triton_parameter, "--triton-parameter")
    check_destination(repository, "--repository")  # before the export, not at its final rename
    password = None
    if sign_key is not None:  # the key, and its password, before an export that may replace a signed artifact
        from .signing import usable_private_key

        password = _key_password(sign_key, password_env, "--sign")
        usable_private_key(sign_key, password)
    from .export import export as run  # imports torch: after the usage errors, which are answered at once

    art = run(model, backend, precision, device, repository, checkpoint=checkpoint, random_init=random_init,
              force=force, quantization=quantization, triton=triton, resign=sign_key is not None,
              triton_parameters=parameters)
    if sign_key is not None:
        from .signing import sign as sign_artifact

        out.print(escape(f"signed: key {sign_artifact(art.path, sign_key, password=password)['key']}"))
    parity = art.manifest["parity"]
    method = art.manifest.get("quantization")
    out.print(f"{art.path}{f' ({method} int8)' if method else ''}: max |error| vs PyTorch fp32 "
              f"{parity['max_abs_error']:.3g} (tolerance atol {parity['tolerance']['atol']:g}, "
              f"rtol {parity['tolerance']['rtol']:g})")
    relative = sorted({c["output"] for c in parity["checks"] if c.get("relative")})
    if relative:
        out.print(f"held to a tenth of their magnitude, being under 10x the atol: {', '.join(relative)}")
    for note in parity.get("notes", []):  # a model without a batch axis
        out.print(escape(note), highlight=False)
    if art.manifest.get("metric"):
        m = art.manifest["metric"]
        allowed = f", allowed worsening {m['allowed_drop']:g}" if m.get("allowed_drop") is not None else ""
        out.print(f"{m['name']}: {m['artifact']:.4f} (PyTorch fp32 {m['reference']:.4f}, "
                  f"change {m['delta']:+.4f}{allowed})")
    if art.manifest.get("domain"):
        facts = {k: v for k, v in art.manifest["domain"].items() if isinstance(v, (int, float, str))}
        out.print("domain check: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                               for k, v in facts.items()))


def _check_export_choices(backend: str, precision: str, device: str, quantization: Optional[str],
                          triton: Optional[str]) -> None:
    """Refuse a name no export knows (backend, precision, device, int8 method, Triton form) as a
    usage error, exit 2, as `zoo bench` and `zoo optimize` do; a known one that this backend or
    machine does not offer stays the library's own error (exit 1)."""
    from .bench.matrix import check_names
    from .spec import QUANTIZATIONS
    from .triton import FORMS

    registry.known_backend(backend, "--backend")
    check_names([precision], [device])
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise UsageError(f"--quantization: unknown {quantization!r}; choose {' or '.join(QUANTIZATIONS)}")
    if quantization is not None and precision != "int8":
        raise UsageError(f"--quantization {quantization} applies to int8 exports, not {precision}")
    if triton is not None and triton not in FORMS:
        raise UsageError(f"--triton: unknown {triton!r}; choose {' or '.join(FORMS)}")


@app.command()
def verify(artifact: str = typer.Argument(..., help="Artifact directory, or its name in the repository."),
           repository: Path = REPOSITORY, threads: Optional[int] = None,
           public_key: Optional[Path] = typer.Option(None, help="A PEM public key: the artifact must carry a "
                                                     "signature (`zoo sign`) that this key verifies."),
           as_json: bool = JSON):
    """Re-check ARTIFACT: its signature (with --public-key), file hashes, parity with PyTorch,
    its test vectors, and the task metric.

    Without the plugin that defined its model, the stored test vectors are the reference,
    and the task metric and domain check are reported as skipped."""
    from .signing import signed, signer, verify_signature
    from .verify import verify_artifact

    path = _one_artifact(artifact, repository, "verify")
    if public_key is not None:
        signature = verify_signature(path, public_key)
    else:
        signature = {"signed": signed(path), "verified": False}
        if signature["signed"]:  # the key the signature names, unchecked without the public key
            signature.update(key=signer(path), skipped="give --public-key to check the signature")
    report = {**verify_artifact(path, threads=threads), "signature": signature}
    if as_json:
        return _emit_json(report)
    _table(["batch", "output", "max |error|", "passed"],
           [["no batch axis" if c["batch"] is None else c["batch"], c["output"], f"{c['max_abs_error']:.3g}",
             c["passed"]] for c in report["parity"]["checks"]],
           title=f"{report['artifact']}: parity vs {report['reference']}")
    vectors = report.get("test_vectors") or {}
    if vectors:
        out.print(escape(f"test vectors: skipped: {vectors['skipped']}" if "skipped" in vectors else
                         f"test vectors: {vectors['sets']} sets reproduce, max |error| {vectors['max_abs_error']:.3g}"))
    for name, key in (("domain check", "domain"), ("metric", "metric")):
        if "skipped" in (report.get(key) or {}):
            out.print(escape(f"{name}: skipped: {report[key]['skipped']}"))
    for key, value in (report.get("domain") or {}).items():
        if key != "skipped":
            out.print(f"{key}: {value:.6g}" if isinstance(value, float) else f"{key}: {value}")
    if "name" in report.get("metric", {}):
        m = report["metric"]
        out.print(f"{m['name']}: {m['artifact']:.4f} (PyTorch {m['reference']:.4f}, change {m['delta']:+.4f})")
    if signature.get("verified"):
        out.print(escape(f"signature: verified, signed by key {signature['key']}"))
    elif signature["signed"]:
        out.print(escape(f"signature: present, by key {signature['key'] or '(not named)'}, not checked: "
                         f"{signature['skipped']}"))
    else:
        out.print("signature: none")
    out.print("[green]verified[/green]")


@app.command()
def sign(artifact: str = typer.Argument(..., help="Artifact directory, or its name in the repository."),
         key: Path = typer.Option(..., "--key", help="An elliptic-curve private key (P-256, P-384 or P-521), PEM "
                                  "(e.g. `openssl ecparam -name prime256v1 -genkey -noout -out key.pem`)."),
         password_env: Optional[str] = typer.Option(None, help="The environment variable holding an encrypted "
                                                    "key's password (without it, a terminal prompts for it)."),
         repository: Path = REPOSITORY, as_json: bool = JSON):
    """Sign ARTIFACT (every file, the manifest included) with OpenSSF model-signing; writes ARTIFACT/model.sig.

    `zoo verify ARTIFACT --public-key PUB.pem` and `zoo serve --require-signature PUB.pem` check it."""
    from .signing import sign as run

    result = run(_one_artifact(artifact, repository, "sign"), key, password=_key_password(key, password_env))
    _emit_json(result) if as_json else out.print(escape(f"signed {artifact}: key {result['key']}"))


def _one_artifact(artifact: str, repository: Path, verb: str) -> Path:
    """ARTIFACT's directory; a model repository given in its place is refused naming what it holds
    (a signature covers one artifact, and `zoo verify` checks one)."""
    from .artifact import MANIFEST, list_artifacts

    path = _artifact_path(artifact, repository)
    held = [] if path.is_symlink() or (path / MANIFEST).exists() else list_artifacts(path)
    if held:
        raise UsageError(f"{artifact} is a model repository ({len(held)} artifact{'s' * (len(held) != 1)}), not an "
                         f"artifact: {verb} each artifact directory, e.g. `zoo {verb} {path / held[0].name}`")
    return path


def _key_password(key: Path, env: Optional[str], option: str = "--key") -> str | None:
    """An encrypted key's password: from the variable --password-env names, else a hidden prompt at a
    terminal. Never an option's value, which shell history and `ps` would show."""
    from .signing import encrypted

    if env is not None:
        if env not in os.environ:
            raise ZooError(f"--password-env {env}: no such environment variable is set")
        return os.environ[env]
    try:
        locked = encrypted(key.read_bytes())
    except OSError:
        return None  # `sign` names the unreadable file
    if not locked:
        return None
    if not sys.stdin.isatty():
        raise ZooError(f"{option} {key} is encrypted: name the environment variable holding its password with "
                       f"--password-env, or run at a terminal to be prompted for it")
    return typer.prompt(f"password for {key}", hide_input=True)


ARTIFACT = typer.Option(None, "--artifact", "-a", help="Run this artifact (directory or name in the repository) "
                        "instead of the PyTorch module.")


DEVICE = typer.Option(None, "--device", help="cpu or cuda[:N] (default: an artifact's own device; cpu for the "
                      "PyTorch module).")


def _predictor(model: Optional[str], artifact: Optional[str], repository: Path, checkpoint: Optional[Path],
               device: Optional[str]):
    from .checkpoint import default_path, missing
    from .predict import predictor

    if artifact is None and checkpoint is None and model is not None:
        spec = registry.get_model(model)
        # said here, not by the exporter's message: these commands have no --random-init
        if spec.trainable and not default_path(spec.name).exists():
            raise missing(spec.name, f"run untrained weights with --artifact NAME after `zoo export {spec.name} "
                                     f"-b onnxruntime --random-init`")
    path = _artifact_path(artifact, repository) if artifact else None
    return predictor(model, path, checkpoint, device=device)


@app.command()
def predict(model: str = typer.Argument(..., help="Model name (or '-' with --artifact)."),
            items: List[str] = typer.Argument(None, help="Domain-native inputs of the kind the model takes (`zoo info` "
                                              "says which): text items as given, binary ones (images, ...) as "
                                              "file paths."),
            text: List[str] = typer.Option([], "--text", help="A text input (repeatable); as an item, checked to "
                                           "be the model's kind."),
            smiles: List[str] = typer.Option([], "--smiles", help="A SMILES string (repeatable)."),
            image: List[str] = typer.Option([], "--image", help="A PNG or JPEG file (repeatable)."),
            tensor: List[str] = typer.Option([], "--tensor", help="NAME=FILE.npy: the model's input NAME from a "
                                             "NumPy file (repeatable; one per input), for models that take "
                                             "tensors. Outputs print as arrays, or go to --out."),
            out_dir: Optional[Path] = typer.Option(None, "--out", help="With --tensor: write each output to "
                                                   "DIR/NAME.npy instead of printing it."),
            artifact: Optional[str] = ARTIFACT, repository: Path = REPOSITORY,
            checkpoint: Optional[Path] = typer.Option(None, help="Checkpoint directory (default checkpoints/MODEL)."),
            url: Optional[str] = typer.Option(None, help="Send the inputs to a server at this URL instead; MODEL "
                                              "is the served model's name. --tensor inputs go to `zoo serve` or "
                                              "Triton alike; --image, --text and --smiles only to zoo serve, which "
                                              "advertises domain-native inputs in its model metadata (Triton does "
                                              "not)."),
            device: Optional[str] = DEVICE, as_json: bool = JSON):
    """Run MODEL on domain-native inputs and print domain outputs (labels, embeddings, properties)."""
    from .errors import InputError
    from .predict import predict as run

    given = {"text": text, "smiles": smiles, "image": image}
    if tensor or out_dir is not None:
        if not tensor:
            raise UsageError("--out writes the outputs of --tensor inputs; give the inputs with --tensor NAME=FILE.npy")
        if items or text or smiles or image:
            raise UsageError("--tensor gives a model's tensors; domain-native items (--text, --image, ...) go "
                             "without it")
        return _predict_tensors(model, _strings(tensor, "--tensor"), out_dir, url, artifact, repository,
                                checkpoint, device, as_json)
    if url is not None:
        from .client import Client

        local = [name for name, value in (("--artifact", artifact), ("--checkpoint", checkpoint),
                                          ("--device", device),
                                          ("--repository", None if repository == Path("exports") else repository))
                 if value is not None]
        if local:
            raise UsageError(f"{', '.join(local)} {'chooses' if len(local) == 1 else 'choose'} what runs here; "
                             "with --url the server runs its own model")

        client = Client(url)
        kind, binary = client.raw_kind(model), client.raw_binary(model)
        if kind is None:  # a tensors-only model, or a server that does not say (Triton)
            raise InputError(client.no_domain_native(model))
        name, source = model, f"server {url}"
        fn = lambda raw: client.predict(model, raw)  # noqa: E731
    else:
        spec, fn_, source = _predictor(None if model == "-" else model, artifact, repository, checkpoint, device)
        kind, binary, name = spec.raw_kind, spec.raw_binary, spec.name
        fn = lambda raw: run(spec, fn_, raw, names=labels if binary else None)  # noqa: E731 - files: their paths
    for k, values in given.items():
        if values and k != kind:
            takes = f"{kind} inputs" if kind else "tensors only (--tensor NAME=FILE.npy)"
            raise UsageError(f"model {name} takes {takes}, not --{k}")
    raw: list = list(given.get(kind or "", [])) + list(items or [])
    labels = [str(item) for item in raw]  # a file's result is labelled by its path, as given
    if binary:
        raw = [_read_file(Path(p)) for p in raw]
    results = fn(raw)
    if as_json:
        return _emit_json({"model": name, "source": source, "results": results})
    for label, result in zip(labels, results):
        out.print(f"{escape(label)}: {escape(json.dumps(result))}", soft_wrap=True)


def _predict_tensors(model: str, files: dict[str, str], out_dir: Optional[Path], url: Optional[str],
                     artifact: Optional[str], repository: Path, checkpoint: Optional[Path], device: Optional[str],
                     as_json: bool) -> None:
    """`zoo predict --tensor NAME=FILE.npy ...`: the model's outputs for tensors read from
    NumPy files (never unpickled), here or on a server (--url)."""
    import numpy as np

    from .errors import InputError
    from .inputs import check_inputs

    arrays = {name: _read_array(Path(path), name) for name, path in files.items()}
    if url is not None:
        from .client import Client

        if artifact or checkpoint or device or repository != Path("exports"):
            raise UsageError("--artifact, --checkpoint, --device and --repository choose what runs here; with "
                             "--url the server runs its own model")
        outputs, source = Client(url).infer(model, arrays), f"server {url}"
    else:
        spec, fn, source = _predictor(None if model == "-" else model, artifact, repository, checkpoint, device)
        model = spec.name
        outputs = fn(check_inputs(arrays, spec, model))  # zoo.load's check, for the PyTorch module's call too
    outputs = {k: np.asarray(v) for k, v in outputs.items()}
    if out_dir is not None:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"--out {out_dir}: {exc.strerror or exc}") from None
        written = {}
        for name, value in outputs.items():
            if value.dtype == object:
                raise InputError(f"output {name!r} holds strings, which a .npy file keeps only pickled; leave "
                                 "--out out (or use --json)")
            path = out_dir / f"{name.replace('/', '_')}.npy"
            np.save(path, value, allow_pickle=False)
            written[name] = str(path)
        if as_json:
            return _emit_json({"model": model, "source": source, "outputs": written})
        for name, path in written.items():
            out.print(f"{escape(name)}: {escape(path)}", soft_wrap=True)
        return None
    if as_json:
        return _emit_json({"model": model, "source": source, "outputs": {
            name: {"dtype": str(v.dtype), "shape": list(v.shape), "data": v.tolist()} for name, v in outputs.items()}})
    for name, value in outputs.items():
        out.print(f"{escape(name)} {value.dtype} {list(value.shape)}:\n{escape(np.array2string(value, threshold=64))}",
                  soft_wrap=True)
    return None


def _read_array(path: Path, name: str):
    """A NumPy `.npy` file as an array; pickled object arrays are refused, never loaded."""
    import numpy as np

    from .errors import InputError

    if not path.is_file():
        raise InputError(f"--tensor {name}={path}: no such file")
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:
        why = ("it holds Python objects, which would be unpickled; save a numeric array (np.save of a "
               "numeric dtype)" if "allow_pickle" in str(exc) else f"not a NumPy .npy file ({exc})")
        raise InputError(f"--tensor {name}={path}: {why}") from None
    except OSError as exc:
        raise InputError(f"--tensor {name}={path}: {exc.strerror or exc}") from None


def _read_file(path: Path) -> bytes:
    from .errors import InputError

    if path.is_dir():
        raise InputError(f"input file {path} is a directory; give the files in it, as {path}/*")
    if not path.is_file():
        raise InputError(f"input file {path} does not exist")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InputError(f"input file {path} cannot be read: {exc.strerror}") from None


@app.command()
def generate(ctx: typer.Context, model: str, prompt: str = typer.Option(..., "--prompt", "-p"),
             max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", "-n", help="Tokens to add, "
                                                          "at most the model's context (its sequence axis maximum, "
                                                          "`zoo info`); default 100, or the context if shorter."),
             temperature: float = typer.Option(0.0, help="0: greedy; higher: more random sampling."),
             seed: int = typer.Option(0, help="The sampling's seed (with --temperature above 0)."), artifact: Optional[str] = ARTIFACT, repository: Path = REPOSITORY,
             checkpoint: Optional[Path] = typer.Option(None, help="Checkpoint directory (default checkpoints/MODEL)."),
             device: Optional[str] = DEVICE):
    """Continue PROMPT with a language model, greedily or by sampling at a temperature."""
    from .predict import generate as run

    if max_new_tokens is not None and max_new_tokens < 1:  # before the model is loaded
        raise UsageError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise UsageError(f"--temperature must be a finite number >= 0, got {temperature}")
    if temperature == 0 and "seed" in (p.name for p in given_options(ctx)):
        raise UsageError("--seed does nothing at --temperature 0: greedy decoding draws nothing; give a "
                         "--temperature above 0 to sample")
    spec, fn, _ = _predictor(model, artifact, repository, checkpoint, device)
    context = _context(spec)
    if max_new_tokens is None:
        max_new_tokens = min(100, context or 100)
    elif context is not None and max_new_tokens > context:
        # each token is a forward pass over up to `context` tokens: an unbounded -n runs for hours
        raise UsageError(f"--max-new-tokens must be from 1 to {context} ({spec.name}'s context), "
                         f"got {max_new_tokens}")
    print(prompt + run(spec, fn, prompt, max_new_tokens, temperature, seed))


def _context(spec) -> int | None:
    """A language model's context: its token input's sequence axis maximum (None for other models,
    which `zoo generate` refuses with its own reason)."""
    if spec.detokenize is None or spec.preprocess is None or len(spec.inputs) != 1:
        return None
    shape = spec.inputs[0].shape
    if len(shape) < 2:
        return None
    return spec.axes[shape[1]].max if isinstance(shape[1], str) else int(shape[1])


@app.command()
def serve(ctx: typer.Context,
          repository: Path = typer.Argument(Path("exports"), help="The model repository that `zoo export` writes."),
          host: str = typer.Option("127.0.0.1", help="Interface to bind; the default answers this machine only."),
          port: int = typer.Option(8000, help="HTTP port."),
          grpc_port: int = typer.Option(8001, help="gRPC port (Triton's GRPCInferenceService), on the same "
                                        "interface; 0 turns gRPC off."),
          shared_memory: str = typer.Option("none", help="`system`: let same-host clients pass tensors in POSIX "
                                            "shared memory regions they register (Triton's extension); `none`: "
                                            "off."),
          max_batch_size: Optional[int] = typer.Option(None, help="Rows per execution (default: config.pbtxt, "
                                                       "else the model's largest batch)."),
          max_queue_delay_ms: Optional[float] = typer.Option(None, help="How long a request may wait for others "
                                                             "to batch with (default: config.pbtxt, else 0: "
                                                             "Triton's default)."),
          preferred_batch_sizes: Optional[str] = typer.Option(None, help="Comma-separated batch sizes sent at once "
                                                              "(default: config.pbtxt)."),
          instances: Optional[int] = typer.Option(None, help="Concurrent executions per model (default: "
                                                  "config.pbtxt instance_group, else 1)."),
          max_queue_size: int = typer.Option(256, help="Requests that may wait per model; more get 503 at once."),
          no_batching: bool = typer.Option(False, "--no-batching", help="Run every request alone, as sent."),
          no_ragged: bool = typer.Option(False, "--no-ragged", help="Batch only requests of identical shapes "
                                         "(no zero-padding of sequence or atom axes)."),
          max_padding: str = typer.Option("0.25", help="A ragged batch runs as one execution per group of "
                                          "requests whose zero-padding stays within this fraction of their real "
                                          "elements; `none`: one execution per batch, however padded."),
          threads: Optional[int] = typer.Option(None, help="Intra-op threads per instance (default: cores / "
                                                "instances)."),
          max_request_size: int = typer.Option(64 << 20, help="Largest request body in bytes; larger get 413."),
          model_control: bool = typer.Option(False, "--model-control", help="Allow loading and unloading "
                                             "artifacts by name over /v2/repository/models/NAME/(un)load."),
          request_timeout: float = typer.Option(60.0, help="Seconds a request may wait for its model (then 503 "
                                                "\"request timeout expired\", as Triton answers)."),
          shutdown_timeout: float = typer.Option(30.0, help="Seconds in-flight requests get to finish on shutdown."),
          log_level: str = typer.Option("info", help="debug, info, warning, error or critical."),
          require_signature: Optional[Path] = typer.Option(
              None, help="A PEM public key: load only artifacts signed with its private key (`zoo sign`); "
                         "the others are listed as unloadable, with the reason.")):
    """Serve REPOSITORY over the Open Inference Protocol (v2, as Triton and KServe), with dynamic batching."""
    from .serve.app import Settings
    from .serve.repository import ServeOptions
    from .serve.server import run

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the server's graceful shutdown takes it (`serve.server`)
    if repository.exists() and not repository.is_dir():  # it is there: "export a model first" would mislead
        raise UsageError(f"REPOSITORY {repository} is a file, not a directory: give the directory `zoo export` "
                         "writes into (default exports)")
    if not repository.is_dir():
        raise ZooError(f"no model repository at {repository}: export a model first (`zoo export MODEL -b BACKEND`)")
    for name, value in {"--max-batch-size": max_batch_size, "--instances": instances, "--threads": threads,
                        "--max-queue-size": max_queue_size, "--max-request-size": max_request_size}.items():
        if value is not None and value < 1:
            raise UsageError(f"{name} must be at least 1, got {value}")
    _check_serve_times(max_queue_delay_ms, request_timeout, shutdown_timeout, log_level)
    preferred = _preferred(preferred_batch_sizes)
    padding = _max_padding(max_padding)
    _check_port_numbers(port, grpc_port)
    if shared_memory not in ("none", "system"):
        raise UsageError(f"--shared-memory is `system` or `none`, got {shared_memory!r} (CUDA shared memory is not "
                         "offered)")
    _refuse_unused_batching(ctx, no_batching, no_ragged)
    if require_signature is not None:
        from .signing import fingerprint

        try:
            # a bad key fails here, not once per artifact
            fingerprint(require_signature.read_bytes(), f"--require-signature key {require_signature}")
        except OSError as exc:
            raise UsageError(f"--require-signature: cannot read {require_signature}: {exc.strerror or exc}") from None
    if not model_control:  # the usage errors (exit 2) first, then what the machine says (1)
        _check_not_empty(repository)
    _check_ports(host, port, grpc_port)
    options = ServeOptions(max_batch_size=max_batch_size, max_queue_delay_ms=max_queue_delay_ms,
                           preferred_batch_sizes=preferred, instances=instances, max_queue_size=max_queue_size,
                           batching=not no_batching, ragged=not no_ragged, max_padding=padding, threads=threads,
                           require_signature=require_signature)
    run(Settings(repository, options, max_request_bytes=max_request_size, model_control=model_control,
                 request_timeout=request_timeout, shutdown_timeout=shutdown_timeout, host=host, grpc_port=grpc_port,
                 shared_memory=shared_memory == "system"),
        host=host, port=port, log_level=log_level.lower())


def _preferred(text: Optional[str]) -> Optional[tuple[int, ...]]:
    """--preferred-batch-sizes as batch sizes, each at least 1: `0,-1` and `1,,2` were taken
    (the batcher dropped what it could not use), `x` was an exit-1 error."""
    from .bench.options import items

    if text is None:
        return None
    sizes = items("--preferred-batch-sizes", text, "batch size", int)
    if min(sizes) < 1:
        raise UsageError(f"--preferred-batch-sizes: batch sizes are at least 1, got {min(sizes)}")
    return tuple(sizes)


#: `zoo serve --log-level`: the levels both uvicorn and the standard logging module know
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _check_serve_times(max_queue_delay_ms: Optional[float], request_timeout: float, shutdown_timeout: float,
                       log_level: str) -> None:
    """Refuse a time no request could be served under (a zero or negative --request-timeout
    times every request out; a NaN delay never batches) and a log level nothing knows, before
    the server starts."""
    for name, value, zero_ok in (("--max-queue-delay-ms", max_queue_delay_ms, True),
                                 ("--request-timeout", request_timeout, False),
                                 ("--shutdown-timeout", shutdown_timeout, True)):
        if value is not None and not (math.isfinite(value) and (value >= 0 if zero_ok else value > 0)):
            raise UsageError(f"{name} must be a finite number {'>= 0' if zero_ok else '> 0'}, got {value}")
    if log_level.lower() not in LOG_LEVELS:
        raise UsageError(f"--log-level: unknown {log_level!r}; choose from {', '.join(LOG_LEVELS)}")


def _refuse_unused_batching(ctx: typer.Context, no_batching: bool, no_ragged: bool) -> None:
    """Batching options that `--no-batching` or `--no-ragged` leave without effect are refused, not ignored."""
    given = {p.opts[0] for p in given_options(ctx)}
    for flag, on, unused in (("--no-batching", no_batching, ("--max-queue-delay-ms", "--preferred-batch-sizes",
                                                             "--max-batch-size", "--no-ragged", "--max-padding")),
                             ("--no-ragged", no_ragged, ("--max-padding",))):
        ignored = [o for o in unused if o in given]
        if on and ignored:
            raise UsageError(f"{', '.join(ignored)} {'does' if len(ignored) == 1 else 'do'} nothing with {flag}: "
                             f"{'every request runs alone' if flag == '--no-batching' else 'nothing is padded'}; "
                             f"leave {'it' if len(ignored) == 1 else 'them'} out")


def _check_port_numbers(port: int, grpc_port: int) -> None:
    if not 1 <= port <= 65535:  # uvicorn takes any int: 99999 would listen on 34463
        raise UsageError(f"--port must be a port from 1 to 65535, got {port}")
    if not 0 <= grpc_port <= 65535 or grpc_port and grpc_port == port:
        raise UsageError(f"--grpc-port must be 0 (off) or a port from 1 to 65535 other than --port, got {grpc_port}")


def _check_not_empty(repository: Path) -> None:
    """A repository with no artifact, served without model control, would serve nothing
    ever: said at once, as a missing one is, not by a server that stays unready."""
    from .serve.repository import MANIFEST, list_artifacts, not_artifacts

    if list_artifacts(repository):
        return
    others = not_artifacts(repository)
    listed = f" ({', '.join(others[:5])}{', ...' if len(others) > 5 else ''}: " \
             f"{'a directory' if len(others) == 1 else 'directories'} without {MANIFEST})" if others else ""
    raise ZooError(f"no artifact in the model repository {repository}{listed}: export a model into it first "
                   f"(`zoo export MODEL -b BACKEND -r {repository}`), or serve it with --model-control to load "
                   "artifacts exported there later")


def _check_ports(host: str, port: int, grpc_port: int) -> None:
    """Each port the server will listen on is free on `host` now, before any model loads
    (a port found taken after loading costs the loading, and uvicorn's or grpc's own words)."""
    import socket

    for option, number in (("--port", port), ("--grpc-port", grpc_port)):
        if not number:
            continue
        try:
            infos = socket.getaddrinfo(host, number, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise UsageError(f"--host {host}: not an address of this machine ({exc.strerror})") from None
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
            try:
                probe.bind(address)
            except OSError as exc:
                raise ZooError(f"cannot listen on {host}:{number} ({option}): {exc.strerror or exc}; another server "
                               f"may hold it: pass {option} PORT{' (0: no gRPC)' if option == '--grpc-port' else ''}"
                               ) from None


def _max_padding(value: str) -> float | None:
    """`--max-padding`: a fraction >= 0, or `none`."""
    if value.strip().lower() == "none":
        return None
    try:
        fraction = float(value)
    except ValueError:
        fraction = -1.0
    if not 0 <= fraction < float("inf"):
        raise UsageError(f"--max-padding is a fraction >= 0 (0.25: a quarter of the real elements) or `none`, "
                         f"got {value!r}")
    return fraction


@app.command()
def demo(repository: Path = REPOSITORY, min_time: float = typer.Option(0.5, help="Seconds of timed runs per point."),
         backends_: Optional[str] = typer.Option(None, "--backends", help="Backends to export and measure, "
                                                 "comma-separated, or `all` (default: every one that runs here "
                                                 "except those whose export compiles native code).")):
    """Train resnet8.digits, export it to the backends available here, verify and benchmark them."""
    from .demo import run

    from .cli_bench import print_bench

    from .bench.options import items

    # before the training: a bad value found after it costs the training
    from .registry import known_backend

    only = None if backends_ is None else items("--backends", backends_, "backend (or all)")
    for name in only or ():
        if name != "all":
            known_backend(name, "--backends")
    if not (math.isfinite(min_time) and min_time > 0):
        raise UsageError(f"--min-time must be a finite number > 0, got {min_time}")
    check_destination(repository, "--repository")
    print_bench(run(repository, min_time=min_time, console=out, only=only))


deploy_app = typer.Typer(no_args_is_help=True, help="Manifests that serve a repository past one machine.")
app.add_typer(deploy_app, name="deploy")


@deploy_app.command("kserve")
def deploy_kserve(repository: Path = typer.Argument(Path("exports"), help="The model repository `zoo export` wrote."),
                  storage_uri: str = typer.Option(..., help="Where the cluster reads the repository from: gs://, "
                                                  "s3://, pvc://, an Azure https:// URI ..., a copy of REPOSITORY; "
                                                  "or an https:// .tar.gz / .zip of it."),
                  name: Optional[str] = typer.Option(None, help="InferenceService name (default: from the "
                                                     "repository's directory name)."),
                  gpu: Optional[int] = typer.Option(None, "--gpu", help="GPUs for the Triton pod (default: 1 when "
                                                    "any artifact was exported for CUDA, else 0)."),
                  protocol: str = typer.Option("v2", help="v2 (HTTP) or grpc-v2 (gRPC on Triton's port 9000)."),
                  cpu: str = typer.Option("1", help="CPU request and limit (a Kubernetes quantity)."),
                  memory: Optional[str] = typer.Option(None, help="Memory request and limit (a Kubernetes "
                                                       "quantity; default: estimated from the repository, "
                                                       "docs/deploy.md \"Memory\")."),
                  image: Optional[str] = typer.Option(None, help="A Triton image with zoo installed: needed when "
                                                      "the repository holds python-form artifacts (docs/deploy.md)."),
                  runtime: Optional[str] = typer.Option(None, help="A KServe ServingRuntime by name (default: "
                                                        "the one KServe picks for modelFormat triton)."),
                  runtime_version: Optional[str] = typer.Option(None, help="The runtime image's tag, e.g. "
                                                                "24.08-py3."),
                  namespace: Optional[str] = typer.Option(None, help="Kubernetes namespace."),
                  out_file: Optional[Path] = typer.Option(None, "--out", help="Write the YAML to this file, outside "
                                                          "REPOSITORY, not to stdout (`-`: stdout).")):
    """A KServe InferenceService serving REPOSITORY with KServe's Triton runtime (modelFormat triton), built
    and validated with the kserve SDK's model classes. Apply it with `kubectl apply -f FILE`."""
    from .deploy import STDOUT, check_out, kserve_manifest, to_yaml
    from .fsutil import atomic_write_text

    if out_file == STDOUT:
        out_file = None
    if out_file is not None:  # before every artifact is hashed
        check_out(out_file, repository)
        _writable_file(out_file, "--out")
    manifest, warnings = kserve_manifest(repository, storage_uri, name=name, gpus=gpu, protocol=protocol, cpu=cpu,
                                         memory=memory, image=image, runtime=runtime,
                                         runtime_version=runtime_version, namespace=namespace)
    for line in warnings:
        err.print(f"[yellow]warning:[/yellow] {escape(line)}", highlight=False)
    text = to_yaml(manifest)
    if out_file is None:
        sys.stdout.write(text)
        return
    try:
        atomic_write_text(out_file, text)
    except OSError as exc:  # what the check before could not see: a full disk, a parent made a file since
        raise UsageError(f"cannot write --out {out_file}: {exc.strerror or exc}") from None
    err.print(escape(f"wrote {out_file}: InferenceService {manifest['metadata']['name']}"), highlight=False)


def _writable_file(path: Path, option: str) -> None:
    """Refuse an `option` file that cannot be written, in one line: a directory, a parent that is a
    file, a folder this user cannot write (`fsutil.check_destination`)."""
    from .fsutil import check_destination

    if path.is_dir():
        raise UsageError(f"cannot write {option} {path}: it is a directory; name the file to write, "
                         f"e.g. {path / 'isvc.yaml'}")
    try:
        check_destination(path, option, directory=False)
    except UsageError as exc:
        raise UsageError(f"cannot write {exc}") from None


from . import cli_bench  # noqa: E402,F401  (registers `zoo bench` and `zoo optimize`)


def _misplaced_plugin(argv: List[str]) -> Optional[str]:
    """The line for a `--plugin` given after the command (`zoo`'s own option, which click
    would answer with only "No such option"), or None."""
    args, command = iter(argv), None
    for arg in args:
        if arg == "--":
            return None
        if arg == "--plugin" or arg.startswith("--plugin="):
            file = arg.partition("=")[2] if "=" in arg else next(args, "FILE")
            if command is not None:
                return f"--plugin goes before the command: zoo --plugin {file} {command} ..."
        elif command is None and not arg.startswith("-"):
            command = arg
    return None


def main() -> None:
    plugins_log = logging.getLogger("zoo.plugins")
    plugins_log.addHandler(_WarningLine())
    plugins_log.propagate = False  # printed here, once, whatever the root logger does
    raise_on_sigterm()  # `zoo serve` leaves SIGTERM to its server's graceful shutdown
    try:
        if misplaced := _misplaced_plugin(sys.argv[1:]):
            raise UsageError(misplaced)
        app()
    except ZooError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        # a model name that names no model is a usage error, as an unknown backend or option is
        sys.exit(UsageError.exit_code if isinstance(exc, UnknownModelError) else exc.exit_code)
    except KeyboardInterrupt as exc:
        sys.exit(exc.exit_code if isinstance(exc, Terminated) else 128 + signal.SIGINT)
    except SystemExit as exc:
        if exc.code == 128 + signal.SIGINT and was_terminated():  # click's status for a KeyboardInterrupt
            sys.exit(Terminated.exit_code)
        raise
    except Exception as exc:
        if debugging():
            raise
        err.print(f"[red]internal error:[/red] {escape(str(exc))} (set ZOO_DEBUG=1 for the traceback)", highlight=False)
        sys.exit(1)

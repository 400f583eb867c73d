"""`zoo bench --scenario`: MLPerf LoadGen scenarios over the matrix, or against a server.

In process, every combination (model, backend, precision, device) is exported in one
fresh process, and each scenario is driven by LoadGen in another, as the latency matrix
is measured: a scenario that times out or crashes (`timeout` bounds each process) costs
that scenario alone, the ones before it keep their results. Against a running `zoo serve`
(`--url`), LoadGen runs here and the server is the system under test. Each scenario's
LoadGen logs are kept under `output_dir/<combination>/<Scenario>/`; a run cut off (a
time-out, a crash, Ctrl-C) leaves none, since no result names its half-written files.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import UnsupportedError, UsageError
from ..spec import ModelSpec
from .env import environment
from .loadgen import find_peak_qps, run_scenario, scenario_name
from .matrix import Interrupted, _Failed, _hole, _in_own_process, checked_models, combinations, int8_method, job_for
from .measure import export_job


def _scenarios(target, spec, names: Sequence[str], settings: Mapping[str, Any], output_dir: Path,
               model: str | None = None) -> list[dict[str, Any]]:
    results = []
    for name in names:
        kw = {"output_dir": output_dir, "batch": settings["batch"], "duration_s": settings["duration_s"]}
        if model is not None:
            kw["model"] = model
        if name == "server" and settings["find_qps"]:
            results.append(find_peak_qps(target, spec, settings["latency_bound_ms"] or 100.0, **kw))
        else:
            results.append(run_scenario(target, spec, name, target_qps=settings["target_qps"],
                                        latency_bound_ms=settings["latency_bound_ms"], **kw))
    return results


def loadgen_job(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """In the combination's own process: load the artifact, run every scenario on it."""
    from ..artifact import Artifact
    from .measure import _setup

    _setup(job)
    art = Artifact.open(job["path"])
    runner = art.load(threads=job["threads"])
    return _scenarios(runner, art.spec(), job["scenarios"], job["settings"], Path(job["output_dir"]))


def _log_dir(name: str, settings: Mapping[str, Any]) -> str:
    """Where scenario `name`'s logs go in its combination's directory (`_scenarios`)."""
    return "server-peak" if name == "server" and settings["find_qps"] else scenario_name(name)


def _remove_logs(logs: Path, name: str | None, settings: Mapping[str, Any], output_dir: Path) -> None:
    """A cut-off run's half-written logs (scenario `name`'s; None: the export was cut off),
    and the directories left empty by their removal."""
    if name is not None:
        shutil.rmtree(logs / _log_dir(name, settings), ignore_errors=True)
    for empty in (logs, output_dir):
        with contextlib.suppress(OSError):
            empty.rmdir()


def _valid(result: Mapping[str, Any]) -> bool:
    return result.get("valid", result.get("peak_qps") is not None)


def loadgen(model, backends: Sequence[str], precisions: Sequence[str], devices: Sequence[str], batch: int,
            scenarios: Sequence[str], output_dir: str | Path, *, repository: str | Path, checkpoint=None,
            random_init: bool = False, threads: int | None = None, target_qps: float | None = None,
            find_qps: bool = False, latency_bound_ms: float | None = None, duration_s: float = 10.0,
            url: str | None = None, model_name: str | None = None, timeout: float | None = 1800.0,
            on_result: Callable[[dict[str, Any]], Any] | None = None) -> dict[str, Any]:
    """Every scenario on every combination (or on the server at `url`); a report whose
    "loadgen" list holds one result per scenario and combination, each with "valid".

    Against a server (`url`), `model` is the name as given (a registered model or the
    served artifact's name, as `--url` without scenarios takes it): the server's metadata
    says which model and config it serves, so nothing is looked up here."""
    names = [scenario_name(n).lower() for n in scenarios]
    if not names:
        raise UsageError("name at least one scenario: singlestream, offline or server")
    if "server" in names and target_qps is None and not find_qps:
        raise UsageError("the server scenario needs --target-qps N, or --find-qps to search for the highest QPS "
                         "that meets --latency-bound-ms")
    settings = {"batch": batch, "duration_s": duration_s, "target_qps": target_qps, "find_qps": find_qps,
                "latency_bound_ms": latency_bound_ms}
    output_dir = Path(output_dir)
    results: list[dict[str, Any]] = []

    def add(found: Sequence[dict[str, Any]], label: Mapping[str, Any]) -> None:
        for r in found:
            results.append({**label, **r, "valid": _valid(r)})
            if on_result:
                on_result(results[-1])

    if url is not None:
        given = [model] if isinstance(model, (str, ModelSpec)) else list(model)
        given = [m.name if isinstance(m, ModelSpec) else m for m in given]
        if len(given) != 1 or any(c in given[0] for c in "*?[") or given[0] == "all":
            raise UsageError("--url load-tests one model; name one (a model or the served artifact's name)")
        label = {"model": given[0], "backend": "server", "precision": "", "device": url}
        add(_scenarios(url, None, names, settings, output_dir / "server", model=model_name or given[0]), label)
        return {"models": given, "environment": environment(threads),
                # against a server, the server decides the backend, precision and device: none is recorded
                "options": {"batch": batch, "scenarios": names, **settings, "url": url},
                "results": [], "loadgen": results}
    specs = checked_models(model, backends, [batch], precisions, devices, checkpoint=checkpoint,
                           random_init=random_init)

    def report() -> dict[str, Any]:
        return {"models": [s.name for s in specs], "environment": environment(threads),
                "options": {"backends": list(backends), "precisions": list(precisions), "devices": list(devices),
                            "batch": batch, "scenarios": names, **settings, "url": url},
                "results": [], "loadgen": results}

    for spec, backend, prec, dev in combinations(specs, backends, precisions, devices):
        label = {"model": spec.name, "backend": backend, "precision": prec,
                 "quantization": int8_method(spec, prec), "device": dev}
        hole = _hole(spec, backend, prec, dev, [batch], None)
        if hole is not None:
            status = "unsupported" if isinstance(hole, UnsupportedError) else "failed"
            add([{"scenario": n, "status": status, "valid": False, "reasons": [str(hole)]} for n in names], label)
            continue
        logs = output_dir / f"{spec.name}.{backend}.{prec}.{dev}"
        job = {**job_for(spec, backend, prec, dev, repository, checkpoint, random_init, threads),
               "scenarios": names, "settings": settings, "output_dir": str(logs)}
        name = None  # the scenario running, whose logs are half-written while it does
        try:
            facts = _in_own_process(export_job, job, timeout)
            for scenario in names:
                name = scenario
                try:
                    found = _in_own_process(loadgen_job, {**job, "path": facts["path"], "scenarios": [name]}, timeout)
                except _Failed as exc:
                    _remove_logs(logs, name, settings, output_dir)
                    found = [{"scenario": name, "status": exc.status, "valid": False, "reasons": [exc.error]}]
                name = None
                add(found, label)
        except _Failed as exc:  # the export
            add([{"scenario": n, "status": exc.status, "valid": False, "reasons": [exc.error]} for n in names],
                label)
        except KeyboardInterrupt:
            _remove_logs(logs, name, settings, output_dir)
            raise Interrupted(report()) from None
    return report()

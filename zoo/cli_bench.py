"""`zoo bench` and `zoo optimize`: the benchmark suite's commands (registered on the shared `zoo.cli_common.app`)."""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .bench.report import precision_label, signed
from .cli_common import JSON, REPOSITORY, _artifact_path, _csv, _emit_json, _table, app, err, given_options, out
from .errors import UsageError, ZooError
from .fsutil import check_destination


def _f(value: Any, spec: str) -> str:
    return "" if value is None else format(value, spec)


def print_bench(report: dict[str, Any], console: Console | None = None) -> None:
    console = console or out
    rows, holes = [], []
    for r in report["results"]:
        if r["status"] != "ok":
            holes.append(f"{r['model']} {r['backend']} {precision_label(r)} {r['device']}: {r['status']}: {r['error']}")
            continue
        lengths = ",".join(f"{k}={v}" for k, v in (r.get("lengths") or {}).items())
        rows.append([r["model"], r["backend"], precision_label(r), r["device"], r["batch"], lengths,
                     _f(r["p50_ms"], ".3f"), _f(r["p90_ms"], ".3f"), _f(r["p99_ms"], ".3f"),
                     _f(r["throughput"], ".1f"), _f(r.get("peak_host_mb"), ".0f"),
                     _f(r.get("export_seconds"), ".1f"), _f((r.get("artifact_bytes") or 0) / 1e6, ".2f"),
                     _f(r.get("max_abs_error"), ".2g"), signed(r.get("metric_delta"))])
    env = report["environment"]
    title = f"{', '.join(report.get('models') or [report.get('model', '')])} on {env['cpu']}" + (
        f" + {env['gpu']}" if env.get("gpu") else "")
    _table(["model", "backend", "precision", "device", "batch", "lengths", "p50 ms", "p90 ms", "p99 ms",
            "samples/s", "host MB", "export s", "size MB (10^6 B)", "max |err|", "metric Δ"], rows, title=title)
    for line in holes:
        console.print(f"[yellow]{escape(line)}[/]", highlight=False)


def _progress() -> Progress:
    # off where stderr is no terminal (CI logs, a pipe): there it drew nothing but left a blank
    # line, before a one-line error too; the rows it prints through its console still show
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err, transient=True, disable=not err.is_terminal)


def _row_line(r: dict[str, Any]) -> str:
    who = f"{r['model']} {r['backend']} {precision_label(r)} {r['device']}"
    if r["status"] != "ok":
        return f"[yellow]{escape(who)}: {r['status']}[/] {escape(r['error'])}"
    lengths = "".join(f" {k}={v}" for k, v in (r.get("lengths") or {}).items())
    return (f"{escape(who)} batch {r['batch']}{lengths}: p50 {r['p50_ms']:.3f} ms, "
            f"{r['throughput']:.1f} samples/s")


# `zoo bench` options whose help runs over a line
_ARTIFACT = typer.Option([], "--artifact", "-a", help="Measure this artifact as it is (directory, or name in "
                         "the repository; repeatable) instead of exporting MODEL: no plugin needed.")
_BATCH_SIZES = typer.Option(None, "--batch-sizes", help="Batch sizes (default 1,8,32, or the nearest the "
                            "model's range holds; with --url, rows per request, default 1; with --scenario, one "
                            "value: the most rows per execution, default 8).")
_PRECISION = typer.Option("fp32", help="Precision(s), comma-separated: fp32,int8 measures every "
                          "backend at each (combinations a backend lacks are listed as unsupported).")
_LENGTHS = typer.Option(None, help="Lengths of the sequence or atom axis to measure at, "
                        "comma-separated (default: as sampled).")
_MIN_TIME = typer.Option(None, help="Seconds of timed runs per point (default 1; "
                         "with --scenario, per LoadGen run, default 10).")
_REPORT_DIR = typer.Option(None, help="Write JSON, CSV, markdown and PNG plots here "
                           "(default reports/bench-TIME).")
_COMPARE = typer.Option(None, "--compare", help="A baseline report.json: exit 1 on a "
                        "regression beyond the noise measured in both runs, or when no row pairs "
                        "with the baseline's; rows too noisy to judge are listed (and fail with --strict).")
_SCENARIO = typer.Option(None, help="MLPerf LoadGen scenario(s): singlestream,offline,"
                         "server; in process per combination, or against an http:// --url "
                         "(grpc:// is for the concurrency sweep only).")
_FIND_QPS = typer.Option(False, "--find-qps", help="Server scenario: search the highest QPS "
                         "meeting --latency-bound-ms (instead of --target-qps).")
_URL = typer.Option(None, help="Load-test a running server at this URL instead "
                    "(requests/s and latency per concurrency): http://HOST:PORT, or "
                    "grpc://HOST:PORT (its gRPC port; needs --metrics-url; the concurrency "
                    "sweep only: --scenario needs http://).")
_METRICS_URL = typer.Option(None, help="With --url: the server's HTTP address "
                            "(http://HOST:PORT) for /metrics and the model's zoo metadata; "
                            "required with a grpc:// URL (default: --url).")
_SHARED_MEMORY = typer.Option(False, "--shared-memory", help="With --url: send every tensor through "
                              "system shared memory (a server on this machine, started with "
                              "--shared-memory system).")
_MODEL_NAME = typer.Option(None, help="With --url: the model's name on the server "
                           "(default MODEL).")
_RAY = typer.Option(None, "--ray", help="Run each combination as a Ray task: `local` "
                    "(a Ray instance on this machine), `auto` (the cluster this machine "
                    "is in), ray://HOST:10001 (a Ray client) or HOST:6379 (a head node's GCS); "
                    "GPU combinations ask for one GPU each (docs/benchmarks.md).")
_STRICT = typer.Option(False, "--strict", help="Exit 1 also when verification refused a "
                       "combination (status refused), or when --compare found a row too noisy "
                       "to judge; a failed one (crash, exporter error, time-out) always does.")


@app.command()
def bench(ctx: typer.Context,
          models: Optional[str] = typer.Argument(None, help="Model name(s), comma-separated; globs ('resnet*') "
                                                 "or 'all'."),
          artifact: List[str] = _ARTIFACT,
          backends_: str = typer.Option("torch,onnxruntime", "--backends"),
          batch_sizes: Optional[str] = _BATCH_SIZES, precision: str = _PRECISION,
          device: str = typer.Option("cpu", help="Device(s), comma-separated: cpu,cuda."),
          lengths: Optional[str] = _LENGTHS,
          repository: Path = REPOSITORY, checkpoint: Optional[Path] = None,
          random_init: bool = typer.Option(False, help="Benchmark untrained weights."),
          threads: Optional[int] = None, min_time: Optional[float] = _MIN_TIME,
          timeout: float = typer.Option(1800.0, help="Seconds each process of a combination may take."),
          report_dir: Optional[str] = _REPORT_DIR, compare: Optional[Path] = _COMPARE,
          sigmas: float = typer.Option(3.0, help="With --compare: noise multiples a change must exceed."),
          min_change: float = typer.Option(0.05, help="With --compare: smallest relative change flagged."),
          scenario: Optional[str] = _SCENARIO,
          target_qps: Optional[float] = typer.Option(None, help="Server scenario: Poisson arrivals at this QPS."),
          find_qps: bool = _FIND_QPS,
          latency_bound_ms: Optional[float] = typer.Option(None, help="Server scenario: the p99 latency bound."),
          url: Optional[str] = _URL, metrics_url: Optional[str] = _METRICS_URL, shared_memory: bool = _SHARED_MEMORY,
          concurrency: str = typer.Option("1,4,16,64", help="With --url: concurrent clients per point."),
          model_name: Optional[str] = _MODEL_NAME,
          json_data: bool = typer.Option(False, "--json-data", help="With --url: JSON tensors instead of binary."),
          streaming: bool = typer.Option(False, "--streaming", help="With a grpc:// --url: each client sends its "
                                         "requests over one ModelStreamInfer stream (perf_analyzer's --streaming)."),
          ray: Optional[str] = _RAY, strict: bool = _STRICT,
          output: Optional[Path] = typer.Option(None, help="Also write the JSON report here."), as_json: bool = JSON):
    """Latency, throughput, memory, cold start, size and accuracy over models x backends x precisions x
    devices x batch sizes, each combination in its own processes; reports with plots; a regression gate.

    With --url: requests/s and latency percentiles of a running `zoo serve` (or Triton) at each concurrency.
    With --scenario: MLPerf LoadGen SingleStream, Offline and Server.

    Exit status: 0 when every combination was measured, unsupported, or refused by verification
    (each listed with its reason); 1 when one failed (a crash, an exporter's error, a time-out), when
    --compare finds a regression or compared nothing (no row pairs with the baseline's, or none that
    does was measured in both runs), when a --url sweep had errors or lost the server, or with
    --strict when one was refused or a compared row was too noisy to judge; 2 for a usage error,
    before anything runs."""
    o = SimpleNamespace(**ctx.params)
    _refuse_ignored(ctx, url, scenario, bool(artifact), find_qps)
    if models is None and not artifact:
        raise UsageError("name MODEL(s) to export and measure, or --artifact to measure existing artifacts")
    if models is not None and artifact:
        raise UsageError("name MODEL(s) to export and measure, or --artifact to measure existing artifacts, not both")
    _check_values(o)
    if ray is not None and (url is not None or scenario is not None):
        raise UsageError("--ray runs the combination matrix; it does not go with --url or --scenario")
    if ray is not None:
        from .bench.ray_sweep import check_reachable

        check_reachable(ray)  # a malformed address (a usage error), or one where nothing answers, before any work
    if (url is None or scenario is not None) and (metrics_url is not None or shared_memory):
        raise UsageError("--metrics-url and --shared-memory go with --url without --scenario (the concurrency sweep "
                       "of a running server)")
    if output is not None:
        check_destination(output, "--output", directory=False)
    if url is not None and scenario is None:
        return _sweep_server(o)
    baseline = _baseline(compare) if compare else None
    directory = (Path(report_dir) if report_dir is not None
                 else Path("reports") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}")
    check_destination(directory, "--report-dir")
    if url is None and not artifact:  # the matrix and in-process LoadGen export into it
        check_destination(repository, "--repository")
    from .bench.matrix import Interrupted

    made = not directory.exists()
    aside = _loadgen_aside(directory) if not made and scenario is not None else None
    try:
        report = _loadgen(o, directory) if scenario is not None else _artifacts(o) if artifact else _matrix(o)
    except Interrupted as exc:
        _loadgen_back(directory, aside, exc.report.get("results") or exc.report.get("loadgen"))
        _interrupted(exc.report, directory if made else None, directory, output, as_json)
    except BaseException:
        _loadgen_back(directory, aside, False)
        raise
    _loadgen_back(directory, aside, True)
    _report(report, directory, baseline, output, as_json, sigmas=sigmas, min_change=min_change, strict=strict,
            compare_path=compare)


#: where an earlier run's LoadGen logs wait while a --scenario run writes its own into loadgen/
LOADGEN_ASIDE = ".loadgen-earlier"


def _loadgen_aside(directory: Path) -> Optional[Path]:
    """Move an earlier run's loadgen/ aside (LoadGen writes its logs there as it runs), so that a
    run that fails keeps the earlier report whole (`_loadgen_back`)."""
    import shutil

    from .bench.report import LOADGEN_DIR

    logs = directory / LOADGEN_DIR
    if logs.is_symlink() or not logs.is_dir():
        return None
    aside = directory / LOADGEN_ASIDE
    try:
        shutil.rmtree(aside, ignore_errors=True)
        logs.rename(aside)
    except OSError as exc:
        raise ZooError(f"cannot move the earlier LoadGen logs in {directory} aside: {exc.strerror or exc}") from None
    return aside


def _loadgen_back(directory: Path, aside: Optional[Path], replaced: bool) -> None:
    """The earlier logs `_loadgen_aside` moved: dropped where this run has a report of its own
    to write (`replaced`), else put back in place of what this run left in loadgen/."""
    import shutil

    from .bench.report import LOADGEN_DIR

    if aside is None:
        return
    if replaced:
        shutil.rmtree(aside, ignore_errors=True)
        return
    shutil.rmtree(directory / LOADGEN_DIR, ignore_errors=True)
    with contextlib.suppress(OSError):
        aside.rename(directory / LOADGEN_DIR)


def _baseline(compare: Path) -> dict[str, Any]:
    """The --compare report, read before the run: one that is missing or is no report is a
    usage error (exit 2), refused before any work, not a failed run (exit 1)."""
    from .bench.report import load_report

    try:
        baseline = load_report(compare)
    except ZooError as exc:
        raise UsageError(f"--compare: {exc}") from None
    if baseline.get("interrupted"):
        raise UsageError(f"--compare {compare} is the report of an interrupted run: it lacks the combinations that "
                         "had not finished, and a gate against it passes them unchecked; compare with a whole run's")
    return baseline


def _interrupted(report: dict[str, Any], made: Optional[Path], directory: Path, output: Optional[Path],
                 as_json: bool) -> None:
    """Ctrl-C: a complete report of the combinations done before it (marked "interrupted"),
    or, when none was, nothing at all; then exit 130, as a shell does for SIGINT. No
    comparison: a gate that saw part of the matrix has passed nothing. `made`: the report
    directory where this run created it."""
    if not (report.get("results") or report.get("loadgen")):
        if made is not None:
            with contextlib.suppress(OSError):
                made.rmdir()  # made by this run for LoadGen's logs, and left empty
        raise typer.Exit(130)
    if as_json:
        _emit_json(report)
    elif report.get("results"):
        print_bench(report)
    if report.get("loadgen") and not as_json:
        from .bench.loadgen import print_loadgen

        print_loadgen(report["loadgen"], out)
    written = _write(report, directory)
    _write_json(output, report)
    err.print(f"interrupted: the report of what finished before it is in {directory} ({written})", highlight=False)
    raise typer.Exit(130)


def _write(report: dict[str, Any], directory: Path) -> str:
    """Write the report; the names written, as the "report:" line lists them (loadgen/ with
    LoadGen's logs too). Ctrl-C while it is written (the plots take a while) exits 130 with
    a line saying what is there: each file is written whole or not at all (zoo.fsutil)."""
    from .bench.report import LOADGEN_DIR, clear_report, report_files, report_snapshot, unreplaced, write_report

    before = report_snapshot(directory)  # a reused directory: the earlier report's files go once this one's are
    try:                                 # written (a run that fails or is stopped first leaves them), so that
        written = [p.name for p in write_report(report, directory).values()]  # it never holds two runs
    except KeyboardInterrupt:
        clear_report(directory, unreplaced(directory, before), loadgen=not report.get("loadgen"))
        there = [name for name in report_files() if (directory / name).is_file()]
        err.print(f"interrupted while writing the report: {directory} holds "
                  + (f"part of it ({', '.join(there)}), each file complete" if there else "none of it"),
                  highlight=False)
        raise typer.Exit(130) from None
    except BaseException:  # a write that failed part-way (a full disk): none of the earlier run's files stay
        clear_report(directory, unreplaced(directory, before), loadgen=not report.get("loadgen"))
        raise
    clear_report(directory, unreplaced(directory, before), loadgen=not report.get("loadgen"))
    if report.get("loadgen") and (directory / LOADGEN_DIR).is_dir():
        written.append(f"{LOADGEN_DIR}/")
    return ", ".join(written)


def _check_values(o: SimpleNamespace) -> None:
    """Refuse a value no run can use before anything is exported or measured: found after
    the run, it would cost the whole run, and some (a zero --min-time) would give empty rows.
    The lists are read here, once (`zoo.bench.options.items`: no empty item, none twice),
    into `o.names`, `o.backends`, `o.precisions`, `o.devices`, `o.sizes`, `o.length_values`,
    `o.concurrencies` and `o.scenarios` (None where the option is not given)."""
    from .bench.options import items

    if o.models is not None and not _csv(o.models, "MODEL", "model"):
        raise UsageError(f"MODEL {o.models!r} names no model: give a name, a glob ('resnet*') or 'all'")
    o.names = None if o.models is None else items("MODEL", o.models, "model")
    if o.report_dir is not None and not o.report_dir.strip():
        raise UsageError("--report-dir is empty: name a directory (`--report-dir .` for this one)")
    for option, value in (("--min-time", o.min_time), ("--timeout", o.timeout), ("--target-qps", o.target_qps),
                          ("--latency-bound-ms", o.latency_bound_ms)):
        if value is not None and not 0 < value < math.inf:
            raise UsageError(f"{option} must be a positive number, got {value:g}")
    for option, value in (("--sigmas", o.sigmas), ("--min-change", o.min_change)):
        if not 0 <= value < math.inf:
            raise UsageError(f"{option} must be a non-negative number, got {value:g}")
    o.backends = items("--backends", o.backends_, "backend")
    o.precisions = items("--precision", o.precision, "precision")
    o.devices = items("--device", o.device, "device")
    o.sizes = None if o.batch_sizes is None else items("--batch-sizes", o.batch_sizes, "batch size", int)
    o.length_values = None if o.lengths is None else items("--lengths", o.lengths, "length", int)
    sweep = o.url is not None and o.scenario is None
    o.concurrencies = items("--concurrency", o.concurrency, "concurrency", int) if sweep else None
    o.scenarios = None if o.scenario is None else items("--scenario", o.scenario, "scenario", key=_scenario_key)
    counts = {"--threads": [] if o.threads is None else [o.threads], "--batch-sizes": o.sizes or [],
              "--lengths": o.length_values or [], "--concurrency": o.concurrencies or []}
    for option, values in counts.items():
        bad = next((v for v in values if v < 1), None)
        if bad is not None:
            raise UsageError(f"{option} must be at least 1, got {bad}")
    if o.url is not None:
        _check_url(o)
    if o.scenario is not None:
        _check_scenarios(o)
    if o.url is None and not o.artifact:  # with them, --precision, --device and --backends are refused as not used
        from .bench.matrix import check_names

        check_names(o.precisions, o.devices, o.backends)


def _check_url(o: SimpleNamespace) -> None:
    """`--url` (and `--metrics-url`) as the mode given them can use: the concurrency sweep
    takes http:// or grpc:// (this one with --metrics-url); LoadGen drives a server over
    HTTP only. Checked here, so a bad address is a usage error before any load is sent."""
    from urllib.parse import urlsplit

    if o.scenario is None:
        from .serve.perf import target

        try:
            where = target(o.url, o.metrics_url)
        except ZooError as exc:
            raise UsageError(str(exc)) from None
        if o.streaming and where.protocol != "grpc":
            raise UsageError(f"--streaming is gRPC's ModelStreamInfer; --url {o.url} is HTTP: give the server's "
                             "grpc://HOST:PORT")
        return
    parts = urlsplit(o.url if "://" in o.url else f"http://{o.url}")
    if parts.scheme == "grpc":
        raise UsageError(f"--url {o.url}: --scenario drives the server with LoadGen over HTTP; give its "
                         "http://HOST:PORT (grpc:// is for the concurrency sweep, without --scenario)")
    try:
        parts.port
    except ValueError:
        raise UsageError(f"--url {o.url!r} has an invalid port") from None
    if parts.scheme != "http" or not parts.hostname:
        raise UsageError(f"--url must be http://HOST:PORT with --scenario, got {o.url!r}")


def _check_scenarios(o: SimpleNamespace) -> None:
    """Scenario names LoadGen has, the server scenario's rate, and the one batch size, before
    any export: each found later cost the exports before it."""
    from .bench.loadgen import SCENARIOS

    names = o.scenarios
    unknown = [n for n in names if _scenario_key(n) not in SCENARIOS]
    if unknown:
        raise UsageError(f"--scenario: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(SCENARIOS)}")
    if "server" in map(_scenario_key, names) and o.target_qps is None and not o.find_qps:
        raise UsageError("--scenario server needs --target-qps N, or --find-qps to search for the highest QPS that "
                         "meets --latency-bound-ms")
    if o.target_qps is not None:  # a schedule LoadGen would build in memory before the first query
        from .bench.loadgen import check_server_schedule

        duration = 10.0 if o.min_time is None else o.min_time
        check_server_schedule(o.target_qps, duration, "--target-qps",
                              "the default --min-time 10 s" if o.min_time is None else f"--min-time {duration:g} s",
                              "--min-time")
    if o.sizes is not None and len(o.sizes) != 1:
        raise UsageError("with --scenario, --batch-sizes takes one value: the most rows per execution")


def _scenario_key(name: str) -> str:
    """How LoadGen's scenario names are matched (`zoo.bench.loadgen.scenario_name`): single-stream is singlestream."""
    return name.strip().lower().replace("-", "").replace("_", "")


def _sweep_server(o: SimpleNamespace) -> None:
    """`--url`: requests/s and latency of a running server at each concurrency. The points
    measured are shown and written whatever ends the sweep: a server that went away (the
    failed point says why; exit 1) or Ctrl-C (marked "interrupted"; exit 130)."""
    from .bench.matrix import Interrupted
    from .serve.perf import most_rows, print_sweep, sweep, target

    served = o.model_name or o.models
    most = most_rows(target(o.url, o.metrics_url), served)
    if most is not None and max(o.sizes or [1]) > most:  # every request would be refused (400): no load to measure
        raise UsageError(f"--batch-sizes {max(o.sizes)}: {served} at {o.url} takes at most {most} rows per request "
                         "(its max_batch_size): the server would refuse every request")
    try:
        report = sweep(o.url, served, o.models, o.concurrencies, o.sizes or [1],
                       duration=1.0 if o.min_time is None else o.min_time, binary=not o.json_data,
                       metrics_url=o.metrics_url, shared_memory=o.shared_memory, streaming=o.streaming)
    except Interrupted as exc:
        report = exc.report
        if not report["results"]:
            raise typer.Exit(130) from None
        _emit_json(report) if o.as_json else print_sweep(report, out)
        _write_json(o.output, report)
        err.print("interrupted: the points above finished before it" + (f"; written to {o.output}" if o.output
                                                                          else ""), highlight=False)
        raise typer.Exit(130) from None
    _emit_json(report) if o.as_json else print_sweep(report, out)
    _write_json(o.output, report)
    if any(r["errors"] or r.get("failed") for r in report["results"]):
        raise typer.Exit(1)


def _loadgen(o: SimpleNamespace, directory: Path) -> dict[str, Any]:
    """`--scenario`: MLPerf LoadGen runs, in process per combination or against `--url`."""
    from .bench.scenarios import loadgen

    sizes = o.sizes or [8]
    if o.url is None:  # a bad model name or batch before the progress bar (against a server, the server's)
        from .bench.matrix import checked_models, default_batch_sizes

        sizes = o.sizes or default_batch_sizes(o.names, defaults=(8,))
        checked_models(o.names, o.backends, sizes, o.precisions, o.devices, checkpoint=o.checkpoint,
                       random_init=o.random_init)
    with _progress() as progress:
        progress.add_task("MLPerf LoadGen", total=None)
        return loadgen(o.names, o.backends, o.precisions, o.devices, sizes[0], o.scenarios, directory / "loadgen",
                       repository=o.repository, checkpoint=o.checkpoint,
                       random_init=o.random_init, threads=o.threads, target_qps=o.target_qps, find_qps=o.find_qps,
                       latency_bound_ms=o.latency_bound_ms, duration_s=10.0 if o.min_time is None else o.min_time,
                       url=o.url, model_name=o.model_name, timeout=o.timeout,
                       on_result=lambda r: progress.console.print(_loadgen_line(r), highlight=False))


def _artifact_dir(given: str, repository: Path) -> Path:
    """An --artifact as the directory it names; a usage error where it names a repository,
    a directory inside an artifact, or no artifact but one of a close name in the
    repository (each was "has no zoo.json: it is incomplete; re-export it")."""
    import difflib

    from .artifact import MANIFEST

    path = _artifact_path(given, repository)
    if (path / MANIFEST).exists() or (path / MANIFEST).is_symlink():
        return path
    if path.is_dir():
        inside = next((p for p in path.parents if (p / MANIFEST).is_file()), None)
        if inside is not None:
            raise UsageError(f"--artifact {given} is a directory inside the artifact {inside}: name the artifact")
        found = sorted(p.name for p in path.iterdir() if (p / MANIFEST).is_file())
        if found:
            listed = ", ".join(found[:8]) + (f" (and {len(found) - 8} more)" if len(found) > 8 else "")
            raise UsageError(f"--artifact {given} is a repository, not an artifact directory: name one of its "
                             f"artifacts: {listed}")
    elif not path.exists() and repository.is_dir():
        names = [p.name for p in repository.iterdir() if (p / MANIFEST).is_file()]
        close = difflib.get_close_matches(path.name, names, n=3)
        if close:
            raise UsageError(f"--artifact {given}: no such artifact; did you mean {', '.join(close)}?")
    return path  # what else is wrong with it, `Artifact.open` says


def _artifacts(o: SimpleNamespace) -> dict[str, Any]:
    """`--artifact`: existing artifacts measured as they are."""
    from .bench import benchmark_artifacts

    return benchmark_artifacts([_artifact_dir(a, o.repository) for a in o.artifact],
                               o.sizes, lengths=o.length_values, threads=o.threads,
                               min_time=1.0 if o.min_time is None else o.min_time, timeout=o.timeout,
                               on_result=lambda row: err.print(_row_line(row), highlight=False),
                               distinct=o.compare is not None)


def _matrix(o: SimpleNamespace) -> dict[str, Any]:
    """The combination matrix: each exported (or reused) and measured in its own processes."""
    from .bench import benchmark
    from .bench.matrix import checked_models, default_batch_sizes

    sizes, lengths = o.sizes or default_batch_sizes(o.names), o.length_values
    # every usage error (a model's range, --lengths without its axis) before the progress bar
    specs = checked_models(o.names, o.backends, sizes, o.precisions, o.devices, lengths, o.checkpoint, o.random_init,
                           o.ray)
    with _progress() as progress:
        task = progress.add_task("benchmarking", total=None)
        return benchmark(
            specs, o.backends, sizes, o.precisions, o.devices, o.repository, checkpoint=o.checkpoint,
            random_init=o.random_init, threads=o.threads,
            min_time=1.0 if o.min_time is None else o.min_time, lengths=lengths,
            timeout=o.timeout, ray=o.ray, on_result=lambda row: progress.console.print(_row_line(row), highlight=False),
            on_combination=lambda done, total, label: progress.update(task, completed=done, total=total,
                                                                       description=label))


def _write_json(output: Optional[Path], report: dict[str, Any]) -> None:
    if output:
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(json.dumps(report, indent=2))
        except OSError as exc:
            raise ZooError(f"--output {output}: cannot write it: {exc.strerror or exc}") from None


def _report(report: dict[str, Any], directory: Path, baseline: Optional[dict], output: Optional[Path],
            as_json: bool, sigmas: float, min_change: float, strict: bool, compare_path: Optional[Path]) -> None:
    """Print the report (and the comparison with `baseline`), then write it, so that a disk
    that fails late loses no measurement; exit 1 as `zoo bench --help` says: a regression,
    nothing to compare, a failed combination, a refused one with --strict."""
    from .bench.compare import compare as compare_reports
    from .bench.compare import compared, failed, measured, print_comparison

    result, unpaired = None, None
    if baseline:
        try:
            result = compare_reports(baseline, report, sigmas=sigmas, min_change=min_change)
        except ZooError as exc:  # raised after the report is written: the measurements are kept
            unpaired = exc
    if result:  # the gate's verdict travels with the report it judged: report.json, report.md, --output, --json
        report = {**report, "comparison": {"baseline": str(compare_path), **result}}
    if as_json:
        _emit_json(report)
    else:
        if report.get("results"):
            print_bench(report)
        if report.get("loadgen"):
            from .bench.loadgen import print_loadgen

            print_loadgen(report["loadgen"], out)
        if result:
            print_comparison(result, out)
    written = _write(report, directory)
    _write_json(output, report)
    if not as_json:
        out.print(f"report: {directory} ({written})", highlight=False)
    if unpaired is not None:
        raise ZooError(f"--compare {compare_path}: {unpaired}")
    if result and not compared(result):
        raise ZooError(f"--compare {compare_path}: no row of the baseline matches one of this run (model, backend, "
                       "precision, device, batch, lengths), so nothing was compared")
    if result and not result["regressions"] and not measured(result):
        raise ZooError(f"--compare {compare_path}: no row paired with the baseline's was measured (ok) in both runs "
                       f"({compared(result)} paired, each unsupported, failed or refused in one run or both), so "
                       "nothing was compared")
    if result and failed(result, strict=strict):
        raise typer.Exit(1)
    failing = ("failed", "refused") if strict else ("failed",)
    if any(r["status"] in failing for r in report["results"]) or any(
            not r["valid"] and (r.get("status") in failing or r.get("status") is None)
            for r in report.get("loadgen", [])):
        raise typer.Exit(1)


#: options each mode does not use: given on the command line there, they are refused, not ignored
_NOT_WITH_URL = ("backends_", "precision", "device", "threads", "lengths", "report_dir", "compare", "checkpoint",
                 "random_init", "strict", "timeout", "target_qps", "find_qps", "latency_bound_ms")
#: options LoadGen runs do not use, each group with its reason
_NOT_WITH_SCENARIO = {("lengths",): "LoadGen runs each combination at its own sizes",
                      ("compare",): "the regression gate compares the timed benchmark's rows (latency per batch "
                                    "size), and LoadGen judges its own runs (VALID or INVALID)",
                      ("artifact",): "LoadGen runs export each combination of MODEL; measure an artifact without "
                                     "--scenario, or serve it (`zoo serve`) and give its --url",
                      ("concurrency", "json_data", "streaming"): "it sets the concurrency sweep of a running "
                                                                 "server (--url without --scenario)"}
#: LoadGen against a server: the server decides what runs, and nothing runs in a process of ours
_NOT_WITH_SERVER_SCENARIO = ("backends_", "precision", "device", "threads", "checkpoint", "random_init", "timeout")
#: with --artifact the artifact says what it is: nothing is exported
_NOT_WITH_ARTIFACT = ("backends_", "precision", "device", "checkpoint", "random_init", "ray", "url")
_ONLY_WITH_URL = ("concurrency", "model_name", "json_data", "streaming")
_ONLY_WITH_SCENARIO = ("target_qps", "find_qps", "latency_bound_ms")
_ONLY_WITH_COMPARE = ("sigmas", "min_change")


def _refuse_ignored(ctx: typer.Context, url: Optional[str], scenario: Optional[str], artifacts: bool,
                    find_qps: bool = False) -> None:
    given = given_options(ctx)
    server = scenario is not None and "server" in map(_scenario_key, _csv(scenario, "--scenario", "scenario"))
    for mode, active, names, why in (
            ("without --compare", ctx.params.get("compare") is None, _ONLY_WITH_COMPARE,
             "it sets the regression gate's threshold"),
            *(("with --scenario", scenario is not None, names, why) for names, why in _NOT_WITH_SCENARIO.items()),
            ("with --url", url is not None and scenario is None, _NOT_WITH_URL, "it measures the server as it runs"),
            ("with --url and --scenario", url is not None and scenario is not None, _NOT_WITH_SERVER_SCENARIO,
             "LoadGen drives the server as it runs"),
            ("with --artifact", artifacts and scenario is None, _NOT_WITH_ARTIFACT,
             "an artifact is measured as it is, and nothing is exported"),
            ("without --url", url is None, _ONLY_WITH_URL, "it sets the load on a running server"),
            ("without --scenario", scenario is None, _ONLY_WITH_SCENARIO, "it sets LoadGen's server scenario"),
            ("without the server scenario", scenario is not None and not server, _ONLY_WITH_SCENARIO,
             "it sets LoadGen's server scenario (--scenario server)"),
            ("with --find-qps", find_qps, ("target_qps",), "the search sets the QPS itself")):
        unused = [p.opts[0] for p in given if active and p.name in names]
        if unused:
            raise UsageError(f"{', '.join(unused)} {'does' if len(unused) == 1 else 'do'} nothing {mode}: "
                           f"{why}; leave {'it' if len(unused) == 1 else 'them'} out")


def _loadgen_line(r: dict[str, Any]) -> str:
    who = escape(f"{r['model']} {r['backend']} {precision_label(r)} {r['device']} {r.get('scenario', '')}")
    if r.get("peak_qps") is not None:
        return f"{who}: peak {r['peak_qps']:.1f} QPS within p99 {r['latency_bound_ms']:g} ms"
    if not r["valid"]:  # the word the table shows: INVALID (LoadGen's verdict), or failed, unsupported...
        from .bench.loadgen_report import verdict

        return f"[yellow]{who}: {verdict(r)}[/] {escape('; '.join(r.get('reasons') or []))}"
    return f"{who}: VALID, p90 {r.get('p90_ms') or 0:.3f} ms, {r.get('samples_per_second') or 0:.1f} samples/s"


@app.command()
def optimize(model: str, device: str = typer.Option("cpu", help="cpu or cuda."),
             objective: str = typer.Option("latency", help="latency: lowest median latency at --batch (default 1); "
                                           "throughput: most samples/s at --batch (default: the model's typical "
                                           "batch)."),
             max_metric_drop: Optional[float] = typer.Option(
                 None, help="Largest allowed worsening of the task metric against PyTorch fp32, in its units "
                            "(0.01: one accuracy point). Default: the model's own bound per precision."),
             backends_: Optional[str] = typer.Option(None, "--backends", help="Only these backends (default: every "
                                                     "one that runs on DEVICE here)."),
             precisions: Optional[str] = typer.Option(None, "--precisions", "--precision",
                                                      help="Only these precisions, e.g. fp32,int8."),
             batch: Optional[int] = typer.Option(None, help="Batch size to rank at."),
             repository: Path = REPOSITORY, checkpoint: Optional[Path] = None,
             random_init: bool = typer.Option(False, help="Optimize untrained weights."),
             threads: Optional[int] = None,
             min_time: float = typer.Option(1.0, help="Seconds of timed runs per candidate."), as_json: bool = JSON):
    """Try every backend and precision available on DEVICE; write the fastest artifact that verifies and keeps
    the metric bound as MODEL.optimized.OBJECTIVE.DEVICE, with every candidate's evidence in its zoo.json."""
    from .optimize import optimize as run
    from .optimize import print_optimize

    with _progress() as progress:
        progress.add_task(f"optimizing {model} for {objective} on {device}", total=None)
        result = run(model, device, objective, max_metric_drop, repository, checkpoint=checkpoint,
                     random_init=random_init,
                     backends=None if backends_ is None else _csv(backends_, "--backends", "backend"),
                     precisions=None if precisions is None else _csv(precisions, "--precisions", "precision"),
                     batch=batch, threads=threads,
                     min_time=min_time, on_result=lambda row: progress.console.print(
                         _row_line(row) if row.get("precision") else
                         f"[yellow]{escape(row['backend'])}: {escape(row.get('error', 'unavailable'))}[/]",
                         highlight=False))
    _emit_json(result) if as_json else print_optimize(result, out)

"""The quality tier: every trainable model trained at full size by its recipe, held to its target.

    .venv/bin/python tools/quality.py [--report docs/reports/quality.json] [--docs docs/models.md]
                                      [--models PATTERNS] [--workers N] [--seeds N] [--plugin FILE] [--plan]

Every registered model with a training recipe (an installed plugin's, or a `--plugin` file's) is trained by
`zoo train NAME --seed S` in a process of its own, one intra-op thread each, `--workers`
at a time (default: one per core), longest first by the last report's timings. A recipe
is run over `Recipe.quality_seeds` seeds (its own seed and the next ones): three where a
run takes a minute or two, one where it takes many.

Every run must reach its recipe's `target` on the held-out split; the report records
every seed's value, the mean, the worst seed and its margin over the target (positive:
met with that much to spare). The figures docs/models.md states are this table: `--docs`
rewrites the block between its `quality:begin` and `quality:end` markers. A run limited by
`--models` replaces those models' rows in the report and keeps the others', each row with
the date and machine it was measured on. A trainable
model without a target, a run that fails, or one that misses its target makes the exit
status 1, after the report is written.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import fnmatch
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- quality:begin -->", "<!-- quality:end -->"


def plan(pattern: str, seeds: int | None) -> list[dict[str, Any]]:
    """One job per (trainable model, seed): what `zoo train` will be asked to do."""
    from zoo import registry

    jobs = []
    for name in sorted(registry.models()):
        if not any(fnmatch.fnmatch(name, p) for p in pattern.split(",")):
            continue
        spec = registry.get_model(name)
        if not spec.trainable:
            continue
        recipe = spec.recipe
        assert recipe is not None, name
        metric = spec.metric
        for i in range(recipe.quality_seeds if seeds is None else seeds):
            jobs.append({"model": name, "seed": recipe.seed + i, "epochs": recipe.epochs,
                         "target": recipe.target if metric is not None else None,
                         "metric": metric.name if metric else None,
                         "higher_is_better": metric.higher_is_better if metric else None})
    return jobs


def run_one(job: dict[str, Any], work: Path, plugins: list[Path]) -> dict[str, Any]:
    """`zoo train` in its own process; the result is what it wrote to metrics.json."""
    out = work / f"{job['model']}.seed{job['seed']}"
    cmd = [sys.executable, "-m", "zoo", *(a for p in plugins for a in ("--plugin", str(p))), "train", job["model"],
           "--seed", str(job["seed"]), "--out", str(out), "--threads", "1", "--no-tensorboard"]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
    result = dict(job, seconds=round(time.perf_counter() - start, 1))
    metrics_file = out / "metrics.json"
    if proc.returncode != 0 or not metrics_file.is_file():
        return dict(result, status="failed", error=(proc.stderr or proc.stdout).strip()[-2000:])
    metrics = json.loads(metrics_file.read_text())
    reached = metrics.get("target")
    if not isinstance(reached, dict):
        return dict(result, status="failed", error="metrics.json holds no test metric to hold to the target")
    return dict(result, status="met" if reached["met"] else "missed", value=reached["value"])


def margin(job: dict[str, Any], value: float) -> float:
    """How far `value` is past the target, positive when met, in the metric's units."""
    return value - job["target"] if job["higher_is_better"] else job["target"] - value


def summarize(results: list[dict[str, Any]], measured: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per model: every seed's value, mean, worst seed and its margin."""
    rows = []
    for model in sorted({r["model"] for r in results}):
        runs = sorted((r for r in results if r["model"] == model), key=lambda r: r["seed"])
        first = runs[0]
        values = [r["value"] for r in runs if "value" in r]
        row = {k: first[k] for k in ("model", "metric", "higher_is_better", "target", "epochs")}
        row.update(measured, seeds=[r["seed"] for r in runs], values=values, statuses=[r["status"] for r in runs],
                   seconds=[r["seconds"] for r in runs],
                   passed=all(r["status"] == "met" for r in runs))
        if values:
            worst = min(values) if first["higher_is_better"] else max(values)
            row.update(mean=sum(values) / len(values), worst=worst, margin=margin(first, worst))
        rows.append(row)
    return rows


def _fmt(x: float) -> str:
    return f"{x:.4f}" if abs(x) < 10 else f"{x:.1f}"


def table(report: dict[str, Any]) -> str:
    """The markdown block docs/models.md shows between its markers."""
    lines = [BEGIN, "",
             "Measured by `make quality` (tools/quality.py; docs/reports/quality.json has every run). Runs go "
             f"{report['workers']} at a time, one thread each, so a run's time is that of one core shared with "
             "the others. Every seed must reach the target; the margin is the worst seed's distance past it.", "",
             "| model | test metric | target | seeds | every seed | mean | margin (worst seed) | time per run | measured |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in report["models"]:
        arrow = ">=" if row["higher_is_better"] else "<="
        values = ", ".join(_fmt(v) for v in row["values"]) or "-"
        failed = [s for s, st in zip(row["seeds"], row["statuses"]) if st != "met"]
        note = "" if not failed else f" (seed {', '.join(map(str, failed))}: {'missed' if row['values'] else 'failed'})"
        seconds = sorted(row["seconds"])[len(row["seconds"]) // 2]
        lines.append(f"| `{row['model']}` | {row['metric']} | {arrow} {row['target']:g} | "
                     f"{', '.join(map(str, row['seeds']))} | {values}{note} | "
                     f"{_fmt(row['mean']) if 'mean' in row else '-'} | "
                     f"{_fmt(row['margin']) if 'margin' in row else '-'} | {seconds:.0f} s | "
                     f"{row['date']}, {row['cpu']}, torch {row['torch']} |")
    lines += ["", END]
    return "\n".join(lines)


def write_docs(path: Path, block: str) -> None:
    text = path.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path} has no {BEGIN} ... {END} block to rewrite")
    path.write_text(pattern.sub(lambda _: block, text))


def order(jobs: list[dict[str, Any]], previous: Path) -> list[dict[str, Any]]:
    """Longest first by the last report's times (unknown ones first), so the pool ends together."""
    seconds: dict[str, float] = {}
    if previous.is_file():
        for row in json.loads(previous.read_text()).get("models", []):
            seconds[row["model"]] = max(row["seconds"])
    return sorted(jobs, key=lambda j: -seconds.get(j["model"], float("inf")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", type=Path, default=ROOT / "docs" / "reports" / "quality.json")
    parser.add_argument("--docs", type=Path, default=None, help="rewrite this file's quality block (docs/models.md)")
    parser.add_argument("--models", default="*", help="patterns of model names, comma-separated (default: every trainable model)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seeds", type=int, default=None, help="seeds per model (default: the recipe's quality_seeds)")
    parser.add_argument("--plugin", type=Path, action="append", default=[], help="a local plugin file (repeatable)")
    parser.add_argument("--plan", action="store_true", help="print the jobs and stop")
    args = parser.parse_args(argv)
    from zoo import registry

    plugins = [p.resolve() for p in args.plugin]
    for plugin in plugins:
        registry.load_plugin_file(plugin)

    jobs = plan(args.models, args.seeds)
    if not jobs:
        raise SystemExit(f"no trainable model matches {args.models!r}")
    untargeted = sorted({j["model"] for j in jobs if j["target"] is None})
    if untargeted:
        print(f"FAIL: no Recipe.target stated (or no metric to hold to one) for {', '.join(untargeted)}",
              file=sys.stderr)
        return 1
    jobs = order(jobs, args.report)
    if args.plan:
        for job in jobs:
            print(f"{job['model']} seed {job['seed']} ({job['epochs']} epochs, target {job['target']:g})")
        return 0

    from zoo.bench.env import cpu_name
    import torch

    start = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory(prefix="zoo-quality-") as tmp, \
            concurrent.futures.ThreadPoolExecutor(max_workers=args.workers) as pool:
        futures = [pool.submit(run_one, job, Path(tmp), plugins) for job in jobs]
        for future in concurrent.futures.as_completed(futures):
            r = future.result()
            results.append(r)
            shown = _fmt(r["value"]) if "value" in r else "".join(r["error"].splitlines()[-1:])
            print(f"[{len(results)}/{len(jobs)}] {r['model']} seed {r['seed']}: {r['status']} {shown} "
                  f"({r['seconds']:.0f} s)", flush=True)
    today = datetime.date.today().isoformat()
    measured = {"date": today, "cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__}
    models, runs = summarize(results, measured), list(results)
    if args.models != "*" and args.report.is_file():  # keep the rows of the models this run left out
        left_out = {j["model"] for j in plan("*", None)} - {r["model"] for r in results}
        previous = json.loads(args.report.read_text())
        kept = [row for row in previous.get("models", []) if row["model"] in left_out]
        env = previous["environment"]
        models += [{"date": previous["date"], "cpu": env["cpu"], "cores": env["cores"], "torch": env["torch"], **row}
                   for row in kept]
        runs += [r for r in previous.get("runs", []) if r["model"] in left_out]
    report = {"date": today, "workers": args.workers, "wall_seconds": round(time.perf_counter() - start, 1),
              "environment": {"cpu": measured["cpu"], "cores": measured["cores"], "platform": platform.platform(),
                              "python": platform.python_version(), "torch": measured["torch"]},
              "command": " ".join(["tools/quality.py", *(argv if argv is not None else sys.argv[1:])]),
              "models": sorted(models, key=lambda r: r["model"]),
              "runs": sorted(runs, key=lambda r: (r["model"], r["seed"]))}
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    block = table(report)
    print(block)
    if args.docs is not None:
        write_docs(args.docs, block)
    bad = [r for r in results if r["status"] != "met"]
    for r in bad:
        print(f"FAIL: {r['model']} seed {r['seed']} {r['status']}: "
              + (f"test {r['metric']} {r['value']:.4g} against target {r['target']:g}" if "value" in r
                 else r["error"]), file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

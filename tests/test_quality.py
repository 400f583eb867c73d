"""tools/quality.py, the quality tier: every seed of every trainable model held to its
recipe's target by `zoo train` in processes of its own, the report, and the docs table.

Run on a plugin's two small recipes (tests/quality_plugin.py) instead of the zoo's full-size
ones, which `make quality` trains; the tool does the same either way.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import zoo
from zoo import registry
from zoo.training import TrainOptions

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "tests" / "quality_plugin.py"
DOCS = "# Models\n\nbefore\n<!-- quality:begin -->\na stale table\n<!-- quality:end -->\nafter\n"


def quality(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "quality.py"), "--plugin", str(PLUGIN), *args],
                          cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("quality")
    (work / "models.md").write_text(DOCS)
    done = quality("--models", "mlp.quality-*", "--report", str(work / "quality.json"),
                   "--docs", str(work / "models.md"), "--workers", "2", cwd=work)
    return work, done


def test_a_missed_target_fails_the_tier_and_names_the_run(first_run):
    _, done = first_run
    assert done.returncode == 1, done.stderr[-3000:]
    assert "FAIL: mlp.quality-missed seed 0 missed: test accuracy" in done.stderr
    assert "against target 1.01" in done.stderr
    assert "FAIL: mlp.quality-met" not in done.stderr


def test_every_seed_is_a_real_training_run_recorded_in_the_report(first_run):
    work, _ = first_run
    report = json.loads((work / "quality.json").read_text())
    rows = {row["model"]: row for row in report["models"]}
    met, missed = rows["mlp.quality-met"], rows["mlp.quality-missed"]
    assert met["seeds"] == [0, 1] and met["statuses"] == ["met", "met"] and met["passed"] is True
    assert missed["seeds"] == [0] and missed["statuses"] == ["missed"] and missed["passed"] is False
    assert met["worst"] == min(met["values"]) and met["margin"] == pytest.approx(met["worst"] - 0.5)
    assert missed["margin"] == pytest.approx(missed["worst"] - 1.01) and missed["margin"] < 0
    # each value is what `zoo train` reaches for that seed, one thread, as the tool runs it
    registry.load_plugin_file(PLUGIN)
    try:
        again = zoo.train("mlp.quality-met", out=work / "again", seed=1, progress=False,
                          options=TrainOptions(threads=1, tensorboard=False))
    finally:
        registry.unload_plugin_file(PLUGIN)
    assert again.metrics["test_accuracy"] == met["values"][1]


def test_the_docs_block_is_rewritten_and_the_rest_kept(first_run):
    work, _ = first_run
    text = (work / "models.md").read_text()
    assert text.startswith("# Models\n\nbefore\n<!-- quality:begin -->") and text.endswith("<!-- quality:end -->\nafter\n")
    assert "a stale table" not in text
    line = next(ln for ln in text.splitlines() if ln.startswith("| `mlp.quality-missed`"))
    assert "| accuracy | >= 1.01 | 0 |" in line and "(seed 0: missed)" in line


def test_a_run_of_some_models_keeps_the_other_rows(first_run, tmp_path):
    work, _ = first_run
    report = tmp_path / "quality.json"
    report.write_text((work / "quality.json").read_text())
    done = quality("--models", "mlp.quality-met", "--seeds", "1", "--report", str(report), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {row["model"]: row for row in json.loads(report.read_text())["models"]}
    assert rows["mlp.quality-met"]["seeds"] == [0]
    assert rows["mlp.quality-missed"]["statuses"] == ["missed"]  # kept from the first run


def test_a_trainable_model_without_a_target_is_refused(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "quality.py"), "--plugin",
                           str(ROOT / "tests" / "train_plugin.py"), "--models", "mlp.digits-test", "--plan"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "no Recipe.target stated" in done.stderr and "mlp.digits-test" in done.stderr

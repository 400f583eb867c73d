"""A backend plugin's slips (tests/user_plugins/slipped_backends.py), each named as that
backend's: an export refused with what the backend did and what it should do, nothing
written; a backend whose versions() fails listed as unavailable with why, and no other
command about another backend disturbed; a declaration that cannot work left out when the
plugin registers. Each once read "internal error: ..." or wrote an artifact zoo then
refused to open."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import zoo
from zoo import registry
from zoo.errors import ZooError

from cli_support import zoo_cli

PLUGINS = Path(__file__).parent / "user_plugins"
BACKENDS = str(PLUGINS / "slipped_backends.py")
MODEL = str(PLUGINS / "keyword_only.py")  # gate.kwonly: a small MLP

REFUSED = {
    "slip-export-says-done": "backend slip-export-says-done: export() returned a str (done); it returns None or a "
                             "dict, which the manifest keeps and load() gets back as `info`",
    "slip-export-keeps-paths": "backend slip-export-keeps-paths: export() returned an `info` the manifest cannot hold "
                               "(Object of type PosixPath is not JSON serializable): keep to strings, numbers, "
                               "booleans, None, lists and dicts with string keys",
    "slip-export-crashes": "backend slip-export-crashes failed to export gate.kwonly (fp32, cpu): RuntimeError: my "
                           "compiler crashed in pass 3",
    "slip-load-forgets-runner": "backend slip-load-forgets-runner: load() returned None, not a runner: a callable "
                                "taking a dict of input arrays by name and returning a dict of output arrays by name",
    "slip-runner-list": "model gate.kwonly: its backend's runner returned a list, not a dict of output arrays by name",
    "slip-versions-raise": "backend slip-versions-raise: versions() raised ModuleNotFoundError: No module named "
                           "'mylib'",
}


@pytest.fixture(scope="module")
def slipped():
    """Both plugin files loaded in this process, as --plugin loads them, every backend of
    REFUSED registered; unloaded after, so no other test module sees them."""
    os.environ["SLIPPED_BACKENDS"] = ",".join(REFUSED)
    try:
        registry.load_plugin_file(BACKENDS)
        registry.load_plugin_file(MODEL)
        yield
    finally:
        registry.unload_plugin_file(BACKENDS)
        registry.unload_plugin_file(MODEL)
        del os.environ["SLIPPED_BACKENDS"]


@pytest.mark.parametrize("backend", REFUSED)
def test_an_export_through_a_slipped_backend_is_refused_naming_it_and_writes_nothing(slipped, tmp_path, backend):
    with pytest.raises(ZooError) as refused:
        zoo.export("gate.kwonly", backend, repository=tmp_path / "exports", random_init=True)
    assert str(refused.value) == REFUSED[backend]
    assert not (tmp_path / "exports").exists() or not any((tmp_path / "exports").iterdir())


def test_the_command_line_says_it_in_one_line(tmp_path):
    result = zoo_cli("--plugin", BACKENDS, "--plugin", MODEL, "export", "gate.kwonly", "-b", "slip-export-crashes",
                     "--random-init", "-r", "exports", cwd=tmp_path, SLIPPED_BACKENDS="slip-export-crashes")
    assert result.returncode == 1 and " ".join(result.stderr.split()) == f"error: {REFUSED['slip-export-crashes']}"


def test_versions_that_fail_mark_their_backend_unavailable_and_the_rest_list(tmp_path):
    result = zoo_cli("--plugin", BACKENDS, "backends", "--json", cwd=tmp_path,
                     SLIPPED_BACKENDS="slip-versions-raise,slip-version-numbers,slip-none")
    assert result.returncode == 0, result.stderr
    rows = {row["backend"]: row for row in json.loads(result.stdout) if row["device"] == "cpu"}
    assert rows["slip-versions-raise"]["available"] is False and rows["slip-versions-raise"]["reason"] == (
        "backend slip-versions-raise: versions() raised ModuleNotFoundError: No module named 'mylib'")
    assert rows["slip-version-numbers"]["available"] is False and rows["slip-version-numbers"]["reason"] == (
        "backend slip-version-numbers: versions() returned {'mylib': 3}; it returns a dict of library names to "
        "version strings, as {\"onnxruntime\": onnxruntime.__version__}")
    assert rows["slip-none"]["available"] is True and rows["onnxruntime"]["available"] is True


def test_a_benchmark_of_another_backend_runs_beside_a_backend_whose_versions_fail(tmp_path):
    result = zoo_cli("--plugin", BACKENDS, "--plugin", MODEL, "bench", "gate.kwonly", "--backends", "onnxruntime",
                     "--batch-sizes", "1", "--random-init", "--min-time", "0.05", "--report-dir", "report",
                     cwd=tmp_path, SLIPPED_BACKENDS="slip-versions-raise")
    assert result.returncode == 0, result.stderr
    assert "slip-versions-raise: versions() raised ModuleNotFoundError" in result.stderr
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert [r["status"] for r in report["results"]] == ["ok"]


@pytest.mark.parametrize("backend, why", [
    ("slip-fp8", "its precisions name fp8, which zoo does not know (it knows fp32, fp16, bf16, int8)"),
    ("slip-nested-file", "its filename 'onnx/model.onnx' is not a file name: it names the model file inside the "
                         "artifact's version folder, as \"model.onnx\""),
])
def test_a_declaration_that_cannot_work_leaves_the_plugin_out_when_it_registers(tmp_path, backend, why):
    result = zoo_cli("--plugin", BACKENDS, "backends", "--json", cwd=tmp_path, SLIPPED_BACKENDS=f"{backend},slip-none")
    assert result.returncode == 0, result.stderr
    assert " ".join(result.stderr.split()) == (f"warning: plugin slipped_backends.py registered backend {backend!r}: "
                                               f"{why}; its backends are left out")
    assert not {backend, "slip-none"} & {row["backend"] for row in json.loads(result.stdout)}

"""A real third-party plugin distribution, installed with pip, adds a model; uninstalled,
the model is gone. Nothing in zoo changes in between: the entry point is the contract.

The distribution is tests/thirdparty/zoo-example-plugin. It is built from a copy (so
the build leaves nothing in the source tree) without build isolation and without an
index, so nothing is downloaded. `zoo` itself runs in subprocesses, which read the
installed entry points afresh, as a user's shell would.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import zoo

DIST = Path(__file__).parent / "thirdparty" / "zoo-example-plugin"
MODEL = "mlp.example"


def pip(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "--no-input"],
                            capture_output=True, text=True)
    assert result.returncode == 0, f"pip {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"


def zoo_cli(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "zoo", *args], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result


def listed() -> dict[str, dict]:
    return {row["name"]: row for row in json.loads(zoo_cli("list", "--json").stdout)}


class Installed:
    """The installed example distribution; `uninstall()` removes it (idempotent)."""

    def uninstall(self) -> None:
        pip("uninstall", "-y", "zoo-example-plugin")


@pytest.fixture(scope="module")
def example_plugin(tmp_path_factory):
    # Load this process's entry points now, so the example plugin never registers in the
    # test process itself: only the subprocesses below see it, and it leaves with them.
    zoo.list_models()
    source = tmp_path_factory.mktemp("dist") / DIST.name
    shutil.copytree(DIST, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    installed = Installed()
    try:
        pip("install", "--no-deps", "--no-build-isolation", "--no-index", "--quiet", str(source))
        yield installed
    finally:
        installed.uninstall()


def test_installed_plugin_model_is_listed_with_its_plugin(example_plugin):
    models = listed()
    assert MODEL in models
    row = models[MODEL]
    assert "zoo-example-plugin" in row["plugin"]
    assert row["domain"] == "tabular"
    assert row["inputs"] == [{"name": "features", "dtype": "float32", "shape": ["batch", 4]}]
    # the built-in plugins are still there, found the same way
    assert "resnet8.digits" in models
    info = json.loads(zoo_cli("info", MODEL, "--json").stdout)  # `zoo list` builds no model; `info` does
    assert info["parameters"] == (4 * 16 + 16) + (16 * 3 + 3)


def test_installed_plugin_model_exports(example_plugin, repository):
    zoo_cli("export", MODEL, "--backend", "onnxruntime", "--repository", str(repository))
    artifact = repository / f"{MODEL}.onnxruntime.fp32"
    assert (artifact / "1" / "model.onnx").is_file()
    assert (artifact / "config.pbtxt").is_file()
    manifest = json.loads((artifact / "zoo.json").read_text())
    assert manifest["model"]["name"] == MODEL
    assert "zoo-example-plugin" in manifest["model"]["plugin"]
    assert manifest["weights"]["source"].startswith("random init")
    assert manifest["parity"]["passed"]
    assert manifest["model"]["origin"]["distribution"] == "zoo-example-plugin"
    # this process never loaded the plugin: the artifact verifies by its test vectors and
    # says which distribution rebuilds its PyTorch module
    assert zoo.verify(artifact)["reference"] == "test vectors"
    with pytest.raises(zoo.ZooError, match=r"distribution zoo-example-plugin.*pip install zoo-example-plugin"):
        zoo.Artifact.open(artifact).spec().build()


def test_uninstalling_the_distribution_removes_its_model(example_plugin):
    # runs last in this module: the fixture's teardown uninstalls again, harmlessly
    example_plugin.uninstall()
    models = listed()
    assert MODEL not in models
    assert "resnet8.digits" in models

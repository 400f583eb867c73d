"""A real third-party plugin distribution, installed with pip, adds a model; uninstalled,
the model is gone. Nothing in zoo changes in between: the entry point is the contract.

The distribution is tests/thirdparty/zoo-example-plugin. It is built from a copy (so
the build leaves nothing in the source tree) without build isolation and without an
index, so nothing is downloaded, and installed into a throwaway environment that sees
the project's packages through a `.pth` file: the environment running the tests is never
changed. `zoo` runs in that environment's interpreter, which reads the installed entry
points afresh, as a user's shell would. Each test that uninstalls has an environment of
its own, so the tests hold in any order.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import zoo

DIST = Path(__file__).parent / "thirdparty" / "zoo-example-plugin"
MODEL = "mlp.example"


class Environment:
    """A virtual environment without pip of its own (this one's pip installs into it) that
    also sees this environment's packages."""

    def __init__(self, root: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
        self.python = root / "bin" / "python"
        site = Path(subprocess.run([str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip())
        # addsitedir, not a bare path: the project's editable installs are .pth files there too
        (site / "zz_project.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")

    def pip(self, *args: str) -> None:
        result = subprocess.run([sys.executable, "-m", "pip", "--python", str(self.python), *args,
                                 "--disable-pip-version-check", "--no-input"], capture_output=True, text=True)
        assert result.returncode == 0, f"pip {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"

    def install(self, tmp: Path) -> None:
        source = tmp / DIST.name
        shutil.copytree(DIST, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        self.pip("install", "--no-deps", "--no-build-isolation", "--no-index", "--quiet", str(source))

    def uninstall(self) -> None:
        self.pip("uninstall", "-y", "zoo-example-plugin")

    def zoo(self, *args: str) -> subprocess.CompletedProcess:
        result = subprocess.run([str(self.python), "-m", "zoo", *args], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        return result

    def listed(self) -> dict[str, dict]:
        return {row["name"]: row for row in json.loads(self.zoo("list", "--json").stdout)}


@pytest.fixture(scope="module")
def example_plugin(tmp_path_factory):
    env = Environment(tmp_path_factory.mktemp("env"))
    env.install(tmp_path_factory.mktemp("dist"))
    return env


def test_installed_plugin_model_is_listed_with_its_plugin(example_plugin):
    models = example_plugin.listed()
    assert MODEL in models
    row = models[MODEL]
    assert "zoo-example-plugin" in row["plugin"]
    assert row["domain"] == "tabular"
    assert row["inputs"] == [{"name": "features", "dtype": "float32", "shape": ["batch", 4]}]
    # the built-in plugins are still there, found the same way
    assert "resnet8.digits" in models
    info = json.loads(example_plugin.zoo("info", MODEL, "--json").stdout)  # `zoo list` builds no model; `info` does
    assert info["parameters"] == (4 * 16 + 16) + (16 * 3 + 3)


def test_installed_plugin_model_exports(example_plugin, repository):
    example_plugin.zoo("export", MODEL, "--backend", "onnxruntime", "--repository", str(repository))
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


def test_uninstalling_the_distribution_removes_its_model(tmp_path):
    env = Environment(tmp_path / "env")
    env.install(tmp_path)
    assert MODEL in env.listed()
    env.uninstall()
    models = env.listed()
    assert MODEL not in models
    assert "resnet8.digits" in models
    assert MODEL not in zoo.list_models()  # never in the environment running the tests


def _readme_block(readme: str, caption: str) -> str:
    """The code block that follows `caption` in README.md."""
    after = readme.split(caption, 1)[1]
    return after.split("```", 2)[1].split("\n", 1)[1]


def test_the_readmes_plugin_installs_as_written(tmp_path):
    """README's "Writing a model plugin", copied as a user copies it: its `pyproject.toml`
    and its module, nothing added, install with pip, list, and export."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    source = tmp_path / "zoo-example-plugin"
    (source / "zoo_example_plugin").mkdir(parents=True)
    (source / "pyproject.toml").write_text(_readme_block(readme, "`pyproject.toml`:"))
    module = _readme_block(readme, "`zoo_example_plugin/__init__.py`:")
    (source / "zoo_example_plugin" / "__init__.py").write_text(module)
    env = Environment(tmp_path / "env")
    env.pip("install", "--no-deps", "--no-build-isolation", "--no-index", "--quiet", str(source))
    assert env.listed()[MODEL]["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["batch", 4]}]
    env.zoo("export", MODEL, "--backend", "onnxruntime", "--repository", str(tmp_path / "exports"))
    assert zoo.verify(tmp_path / "exports" / f"{MODEL}.onnxruntime.fp32")["parity"]["passed"]

"""An artifact is exactly what its manifest lists, under the name it was exported with,
and a hand-edited manifest is refused naming its bad field.

The manifest's hashes (and a signature over them) vouch only for the files it lists,
while Triton serves the directory: an added `2/model.py` is the version Triton serves
(its default version policy is the latest), answering whatever its author wrote, while
`zoo verify` said "verified" (found so). A signed artifact copied under another name was
served under that name with its signature "verified". Each case is refused by
`Artifact.open`, so by `zoo verify`, `zoo serve`, `zoo bench`, `zoo deploy` and `zoo.load`.
"""

from __future__ import annotations

import importlib.util
import json
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import zoo
from zoo.artifact import Artifact
from zoo.errors import ArtifactError


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    spec = zoo.get_model("resnet8.digits").tiny()
    # the Python-backend form: it lists a 1/model.py, which Triton's Python backend imports
    return zoo.export(spec, "onnxruntime", repository=tmp_path_factory.mktemp("exports"), random_init=True,
                      triton="python").path


@pytest.fixture
def copy(exported, tmp_path) -> Path:
    return Path(shutil.copytree(exported, tmp_path / exported.name))


PYTHON_MODEL = "import triton_python_backend_utils as pb_utils\nclass TritonPythonModel:\n    pass\n"


@pytest.mark.parametrize("added, named", [
    ({"2/model.py": PYTHON_MODEL}, "2"),  # a version Triton serves in place of 1/
    ({"2/": None}, "2"),  # an empty version directory: Triton waited on it for minutes
    ({"configs/other.pbtxt": 'name: "x"\n'}, "configs"),  # Triton's custom configuration folder
    ({"1/__pycache__/model.cpython-311.pyc": "x"}, "1/__pycache__/model.cpython-311.pyc"),  # runs before model.py
    ({"notes.txt": "hello"}, "notes.txt"),
])
def test_anything_the_manifest_does_not_list_is_refused(copy, added, named):
    for rel, text in added.items():
        target = copy / rel
        if text is None:
            target.mkdir(parents=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    with pytest.raises(ArtifactError, match=rf"artifact {copy.name} holds {named}, which its manifest does not list"):
        Artifact.open(copy)
    with pytest.raises(ArtifactError, match="which its manifest does not list"):
        zoo.verify(copy)


def test_the_bytecode_python_writes_for_a_listed_model_py_is_accepted_and_no_other(copy, tmp_path):
    """Triton's Python backend caches `1/model.py`'s bytecode in `1/__pycache__` when it
    imports it (whatever PYTHONDONTWRITEBYTECODE says): that file is the compilation of a
    listed, hashed source, and accepted; a .pyc compiled from anything else, which Python
    would run in place of model.py, is refused."""
    model_py = copy / "1" / "model.py"
    cached = Path(importlib.util.cache_from_source(str(model_py)))
    py_compile.compile(str(model_py), cfile=str(cached), doraise=True)  # as an import writes it
    assert Artifact.open(copy).name == copy.name
    assert zoo.verify(copy)["parity"]["passed"]
    other = tmp_path / "model.py"
    other.write_text(model_py.read_text() + "\nprint('not the listed source')\n")
    py_compile.compile(str(other), cfile=str(cached), doraise=True)
    with pytest.raises(ArtifactError, match=rf"holds 1/__pycache__/{cached.name}, which its manifest does not list.*"
                                            rf"accepted only where each file compiles a listed source"):
        Artifact.open(copy)
    cached.write_bytes(b"\x00" * 8)  # not bytecode at all
    with pytest.raises(ArtifactError, match=rf"holds 1/__pycache__/{cached.name}"):
        Artifact.open(copy)


def test_an_artifact_under_another_name_is_refused(exported, tmp_path):
    other = Path(shutil.copytree(exported, tmp_path / "resnet8.digits.torch.fp32"))
    with pytest.raises(ArtifactError, match=rf"artifact resnet8.digits.torch.fp32: its manifest names it "
                                            rf"'{exported.name}'.*rename the directory back, or re-export it"):
        zoo.load(other)


def test_the_untouched_copy_opens(copy):
    assert Artifact.open(copy).name == copy.name


@pytest.mark.parametrize("edit, field", [
    (lambda m: m.update(model="resnet8"), "model"),
    (lambda m: m["model"].update(name=["a"]), "model.name"),
    (lambda m: m["model"].update(config=[1]), "model.config"),
    (lambda m: m.update(backend="onnxruntime"), "backend"),
    (lambda m: m["backend"].update(versions="x"), "backend.versions"),
    (lambda m: m["signature"]["axes"].update(batch=[1]), "signature.axes"),
    (lambda m: m["signature"]["axes"].update(batch=[1, 8, "64"]), "signature.axes"),
    (lambda m: m["signature"].update(inputs="image"), "signature.inputs"),
    (lambda m: m["test_data"].update(sets=5), "test_data.sets"),
    (lambda m: m.update(precision=32), "precision"),
    # each of these reached a TypeError, a shape read letter by letter, or an engine error
    (lambda m: m["test_data"]["sets"][0].update(file=["x"]), r"test_data.sets\[0\].file"),
    (lambda m: m["model"].update(tolerances={"fp32": "x"}), "model.tolerances.fp32"),
    (lambda m: m["model"]["tolerances"]["fp32"].update(atol=float("nan")), "model.tolerances.fp32.atol"),
    (lambda m: m["model"]["tolerances"]["fp32"].update(rtol=-1), "model.tolerances.fp32.rtol"),
    (lambda m: m["signature"]["inputs"][0].update(value_range="ab"), r"signature.inputs\[0\].value_range"),
    (lambda m: m["signature"]["inputs"][0].update(shape="batch"), r"signature.inputs\[0\].shape"),
    (lambda m: m["signature"]["outputs"][0].update(dtype=None), r"signature.outputs\[0\].dtype"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_manifest_field_of_the_wrong_type_is_refused_naming_it(copy, edit, field):
    manifest = json.loads((copy / "zoo.json").read_text())
    edit(manifest)
    (copy / "zoo.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=rf"manifest field {field} must be "):
        Artifact.open(copy)


def test_zoo_verify_says_so_in_one_line(copy):
    manifest = json.loads((copy / "zoo.json").read_text())
    manifest["test_data"]["sets"] = 5
    (copy / "zoo.json").write_text(json.dumps(manifest))
    result = subprocess.run([sys.executable, "-m", "zoo", "verify", str(copy)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip() == (f"error: artifact {copy.name}: manifest field test_data.sets must be a list; "
                                      f"re-export it")

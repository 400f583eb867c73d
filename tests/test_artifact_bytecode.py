"""The bytecode another Python wrote for a python-form `1/model.py` is refused, saying why.

Triton's container runs its own Python (tritonserver:24.08-py3: 3.10), which writes
`1/__pycache__/model.cpython-310.pyc` when it imports `model.py` from a repository mounted
writable. `zoo verify` on a machine with another Python said only "holds
1/__pycache__/model.cpython-310.pyc, which its manifest does not list". This Python cannot
compile the code that one would, and the file's header vouches for nothing (a planted file
copies the source's time and size, or its hash, into it, and that Python runs the planted
code instead of model.py), so it stays refused; the message now says whose bytecode it is
and what to do. This Python's own is accepted where it is model.py's compilation
(tests/test_artifact_contents.py).
"""

from __future__ import annotations

import importlib.util
import py_compile
import shutil
import sys
from pathlib import Path

import pytest

import zoo
from zoo.artifact import Artifact
from zoo.errors import ArtifactError

#: a CPython cache tag other than this Python's
OTHER = "cpython-310" if sys.implementation.cache_tag != "cpython-310" else "cpython-312"


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    spec = zoo.get_model("resnet8.digits").tiny()
    return zoo.export(spec, "onnxruntime", repository=tmp_path_factory.mktemp("exports"), random_init=True,
                      triton="python").path


def cache(source: Path, tag: str) -> Path:
    """`source` compiled as an import writes it, then named with `tag`."""
    own = Path(importlib.util.cache_from_source(str(source)))
    py_compile.compile(str(source), cfile=str(own), doraise=True)
    return own.rename(own.with_name(f"{source.stem}.{tag}.pyc"))


@pytest.mark.parametrize("name", [f"model.{OTHER}.pyc", f"model.{OTHER}.opt-1.pyc"])
def test_another_cpythons_cache_of_model_py_is_refused_naming_it_and_the_fix(exported, tmp_path, name):
    copy = Path(shutil.copytree(exported, tmp_path / exported.name))
    cache(copy / "1" / "model.py", OTHER).rename(copy / "1" / "__pycache__" / name)
    with pytest.raises(ArtifactError) as refused:
        Artifact.open(copy)
    assert str(refused.value) == (
        f"artifact {copy.name} holds 1/__pycache__/{name}, {OTHER}'s bytecode of 1/model.py (Triton's container "
        f"runs its own Python), which this Python ({sys.implementation.cache_tag}) cannot compile to compare: "
        f"nothing here vouches for its code, yet that Python would run it; remove 1/__pycache__ (Triton writes it "
        f"again), and serve the repository read-only to keep it unwritten")
    shutil.rmtree(copy / "1" / "__pycache__")  # as the message says
    assert zoo.verify(copy)["parity"]["passed"]


def test_this_pythons_own_cache_of_model_py_is_accepted(exported, tmp_path):
    copy = Path(shutil.copytree(exported, tmp_path / exported.name))
    cache(copy / "1" / "model.py", sys.implementation.cache_tag)
    assert Artifact.open(copy).name == copy.name
    planted = copy / "1" / "__pycache__" / f"model.{sys.implementation.cache_tag}.pyc"
    planted.write_bytes(planted.read_bytes()[:16] + b"\x00" * 8)  # the header kept, the code not model.py's
    with pytest.raises(ArtifactError, match=r"holds 1/__pycache__/model\.cpython-\d+\.pyc, which its manifest "):
        Artifact.open(copy)

"""A damaged or hand-edited artifact is refused in one line that names the file or field.

Found by feeding `zoo verify` corrupted artifacts: a safetensors file that does not parse,
a 5000-character manifest path and a zoo.json nested 100000 deep each ended in "internal
error" with the library's words and no file named; a tolerance of 1e308 in the manifest
verified anything; an artifact renamed with its manifest's "name" was served while its
config.pbtxt still named the old model, which Triton refuses.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import struct
from pathlib import Path

import pytest

import zoo
from zoo.artifact import Artifact
from zoo.errors import ArtifactError
from zoo.fsutil import sha256_file

NAME = "resnet8.digits.onnxruntime.fp32"


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    spec = zoo.get_model("resnet8.digits").tiny()
    return zoo.export(spec, "onnxruntime", repository=tmp_path_factory.mktemp("exports"), random_init=True).path


@pytest.fixture
def copy(exported, tmp_path) -> Path:
    return Path(shutil.copytree(exported, tmp_path / "repo" / exported.name))


def edit(artifact: Path, change) -> None:
    manifest = json.loads((artifact / "zoo.json").read_text())
    change(manifest)
    (artifact / "zoo.json").write_text(json.dumps(manifest))


def rehash(artifact: Path, member: str) -> None:
    edit(artifact, lambda m: m["files"].update({member: sha256_file(artifact / member)}))


def header(text: bytes, body: bytes = b"", length: int | None = None) -> bytes:
    """A safetensors file: the header's length (8 bytes, little-endian), the header, the data."""
    return struct.pack("<Q", len(text) if length is None else length) + text + body


@pytest.mark.parametrize("member, content", [
    ("weights.safetensors", b"abc"),  # cut short
    ("test_data/set_1.safetensors", b"abc"),
    ("test_data/set_1.safetensors", header(b"{}", length=2 ** 62)),
    ("test_data/set_1.safetensors",  # a shape of 1e15 elements over 4 bytes
     header(b'{"input.image":{"dtype":"F32","shape":[1000000000000000],"data_offsets":[0,4]}}', b"\0" * 4)),
], ids=["weights", "vectors", "header-length", "shape"])
def test_a_safetensors_file_that_does_not_parse_is_named(copy, member, content):
    (copy / member).write_bytes(content)
    rehash(copy, member)  # as an edit that rehashes would: only a signature sees it otherwise
    with pytest.raises(ArtifactError, match=rf"^artifact {NAME}: {member} is not a valid safetensors file \(.+\); "
                                            rf"re-export it$"):
        zoo.verify(copy)


def test_test_vectors_naming_a_file_that_is_not_safetensors_are_named(copy):
    edit(copy, lambda m: m["test_data"]["sets"][0].update(file="1/model.onnx"))
    with pytest.raises(ArtifactError, match=r"1/model.onnx is not a valid safetensors file"):
        Artifact.open(copy).test_vectors()


def test_a_path_too_long_for_the_file_system_is_refused_cut_short(copy, caplog):
    edit(copy, lambda m: m["files"].update({"a" * 5000: "0" * 64}))
    with pytest.raises(ArtifactError) as caught:
        Artifact.open(copy)
    assert str(caught.value) == f"artifact {NAME}: manifest names an invalid path '{'a' * 80}…' (too long)"
    from zoo.serve.repository import ServeOptions, scan

    with caplog.at_level(logging.WARNING, logger="zoo"):
        loaded, skipped = scan(copy.parent, ServeOptions())
    assert not loaded and [s.reason for s in skipped] == [str(caught.value)]
    assert not any(r.exc_info for r in caplog.records)  # a zoo error: its reason, no traceback


def test_a_manifest_nested_too_deeply_is_unreadable(copy):
    (copy / "zoo.json").write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(ArtifactError, match=rf"^artifact {NAME}: zoo.json is unreadable \(nested too deeply\)"):
        Artifact.open(copy)


def unregistered(manifest: dict) -> None:
    """The manifest of a model no plugin here registers: its own tolerances are the ones held."""
    manifest["model"]["name"] = "ghost.model"


def test_without_the_plugin_the_tolerance_comes_from_the_manifest(copy):
    edit(copy, unregistered)
    assert zoo.verify(copy)["parity"]["tolerance_from"] == "manifest"


@pytest.mark.parametrize("tolerance, says", [
    ({"atol": 1e308, "rtol": 1e-3}, "fp32 tolerance atol=1e+308 is not between 0 and 1000"),
    ({"atol": 1e-3, "rtol": 2.0}, "fp32 tolerance rtol=2 is not between 0 and 1"),
])
def test_a_manifest_tolerance_that_bounds_nothing_is_refused(copy, tolerance, says):
    def change(manifest):
        unregistered(manifest)
        manifest["model"]["tolerances"]["fp32"] = tolerance

    edit(copy, change)
    with pytest.raises(ArtifactError, match=rf"^artifact {NAME}: its manifest's {re.escape(says)}"):
        zoo.verify(copy)


def test_config_pbtxt_must_name_the_model_as_its_directory_does(copy):
    renamed = copy.rename(copy.parent / "resnet8.digits.onnxruntime.fp16")
    edit(renamed, lambda m: m.update(name=renamed.name))
    with pytest.raises(ArtifactError, match=rf"^artifact {renamed.name}: its config.pbtxt names it '{NAME}'"):
        Artifact.open(renamed)
    config = renamed / "config.pbtxt"
    config.write_text(config.read_text().replace(f'name: "{NAME}"', f'name: "{renamed.name}"', 1))
    rehash(renamed, "config.pbtxt")
    assert Artifact.open(renamed).name == renamed.name


@pytest.mark.parametrize("named, says", [
    ("/tmp/weights.safetensors", "manifest path '/tmp/weights.safetensors' escapes the artifact directory"),
    ("../other/weights.safetensors", "manifest path '../other/weights.safetensors' escapes the artifact directory"),
    ("test_data/set_1.safetensors", "manifest field weights.file is 'test_data/set_1.safetensors', while an "
                                    "artifact's reference weights are its own weights.safetensors; re-export it"),
], ids=["absolute", "escaping", "another-member"])
def test_weights_file_must_name_the_artifacts_own_weights(copy, tmp_path, named, says):
    """weights.file was never read (the weights are always weights.safetensors), so a manifest
    naming other weights there was verified, and signed, as it stood."""
    from zoo.signing import sign

    edit(copy, lambda m: m["weights"].update(file=named))
    with pytest.raises(ArtifactError, match=rf"^artifact {NAME}: {re.escape(says)}"):
        zoo.verify(copy)
    with pytest.raises(ArtifactError, match=rf"^artifact {NAME}: {re.escape(says)}"):
        sign(copy, tmp_path / "key.pem")  # refused before any key is read


@pytest.mark.parametrize("make, kind", [(os.mkfifo, "a FIFO"), (os.mkdir, "a directory")])
def test_a_listed_member_that_is_no_regular_file_is_not_called_missing(copy, make, kind):
    (copy / "weights.safetensors").unlink()
    make(copy / "weights.safetensors")
    with pytest.raises(ArtifactError, match=rf"^artifact {NAME}: file weights.safetensors is not a regular file "
                                            rf"\(it is {kind}\); re-export it$"):
        zoo.verify(copy)

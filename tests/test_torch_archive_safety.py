"""A `torch` artifact's `model.pt2` is read without unpickling anything, whatever its
records say. Each archive below is a real exported program with one record added or
changed the way an attacker would, and its manifest hash updated to match (as anyone who
can write the directory can; only a signature vouches for who wrote it). Each payload is a
pickle that writes a marker file when unpickled: the artifact must be refused by name,
and the marker must not exist. torch.export.load unpickles `opaque_obj_*` constants and
legacy `<model>.pt` records whatever their `use_pickle` flag says, so a check that only
looks for the flag lets them through.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

import zoo
from zoo.errors import ArtifactError
from zoo_torch.backend import check_no_pickle


class _Marker:
    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (eval, (f"open({self.path!r}, 'w').write('unpickled') and __import__('torch').zeros(1)",))


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    spec = zoo.get_model("resnet8.digits").tiny()
    return zoo.export(spec, "torch", repository=tmp_path_factory.mktemp("exports"), random_init=True).path


def _raw_entry(path_name: str, size: int) -> dict:
    return {"path_name": path_name, "is_param": False, "use_pickle": False,
            "tensor_meta": {"dtype": 1, "sizes": [{"as_int": size}], "strides": [{"as_int": 1}],
                            "storage_offset": {"as_int": 0}, "requires_grad": False,
                            "device": {"type": "cpu", "index": None}, "layout": 7}}


def _opaque_constant(payload: bytes) -> dict[str, bytes]:
    config = {"config": {"evil": _raw_entry("opaque_obj_0", len(payload))}}
    return {"model/data/constants/model_constants_config.json": json.dumps(config).encode(),
            "model/data/constants/opaque_obj_0": payload}


def _pickled_weight(payload: bytes, archive: zipfile.ZipFile) -> dict[str, bytes]:
    name = "model/data/weights/model_weights_config.json"
    config = json.loads(archive.read(name))
    first = next(iter(config["config"]))
    config["config"][first] = {**config["config"][first], "use_pickle": True}
    return {name: json.dumps(config).encode(),
            f"model/data/weights/{config['config'][first]['path_name']}": payload}


ATTACKS = {
    "opaque-constant-flagged-raw": lambda payload, archive: _opaque_constant(payload),
    "legacy-weights-record": lambda payload, archive: {"model/data/weights/model.pt": payload},
    "legacy-constants-record": lambda payload, archive: {"model/data/constants/model.pt": payload},
    "weight-flagged-pickle": _pickled_weight,
    "sample-inputs": lambda payload, archive: {"model/data/sample_inputs/model.pt": payload},
    "unknown-record": lambda payload, archive: {"model/data/other/thing.pkl": payload},
}
REFUSALS = {
    "opaque-constant-flagged-raw": r"stores constant 'evil' as something other than raw tensor bytes",
    "legacy-weights-record": r"contains model/data/weights/model.pt, which is not a record of a plain torch.export",
    "legacy-constants-record": r"contains model/data/constants/model.pt, which is not a record",
    "weight-flagged-pickle": r"stores weight '[^']+' as something other than raw tensor bytes",
    "sample-inputs": r"contains pickled sample inputs \(model/data/sample_inputs/model.pt\)",
    "unknown-record": r"contains model/data/other/thing.pkl, which is not a record",
}


def _tampered(source: Path, target: Path, changes: dict[str, bytes]) -> Path:
    """A copy of the artifact whose model.pt2 has `changes` written over or added to its
    records, with the manifest's hash of the archive updated to match."""
    shutil.copytree(source, target)
    archive = target / "1" / "model.pt2"
    with zipfile.ZipFile(source / "1" / "model.pt2") as old, zipfile.ZipFile(archive, "w") as new:
        for info in old.infolist():
            if info.filename not in changes:
                new.writestr(info.filename, old.read(info))
        for name, data in changes.items():
            new.writestr(name, data)
    manifest = json.loads((target / "zoo.json").read_text())
    manifest["files"]["1/model.pt2"] = hashlib.sha256(archive.read_bytes()).hexdigest()
    (target / "zoo.json").write_text(json.dumps(manifest, indent=2))
    return target


def test_the_exported_archive_passes_and_loads(exported):
    check_no_pickle(exported / "1" / "model.pt2")
    spec = zoo.get_model("resnet8.digits").tiny()
    inputs = spec.sample(2, np.random.default_rng(0))
    assert zoo.load(exported)(inputs)["logits"].shape == (2, 10)


@pytest.mark.parametrize("attack", ATTACKS)
def test_an_archive_that_would_unpickle_is_refused_before_anything_runs(exported, tmp_path, attack):
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Marker(marker))
    with zipfile.ZipFile(exported / "1" / "model.pt2") as archive:
        changes = ATTACKS[attack](payload, archive)
    artifact = _tampered(exported, tmp_path / exported.name, changes)
    with pytest.raises(ArtifactError, match=REFUSALS[attack]):
        check_no_pickle(artifact / "1" / "model.pt2")
    for load in (zoo.load, zoo.verify):  # the paths `zoo serve`, `zoo bench` and `zoo verify` take
        with pytest.raises(ArtifactError, match=REFUSALS[attack]):
            load(artifact)
    assert not marker.exists()


def test_an_aotinductor_package_may_hold_its_compiled_code_but_no_torchscript_object(tmp_path):
    archive = tmp_path / "model.pt2"
    records = {"model/archive_format": b"pt2", "model/archive_version": b"0",
               "model/data/aotinductor/model/abc.wrapper.so": b"\x7fELF",
               "model/data/aotinductor/model/abc.wrapper_metadata.json": b"{}"}
    with zipfile.ZipFile(archive, "w") as z:
        for name, data in records.items():
            z.writestr(name, data)
    check_no_pickle(archive, compiled_code=True)
    with pytest.raises(ArtifactError, match=r"abc.wrapper.so, which is not a record of a plain torch.export"):
        check_no_pickle(archive)  # compiled code only where an AOTInductor package is expected
    with zipfile.ZipFile(archive, "a") as z:
        z.writestr("model/data/aotinductor/model/custom_objs_config.json", b"{}")
    with pytest.raises(ArtifactError, match=r"a pickled TorchScript object \(model/data/aotinductor/model/custom_objs"):
        check_no_pickle(archive, compiled_code=True)

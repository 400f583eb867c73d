"""Signed artifacts (zoo/signing.py): OpenSSF model-signing over every file of the artifact.

The attack the unsigned manifest cannot see is the one tested first: change the model
file and write its new sha256 into zoo.json. `Artifact.open` accepts that artifact; the
signature refuses it, naming the files. Keys are elliptic-curve P-256, made here with
`cryptography`; nothing reaches the network (no Sigstore).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("model_signing", reason="zoo[sign] is not installed")

from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

import zoo  # noqa: E402
from zoo.artifact import Artifact  # noqa: E402
from zoo.fsutil import sha256_file  # noqa: E402
from zoo.signing import SIGNATURE, SignatureError, fingerprint, sign, verify_signature  # noqa: E402

ONNX = "resnet8.digits.onnxruntime.fp32"


def keypair(directory: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    private, public = directory / f"{name}.pem", directory / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("signing-exports")
    return zoo.export(zoo.get_model("resnet8.digits").tiny(), "onnxruntime", repository=repo, random_init=True).path


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    directory = tmp_path_factory.mktemp("keys")
    return {"owner": keypair(directory, "owner"), "other": keypair(directory, "other")}


@pytest.fixture
def artifact(exported, tmp_path) -> Path:
    """A private copy under the artifact's own name."""
    copy = tmp_path / "exports" / exported.name
    shutil.copytree(exported, copy)
    return copy


def test_sign_then_verify_names_the_key(artifact, keys):
    private, public = keys["owner"]
    result = sign(artifact, private)
    assert (artifact / SIGNATURE).is_file()
    assert result["key"] == fingerprint(public.read_bytes()) and result["key"].startswith("sha256:")
    assert verify_signature(artifact, public) == {"signed": True, "verified": True, "key": result["key"]}
    Artifact.open(artifact)  # the signature file is not one of the manifest's: the artifact still opens


def test_a_file_changed_with_its_manifest_hash_is_refused(artifact, keys):
    private, public = keys["owner"]
    sign(artifact, private)
    model = artifact / "1" / "model.onnx"
    model.write_bytes(model.read_bytes() + b"\0")
    manifest = json.loads((artifact / "zoo.json").read_text())
    manifest["files"]["1/model.onnx"] = sha256_file(model)
    (artifact / "zoo.json").write_text(json.dumps(manifest))
    Artifact.open(artifact)  # what the hashes alone cannot see
    with pytest.raises(SignatureError, match=r"changed: 1/model.onnx, zoo.json"):
        verify_signature(artifact, public)


def test_an_added_or_removed_file_is_refused(artifact, keys):
    private, public = keys["owner"]
    sign(artifact, private)
    (artifact / "1" / "extra.py").write_text("print('hello')\n")
    with pytest.raises(SignatureError, match=r"Extra files found in model .*1/extra.py"):
        verify_signature(artifact, public)
    (artifact / "1" / "extra.py").unlink()
    (artifact / "config.pbtxt").unlink()
    with pytest.raises(SignatureError, match=r"Missing files .*config.pbtxt"):
        verify_signature(artifact, public)


def test_another_key_and_an_unsigned_artifact_are_refused(artifact, keys):
    with pytest.raises(SignatureError, match="is not signed"):
        verify_signature(artifact, keys["owner"][1])
    sign(artifact, keys["owner"][0])
    other = fingerprint(keys["other"][1].read_bytes())
    with pytest.raises(SignatureError, match=f"does not verify with key {other}"):
        verify_signature(artifact, keys["other"][1])


def test_signing_refuses_an_artifact_that_does_not_match_its_manifest(artifact, keys):
    (artifact / "weights.safetensors").write_bytes(b"corrupted")
    with pytest.raises(zoo.ZooError, match="does not match its sha256"):
        sign(artifact, keys["owner"][0])
    assert not (artifact / SIGNATURE).exists()


def test_a_bad_key_file_is_one_clear_error(artifact, tmp_path):
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key")
    with pytest.raises(zoo.ZooError, match="not a usable PEM private key"):
        sign(artifact, bad)
    with pytest.raises(zoo.ZooError, match="cannot read the private key"):
        sign(artifact, tmp_path / "missing.pem")
    with pytest.raises(zoo.ZooError, match="not a PEM public key"):
        verify_signature(artifact, bad)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_PLUGINS", "ZOO_DEBUG")}
    return subprocess.run([sys.executable, "-m", "zoo", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_cli_sign_verify_and_export_sign(artifact, keys, tmp_path):
    private, public = keys["owner"]
    repo = artifact.parent
    unsigned = cli("verify", str(artifact), "--public-key", str(public), cwd=tmp_path)
    assert unsigned.returncode != 0 and "is not signed" in unsigned.stderr
    assert len(unsigned.stderr.strip().splitlines()) == 1, unsigned.stderr
    signed = cli("sign", artifact.name, "--repository", str(repo), "--key", str(private), cwd=tmp_path)
    assert signed.returncode == 0, signed.stderr
    assert fingerprint(public.read_bytes()) in signed.stdout
    report = cli("verify", str(artifact), "--public-key", str(public), "--json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["signature"] == {"signed": True, "verified": True,
                                                      "key": fingerprint(public.read_bytes())}
    unchecked = cli("verify", str(artifact), "--json", cwd=tmp_path)
    assert json.loads(unchecked.stdout)["signature"]["skipped"] == "give --public-key to check the signature"
    wrong = cli("verify", str(artifact), "--public-key", str(keys["other"][1]), cwd=tmp_path)
    assert wrong.returncode != 0 and "does not verify with key" in wrong.stderr
    exported = cli("export", "resnet8.digits", "-b", "onnxruntime", "--random-init", "--repository",
                   str(tmp_path / "fresh"), "--sign", str(private), cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    verify_signature(tmp_path / "fresh" / ONNX, public)


def test_serve_require_signature_loads_signed_artifacts_only(exported, keys, tmp_path):
    """The real ASGI app over a repository of a signed, an unsigned and a modified-after-
    signing artifact: only the first loads; the others are UNAVAILABLE with the reason."""
    from starlette.testclient import TestClient

    from zoo.serve.app import Settings, create_app
    from zoo.serve.repository import ServeOptions

    private, public = keys["owner"]
    repo = tmp_path / "exports"
    for name in ("signed", "unsigned", "modified"):
        shutil.copytree(exported, repo / f"{name}.onnxruntime.fp32")
    sign(repo / "signed.onnxruntime.fp32", private)
    sign(repo / "modified.onnxruntime.fp32", private)
    (repo / "modified.onnxruntime.fp32" / "config.pbtxt").write_text("name: \"modified.onnxruntime.fp32\"\n")
    with TestClient(create_app(Settings(repo, ServeOptions(require_signature=public)))) as client:
        index = {row["name"]: row for row in client.post("/v2/repository/index").json()}
        assert index["signed.onnxruntime.fp32"]["state"] == "READY"
        assert index["unsigned.onnxruntime.fp32"]["state"] == "UNAVAILABLE"
        assert "is not signed" in index["unsigned.onnxruntime.fp32"]["reason"]
        assert index["modified.onnxruntime.fp32"]["state"] == "UNAVAILABLE"
        assert "changed: config.pbtxt" in index["modified.onnxruntime.fp32"]["reason"]
        assert client.get("/v2/models/signed.onnxruntime.fp32/ready").status_code == 200
        assert client.get("/v2/models/unsigned.onnxruntime.fp32/ready").status_code != 200


def test_serve_refuses_an_unreadable_key_at_start(tmp_path):
    (tmp_path / "exports").mkdir()
    result = cli("serve", "exports", "--require-signature", str(tmp_path / "missing.pem"), cwd=tmp_path)
    assert result.returncode != 0 and "--require-signature: cannot read" in result.stderr

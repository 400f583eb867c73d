"""Signed artifacts (zoo/signing.py): OpenSSF model-signing over every file of the artifact.

The attack the unsigned manifest cannot see is the one tested first: change the model
file and write its new sha256 into zoo.json. `Artifact.open` accepts that artifact; the
signature refuses it, naming the files. Keys are elliptic-curve P-256, made here with
`cryptography`; nothing reaches the network (no Sigstore). The CLI runs in process
(typer's CliRunner) except where the one-line error of `zoo`'s main is the point, and
`zoo serve --require-signature` is one real server over signed, unsigned and modified
artifacts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("model_signing", reason="zoo[sign] is not installed")

from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

import zoo  # noqa: E402
from zoo.artifact import Artifact  # noqa: E402
from zoo.fsutil import sha256_file  # noqa: E402
from zoo.signing import SIGNATURE, SignatureError, fingerprint, sign, signer, verify_signature  # noqa: E402

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
    return zoo.export("resnet8.digits", "onnxruntime", repository=repo, random_init=True).path


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


def test_a_removed_file_is_named_beside_a_changed_one(artifact, keys):
    """model-signing says "Missing files in model" (its extra files are "found"): the summary
    that leaves its digests out must keep that line as it keeps the changed files."""
    private, public = keys["owner"]
    sign(artifact, private)
    (artifact / "config.pbtxt").unlink()
    (artifact / "zoo.json").write_text((artifact / "zoo.json").read_text() + "\n")
    with pytest.raises(SignatureError, match=r"Missing files in model '[^']+': config.pbtxt; changed: zoo.json$"):
        verify_signature(artifact, public)


def test_another_key_and_an_unsigned_artifact_are_refused(artifact, keys):
    with pytest.raises(SignatureError, match="is not signed"):
        verify_signature(artifact, keys["owner"][1])
    sign(artifact, keys["owner"][0])
    owner, other = (fingerprint(keys[k][1].read_bytes()) for k in ("owner", "other"))
    assert signer(artifact) == owner
    with pytest.raises(SignatureError, match=f"is signed by key {owner}, not by the required key {other}"):
        verify_signature(artifact, keys["other"][1])


def test_a_signature_that_names_another_key_still_needs_that_key(artifact, keys):
    """The key named in the signature is a hint, outside what is signed: rewriting it to
    the verifier's key does not make another key's signature verify."""
    sign(artifact, keys["owner"][0])
    bundle = json.loads((artifact / SIGNATURE).read_text())
    other = fingerprint(keys["other"][1].read_bytes())
    bundle["verificationMaterial"]["publicKey"]["hint"] = other.removeprefix("sha256:")
    (artifact / SIGNATURE).write_text(json.dumps(bundle))
    with pytest.raises(SignatureError, match=f"does not verify with key {other}"):
        verify_signature(artifact, keys["other"][1])


def test_an_encrypted_private_key_signs_with_its_password(artifact, tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    private = tmp_path / "locked.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.BestAvailableEncryption(b"secret")))
    public = tmp_path / "locked.pub.pem"
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(zoo.ZooError, match="not a usable PEM private key"):
        sign(artifact, private)
    assert sign(artifact, private, password="secret")["key"] == verify_signature(artifact, public)["key"]


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



def test_without_model_signing_signing_asks_for_the_extra(artifact, keys, monkeypatch):
    monkeypatch.setitem(sys.modules, "model_signing", None)  # as if zoo[sign] were not installed
    with pytest.raises(zoo.ZooError, match=r"pip install 'zoo\[sign\]'"):
        sign(artifact, keys["owner"][0])
    assert not (artifact / SIGNATURE).exists()

def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m zoo ARGS`: main's error handling, one line on stderr."""
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_PLUGINS", "ZOO_DEBUG")}
    return subprocess.run([sys.executable, "-m", "zoo", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def invoke(*args: str):
    """The same command in this process (typer's CliRunner): a refusal is `result.exception`."""
    from typer.testing import CliRunner

    from zoo.cli import app

    return CliRunner().invoke(app, list(args))


def test_cli_sign_verify_and_export_sign(artifact, keys, tmp_path):
    private, public = keys["owner"]
    owner = fingerprint(public.read_bytes())
    repo = artifact.parent
    unsigned = cli("verify", str(artifact), "--public-key", str(public), cwd=tmp_path)
    assert unsigned.returncode != 0 and "is not signed" in unsigned.stderr
    assert len(unsigned.stderr.strip().splitlines()) == 1, unsigned.stderr
    signed = invoke("sign", artifact.name, "--repository", str(repo), "--key", str(private))
    assert signed.exit_code == 0, signed.output
    assert owner in signed.output
    report = invoke("verify", str(artifact), "--public-key", str(public), "--json")
    assert report.exit_code == 0, report.output
    assert json.loads(report.stdout)["signature"] == {"signed": True, "verified": True, "key": owner}
    unchecked = invoke("verify", str(artifact))
    assert unchecked.exit_code == 0, unchecked.output
    assert f"signature: present, by key {owner}, not checked" in unchecked.stdout
    wrong = invoke("verify", str(artifact), "--public-key", str(keys["other"][1]))
    assert wrong.exit_code != 0 and f"is signed by key {owner}, not by the required key" in str(wrong.exception)
    # export --sign over an artifact that is already there: reused, and (re)signed by the other key
    (artifact / SIGNATURE).unlink()
    written = (artifact / "zoo.json").stat().st_mtime_ns
    exported = invoke("export", "resnet8.digits", "-b", "onnxruntime", "--random-init", "--repository", str(repo),
                      "--sign", str(keys["other"][0]))
    assert exported.exit_code == 0, exported.output
    assert f"signed: key {fingerprint(keys['other'][1].read_bytes())}" in exported.stdout
    assert (artifact / "zoo.json").stat().st_mtime_ns == written  # reused, not exported again
    verify_signature(artifact, keys["other"][1])


def test_serve_require_signature_loads_signed_artifacts_only(exported, keys, tmp_path):
    """One real `zoo serve --require-signature` over a signed, an unsigned and a modified-
    after-signing artifact: the first is ready and answers; the others are UNAVAILABLE in
    the repository index and the server log with the reason, and loading one is refused."""
    from serve_support import ServerProcess, copy_as

    private, public = keys["owner"]
    repo = tmp_path / "exports"
    for name in ("signed", "unsigned", "modified"):
        copy_as(exported, repo / f"{name}.onnxruntime.fp32")
    sign(repo / "signed.onnxruntime.fp32", private)
    sign(repo / "modified.onnxruntime.fp32", private)
    (repo / "modified.onnxruntime.fp32" / "config.pbtxt").write_text("name: \"modified.onnxruntime.fp32\"\n")
    (repo / "notes").mkdir()  # not artifacts: named in the log, as Triton would try to load them
    (repo / ".ipynb_checkpoints").mkdir()
    server = ServerProcess(repo, "--require-signature", str(public), "--model-control", log=tmp_path / "server.log")
    try:
        server.wait_ready()
        index = {row["name"]: row for row in httpx.post(f"{server.url}/v2/repository/index").json()}
        assert index["signed.onnxruntime.fp32"]["state"] == "READY"
        assert index["unsigned.onnxruntime.fp32"]["state"] == "UNAVAILABLE"
        assert "is not signed" in index["unsigned.onnxruntime.fp32"]["reason"]
        assert index["modified.onnxruntime.fp32"]["state"] == "UNAVAILABLE"
        assert "changed: config.pbtxt" in index["modified.onnxruntime.fp32"]["reason"]
        body = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8], "data": [0.25] * 64}]}
        answered = httpx.post(f"{server.url}/v2/models/signed.onnxruntime.fp32/infer", json=body, timeout=30)
        assert answered.status_code == 200, answered.text
        # a refused model is not "unknown": every route says it is in the repository, and why not served
        for route in ("ready", "", "config"):
            refused = httpx.get(f"{server.url}/v2/models/unsigned.onnxruntime.fp32/{route}".rstrip("/"))
            assert refused.status_code == 404 and "in the repository but not served (UNAVAILABLE)" in \
                refused.json()["error"] and "is not signed" in refused.json()["error"], refused.text
        # a load the artifact fails is the client's 400, as Triton answers it, not a server error
        load = httpx.post(f"{server.url}/v2/repository/models/unsigned.onnxruntime.fp32/load", timeout=60)
        assert load.status_code == 400 and "failed to load unsigned.onnxruntime.fp32" in load.json()["error"]
        assert "is not signed" in load.json()["error"]
        load = httpx.post(f"{server.url}/v2/repository/models/signed.onnxruntime.fp32/load", timeout=60)
        assert load.status_code == 200, load.text
        log = server.log()
        assert "not served: .ipynb_checkpoints, notes (directories without zoo.json" in log
        assert "skipped unsigned.onnxruntime.fp32" in log and "skipped modified.onnxruntime.fp32" in log
        assert "corrupted or modified since it was signed" in log
    finally:
        server.kill()


def test_serve_refuses_an_unreadable_key_at_start(tmp_path):
    (tmp_path / "exports").mkdir()
    result = cli("serve", "exports", "--require-signature", str(tmp_path / "missing.pem"), cwd=tmp_path)
    assert result.returncode == 2 and "--require-signature: cannot read" in result.stderr


def encrypted_keypair(directory: Path, password: bytes) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = directory / "locked.pem", directory / "locked.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.BestAvailableEncryption(password)))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def test_cli_sign_takes_an_encrypted_keys_password_from_the_environment(artifact, tmp_path, monkeypatch):
    private, public = encrypted_keypair(tmp_path, b"secret")
    args = ("sign", str(artifact), "--key", str(private))
    locked = invoke(*args)  # CliRunner's stdin is no terminal: nothing to prompt at
    assert locked.exit_code != 0 and "is encrypted: name the environment variable holding its password with " \
        "--password-env" in str(locked.exception)
    assert "no such environment variable" in str(invoke(*args, "--password-env", "ZOO_TEST_UNSET").exception)
    monkeypatch.setenv("ZOO_TEST_KEY_PASSWORD", "secret")
    signed = invoke(*args, "--password-env", "ZOO_TEST_KEY_PASSWORD")
    assert signed.exit_code == 0, signed.output
    assert verify_signature(artifact, public)["key"] in signed.output


def test_export_sign_takes_an_encrypted_keys_password_before_the_export(exported, tmp_path, monkeypatch):
    """`zoo export --sign` with an encrypted key: the password is asked for (or read from
    --password-env) before any export work, so a missing one costs nothing."""
    private, public = encrypted_keypair(tmp_path, b"secret")
    repo = tmp_path / "exports"
    args = ("export", "resnet8.digits", "-b", "onnxruntime", "--random-init", "--repository", str(repo),
            "--sign", str(private))
    locked = invoke(*args)
    assert locked.exit_code != 0 and "is encrypted: name the environment variable" in str(locked.exception)
    assert not repo.exists()  # refused before the export
    alone = invoke("export", "resnet8.digits", "-b", "onnxruntime", "--password-env", "X")
    assert "--password-env goes with --sign" in str(alone.exception)
    monkeypatch.setenv("ZOO_TEST_KEY_PASSWORD", "secret")
    signed = invoke(*args, "--password-env", "ZOO_TEST_KEY_PASSWORD")
    assert signed.exit_code == 0, signed.output
    assert verify_signature(repo / ONNX, public)["key"] in signed.output


def test_export_sign_with_a_key_it_cannot_use_is_refused_before_the_export(artifact, keys, tmp_path, monkeypatch):
    """`zoo export --sign` loads the key (type, curve, password) before it exports. Before,
    a wrong password or an RSA key failed only after the export: an artifact signed before
    had been rebuilt in its place, unsigned, and nothing said the signature was gone."""
    from cryptography.hazmat.primitives.asymmetric import rsa

    rsa_key = tmp_path / "rsa.pem"
    rsa_key.write_bytes(rsa.generate_private_key(65537, 2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    locked, _ = encrypted_keypair(tmp_path, b"secret")
    monkeypatch.setenv("ZOO_TEST_WRONG_PASSWORD", "wrong")
    sign(artifact, keys["owner"][0])
    files = {p.name: p.stat().st_mtime_ns for p in artifact.rglob("*")}
    base = ("export", "resnet8.digits", "-b", "onnxruntime", "--random-init", "--force", "--repository",
            str(artifact.parent))
    for key, extra, says in [(rsa_key, (), "is RSA, not an elliptic-curve key"),
                             (locked, ("--password-env", "ZOO_TEST_WRONG_PASSWORD"), "not a usable PEM private key")]:
        result = invoke(*base, "--sign", str(key), *extra)
        assert result.exit_code == 1 and says in str(result.exception), result.output
        assert {p.name: p.stat().st_mtime_ns for p in artifact.rglob("*")} == files  # not rebuilt, still signed
    verify_signature(artifact, keys["owner"][1])


def test_cli_sign_prompts_for_an_encrypted_keys_password_at_a_terminal(artifact, tmp_path):
    import pty
    import termios
    import time

    private, public = encrypted_keypair(tmp_path, b"secret")
    main, terminal = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_PLUGINS", "ZOO_DEBUG")}
    proc = subprocess.Popen([sys.executable, "-m", "zoo", "sign", str(artifact), "--key", str(private)],
                            stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # no controlling terminal: getpass reads the pty on stdin
    os.close(terminal)
    deadline = time.monotonic() + 60
    # getpass flushes what was typed before it turned echo off: type once it has
    while termios.tcgetattr(main)[3] & termios.ECHO and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.write(main, b"secret\n")
    out, err = proc.communicate(timeout=120)
    os.close(main)
    assert proc.returncode == 0, err
    assert verify_signature(artifact, public)["key"] in out


@pytest.mark.parametrize("make, says", [
    (lambda: __import__("cryptography.hazmat.primitives.asymmetric.rsa", fromlist=["rsa"]).generate_private_key(
        65537, 2048), "is RSA, not an elliptic-curve key"),
    (lambda: __import__("cryptography.hazmat.primitives.asymmetric.ed25519", fromlist=["ed25519"])
     .Ed25519PrivateKey.generate(), "is Ed25519, not an elliptic-curve key"),
    (lambda: ec.generate_private_key(ec.SECP256K1()), "is on curve secp256k1"),
])
def test_a_key_model_signing_cannot_use_is_refused_naming_what_it_takes(artifact, tmp_path, make, says):
    key = make()
    private, public = tmp_path / "key.pem", tmp_path / "key.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    takes = "(model-signing's key signer takes EC keys: P-256/P-384/P-521)"
    result = cli("sign", str(artifact), "--key", str(private), cwd=tmp_path)
    assert result.returncode != 0 and result.stderr.strip().splitlines() == [
        f"error: the private key {private} {says} {takes}"]
    with pytest.raises(zoo.ZooError, match=f"the public key {public} {says}"):
        verify_signature(artifact, public)
    assert not (artifact / SIGNATURE).exists()


def test_the_bytecode_triton_caches_after_signing_keeps_the_signature_and_nothing_else_passes(keys, tmp_path):
    """Triton's Python backend writes `1/__pycache__/model.<tag>.pyc` when it imports a
    signed Python-form artifact's model.py. The signature leaves `__pycache__` out and
    `Artifact.open` checks what is in it: that file is accepted; bytecode of anything else,
    which Python would run in place of model.py, is refused by every load after the
    signature verified."""
    import importlib.util
    import py_compile

    private, public = keys["owner"]
    art = zoo.export(zoo.get_model("resnet8.digits").tiny(), "onnxruntime", repository=tmp_path / "exports",
                     random_init=True, triton="python")
    sign(art.path, private)
    model_py = art.path / "1" / "model.py"
    cached = Path(importlib.util.cache_from_source(str(model_py)))
    py_compile.compile(str(model_py), cfile=str(cached), doraise=True)  # as Triton's import writes it
    assert verify_signature(art.path, public)["verified"]
    assert zoo.verify(art.path)["parity"]["passed"]
    planted = tmp_path / "model.py"
    planted.write_text(model_py.read_text() + "\nimport os\n")
    py_compile.compile(str(planted), cfile=str(cached), doraise=True)
    assert verify_signature(art.path, public)["verified"]  # left out of the signature ...
    with pytest.raises(zoo.ZooError, match=rf"holds 1/__pycache__/{cached.name}, which its manifest does not list"):
        zoo.load(art.path)  # ... and refused when the artifact is opened



def test_symbolic_links_are_refused_in_zoos_words(artifact, keys, tmp_path):
    private, public = keys["owner"]
    sign(artifact, private)
    link = tmp_path / "link"
    link.symlink_to(artifact, target_is_directory=True)
    # the artifact directory itself: said to be a link, not "no artifact directory"
    for check in (lambda: Artifact.open(link), lambda: verify_signature(link, public)):
        with pytest.raises(zoo.ZooError, match=rf"^{link} is a symbolic link \(to {artifact}\), which is refused: "
                                               "give the artifact directory itself$"):
            check()
    # a version directory that is a link is named as such, not as the file under it; with a
    # public key, in zoo's words rather than model-signing's `allow_symlinks` hint
    shutil.move(artifact / "1", tmp_path / "v1real")
    (artifact / "1").symlink_to(tmp_path / "v1real", target_is_directory=True)
    with pytest.raises(zoo.ZooError, match=rf"^artifact {ONNX}: '1' \(in '1/model.onnx'\) is a symbolic link, which "
                                           "is refused$"):
        Artifact.open(artifact)
    with pytest.raises(SignatureError, match=rf"^artifact {ONNX}: '1' is a symbolic link, which is refused$"):
        verify_signature(artifact, public)


def test_a_signature_that_is_a_symbolic_link_is_refused_with_a_key_or_without(artifact, keys, tmp_path):
    """A linked model.sig was "present ... not checked" without a key and "not signed" with
    one, while every other link in an artifact is refused in one line naming it."""
    private, public = keys["owner"]
    sign(artifact, private)
    kept = tmp_path / "elsewhere.sig"
    shutil.move(artifact / SIGNATURE, kept)
    (artifact / SIGNATURE).symlink_to(kept)
    says = f"artifact {ONNX}: 'model.sig' is a symbolic link, which is refused"
    for check in (lambda: verify_signature(artifact, public), lambda: signer(artifact),
                  lambda: Artifact.open(artifact)):
        with pytest.raises(zoo.ZooError, match=f"^{says}$"):
            check()
    for key in ((), ("--public-key", str(public))):
        result = cli("verify", str(artifact), *key, cwd=tmp_path)
        assert result.returncode == 1 and result.stderr.strip().splitlines() == [f"error: {says}"], result.stderr


def test_a_signature_copied_from_another_artifact_names_it(artifact, keys):
    private, public = keys["owner"]
    other = artifact.parent / "other.onnxruntime.fp32"
    shutil.copytree(artifact, other)
    manifest = json.loads((other / "zoo.json").read_text())
    config = other / "config.pbtxt"  # renamed throughout: Triton's name in it is the directory's too
    config.write_text(config.read_text().replace(f'name: "{ONNX}"', f'name: "{other.name}"', 1))
    manifest["files"]["config.pbtxt"] = sha256_file(config)
    (other / "zoo.json").write_text(json.dumps({**manifest, "name": other.name, "copied": True}))
    sign(other, private)
    shutil.copy(other / SIGNATURE, artifact / SIGNATURE)
    with pytest.raises(SignatureError, match=rf"^artifact {ONNX}: its model.sig was signed for another artifact "
                                             r"\(other.onnxruntime.fp32\); sign this one with `zoo sign`$"):
        verify_signature(artifact, public)


def test_a_repository_or_a_missing_key_is_a_usage_error(artifact, keys, tmp_path):
    private, public = keys["owner"]
    repo = artifact.parent
    for args, says in (
            (("sign", str(repo), "--key", str(private)),
             f"{repo} is a model repository (1 artifact), not an artifact: sign each artifact directory, "
             f"e.g. `zoo sign {artifact}`"),
            (("verify", str(repo)), f"{repo} is a model repository (1 artifact), not an artifact: verify each "
                                    f"artifact directory, e.g. `zoo verify {artifact}`"),
            (("verify", str(artifact), "--public-key", str(tmp_path / "nope.pem")),
             f"cannot read the public key {tmp_path / 'nope.pem'}: No such file or directory")):
        result = cli(*args, cwd=tmp_path)
        assert result.returncode == 2 and result.stderr.strip().splitlines() == [f"error: {says}"], result.stderr
    assert not (artifact / SIGNATURE).exists()


def test_export_force_over_a_signed_artifact_says_the_signature_is_gone(artifact, keys, caplog):
    sign(artifact, keys["owner"][0])
    with caplog.at_level("WARNING", logger="zoo"):
        zoo.export("resnet8.digits", "onnxruntime", repository=artifact.parent, random_init=True, force=True)
    assert not (artifact / SIGNATURE).exists()
    assert f"{ONNX}: the previous signature was removed; re-sign with --sign KEY or zoo sign" in caplog.messages
    sign(artifact, keys["owner"][0])
    caplog.clear()
    with caplog.at_level("WARNING", logger="zoo"):  # `zoo export --sign` signs the new one: nothing to say
        zoo.export("resnet8.digits", "onnxruntime", repository=artifact.parent, random_init=True, force=True,
                   resign=True)
    assert not any("signature" in m for m in caplog.messages)

"""Signed artifacts: OpenSSF's `model-signing` over the whole artifact directory.

The sha256 values in `zoo.json` catch a corrupted file, not a modified one: whoever can
change a file can change its hash beside it. A signature made with a private key the
modifier does not hold closes that: `zoo sign` (or `zoo export --sign KEY`) hashes every
file of the artifact directory (the manifest included) with model-signing and signs the
list with an elliptic-curve private key (PEM); the signature, a Sigstore bundle, is
written as `model.sig` inside the artifact and is the one file the signature leaves out.
Any changed, added or removed file then fails verification, which names it.

`zoo verify ARTIFACT --public-key PUB.pem` checks the signature (and refuses an unsigned
artifact); `zoo serve --require-signature PUB.pem` loads only artifacts whose signature
that key verifies, and lists the others as unloadable with the reason. A key is named
by its SHA-256 fingerprint, of its PEM SubjectPublicKeyInfo (`openssl pkey -pubin -in
PUB.pem | sha256sum`): the hint model-signing records in the signature, so `zoo verify`
names the signing key even without `--public-key`, and a signature by another key is
refused naming both.

Triton's Python backend writes `1/__pycache__/` beside a python-form `model.py` when it
loads it, with its own Python (`model.cpython-310.pyc` in tritonserver 24.08), which a
verifier on another Python cannot compile to compare and refuses: verify before handing an
artifact to Triton, or load it from a read-only copy.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from .errors import ArtifactError, UnsupportedError, UsageError, ZooError

SIGNATURE = "model.sig"


class SignatureError(ArtifactError):
    """An artifact is unsigned, or its signature does not verify with the given key."""


def _model_signing():
    try:
        import model_signing  # noqa: F401
        from model_signing import hashing, signing, verifying
    except ImportError as exc:
        raise UnsupportedError(f"signing artifacts needs OpenSSF's model-signing ({exc}): "
                               "pip install 'zoo[sign]'") from None
    return hashing, signing, verifying


def _key_bytes(path: str | Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None


#: the curves model-signing's key signer and verifier take (`sign_ec_key.py`)
CURVES = {"secp256r1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521"}


def _check_curve(key, what: str) -> None:
    """Refuse a key model-signing cannot use before it fails inside with an AttributeError."""
    from cryptography.hazmat.primitives.asymmetric import ec

    takes = f"model-signing's key signer takes EC keys: {'/'.join(CURVES.values())}"
    if not isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        kind = type(key).__name__.removesuffix("PrivateKey").removesuffix("PublicKey")
        raise UnsupportedError(f"the {what} is {kind}, not an elliptic-curve key ({takes})")
    if key.curve.name not in CURVES:
        raise UnsupportedError(f"the {what} is on curve {key.curve.name} ({takes})")


def encrypted(private_key_pem: bytes) -> bool:
    """Whether the PEM private key needs a password to be read."""
    from cryptography.hazmat.primitives import serialization

    try:
        serialization.load_pem_private_key(private_key_pem, None)
    except TypeError:  # "Password was not given but private key is encrypted"
        return True
    except ValueError:  # not a key at all: `sign` says so
        return False
    return False


def fingerprint(public_key_pem: bytes, what: str = "public key") -> str:
    """`sha256:<hex>` of the key's PEM SubjectPublicKeyInfo, as model-signing's key hint."""
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_public_key(public_key_pem)
    except ValueError as exc:
        raise ZooError(f"not a PEM public key: {exc}") from None
    _check_curve(key, what)
    pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(pem).hexdigest()


def _public_of(private_key_pem: bytes, password: str | None, what: str) -> bytes:
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(private_key_pem, password.encode() if password else None)
    except (ValueError, TypeError) as exc:
        raise ZooError(f"the {what} is not a usable PEM private key: {exc}") from None
    _check_curve(key, what)
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _hashing(hashing, root: Path, *also: Path):
    """Every file under `root` but the signature (and `also`), symbolic links refused.

    `__pycache__` folders are left out too: Triton's Python backend writes one beside
    `1/model.py` when it imports it, after the artifact was signed. `Artifact.open`, which
    every load runs after the signature, accepts a cached file only where it is this
    Python's compilation of a listed, hashed (so signed) source; another Python's (Triton's
    container runs its own), which cannot be compiled here to compare, is refused."""
    config = hashing.Config()
    caches = sorted(p for p in root.rglob("__pycache__") if p.is_dir() and not p.is_symlink())
    config.set_ignored_paths(paths=[root / SIGNATURE, *caches, *also], ignore_git_paths=False)
    return config


def usable_private_key(private_key: str | Path, password: str | None = None) -> str:
    """The fingerprint of the key `sign` signs with; a `ZooError` where it cannot sign with it
    (unreadable, not PEM, a wrong password, a type or curve model-signing does not take).
    `zoo export --sign` asks before the export, which may replace a signed artifact."""
    return fingerprint(_public_of(_key_bytes(private_key, "private key"), password, f"private key {private_key}"))


def sign(path: str | Path, private_key: str | Path, password: str | None = None) -> dict[str, Any]:
    """Sign the artifact at `path` with an elliptic-curve private key (PEM); replaces an
    earlier signature. Only an artifact whose files match its manifest is signed."""
    from .artifact import Artifact

    art = Artifact.open(path)
    identity = usable_private_key(private_key, password)
    hashing, signing, _ = _model_signing()
    root = art.path.resolve()
    staged = root / f".{SIGNATURE}.tmp"
    try:  # model-signing hands the password to `cryptography` as is, which takes bytes only
        signing.Config().use_elliptic_key_signer(private_key=Path(private_key),
                                                 password=password.encode() if password else None).set_hashing_config(
            _hashing(hashing, root, staged)).sign(root, staged)
        staged.replace(root / SIGNATURE)
    except ZooError:
        raise
    except Exception as exc:  # the library's own: a key type it does not take, an unreadable file
        raise ZooError(f"artifact {art.name}: signing failed: {exc}") from None
    finally:
        staged.unlink(missing_ok=True)
    return {"signed": True, "signature": SIGNATURE, "key": identity}


def _signature(path: str | Path) -> Path:
    """The artifact's signature file, refused where it is a symbolic link (as every link in
    an artifact is, `zoo.artifact`): what it points to was not written into the artifact,
    and reading it would vouch for, or name the key of, a signature kept elsewhere."""
    file = Path(path) / SIGNATURE
    if file.is_symlink():
        raise SignatureError(f"artifact {Path(path).resolve().name}: {SIGNATURE!r} is a symbolic link, "
                             f"which is refused")
    return file


def signed(path: str | Path) -> bool:
    """Whether the artifact has a signature (unchecked); `SignatureError` where it is a link."""
    return _signature(path).is_file()


def signer(path: str | Path) -> str | None:
    """The fingerprint of the key the artifact's signature names (unchecked), or None:
    unsigned, unreadable, or a signature that names no key. `SignatureError` where the
    signature is a symbolic link."""
    file = _signature(path)
    try:
        bundle = json.loads(file.read_text())
        hint = bundle["verificationMaterial"]["publicKey"]["hint"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):  # RecursionError: JSON nested too deeply
        return None
    return f"sha256:{hint}" if isinstance(hint, str) and hint else None


def verify_signature(path: str | Path, public_key: str | Path) -> dict[str, Any]:
    """Check the artifact's signature with `public_key` (PEM); `SignatureError` naming the
    reason when it is unsigned or any file differs from what was signed."""
    from .artifact import refuse_link_or_missing

    pem = _key_bytes(public_key, "public key")
    identity = fingerprint(pem, f"public key {public_key}")
    refuse_link_or_missing(Path(path))
    root = Path(path).resolve()
    if not signed(root):  # a linked model.sig refused in its own words
        raise SignatureError(f"artifact {root.name} is not signed (no {SIGNATURE}); a signature by key "
                             f"{identity} is required: sign it with `zoo sign`")
    _refuse_links(root)
    hashing, _, verifying = _model_signing()
    by = signer(root)
    if by is not None and by != identity:
        raise SignatureError(f"artifact {root.name} is signed by key {by}, not by the required key {identity}")
    try:
        verifying.Config().use_elliptic_key_verifier(public_key=Path(public_key)).set_hashing_config(
            _hashing(hashing, root)).verify(root, root / SIGNATURE)
    except Exception as exc:  # model-signing raises ValueError (mismatch) and its libraries' own errors
        other = signed_for(root)
        if other is not None and other != root.name:  # a model.sig copied from another artifact
            raise SignatureError(f"artifact {root.name}: its {SIGNATURE} was signed for another artifact "
                                 f"({other}); sign this one with `zoo sign`") from None
        raise SignatureError(f"artifact {root.name}: its signature does not verify with key {identity} "
                             f"(corrupted or modified since it was signed): "
                             f"{_reason(exc)}") from None
    return {"signed": True, "verified": True, "key": identity}


def signed_for(path: str | Path) -> str | None:
    """The artifact name the signature's statement names as its subject (the directory signed,
    unchecked), or None where it names none or is unreadable."""
    import base64

    try:
        bundle = json.loads((Path(path) / SIGNATURE).read_text())
        statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        name = statement["subject"][0]["name"]
    except (OSError, ValueError, KeyError, IndexError, TypeError, RecursionError):
        return None
    return name if isinstance(name, str) and name else None


def _refuse_links(root: Path) -> None:
    """A symbolic link in the artifact, refused in zoo's words (as `zoo.artifact` refuses
    them), before model-signing refuses it in its own, which point to an option zoo has not."""
    for dirpath, dirnames, filenames in os.walk(root):  # not into linked folders: they are refused
        for entry in dirnames + filenames:
            if (Path(dirpath) / entry).is_symlink():
                rel = (Path(dirpath) / entry).relative_to(root).as_posix()
                raise SignatureError(f"artifact {root.name}: {rel!r} is a symbolic link, which is refused")


def _reason(exc: Exception) -> str:
    """model-signing's message with its digests left out: which files differ, and how."""
    import re

    text = " ".join(str(exc).split())
    # the message is a list's repr: an item holding both quote kinds has them escaped
    changed = re.findall(r"Hash mismatch for \\?'([^'\\]+)\\?'", text)
    # model-signing's wordings (verifying.py): "Extra files found in model 'm': a, b" and
    # "Missing files in model 'm': a, b"
    others = re.findall(r"((?:Extra files found|Missing files) in model '[^']*': [^\"\]]+)", text)
    if changed or others:
        return "; ".join(others + ([f"changed: {', '.join(changed)}"] if changed else []))
    return text[:600] + ("..." if len(text) > 600 else "")

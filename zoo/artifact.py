"""An `Artifact`: one verified export in the model repository.

    exports/resnet8.digits.onnxruntime.fp32/
        1/model.onnx          the backend's model file(s); "1" is Triton's version directory
        config.pbtxt          Triton model configuration
        weights.safetensors   the fp32 reference weights, so `zoo verify` needs nothing else
        test_data/set_N.safetensors   inputs and PyTorch fp32 outputs (`zoo.vectors`)
        zoo.json              the manifest: provenance, the model as its spec describes it,
                              signature, file hashes, parity report

Opening an artifact validates the manifest before anything is loaded: every path it
names stays inside the directory (no absolute paths, no `..`, no symlinks), every file's
sha256 matches, and the backend can read what the recorded library versions wrote.
It needs no model plugin: without one, its spec is the one its manifest describes
(`zoo.standalone`) and its test vectors are its reference.
"""

from __future__ import annotations

import errno
import json
import marshal
import os
import re
import stat
import sys
import types
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .errors import ArtifactError, BackendUnavailableError, UnknownBackendError, UsageError, ZooError, first_line
from .fsutil import sha256_file
from .inputs import CheckedRunner
from .manifest_fields import check_fields

MANIFEST = "zoo.json"
FORMAT = 1
VERSION_DIR = "1"
WEIGHTS = "weights.safetensors"
#: where `zoo export` writes and `zoo bench`, `zoo serve` and `zoo.load` look, unless told
DEFAULT_REPOSITORY = Path("exports")


def artifact_name(model: str, backend: str, precision: str, method: str | None = None) -> str:
    """`resnet8.digits.onnxruntime.int8`: an export's directory and Triton model name.

    `method` is given only for an int8 method other than the model's own
    (`ModelSpec.quantization`): `resnet8.digits.onnxruntime.int8-dynamic`, so static and
    dynamic int8 of one model live side by side while the model's own keeps the plain
    name. The suffix stays inside the last dot-separated field, the precision, which is
    where readers of a name split it (`<model>.<backend>.<precision>`; model names hold dots).
    """
    return f"{model}.{backend}.{precision}" + (f"-{method}" if method else "")


def safe_member(root: Path, rel: Any, artifact: str) -> Path:
    """Resolve a manifest path inside `root`, refusing anything that could escape it."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\x00" in rel:
        raise ArtifactError(f"artifact {artifact}: manifest names an invalid path {shown(rel)}")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts:
        raise ArtifactError(f"artifact {artifact}: manifest path {shown(rel)} escapes the artifact directory")
    path = root / pure
    try:
        for parent in [path, *path.parents]:
            if parent == root:
                break
            if parent.is_symlink():  # named as it is: `1`, not the '1/model.onnx' it leads to
                link = parent.relative_to(root).as_posix()
                raise ArtifactError(f"artifact {artifact}: {shown(link)}{'' if link == rel else f' (in {shown(rel)})'}"
                                    f" is a symbolic link, which is refused")
        inside = path.resolve().is_relative_to(root.resolve())
    except OSError as exc:  # a name longer than the file system takes (ENAMETOOLONG), and the like
        why = "too long" if exc.errno == errno.ENAMETOOLONG else exc.strerror or type(exc).__name__
        raise ArtifactError(f"artifact {artifact}: manifest names an invalid path {shown(rel)} ({why})") from None
    if not inside:
        raise ArtifactError(f"artifact {artifact}: manifest path {shown(rel)} escapes the artifact directory")
    return path


def shown(value: Any, limit: int = 80) -> str:
    """`value` as a message quotes it, cut to its first `limit` characters: a manifest's
    path may be thousands of characters long, and a message is one readable line."""
    if isinstance(value, str) and len(value) > limit:
        cut = repr(value[:limit])
        return f"{cut[:-1]}…{cut[-1]}"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


@dataclass(frozen=True)
class Artifact:
    path: Path
    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def model(self) -> str:
        return self.manifest["model"]["name"]

    @property
    def backend(self) -> str:
        return self.manifest["backend"]["name"]

    @property
    def precision(self) -> str:
        return self.manifest["precision"]

    @property
    def device(self) -> str:
        return self.manifest["device"]

    def __repr__(self) -> str:  # the manifest (every file's hash, parity, vectors) is its own attribute
        return (f"Artifact({self.name!r}, path={str(self.path)!r}, model={self.model!r}, backend={self.backend!r}, "
                f"precision={self.precision!r}, device={self.device!r})")

    @property
    def model_file(self) -> Path:
        return safe_member(self.path, self.manifest["model_file"], self.name)

    @classmethod
    def open(cls, path: str | Path, check_hashes: bool = True) -> "Artifact":
        """Read and validate an artifact directory; raise `ArtifactError` on any defect."""
        if not isinstance(path, (str, os.PathLike)):
            raise UsageError(f"an artifact is opened from a path (str or pathlib.Path), not {path!r}")
        path = Path(path)
        refuse_link_or_missing(path)
        label = path.resolve().name
        if path.name != label:  # "." or "" inside the artifact, "..": the directory they name, by its name
            path = path.resolve()
        if (path / MANIFEST).is_symlink():
            raise ArtifactError(f"artifact {label}: {MANIFEST} is a symbolic link, which is refused")
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except FileNotFoundError:
            raise ArtifactError(f"artifact {label} has no {MANIFEST}: it is incomplete; re-export it") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ArtifactError(f"artifact {label}: {MANIFEST} is unreadable ({exc}); re-export it") from None
        except RecursionError:  # arrays or objects nested thousands deep: no manifest zoo writes
            raise ArtifactError(f"artifact {label}: {MANIFEST} is unreadable (nested too deeply); "
                                f"re-export it") from None
        required = ("format", "model", "backend", "precision", "device", "model_file", "files", "weights")
        if not isinstance(manifest, dict) or any(k not in manifest for k in required):
            raise ArtifactError(f"artifact {label}: {MANIFEST} lacks required fields {required}")
        if manifest["format"] != FORMAT:
            raise ArtifactError(f"artifact {label}: manifest format {manifest['format']!r} is not {FORMAT}; re-export it")
        check_fields(manifest, label)
        recorded = manifest.get("name")
        if recorded is not None and label != recorded and not _staged_as(label, recorded):
            raise ArtifactError(f"artifact {label}: its manifest names it {recorded!r}. An artifact keeps the name it "
                                f"was exported (and signed) under, which Triton requires of its config.pbtxt too: "
                                f"rename the directory back, or re-export it")
        files = manifest["files"]
        if not isinstance(files, dict) or manifest["model_file"] not in files or WEIGHTS not in files:
            raise ArtifactError(f"artifact {label}: manifest does not list its model file and weights")
        _check_weights_file(path, manifest["weights"], label)
        for rel, digest in files.items():
            member = safe_member(path, rel, label)
            if not member.is_file():
                raise ArtifactError(f"artifact {label}: file {rel} {_not_a_file(member)}; re-export it")
            if check_hashes and sha256_file(member) != digest:
                raise ArtifactError(f"artifact {label}: file {rel} does not match its sha256 in the manifest "
                                    f"(corrupted or modified); re-export it with `zoo export --force`")
        _check_unlisted(path, files, label)
        _check_config_name(path, files, recorded if recorded is not None and _staged_as(label, recorded) else label)
        for entry in (manifest.get("test_data") or {}).get("sets") or []:
            axes = entry.get("axes") if isinstance(entry, dict) else None
            if not isinstance(axes, dict) or entry.get("file") not in files or not isinstance(axes.get("batch"), int):
                raise ArtifactError(f"artifact {label}: manifest names test vectors {entry!r} that are not "
                                    f"among its hashed files, or without their sizes; re-export it")
        return cls(path, manifest)

    def spec(self):
        """The model spec this artifact was exported from: its plugin's at the recorded
        config where the plugin is loaded, else the one the manifest describes (`zoo.standalone`)."""
        from .standalone import artifact_spec

        return artifact_spec(self)

    def test_vectors(self) -> list:
        """The stored inputs and PyTorch fp32 outputs (`zoo.vectors.VectorSet`s); [] if none."""
        from .vectors import read

        return read(self)

    def load(self, threads: int | None = None, device: str | None = None):
        """A `Runner` for this artifact, after checking the backend can run it here: the
        backend's, behind the input check the server makes (`zoo.inputs.CheckedRunner`)."""
        from .backend import loaded
        from .registry import backend_missing, get_backend, probe

        try:
            backend = get_backend(self.backend)
        except UnknownBackendError:
            raise UnknownBackendError(backend_missing(self.backend, self.manifest["backend"], self.name)) from None
        device = device or self.device
        availability = probe(backend, device)
        if not availability.ok:
            raise BackendUnavailableError(f"artifact {self.name}: backend {backend.name} cannot run on "
                                          f"{device} here: {availability.reason}")
        backend.check_compatible(self.manifest["backend"].get("versions", {}), self.name)
        try:
            spec = self.spec()
            runner = loaded(backend, backend.load(self.model_file, spec, self.precision, device, threads,
                                                  self.manifest["backend"].get("info") or {}))
        except ZooError:
            raise
        except Exception as exc:  # a library's own error while reading a file that hashed fine
            raise ArtifactError(f"artifact {self.name}: backend {backend.name} failed to load it: {exc}") from exc
        return CheckedRunner(runner, spec, self.name, self.precision)

    def weights(self):
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(safe_member(self.path, WEIGHTS, self.name)))
        except (SafetensorError, OSError) as exc:
            raise not_safetensors(self.name, WEIGHTS, exc) from None


def not_safetensors(artifact: str, rel: str, exc: Exception) -> ArtifactError:
    """The error for member `rel` that safetensors cannot read (its hash matched: the manifest
    was edited with it, or the exporter wrote it so), naming the file, not only the library's words."""
    why = first_line(exc).removeprefix("Error while deserializing header: ")
    return ArtifactError(f"artifact {artifact}: {rel} is not a valid safetensors file ({why}); re-export it")


def _check_weights_file(root: Path, weights: dict[str, Any], label: str) -> None:
    """Refuse a manifest whose `weights.file` names anything but the artifact's own
    `weights.safetensors`: the weights are read from that name whatever the field says, so
    a field naming another file (`../other/weights.safetensors`, an absolute path) would be
    verified, and signed, as a lie about what the reference is."""
    if "file" not in weights:
        return
    rel = weights["file"]
    safe_member(root, rel, label)  # an invalid or escaping path, or a link, said as for every manifest path
    if rel != WEIGHTS:
        raise ArtifactError(f"artifact {label}: manifest field weights.file is {shown(rel)}, while an artifact's "
                            f"reference weights are its own {WEIGHTS}; re-export it")


def _not_a_file(path: Path) -> str:
    """Why a listed member that is no regular file is refused: missing, or what it is instead
    (reading a FIFO to hash it would wait for a writer for ever)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "is missing"
    except OSError as exc:
        return f"is unreadable ({exc.strerror or type(exc).__name__})"
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))
    kind = next((name for test, name in kinds if test(mode)), None)
    return "is not a regular file" + (f" (it is {kind})" if kind else "")


def refuse_link_or_missing(path: Path) -> None:
    """Refuse an artifact directory given as a symbolic link, as every link inside an artifact is:
    the directory's name is the artifact's (its manifest's, Triton's model name), and a link named
    otherwise, or repointed between the check and the load, would serve what was not checked.
    Refuse a path that is missing or not a directory, saying which."""
    if path.is_symlink():  # the path as given: resolving would follow the link
        raise ArtifactError(f"{path} is a symbolic link (to {os.readlink(path)}), which is refused: give the "
                            f"artifact directory itself")
    if not path.exists():
        raise ArtifactError(f"no artifact directory at {path}")
    if not path.is_dir():
        raise ArtifactError(f"{path} is a file, not an artifact directory")


def list_artifacts(repository: str | Path) -> list[Path]:
    root = Path(repository)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST).exists())


#: what an artifact directory holds besides the files its manifest lists and hashes
UNLISTED_ALLOWED = {MANIFEST, "model.sig"}  # the manifest itself; the signature (zoo.signing) over all the rest
def _check_config_name(root: Path, files: dict[str, Any], name: str) -> None:
    """Refuse a listed config.pbtxt that names the model otherwise than its directory:
    Triton refuses such a model, and zoo would serve under one name what the configuration,
    copied from another artifact (rehashed, or re-signed), describes under another."""
    from .triton import CONFIG, config_names

    if CONFIG not in files:
        return
    try:
        named = config_names(safe_member(root, CONFIG, name).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"artifact {name}: {CONFIG} is unreadable ({exc}); re-export it") from None
    wrong = [n for n in named if n != name]
    if wrong:
        raise ArtifactError(f"artifact {name}: its {CONFIG} names it {shown(wrong[0])}, while Triton serves it "
                            f"under its directory's name: rename the directory back, or re-export it")


def _staged_as(label: str, name: str) -> bool:
    """Whether `label` is `fsutil.atomic_directory`'s staging name for `name` (verified before it is renamed)."""
    prefix = f".{name}.tmp-"
    return label.startswith(prefix) and len(label) == len(prefix) + 8


def _check_unlisted(root: Path, files: dict[str, Any], label: str) -> None:
    """Refuse anything in the directory its manifest does not list: the hashes (and a
    signature) vouch only for listed files, while Triton serves the directory: an added
    `2/model.py` is a version Triton serves in place of `1/` (its default policy is the
    latest version), and an added `configs/` or `__pycache__/*.pyc` changes what runs.
    The one exception is the bytecode Triton's Python backend writes beside a listed
    `model.py` when it imports it, accepted only where it is that file's own compilation
    (`_own_bytecode`). A signature (`model.sig`) that is a symbolic link is refused, as
    every link in an artifact is: what it points to is not the artifact's."""
    listed = {str(PurePosixPath(rel)) for rel in files if isinstance(rel, str)} | UNLISTED_ALLOWED
    folders = {str(parent) for rel in listed for parent in PurePosixPath(rel).parents if str(parent) != "."}
    for dirpath, dirnames, filenames in os.walk(root):
        here = PurePosixPath(Path(dirpath).relative_to(root).as_posix())
        for entry in sorted(dirnames) + sorted(filenames):
            rel = str(here / entry) if str(here) != "." else entry
            if rel in UNLISTED_ALLOWED and (root / rel).is_symlink():
                raise ArtifactError(f"artifact {label}: {shown(rel)} is a symbolic link, which is refused")
            if rel in listed or (entry in dirnames and rel in folders):
                continue
            if here.name == "__pycache__" and _own_bytecode(root, here, entry, listed) \
                    or entry == "__pycache__" and entry in dirnames and not (Path(dirpath) / entry).is_symlink():
                continue  # a __pycache__ folder: each file in it is checked as the walk reaches it
            hint = (" (Triton's Python backend writes __pycache__ when it imports model.py, which is accepted only "
                    "where each file compiles a listed source with this Python)" if "__pycache__" in rel else "")
            if here.name == "__pycache__" and (tag := _foreign_tag(entry)):
                raise ArtifactError(f"artifact {label} holds {rel}, {tag}'s bytecode of "
                                    f"{here.parent / (entry.split('.')[0] + '.py')} "
                                    f"(Triton's container runs its own Python), which this Python "
                                    f"({sys.implementation.cache_tag}) cannot compile to compare: nothing here "
                                    f"vouches for its code, yet that Python would run it; remove {here} (Triton "
                                    f"writes it again), and serve the repository read-only to keep it unwritten")
            raise ArtifactError(f"artifact {label} holds {rel}, which its manifest does not list: nothing vouches "
                                f"for it, yet Triton would serve it{hint}; remove it, or re-export the artifact")


#: another CPython's bytecode of a module: `model.cpython-310.pyc`, `model.cpython-312.opt-1.pyc`
_FOREIGN_PYC = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.(cpython-3[0-9]{1,2})(\.opt-[12])?\.pyc")


def _foreign_tag(entry: str) -> str | None:
    """The cache tag of `entry` where it is another CPython's bytecode (`cpython-310`)."""
    m = _FOREIGN_PYC.fullmatch(entry)
    return m[1] if m and m[1] != sys.implementation.cache_tag else None


def _own_bytecode(root: Path, folder: PurePosixPath, entry: str, listed: set[str]) -> bool:
    """Whether `folder/entry` (in a `__pycache__`) is Python's cache of a listed source beside
    it: `model.<cache tag>[.opt-N].pyc` for a listed `model.py`. One with this Python's tag
    must hold the code this Python compiles from the source (code objects compare by their
    instructions, constants, names and line table, not their file name, so the path Triton
    imported it from does not matter). Another CPython's (Triton's container runs its own
    Python: 24.08 writes `cpython-310`) cannot be compiled here to compare, and its header
    vouches for nothing (a planted file copies the source's time, size or hash into it, and
    that Python runs its code): it is refused, saying so (`_foreign_tag`)."""
    parts = entry.split(".")
    if len(parts) not in (3, 4) or parts[-1] != "pyc":
        return False
    optimize = {3: 0, 4: {"opt-1": 1, "opt-2": 2}.get(parts[2], -1)}[len(parts)]
    source = folder.parent / f"{parts[0]}.py"
    path = root / folder / entry
    if str(source) not in listed or optimize < 0 or path.is_symlink() or not path.is_file():
        return False
    if parts[1] != sys.implementation.cache_tag:  # another CPython's: not compiled here
        return False
    try:
        code = marshal.loads(path.read_bytes()[16:])  # after the header: magic, flags, mtime/hash, size
        own = compile((root / source).read_bytes(), getattr(code, "co_filename", str(source)), "exec",
                      dont_inherit=True, optimize=optimize)
    except (ValueError, EOFError, TypeError, SyntaxError, OSError):
        return False
    return isinstance(code, types.CodeType) and code == own

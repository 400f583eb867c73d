"""KServe `InferenceService` manifests for a zoo repository served by Triton (`zoo deploy kserve`).

The export directory is a Triton model repository (`zoo.triton`), so on a cluster it is
served by KServe's Triton runtime: the manifest names `modelFormat: triton`, the
repository's storage URI, the protocol (`v2` over HTTP, or `grpc-v2`, which KServe
routes to Triton's gRPC port 9000 through a container port named `h2c`), and the
resources the artifacts need: one GPU or more when any artifact was exported for CUDA.

The manifest is built from the `kserve` SDK's own model classes (`V1beta1InferenceService`
and the Kubernetes `V1ResourceRequirements`, `V1ContainerPort` they hold), which check
their required fields when built; it is then serialized with the SDK's `ApiClient` and
read back into the same classes, so what is written is what KServe's client accepts.
Before any of that, every artifact is opened as `zoo.load` opens it (manifest validated,
every file hashed): a repository with a broken artifact is refused, since Triton would
leave that model UNAVAILABLE on the cluster.

Python-form artifacts (`zoo export --triton python`; the default for `torch`,
`torch-compile` and `torch-aoti`) run zoo's runner inside Triton's Python backend, so the
Triton image must have zoo and the artifacts' backend plugins installed: NVIDIA's stock
image has not. Such a repository needs `--image` (docs/deploy.md builds one); without
it the command says which artifacts need it and refuses. Each such artifact also runs in a
Triton Python stub process of its own, which imports zoo, its backend's engine and for a
PyTorch artifact PyTorch: the default memory is estimated from the repository
(`memory_estimate`, measured with `tools/triton_memory.py`), not a fixed figure.

The kserve SDK is imported only when a manifest is built. It registers KServe's
`inference.*` protobuf messages under the same names as Triton's (tritonclient.grpc, which
`zoo serve`'s gRPC front end uses), and one Python process cannot hold both: build
manifests in a process that does not serve.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .artifact import Artifact, list_artifacts, safe_member
from .errors import ArtifactError, UnsupportedError, UsageError, ZooError

PROTOCOLS = ("v2", "grpc-v2")
#: `--out -`: the manifest goes to stdout, as `-` means for most command-line tools
STDOUT = Path("-")
# --- storage URIs: the rules of KServe's storage initializer (`kserve_storage.Storage.download`) ---
#: storage URI schemes KServe's storage initializer (and modelcar for oci://) understands
STORAGE_SCHEMES = ("gs://", "s3://", "pvc://", "hdfs://", "webhdfs://", "https://", "http://", "oci://", "hf://")
#: https:// URIs the storage initializer reads as a directory: Azure Blob and File storage
#: (`_AZURE_BLOB_RE`/`_AZURE_FILE_RE`: `https://(.+?).blob.core.windows.net/(.+)`, `.z12.blob.storage.azure.net`
#: and `.file.` alike), whose path `_parse_azure_uri` splits into CONTAINER/PREFIX: a container
#: alone fails that split, `CONTAINER/` is the whole container
AZURE = re.compile(r"https://[^/?#]+?\.(?:z[0-9]{1,2}\.(?:blob|file)\.storage\.azure\.net"
                   r"|(?:blob|file)\.core\.windows\.net)/(?P<path>.*)")
#: any other http(s) URI must match `_URI_RE` (`https?://(.+)/(.+)`) and name a file (`_download_from_uri`
#: refuses an empty `os.path.basename(path)`); it is one file, unpacked when `mimetypes.guess_type`
#: reads application/x-tar or application/zip from the path's extension (from the query's only
#: when the path's says nothing) and tarfile then opens it: gzip is decompressed while downloading,
#: bzip2 and xz by tarfile's "r" mode, compress (.Z) and brotli (.br) not at all. The extensions
#: are taken in lower case only (mimetypes reads `.TAR.GZ` as no tar archive), and the query only
#: when the file has no extension (which the image's /etc/mime.types could give a type)
ARCHIVES = (".tar", ".tar.gz", ".tgz", ".taz", ".tz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".zip")
#: an hf:// URI: `_download_hf` splits it at '/' into exactly ORG and MODEL[:REVISION], MODEL not empty
HF = re.compile(r"hf://[^/]+/[^/:][^/]*")
#: Triton's gRPC port in KServe's `kserve-tritonserver` runtime; the port named h2c is
#: the one KServe's ingress routes gRPC (HTTP/2 cleartext) to
GRPC_PORT = 9000
#: an InferenceService name: a DNS-1035 label, as KServe's webhook requires
NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
#: a DNS label's limit. KServe names the predictor `{name}-predictor` and its host label
#: `{name}-predictor-{namespace}` (Knative's `{{.Name}}-{{.Namespace}}.{{.Domain}}`): a longer
#: one is accepted by the API server and then fails in KServe's controller (kserve/kserve#4807, #4208)
LABEL_MAX = 63
PREDICTOR = "-predictor"
#: a ServingRuntime's name (`--runtime`): a DNS-1123 subdomain, as every Kubernetes object's
RUNTIME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
RUNTIME_MAX = 253
#: the least CPU Kubernetes takes (1m: finer precision is refused)
CPU_MIN = 1e-3
#: the most CPU and memory accepted: past any machine a node runs on (the largest cloud instances,
#: such as AWS's u7in-32tb with 896 vCPUs and 32 TiB, fit under both), so a value beyond is a typo
#: or a unit meant for the other quantity, which the API server would accept and no node schedule
CPU_MAX = 1024
MEMORY_MAX = "64Ti"
#: Kubernetes resource quantities ("1", "500m", "2Gi", "1.5", "1e3"): its grammar is
#: <signedNumber><suffix>, the suffix a binary SI one, a decimal SI one, or a decimal exponent
#: (e or E and a signed integer: "E" alone is exa, "1E3" a thousand)
QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                      r"(?:(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)|[eE]([+-]?[0-9]+))?$")
#: a namespace: a DNS-1123 label
NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
#: an image reference, as the distribution project's grammar (`reference/regexp.go`) has it:
#: [registry[:port]/]path[:tag][@digest], lower-case path components
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
TAG = re.compile(r"[\w][\w.-]{0,127}")
IMAGE = re.compile(rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::{TAG.pattern})?"
                   r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?")
IMAGE_MAX = 255  # the name part's limit; a longer reference is refused as a whole

# --- memory: what Triton holds for the repository (docs/deploy.md, "Memory") ---
# Measured with `tools/triton_memory.py --rounds 3` (tritonserver 2.51 CPU from `make triton`,
# Python 3.11, torch 2.13 CPU, onnxruntime 1.32, 2026-11-27): random-init exports (2-4 MiB of
# files each, and minilm-l6.all-v2's 173 MiB) served by a real tritonserver, read from /proc
# 5 s after every model loaded; the largest of 3 rounds, rounded up to 8 MiB. Each
# python-form artifact runs in a Triton Python stub of its own (fork+exec, so nothing is
# shared copy-on-write): its anonymous memory (peak RSS less the libraries it maps) is its
# own, while the libraries (RSS less anonymous memory) are page cache mapped once per
# container whatever the number of stubs that map them.
#: tritonserver itself, idle, with only the Python backend loaded: RSS 41.1 MiB
SERVER_MIB = 48
#: per stub family: (each stub's own memory for a model of 2-4 MiB of files, the family's
#: libraries, counted once)
STUB_MIB = {
    # resnet8.digits torch 246.9 MiB (libraries 97.6), torch-aoti 241.1 (95.3); also every
    # artifact this project has not measured: tensorrt, any CUDA artifact (its stub imports
    # torch for CUDA tensors), a third-party backend
    "torch": (248, 104),
    # resnet8.digits torch-compile: 429.0 MiB (peak 584.5 less libraries 155.5); Inductor
    # compiles the program in the stub when it loads
    "torch-compile": (432, 160),
    # a CPU ONNX Runtime or OpenVINO artifact, whose stub imports no PyTorch: mpnn.freesolv
    # onnxruntime 72.3 MiB, resnet8.digits onnxruntime 37.1, openvino 41.9; libraries 41.5 (ORT),
    # 69.6 (OpenVINO)
    "onnxruntime/openvino": (80, 72),
}
#: backends whose CPU stub imports no PyTorch
LIGHT_BACKENDS = ("onnxruntime", "openvino")
#: memory per MiB of an artifact's files (its manifest's list): weights read in plus the
#: engine's working memory at load (the stored test vectors run before READY). minilm-l6.all-v2
#: (172.6 MiB of files, 86 MiB of weights) added 2.99x its files through ONNX Runtime (588.5
#: MiB, 516 over mpnn.freesolv's stub) and 2.41x at its load peak through torch (662.7 MiB)
FILES_FACTOR = 3
#: over the sum, for what requests add (activations of larger batches, shared-memory regions
#: for request tensors), which the idle measurement does not hold
HEADROOM = 1.25
#: the estimate is rounded up to a multiple of this, written in Mi (Gi when whole)
ROUND_MIB = 64
#: the default when any artifact is in a native form: Triton's native backends (onnxruntime,
#: OpenVINO, TensorRT) are not in this project's Triton build, so their memory is not measured;
#: the former fixed default stays the floor
NATIVE_FLOOR_MIB = 2048
_UNITS = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
          "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}


@dataclass(frozen=True)
class RepositoryFacts:
    """What the manifest needs to know about a repository, read from its artifacts' manifests."""

    artifacts: tuple[str, ...]
    cuda: tuple[str, ...]  # artifacts exported for a CUDA device
    python_form: tuple[str, ...]  # artifacts Triton serves through zoo's runner
    other_dirs: tuple[str, ...]  # directories Triton would try to load and fail: neither artifacts nor models
    #: (artifact or Triton model, its stub family in STUB_MIB or None for a native form, its files' bytes)
    memory: tuple[tuple[str, str | None, int], ...] = ()
    #: Triton models zoo did not export (a config.pbtxt, no zoo.json): (name, the backend or platform
    #: its config names, as "platform onnxruntime_onnx"); Triton serves them, zoo checks nothing of them
    triton_models: tuple[tuple[str, str], ...] = ()


def read_repository(repository: Path) -> RepositoryFacts:
    repository = Path(repository)
    if not repository.is_dir():
        raise ArtifactError(f"no model repository at {repository}")
    paths = list_artifacts(repository)
    if not paths:
        raise ArtifactError(f"{repository} holds no artifacts: export some with `zoo export` first")
    cuda, python_form, names, memory = [], [], [], []
    for path in paths:
        art = Artifact.open(path)  # hashes every file: a broken artifact is refused here, not on the cluster
        if not (path / "config.pbtxt").is_file():
            raise ArtifactError(f"artifact {art.name} has no config.pbtxt, so Triton cannot serve it; "
                                f"re-export it with `zoo export --force`")
        names.append(art.name)
        if art.device.startswith("cuda"):
            cuda.append(art.name)
        family = None
        if (art.manifest.get("triton") or {}).get("form", "native") == "python":
            python_form.append(art.name)
            family = stub_family(art.backend, art.device)
        size = sum(safe_member(path, rel, art.name).stat().st_size for rel in art.manifest["files"])
        memory.append((art.name, family, size))
    # hidden ones too: tritonserver 2.51 polls every directory, `.name` included (a `.name.old-…`
    # left by an interrupted replacement fails its start under --exit-on-error, its default)
    others, models = [], []
    for path in sorted(p for p in repository.iterdir() if p.is_dir() and p.name not in names):
        runtime = triton_model(path)
        if runtime is None:
            others.append(path.name)
            continue
        # served by Triton as zoo serve never serves it (it skips directories without zoo.json): a
        # Python-backend model counted as an unmeasured stub (the torch family's), any other as a native form
        models.append((path.name, runtime))
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
        memory.append((path.name, "torch" if runtime == "backend python" else None, size))
    return RepositoryFacts(tuple(names), tuple(cuda), tuple(python_form), tuple(others), tuple(memory),
                           tuple(models))


#: a config.pbtxt's top-level `backend:` or `platform:` field, either quote
_RUNTIME_FIELD = re.compile(r"""^(backend|platform)\s*:\s*(?:"([^"\n]*)"|'([^'\n]*)')""", re.M)


def triton_model(path: Path) -> str | None:
    """What Triton loads `path` with when it is a model Triton can poll although not a zoo artifact:
    a config.pbtxt naming no other model, a numeric version directory. "backend NAME" or "platform
    NAME" as the config names it ("backend or platform unnamed" when it names neither), else None."""
    from .triton import CONFIG, config_names

    try:
        text = (path / CONFIG).read_text(errors="replace")
    except OSError:
        return None
    if any(name != path.name for name in config_names(text)):
        return None
    if not any(p.is_dir() and p.name.isdigit() for p in path.iterdir()):
        return None
    m = _RUNTIME_FIELD.search(text)
    return f"{m[1]} {m[2] or m[3]}" if m else "backend or platform unnamed"


def stub_family(backend: str, device: str) -> str:
    """The STUB_MIB family of a python-form artifact's Triton stub."""
    if backend == "torch-compile":
        return "torch-compile"
    if backend in LIGHT_BACKENDS and device == "cpu":
        return "onnxruntime/openvino"
    return "torch"


def quantity_bytes(quantity: str) -> float:
    """A Kubernetes quantity (`QUANTITY`: "2Gi", "512M", "1.5G") in bytes."""
    m = QUANTITY.fullmatch(quantity)
    if not m:
        raise UnsupportedError(f"{quantity!r} is not a Kubernetes quantity (e.g. 1, 500m, 2Gi)")
    if m[3] is not None:  # a decimal exponent: as float() reads "1.5e3" (inf past its range, not an error)
        return float(f"{m[1]}e{m[3]}")
    return float(m[1]) * _UNITS[m[2] or ""]


def memory_estimate(facts: RepositoryFacts) -> int:
    """MiB of memory the repository is estimated to need under Triton, a multiple of ROUND_MIB:
    (SERVER_MIB + each family's libraries once + each python-form artifact's stub + FILES_FACTOR
    x every artifact's files) x HEADROOM. Native forms count only their files: NATIVE_FLOOR_MIB
    is the default's floor for them (`default_memory`), not part of the estimate."""
    total = SERVER_MIB
    families = {family for _, family, _ in facts.memory if family is not None}
    total += sum(STUB_MIB[family][1] for family in families)
    for _, family, size in facts.memory:
        total += FILES_FACTOR * size / 2 ** 20
        if family is not None:
            total += STUB_MIB[family][0]
    return math.ceil(total * HEADROOM / ROUND_MIB) * ROUND_MIB


def mib_quantity(mib: int) -> str:
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


def default_memory(facts: RepositoryFacts) -> str:
    """The memory request and limit written without --memory: `memory_estimate`, at least
    NATIVE_FLOOR_MIB when any artifact is in a native form."""
    mib = memory_estimate(facts)
    if any(family is None for _, family, _ in facts.memory):
        mib = max(mib, NATIVE_FLOOR_MIB)
    return mib_quantity(mib)


def name_max(namespace: str | None = None) -> int:
    """The longest InferenceService name whose `{name}-predictor` (and, in `namespace`, host
    label `{name}-predictor-{namespace}`) is a DNS label: 53, less the namespace and a '-'."""
    return LABEL_MAX - len(PREDICTOR) - (len(namespace) + 1 if namespace else 0)


def default_name(repository: Path, namespace: str | None = None) -> str:
    """A DNS-1035 label from the repository's directory name ("exports" → "exports"), cut to `name_max`."""
    text = re.sub(r"[^a-z0-9-]+", "-", Path(repository).resolve().name.lower()).strip("-")
    text = re.sub(r"^[^a-z]+", "", text)[:name_max(namespace)].rstrip("-")
    return text or "zoo"


def _check(name: str, storage_uri: str, protocol: str, gpus: int, cpu: str, memory: str | None,
           namespace: str | None = None, image: str | None = None, runtime_version: str | None = None,
           runtime: str | None = None) -> None:
    """Refuse values the API server or KServe's webhook or controller would reject, one line each
    (fullmatch: `$` would let a trailing newline through into the YAML)."""
    if namespace is not None and (not NAMESPACE.fullmatch(namespace) or len(namespace) > LABEL_MAX):
        raise UsageError(f"--namespace {namespace!r} is not a valid namespace (a DNS-1123 label): lower-case "
                         f"letters, digits and '-', starting and ending with a letter or digit, at most "
                         f"{LABEL_MAX} characters")
    if namespace is not None and name_max(namespace) < 1:
        raise UsageError(f"--namespace {namespace!r} is {len(namespace)} characters, over "
                         f"{LABEL_MAX - len(PREDICTOR) - 2}: KServe serves an InferenceService as "
                         f"NAME{PREDICTOR}-{namespace}.DOMAIN, whose first label may have at most {LABEL_MAX} "
                         f"characters, so the namespace leaves no room for a name")
    if not NAME.fullmatch(name):
        raise UsageError(f"--name {name!r} is not a valid InferenceService name: lower-case letters, digits "
                         f"and '-', starting with a letter and ending with a letter or digit, at most "
                         f"{name_max(namespace)} characters")
    if len(name) > name_max(namespace):
        raise UsageError(f"--name {name!r} is {len(name)} characters, over {name_max(namespace)}: KServe "
                         f"serves it as {name}{PREDICTOR}-{namespace or 'NAMESPACE'}.DOMAIN, whose first "
                         f"label may have at most {LABEL_MAX} characters")
    _check_storage_uri(storage_uri)
    if runtime is not None and (not RUNTIME.fullmatch(runtime) or len(runtime) > RUNTIME_MAX):
        raise UsageError(f"--runtime {runtime!r} is not a ServingRuntime name (a Kubernetes object name: "
                         f"lower-case letters, digits, '-' and '.', starting and ending with a letter or digit)")
    if image is not None and (not IMAGE.fullmatch(image) or len(image) > IMAGE_MAX):
        raise UsageError(f"--image {image!r} is not a valid image reference: "
                         f"[REGISTRY[:PORT]/]PATH[:TAG][@DIGEST], e.g. registry.example/zoo-triton:0.1")
    if runtime_version is not None and not TAG.fullmatch(runtime_version):
        raise UsageError(f"--runtime-version {runtime_version!r} is not a valid image tag (e.g. 24.08-py3)")
    if image is not None and runtime_version is not None:
        # KServe's UpdateImageTag rewrites the container's image, --image included: its last
        # `:[\w.-]*` (a tag, or a digest's hex) replaced by ":VERSION", or ":VERSION" appended
        retagged = re.sub(r":[\w.-]*$", "", image) + f":{runtime_version}"
        raise UsageError(f"--runtime-version {runtime_version} with --image {image}: KServe replaces the "
                         f"image's tag with the runtime version, so the pod would run {retagged}; give the "
                         f"tag in --image and leave --runtime-version out")
    if protocol not in PROTOCOLS:
        raise UsageError(f"--protocol {protocol!r}: choose {' or '.join(PROTOCOLS)}")
    if gpus < 0:
        raise UsageError(f"--gpu {gpus}: give 0 or more GPUs")
    for option, value in (("--cpu", cpu), ("--memory", memory)):
        if value is not None and not QUANTITY.fullmatch(value):
            raise UsageError(f"{option} {value!r} is not a Kubernetes quantity (e.g. 1, 500m, 2Gi)")
        if value is not None and not math.isfinite(quantity_bytes(value)):
            raise UsageError(f"{option} {value} is not a finite amount: give e.g. "
                             f"{'2' if option == '--cpu' else '2Gi'}")
    suffix = QUANTITY.fullmatch(cpu)[2] or ""
    if suffix.endswith("i"):  # Kubernetes takes "1Gi" CPUs (2^30 of them): a memory amount given as --cpu
        raise UsageError(f"--cpu {cpu}: {suffix} is a suffix for bytes; give CPUs as a number or in thousandths, "
                         f"e.g. 2 or 500m")
    if quantity_bytes(cpu) < CPU_MIN:
        raise UsageError(f"--cpu {cpu}: give at least 1m (a thousandth of a CPU), the least Kubernetes takes; "
                         f"0 gives Triton no CPU time")
    if quantity_bytes(cpu) > CPU_MAX:
        raise UsageError(f"--cpu {cpu} is {quantity_bytes(cpu):.15g} CPUs, over {CPU_MAX}: more than any machine "
                         f"offers (is the unit a typo?); give e.g. 2 or 500m")
    if memory is None:
        return
    if quantity_bytes(memory) < SERVER_MIB * 2 ** 20:
        raise UsageError(f"--memory {memory} is {quantity_bytes(memory):.15g} bytes, less than the {SERVER_MIB}Mi "
                         f"tritonserver holds before any model loads: give a unit, e.g. 2Gi, or leave "
                         f"--memory out to write the repository's estimate")
    if quantity_bytes(memory) > quantity_bytes(MEMORY_MAX):
        raise UsageError(f"--memory {memory} is over {MEMORY_MAX}: more than any machine "
                         f"offers (is the unit a typo?); give e.g. 2Gi, or leave --memory out to write the "
                         f"repository's estimate")


def _check_storage_uri(uri: str) -> None:
    """A URI the storage initializer reads as the repository: a directory, or an archive of one
    (its rules: `STORAGE_SCHEMES` to `HF` above)."""
    if not uri.startswith(STORAGE_SCHEMES):
        raise UsageError(f"--storage-uri {uri!r}: KServe's storage initializer reads "
                         f"{', '.join(STORAGE_SCHEMES)} URIs; copy the repository to one of those "
                         f"(e.g. `gsutil cp -r exports gs://BUCKET/zoo`) and give its URI")
    if any(c.isspace() or not c.isprintable() for c in uri):
        raise UsageError(f"--storage-uri {uri!r} holds spaces or control characters")
    scheme, rest = uri.split("://", 1)
    if not rest.split("/", 1)[0]:
        raise UsageError(f"--storage-uri {uri!r} names no bucket, claim or host after {scheme}://, "
                         f"e.g. {scheme}://BUCKET/zoo")
    azure = AZURE.fullmatch(uri)
    web = scheme in ("http", "https") and not azure
    if "#" in uri or ("?" in uri and not web):
        raise UsageError(f"--storage-uri {uri!r} holds {'#' if '#' in uri else '?'}: the storage initializer "
                         f"would read it as part of the {'URL' if web else 'object path'}; leave the "
                         f"{'fragment' if '#' in uri else 'query'} out")
    if azure and "/" not in azure["path"]:
        raise UsageError(f"--storage-uri {uri!r} names no container and path: Azure URIs are "
                         f"https://ACCOUNT.blob.core.windows.net/CONTAINER/PATH (CONTAINER/ for a whole container), "
                         f"which the storage initializer splits in two")
    if scheme == "hf" and not HF.fullmatch(uri):
        raise UsageError(f"--storage-uri {uri!r}: hf:// URIs name ORG/MODEL[:REVISION], one Hugging Face "
                         f"repository, e.g. hf://ORG/zoo-models")
    if web:
        _check_archive_uri(uri)


def _check_archive_uri(uri: str) -> None:
    """An http(s) URI (not Azure's) that the storage initializer downloads as a file and unpacks."""
    url = urlsplit(uri)
    file = url.path.rsplit("/", 1)[-1]
    if not file:
        raise UsageError(f"--storage-uri {uri!r} names no file to download: the storage initializer downloads an "
                         f"http(s) URI as the file its path ends in, e.g. https://HOST/zoo.tar.gz")
    if file.endswith(ARCHIVES) or ("." not in file and url.query.endswith(ARCHIVES)):
        return
    if file.lower().endswith(ARCHIVES) or ("." not in file and url.query.lower().endswith(ARCHIVES)):
        raise UsageError(f"--storage-uri {uri!r}: give the archive's extension in lower case: the storage "
                         f"initializer reads the file's type with Python's mimetypes, which reads .TAR.GZ as no "
                         f"tar archive, so it would not be unpacked")
    raise UsageError(f"--storage-uri {uri!r}: KServe downloads an http(s) URI as one file (Azure Blob and File URIs "
                     f"apart), which Triton cannot load as a model repository; give an archive of the repository "
                     f"({', '.join(ARCHIVES)}, its artifacts at the top; named by the path, or by the query when "
                     f"the path's file has no extension), which the storage initializer unpacks, or a gs://, s3:// "
                     f"or pvc:// directory")


def kserve_manifest(repository: Path, storage_uri: str, *, name: str | None = None, gpus: int | None = None,
                    protocol: str = "v2", cpu: str = "1", memory: str | None = None, image: str | None = None,
                    runtime: str | None = None, runtime_version: str | None = None,
                    namespace: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """The `InferenceService` for REPOSITORY as a dict (YAML-ready), and warnings to show.

    `gpus`: None gives 1 when any artifact was exported for CUDA, else 0; 0 with CUDA
    artifacts is refused. `image`: a Triton image with zoo installed, required when the
    repository holds python-form artifacts. `runtime`/`runtime_version`: a KServe
    ServingRuntime and its image tag, else KServe picks the runtime for `triton`. `memory`: None
    gives `default_memory` (the repository's estimate, or the native forms' floor); a value below it
    is kept, with a warning naming it."""
    name = name if name is not None else default_name(repository, namespace)
    _check(name, storage_uri, protocol, gpus or 0, cpu, memory, namespace, image, runtime_version, runtime)
    facts = read_repository(repository)
    warnings: list[str] = []
    if gpus is None:
        gpus = 1 if facts.cuda else 0
    if facts.cuda and gpus == 0:
        one = len(facts.cuda) == 1
        raise UnsupportedError((f"artifact {facts.cuda[0]} was exported for CUDA and needs" if one else
                                f"artifacts {', '.join(facts.cuda)} were exported for CUDA and need") +
                               f" a GPU: give --gpu 1 (or more), or export {'it' if one else 'them'} for cpu")
    if gpus and not facts.cuda:
        warnings.append(f"--gpu {gpus}: every artifact was exported for cpu (Triton's KIND_CPU), so the GPU "
                        f"would sit idle")
    if facts.python_form and image is None:
        which = (f"artifacts {', '.join(facts.python_form)} are" if len(facts.python_form) > 1
                 else f"artifact {facts.python_form[0]} is")
        raise UnsupportedError(f"{which} served by Triton's Python backend "
                               f"through zoo's runner, which the stock Triton image lacks: build an image with zoo "
                               f"and its backend plugins installed (docs/deploy.md) and give it with --image")
    default = default_memory(facts)
    if memory is None:
        memory = default
    elif quantity_bytes(memory) < quantity_bytes(default) and default != mib_quantity(memory_estimate(facts)):
        # the floor, not the estimate: a native form's memory is not measured
        warnings.append(f"--memory {memory} is below the {default} written for a repository with native-form "
                        f"artifacts, whose memory under Triton's native backends is not measured (docs/deploy.md, "
                        f"\"Memory\"): the pod may be OOM-killed; leave --memory out to write {default}")
    elif quantity_bytes(memory) < quantity_bytes(default):
        stubs = len(facts.python_form)
        warnings.append(f"--memory {memory} is below the {default} estimated for this "
                        f"repository (Triton, {stubs} Python stub process{'' if stubs == 1 else 'es'}, one per "
                        f"python-form artifact, and the models' files: docs/deploy.md, \"Memory\"): the pod may "
                        f"be OOM-killed; leave --memory out to write the estimate")
    for model, runtime in facts.triton_models:
        counted = "an unmeasured Python stub's" if runtime == "backend python" else "a native form's"
        warnings.append(f"{model} holds a config.pbtxt and no zoo.json: Triton serves it as its config.pbtxt says "
                        f"({runtime}), unchecked by zoo (a zoo artifact whose copy was cut short lacks zoo.json too: "
                        f"copy it again); its memory is counted as {counted}")
    if facts.other_dirs:
        one = len(facts.other_dirs) == 1
        warnings.append(f"Triton loads every directory of the repository, and {', '.join(facts.other_dirs)} "
                        f"{'is not a zoo artifact' if one else 'are not zoo artifacts'}: remove "
                        f"{'it' if one else 'them'} before copying the repository to {storage_uri}")
    return _build(name, storage_uri, protocol, gpus, cpu, memory, image, runtime, runtime_version, namespace), warnings


def check_out(out: Path, repository: Path) -> None:
    """Refuse an `--out` inside `repository` (both resolved, links followed), which is copied whole to
    the storage Triton reads: a file written into an artifact fails its check (a file its manifest
    does not list), one in a new directory is a directory Triton fails to load. `STDOUT` passes."""
    out = Path(out)
    if out != STDOUT and out.resolve().is_relative_to(Path(repository).resolve()):
        raise UsageError(f"cannot write --out {out}: it is inside the repository {repository}, which is copied "
                         f"whole to the storage Triton reads (a file in an artifact fails its check, a new directory "
                         f"is a model Triton fails to load); write it outside")


def _sdk():
    try:
        import kserve
        from kubernetes import client as k8s
    except ImportError as exc:
        raise ZooError(f"`zoo deploy kserve` builds the manifest with the kserve SDK, which is not installed "
                       f"({exc}): pip install 'zoo[kserve]'") from None
    return kserve, k8s


def _build(name, storage_uri, protocol, gpus, cpu, memory, image, runtime, runtime_version, namespace) -> dict:
    kserve, k8s = _sdk()
    limits = {"cpu": cpu, "memory": memory}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    model = kserve.V1beta1ModelSpec(
        model_format=kserve.V1beta1ModelFormat(name="triton"),
        protocol_version=protocol,
        storage_uri=storage_uri,
        runtime=runtime,
        runtime_version=runtime_version,
        image=image,
        # requests equal limits: the Guaranteed QoS class, so a benchmarked pod is not throttled
        resources=k8s.V1ResourceRequirements(requests=dict(limits), limits=limits),
        ports=[k8s.V1ContainerPort(name="h2c", container_port=GRPC_PORT, protocol="TCP")]
        if protocol == "grpc-v2" else None,
    )
    isvc = kserve.V1beta1InferenceService(
        api_version=f"{kserve.constants.KSERVE_GROUP}/{kserve.constants.KSERVE_V1BETA1_VERSION}",
        kind=kserve.constants.KSERVE_KIND_INFERENCESERVICE,
        metadata=k8s.V1ObjectMeta(name=name, namespace=namespace),
        spec=kserve.V1beta1InferenceServiceSpec(predictor=kserve.V1beta1PredictorSpec(model=model)))
    manifest = serialize(isvc)
    if serialize(parse_manifest(manifest)) != manifest:  # read back field by field by the SDK's classes
        raise ZooError("internal error: the kserve SDK's classes do not read back the InferenceService written")
    return manifest


def serialize(isvc) -> dict:
    """The SDK's own JSON form of `isvc` (camelCase keys, unset fields left out)."""
    kserve, _ = _sdk()
    manifest = kserve.ApiClient().sanitize_for_serialization(isvc)
    model = manifest["spec"]["predictor"]["model"]
    if not model.get("name"):  # the SDK's '' for an unset container name: KServe names it
        model.pop("name", None)
    return manifest


def parse_manifest(manifest: dict) -> Any:
    """`manifest` read into the kserve SDK's `V1beta1InferenceService`, field by field through
    the classes' own `openapi_types` and `attribute_map` (KServe's types from `kserve.models`,
    Kubernetes' from `kubernetes.client`), each built with its required fields checked.
    An unknown field is refused, naming its path: KServe's API server would drop it."""
    kserve, k8s = _sdk()

    def read(value: Any, kind: str, where: str) -> Any:
        if value is None:
            return None
        if m := re.fullmatch(r"(?:list|List)\[(.+)\]", kind):  # kserve's spelling, and kubernetes'

            if not isinstance(value, list):
                raise UnsupportedError(f"{where}: a list was expected, not {value!r}")
            return [read(v, m[1], f"{where}[{i}]") for i, v in enumerate(value)]
        if m := re.fullmatch(r"dict\(str, (.+)\)|Dict\[str, (.+)\]", kind):
            if not isinstance(value, dict):
                raise UnsupportedError(f"{where}: a mapping was expected, not {value!r}")
            return {k: read(v, m[1] or m[2], f"{where}.{k}") for k, v in value.items()}
        primitive = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}.get(kind)
        if primitive is not None:
            if not isinstance(value, primitive):
                raise UnsupportedError(f"{where}: {kind} expected, not {value!r}")
            return value
        klass = getattr(kserve.models, kind, None) or getattr(k8s, kind)
        if not isinstance(value, dict):
            raise UnsupportedError(f"{where}: a {kind} mapping was expected, not {value!r}")
        by_key = {key: attr for attr, key in klass.attribute_map.items()}
        unknown = sorted(set(value) - set(by_key))
        if unknown:
            raise UnsupportedError(f"{where}: {kind} has no field {', '.join(unknown)}")
        try:
            return klass(**{by_key[k]: read(v, klass.openapi_types[by_key[k]], f"{where}.{k}")
                            for k, v in value.items()})
        except ValueError as exc:  # a required field missing or a value outside its set
            raise UnsupportedError(f"{where}: {'; '.join(str(exc).splitlines()[:3])}") from None

    return read(manifest, "V1beta1InferenceService", "InferenceService")


def to_yaml(manifest: dict) -> str:
    import yaml

    return yaml.safe_dump(manifest, sort_keys=False)

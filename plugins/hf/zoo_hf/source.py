"""Where a model's files are: a local directory or the local Hugging Face cache, never the network.

A source is a directory (`save_pretrained` output, a sentence-transformers folder, a
`git clone` of a hub repository) or a hub id ("org/name") already in the cache that
`hf download` (`huggingface-cli download` before huggingface_hub 1.0) and `from_pretrained` fill. The cache is found as
`huggingface_hub` finds it (`CACHE_ORDER`), read when asked (not at import), so a changed
environment is seen.

Weights are read from safetensors only. `pytorch_model.bin` and friends are pickles:
loading one runs whatever code it was made to run, so a directory with nothing else is
refused rather than loaded.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from zoo.errors import CheckpointError

#: the files that hold weights as safetensors, one file or shards with an index.
SAFETENSORS = ("model.safetensors", "model.safetensors.index.json")
#: weight files zoo will not read: pickles (torch.load) and other frameworks' formats.
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.bin", "model.pt", "model.pth", "model.ckpt")
OTHER_FORMATS = ("tf_model.h5", "flax_model.msgpack", "model.onnx")
#: what a hub id looks like: "name" or "org/name" (letters, digits, -, _, .)
_HUB_ID = re.compile(r"[\w.\-]+(/[\w.\-]+)?")
_COMMIT = re.compile(r"[0-9a-f]{40}")
#: where the hub cache is, the first that is set: huggingface_hub's order (its constants.py)
CACHE_ORDER = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "$HF_HOME/hub", "$XDG_CACHE_HOME/huggingface/hub",
               "~/.cache/huggingface/hub")


class ModelNotFoundError(CheckpointError):
    """A model's files are not where zoo looked (a directory, the local cache); nothing is downloaded."""


class UnsafeWeightsError(CheckpointError):
    """A model's weights exist only in a format that zoo refuses to load (pickles)."""


def hub_cache() -> Path:
    """The local Hugging Face hub cache directory, resolved from the environment now."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):  # the second: the older name, still read
        if os.environ.get(name):
            return _expanded(os.environ[name])
    if os.environ.get("HF_HOME"):
        return _expanded(os.environ["HF_HOME"]) / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return _expanded(xdg) / "huggingface" / "hub"


def _expanded(path: str) -> Path:
    """`path` with ~ and $VARIABLES expanded, as huggingface_hub expands the cache's."""
    return Path(os.path.expandvars(path)).expanduser()


def resolve(source: str | os.PathLike[str], revision: str = "main") -> Path:
    """The directory holding `source`'s files: the directory itself, or the cached snapshot
    of hub id `source` at `revision` (a branch, tag or commit the cache has).

    Raises `ModelNotFoundError` naming every place it looked."""
    path = Path(source).expanduser()
    looked = [f"directory {path.resolve()}"]
    if path.is_dir():
        return _checked(path)
    if isinstance(source, str) and _HUB_ID.fullmatch(source):
        repo = hub_cache() / f"models--{source.replace('/', '--')}"
        looked.append(f"the Hugging Face cache {repo} (revision {revision!r}; the cache is "
                      f"{', else '.join(CACHE_ORDER)})")
        snapshot = _snapshot(repo, revision)
        if snapshot is not None:
            return _checked(snapshot)
    raise ModelNotFoundError(
        f"no Hugging Face model {str(source)!r}: looked in {' and in '.join(looked)}. zoo never downloads; put "
        f"config.json, model.safetensors and the tokenizer files in a directory, or fetch the model into the "
        f"cache first (`hf download ORG/NAME`, under the same environment)")


def _snapshot(repo: Path, revision: str) -> Path | None:
    """The cache's snapshot for `revision`: refs/<revision> names the commit, or it is one."""
    ref = repo / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    if not _COMMIT.fullmatch(commit):
        return None
    snapshot = repo / "snapshots" / commit
    return snapshot if snapshot.is_dir() else None


def _checked(directory: Path) -> Path:
    """`directory` if it has a config and safetensors weights; refuse pickled weights by name."""
    if not (directory / "config.json").is_file():
        raise ModelNotFoundError(f"{directory} has no config.json, so it is not a transformers model directory "
                                 f"(it holds {_listing(directory)})")
    if any((directory / name).is_file() for name in SAFETENSORS):
        return directory
    pickles = [name for name in PICKLES if (directory / name).is_file()]
    if pickles:
        raise UnsafeWeightsError(
            f"{directory} has its weights only as {', '.join(pickles)}: a pickle, which runs arbitrary code when "
            f"loaded, so zoo does not load it. Convert it once on a machine where you trust the file (load it with "
            f"transformers and call save_pretrained(..., safe_serialization=True)) to get model.safetensors")
    others = [name for name in OTHER_FORMATS if (directory / name).is_file()]
    raise ModelNotFoundError(f"{directory} has no model.safetensors (nor a sharded model.safetensors.index.json)"
                             + (f"; {', '.join(others)} is not a format zoo loads" if others else "")
                             + f"; it holds {_listing(directory)}")


def _listing(directory: Path, limit: int = 12) -> str:
    names = sorted(p.name for p in directory.iterdir())
    shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
    return shown or "nothing"

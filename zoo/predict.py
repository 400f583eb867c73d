"""`zoo predict` and `zoo generate`: domain-native inputs (text, SMILES, images) in,
domain outputs (labels with scores, embeddings, a property, generated text) out.

The model runs through an artifact's runner when one is named, otherwise through the
PyTorch module with its trained (or pretrained) weights. Preprocessing and
postprocessing are the spec's own, so the server's BYTES path gives the same results.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from .arguments import check_device, check_text_items, check_threads, domain_items
from .errors import InputError, NoInputsError, PluginError, SettingError, ZooError, first_line
from .inputs import postprocessed, preprocessed
from .registry import get_model
from .spec import ModelSpec

if TYPE_CHECKING:  # importing it imports torch, which `zoo predict --url` does not need
    from .checkpoint import Checkpoint

ArrayFn = Callable[[Mapping[str, np.ndarray]], Mapping[str, Any]]


def predictor(model: str | None = None, artifact: str | Path | None = None,
              checkpoint: str | Path | Checkpoint | None = None, device: str | None = None,
              threads: int | None = None) -> tuple[ModelSpec, ArrayFn, str]:
    """The spec, a numpy-in/numpy-out callable and a description of what runs.

    `device`: for an artifact, default the device it was exported for; for the PyTorch
    module, default cpu."""
    if artifact is not None and checkpoint is not None:
        raise ZooError("a checkpoint names PyTorch weights and an artifact carries its own: give one of them")
    if artifact is not None:
        from .artifact import Artifact

        from .standalone import with_raw_inputs

        art = Artifact.open(artifact)
        if model is not None and model != art.model:  # a name: the artifact needs no plugin to know its own
            raise ZooError(f"artifact {art.name} holds model {art.model}, not {model}")
        spec = art.spec()
        if spec.raw_kind is None and art.manifest["model"].get("raw_input"):  # its plugin is not loaded
            spec = with_raw_inputs(spec, art.manifest["model"])
        return spec, art.load(threads=check_threads(threads), device=device), f"artifact {art.name}"
    if model is None:
        raise ZooError("name a model or an artifact")
    from .export import reference_module
    from .train import module_fn

    device = check_device(device or "cpu")
    spec = get_model(model)
    module, source = reference_module(spec, checkpoint)
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ZooError(f"--device {device}: no CUDA device (torch {torch.__version__} sees none)")
    return spec, module_fn(module.to(device), spec, device), f"PyTorch ({source})"


def _raw(spec: ModelSpec, items: Sequence[bytes | str] | bytes | str) -> list[bytes]:
    if spec.preprocess is None:
        raise ZooError(f"model {spec.name} takes no domain-native inputs (it takes tensors: "
                       f"{', '.join(t.name for t in spec.inputs)}; on the command line, --tensor NAME=FILE.npy)")
    if spec.raw_binary and any(isinstance(x, str) for x in ([items] if isinstance(items, str) else items)):
        # as `zoo.client.Client.predict`: a path string would be sent as the image's bytes
        raise InputError(f"model {spec.name} takes {spec.raw_kind} inputs as bytes, not str (a path is not read): "
                         f"pass the file's bytes, open(path, 'rb').read()")
    raw = domain_items(items)
    if not raw:
        raise NoInputsError(f"model {spec.name}: give at least one {spec.raw_kind} input")
    return raw if spec.raw_binary else check_text_items(spec.raw_kind, raw)


def predict(spec: ModelSpec, fn: ArrayFn, items: Sequence[bytes | str] | bytes | str, *,
            names: Sequence[str] | None = None) -> list[Any]:
    """One domain result per item, in batches the signature admits.

    `items` is a list of inputs (str or bytes); a lone str or bytes is one item, and its
    result comes back as a list of one, as a transformers pipeline returns for one text.
    `names`: what the caller calls each item (the path of the file an image was read
    from), said with the item's input number when it is refused (`_which_input`)."""
    raw = _raw(spec, items)
    if names is not None and len(names) != len(raw):
        raise ZooError(f"{len(names)} names for {len(raw)} items: give one name per item, or none")
    if spec.postprocess is None and spec.detokenize is not None:  # a language model: its results are texts
        raise ZooError(f"model {spec.name} is a language model, whose answer to a text is the text it continues "
                       f"it with: `zoo generate {spec.name} --prompt TEXT`; `zoo predict` takes its tensors "
                       f"(--tensor NAME=FILE.npy: {', '.join(t.name for t in spec.inputs)})")
    if spec.postprocess is None:
        raise ZooError(f"model {spec.name} turns {spec.raw_kind} inputs into tensors but has no results to make "
                       f"of its outputs (its plugin gives no postprocess): `zoo predict` takes its tensors "
                       f"(--tensor NAME=FILE.npy: {', '.join(t.name for t in spec.inputs)})")
    step = spec.axes["batch"].max
    results: list[Any] = []
    for i in range(0, len(raw), step):
        chunk = raw[i:i + step]
        try:
            inputs = preprocessed(spec, len(chunk), spec.preprocess(chunk))
        except InputError as exc:  # the plugin numbers items within the chunk it was given
            raise _which_input(spec, exc, raw, i, len(chunk), names) from None
        except ZooError:
            raise
        except Exception as exc:  # a slip in the plugin's code, named as its own
            raise PluginError(f"model {spec.name}: its preprocess failed: {type(exc).__name__}: "
                              f"{first_line(exc)}") from exc
        outputs = {k: np.asarray(v) for k, v in fn(inputs).items()}
        try:
            made = spec.postprocess(outputs)
        except ZooError:
            raise
        except Exception as exc:
            raise PluginError(f"model {spec.name}: its postprocess failed: {type(exc).__name__}: "
                              f"{first_line(exc)}") from exc
        results.extend(postprocessed(spec, len(chunk), made))
    return results


def _which_input(spec: ModelSpec, exc: InputError, raw: Sequence[bytes], start: int, size: int,
                 names: Sequence[str] | None) -> InputError:
    """`exc`, which the plugin's preprocess raised for raw[start:start + size], saying which
    input its item is as the caller counts them (from 1), and its name where given.

    The plugin numbers items within the batch it is given, and in its own words ("image 9",
    "item 9"): a bad 41st image, the 9th of the second batch, was told as "image 9 ... item
    1 is input 33", its number left to work out and its file unsaid. The item is found by
    preprocessing the batch's items alone (on this error only), and is the one the message
    names where that number follows a word: "so image 9 is input 41 (many/bad.png)". Where
    none fails alone, or the message names another, the batch's range is said (`in_chunk`)."""
    if not start and names is None:  # the plugin's numbers are the caller's, and there is nothing to add
        return exc
    failing = None
    for k in range(size):
        try:
            spec.preprocess(raw[start + k:start + k + 1])
        except InputError:
            failing = k + 1
            break
        except Exception:  # noqa: BLE001 - the plugin's code, failing otherwise alone: the batch is said
            break
    said = failing and re.search(rf"\b([A-Za-z]+) {failing}\b", str(exc))
    if not said:
        return exc.in_chunk(start, size, len(raw))
    word, number = said.group(1), start + failing
    if not start:  # the plugin's numbers are the caller's
        return InputError(f"{exc} ({word} {failing} is {names[number - 1]})") if names is not None else exc
    among = f"{exc} (among inputs {start + 1} to {start + size} of {len(raw)}: {word} 1 is input {start + 1})"
    if names is None and failing == 1:  # nothing more to say
        return InputError(among)
    return InputError(f"{among}, so {word} {failing} is input {number}"
                      + (f" ({names[number - 1]})" if names is not None else ""))


def generate(spec: ModelSpec, fn: ArrayFn, prompt: str, max_new_tokens: int = 100, temperature: float = 0.0,
             seed: int = 0) -> str:
    """Greedy (temperature 0) or sampled continuation of `prompt` by a causal language model
    whose spec takes token ids and returns next-token logits at every position: at most
    `max_new_tokens`, ending before the first of the spec's `stop_tokens`."""
    if spec.detokenize is None or spec.preprocess is None:
        if spec.task == "text-generation":
            raise ZooError(f"model {spec.name} generates tokens but has no tokenizer, so it takes no text prompt; "
                           f"run it on token ids ({', '.join(t.name for t in spec.inputs)}) through the tensor API")
        raise ZooError(f"model {spec.name} is not a language model (task {spec.task})")
    if max_new_tokens < 1:
        raise SettingError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if not temperature >= 0:
        raise SettingError(f"temperature must be >= 0, got {temperature}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        # numpy's generator takes no negative seed: it failed mid-run as an internal error
        raise SettingError(f"seed must be an integer >= 0, got {seed!r}")
    (name,) = [t.name for t in spec.inputs]
    (logits_name,) = [t.name for t in spec.outputs]
    seq_axis = spec.inputs[0].shape[1]
    window = spec.axes[seq_axis].max if isinstance(seq_axis, str) else int(seq_axis)
    # a prompt from the command line that is not UTF-8 arrives with its bytes escaped as
    # lone surrogates (PEP 383): they go to the tokenizer as the bytes they were, which a
    # byte-level model takes and a text tokenizer refuses as not UTF-8 (strict encoding
    # raised an internal error instead)
    ids = list(np.asarray(spec.preprocess([prompt.encode("utf-8", "surrogateescape")])[name])[0])
    if not ids:
        raise InputError("the prompt is empty")
    rng = np.random.default_rng(seed)
    start = len(ids)
    for _ in range(max_new_tokens):
        context = np.asarray([ids[-window:]], dtype=np.dtype(spec.inputs[0].dtype))
        logits = np.asarray(fn({name: context})[logits_name], dtype=np.float64)[0, -1]
        if temperature == 0:
            token = int(logits.argmax())
        else:
            with np.errstate(over="ignore"):  # a tiny temperature: -inf, whose exp is 0, is meant
                p = np.exp((logits - logits.max()) / temperature)
            token = int(rng.choice(len(p), p=p / p.sum()))
        if token in spec.stop_tokens:  # the end of the sequence: not text
            break
        ids.append(token)
    return _continuation(spec, ids[:start], ids[start:])


def _continuation(spec: ModelSpec, prompt: list[int], new: list[int]) -> str:
    """The text `new` adds after `prompt`: the whole sequence decoded, less the prompt's
    decoding, as transformers' text streamers take it. Decoded alone, `new` lost what its
    first token shares with what precedes it: a SentencePiece (Metaspace) decoder strips
    the space its first piece begins with ("The import" + "statement"), and a byte-level
    model's character split at the boundary came out as replacement characters. Alone only
    where the prompt's decoding does not begin the whole's."""
    if not new:
        return ""
    head, whole = spec.detokenize(prompt), spec.detokenize(prompt + new)
    return whole[len(head):] if whole.startswith(head) else spec.detokenize(new)

"""`hf_model`: a `zoo.ModelSpec` for a Hugging Face transformers model.

    spec = zoo_hf.hf_model("bge-small.en", "/models/bge-small-en-v1.5")   # pooling from its folder
    zoo.register(spec)                                  # or register(spec) in a plugin's hook

The signature comes from the model's config: token ids, the attention mask (not for
causal language models: see `_input_names`), token types where the config has more than
one (the build checks that the forward takes each); the outputs from the task. Nothing
is fetched: the files come from a directory or the local cache (`zoo_hf.source`), the
weights from safetensors only, the config from config.json read as JSON (`zoo_hf.config`,
so describing and serving a model imports no PyTorch) or `transformers`' local-only loaders.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from functools import partial
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from zoo import AxisRange, ModelSpec, TensorSpec, Tolerance
from zoo.errors import ToleranceError, UnsupportedError, ZooError

from . import tasks, text
from .config import PlainConfig, plain, read
from .source import resolve

#: under `zoo.plugins`: the CLI prints its warnings as the registry's, "warning: ..." on stderr
log = logging.getLogger("zoo.plugins.hf")
#: (model, tokenizer file) pairs whose tokenizer was found larger than the model's vocabulary
_WARNED: set[tuple[str, str]] = set()

#: the longest sequence exported when neither the caller nor the model's folder says
#: (sentence-transformers' max_seq_length): BERT's 512, where attention's quadratic cost
#: and the engines' optimization profiles stay sensible; `max_length` raises it.
DEFAULT_MAX_LENGTH = 512
#: architecture sizes `get_model(name, **config)` may change (a random-init variant), as
#: transformers names them for every model (attribute aliases map GPT-2's n_embd ...).
ARCHITECTURE = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
#: the variant the test suite runs when the caller gives none: BERT-sized shapes shrunk.
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
#: models whose position ids count from pad_token_id + 1 (RoBERTa's embeddings), so
#: pad_token_id + 1 of max_position_embeddings are never a token's position.
PADDING_OFFSET_POSITIONS = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "roberta-prelayernorm",
                            "data2vec-text", "mpnet", "longformer", "ibert", "xmod", "luke", "esm")
#: fp32: ONNX Runtime, OpenVINO, torch-compile and torch-aoti differ from PyTorch by at most
#: 2.1e-7 on the models registered here (OpenVINO on MiniLM; tools/hf_models.py), at seq 1 and
#: the longest too; 1e-4 leaves room for other CPUs' kernels and for larger logits. bf16
#: (torch, CPU) measured up to 4e-3. fp16 (GPU only) is zoo_nlp's MiniLM bound, not measured here.
TOLERANCES = {"fp32": Tolerance(1e-4, 1e-4), "fp16": Tolerance(5e-3, 2e-2), "bf16": Tolerance(2e-2, 5e-2)}
#: the least cosine an embedding through an artifact may have with PyTorch fp32's, for every
#: text of `text.EXAMPLES` in one batch and each short query alone (`embedding_check`).
#: all-MiniLM-L6-v2 measured: bf16 0.9998, int8 0.996 through OpenVINO (int8 weights), 0.9978
#: through ONNX Runtime (activations per row and block of 32; one scale per tensor kept one-word
#: texts at 0.956, sentences at 0.99, which was refused).
MIN_COSINE = {"fp32": 0.999, "fp16": 0.999, "bf16": 0.999, "int8": 0.99}


def _build(*args: Any):
    from .module import build  # torch and the model's code: imported to build it, not to describe it

    return build(*args)


def _pretrained_state(*args: Any):
    from .module import pretrained_state

    return pretrained_state(*args)


def hf_model(name: str, source: Any, *, task: str = "feature-extraction", pooling: str | None = None,
             normalize: bool | None = None, max_length: int | None = None, config: Mapping[str, int] | None = None,
             tiny: Mapping[str, int] | None = None, revision: str = "main", description: str = "",
             tolerances: Mapping[str, Tolerance] | None = None, quantization: str | None = None) -> ModelSpec:
    """A spec for the transformers model at `source`.

    source: a directory with config.json and model.safetensors (and tokenizer.json for
      text inputs), a hub id already in the local cache ("org/name" at `revision`), or for a
      randomly initialized model without files a dict of config.json's fields ("model_type"
      and the rest) or a `transformers.PretrainedConfig`. Neither a directory nor a dict of
      a family in `zoo_hf.config.FAMILIES` imports transformers (nor PyTorch) until the model
      is built.
    task: "feature-extraction", "text-classification", "token-classification",
      "fill-mask" or "text-generation" (the Auto class each builds: `tasks.TASKS`).
    pooling, normalize: feature extraction only: "mean" over real tokens, "cls" (the
      first token) or "none" (every token's "last_hidden_state"), L2-normalized or not.
      By default what a sentence-transformers folder says (1_Pooling, Normalize), else
      mean pooling without normalization.
    max_length: the longest sequence in tokens (default: the folder's sentence-transformers
      max_seq_length, else 512), capped by the model's positions.
    config: architecture overrides (`ARCHITECTURE` keys): a random-init variant.
    tiny: the overrides the test suite runs (default `TINY` where the model has those
      sizes and is larger; {} keeps the model as it is).
    tolerances, quantization: per-precision bounds (default `TOLERANCES`); an "int8" entry
      needs a `quantization` method ("dynamic" for transformers).
    """
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2):
        raise ZooError(f"model {name}: max_length is the longest sequence in tokens, a whole number of at least 2 "
                       f"(the tokenizer's start and end tokens and one of text), got {max_length!r}")
    if quantization is not None and "int8" not in (tolerances or TOLERANCES):
        raise ZooError(f"model {name}: quantization={quantization!r} says how its int8 artifacts are made, and "
                       f"tolerances= has no int8 bound, so none would be: pass tolerances={{**zoo_hf.spec.TOLERANCES, "
                       f"'int8': zoo.Tolerance(atol, rtol)}} with the bound you measured")
    directory, base = _load_config(source, revision)
    tasks.check_task(base, task)
    if tasks.missing_pad_token(base, task):
        eos = getattr(base, "eos_token_id", None)
        eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
        raise ZooError(f"model {name}: a {base.model_type} sequence classifier scores each item's last token that is "
                       f"not padding, so transformers classifies a batch of more than one item only with a "
                       f"pad_token_id in the config, and this config has none: set pad_token_id in its config "
                       f"(config.json or the config object)" + (f", e.g. to its eos_token_id {eos}"
                                                                if isinstance(eos, int) else ""))
    saved = tasks.saved_head(base)
    if directory is not None and saved is not None and saved[1] != task and (name, "task") not in _WARNED:
        _WARNED.add((name, "task"))  # once, not per variant of the spec
        log.warning("model %s: its checkpoint was saved as %s (%s) and is built here for %s, %s: pass task=%r for "
                    "the model it was saved as", name, saved[0], saved[1], task,
                    "without its trained head" if task == "feature-extraction" else "its trained head in another's "
                    "place", saved[1])
    folder = _sentence_transformers(directory) if directory is not None else {}
    if task == "feature-extraction":
        if pooling is None and folder.get("other_modules"):
            raise UnsupportedError(f"model {name}: its sentence-transformers modules include "
                                   f"{', '.join(folder['other_modules'])}, which zoo_hf does not export, so its "
                                   f"embeddings would not be the folder's; pass pooling= (and normalize=) to export "
                                   f"the transformer's own pooled output")
        if pooling is None and folder.get("pooling", "mean") not in tasks.POOLINGS:
            raise UnsupportedError(f"model {name}: its sentence-transformers folder pools by {folder['pooling']} "
                                   f"({folder['pooling_source']}), which zoo_hf does not build, so its embeddings "
                                   f"would not be the folder's; pass pooling= (mean or cls) and normalize= to export "
                                   f"the transformer's own pooled output")
        pooling = pooling or folder.get("pooling", "mean")
        normalize = folder.get("normalize", False) if normalize is None else normalize
        if pooling not in tasks.POOLINGS:
            raise UnsupportedError(f"model {name}: pooling {pooling!r} is not one zoo_hf builds; choose one of "
                                   f"{', '.join(tasks.POOLINGS)}")
        if pooling == "none" and normalize:
            raise ZooError(f"model {name}: normalize=True L2-normalizes a pooled embedding, and pooling='none' "
                           f"pools none (its output is every token's last_hidden_state): choose a pooling "
                           f"({', '.join(p for p in tasks.POOLINGS if p != 'none')}) or leave normalize off")
    elif pooling is not None or normalize:
        raise ZooError(f"model {name}: pooling and normalize apply to feature-extraction, not {task}")
    hf_config = _configured(base, config or {})
    arch = {k: getattr(hf_config, k) for k in ARCHITECTURE if isinstance(getattr(hf_config, k, None), int)}
    changed = {k for k in arch if getattr(base, k) != arch[k]}
    real = directory is not None and not changed
    names = _input_names(hf_config, task)
    seq_max = _longest(hf_config, max_length or folder.get("max_length") or DEFAULT_MAX_LENGTH)
    if max_length is not None and seq_max < max_length and (name, "max_length") not in _WARNED:
        _WARNED.add((name, "max_length"))  # once, not per variant of the spec
        log.warning("model %s: max_length %d is more than the %d positions the model has; its sequences go up to %d "
                    "tokens", name, max_length, seq_max, seq_max)
    output, postprocess = _outputs(task, pooling, hf_config)
    pad_id = _pad_id(hf_config)
    tokenizer = directory / "tokenizer.json" if directory is not None else None
    codec = (text.TextCodec(tokenizer, names, seq_max, pad_id, keep_last=task == "text-generation",
                            vocab_size=hf_config.vocab_size, pairs=task == "text-classification")
             if tokenizer is not None and tokenizer.is_file() else None)
    if codec is not None:
        _warn_larger_tokenizer(name, codec, hf_config.vocab_size)
    elif tokenizer is not None and (name, str(tokenizer)) not in _WARNED:  # once, not per variant of the spec
        _WARNED.add((name, str(tokenizer)))
        log.warning("model %s: %s has no tokenizer.json, so the model takes token ids (%s), not text: copy the "
                    "tokenizer.json of the model's tokenizer there (transformers' save_pretrained of a fast "
                    "tokenizer writes it) to give it texts", name, directory, ", ".join(names))
    sample = codec.sample if codec else partial(text.random_sample, names=names, vocab_size=hf_config.vocab_size,
                                                type_vocab_size=getattr(hf_config, "type_vocab_size", 0),
                                                length=min(16, seq_max), pad_id=pad_id)
    if codec and task == "fill-mask":
        postprocess = codec.top_tokens
    embedding = output.name == "sentence_embedding"
    options = {"task": task, "pooling": pooling, "normalize": normalize, "max_length": max_length, "tiny": tiny,
               "revision": revision, "description": description, "tolerances": tolerances,
               "quantization": quantization}
    tiny = {k: v for k, v in TINY.items() if k in arch and arch[k] > v} if tiny is None else dict(tiny)
    return ModelSpec(
        name=name,
        domain="nlp",
        task=task,
        description=description or _describe(hf_config, task, pooling, normalize, directory, source, real),
        inputs=_inputs(hf_config, names),
        outputs=(output,),
        # batch: 1 to 32 covers online and batched serving; seq: any length the model has
        # positions for up to `max_length`, tuned at 128 tokens (a sentence or two), or half
        # the longest below 256: a typical length at the longest leaves nothing to pad, and
        # the server then batches only requests of one length (zoo.padding)
        axes={"batch": AxisRange(1, 8, 32), "seq": AxisRange(1, min(128, max(1, seq_max // 2)), seq_max)},
        build=partial(_build, hf_config, task, names, pooling or "none", bool(normalize)),
        sample=sample,
        config=arch,
        tiny_config=tiny,
        variant=partial(_variant, name, source, options),
        tolerances=dict(tolerances or TOLERANCES),
        quantization=quantization,
        pretrained=partial(_pretrained_state, str(directory), hf_config, task) if real else None,
        domain_check=partial(embedding_check, name, codec.examples if codec else partial(_seeded_examples, sample))
        if embedding else None,
        raw_kind="text" if codec else None,
        preprocess=codec.preprocess if codec else None,
        postprocess=postprocess if codec else None,
        detokenize=codec.detokenize if codec and task == "text-generation" else None,
        stop_tokens=_stop_tokens(hf_config, directory) if task == "text-generation" else (),
    )


def _stop_tokens(config: Any, directory: Path | None) -> tuple[int, ...]:
    """The ids that end a generation, as transformers' `generate` takes them: the config's
    `eos_token_id` and its generation_config.json's (an id or a list of ids)."""
    found = [getattr(config, "eos_token_id", None)]
    generation = None if directory is None else Path(directory) / "generation_config.json"
    if generation is not None and generation.is_file():
        try:
            found.append(json.loads(generation.read_text(encoding="utf-8")).get("eos_token_id"))
        except (OSError, ValueError, AttributeError):  # unreadable: the config's alone, as transformers falls back
            pass
    ids = [i for v in found for i in (v if isinstance(v, (list, tuple)) else [v])]
    return tuple(sorted({i for i in ids if isinstance(i, int) and not isinstance(i, bool) and i >= 0}))


def _warn_larger_tokenizer(name: str, codec: text.TextCodec, vocab_size: int) -> None:
    """A tokenizer that knows more tokens than the model has embeddings (tokens added to it,
    the embeddings not resized) is logged once: texts with those tokens are refused."""
    try:
        size = codec.size()  # loads the tokenizer, which the codec then keeps
    except Exception as exc:  # a broken tokenizer.json: said when a text is first tokenized
        log.debug("model %s: could not read %s: %s", name, codec.path, exc)
        return
    if size > vocab_size and (name, str(codec.path)) not in _WARNED:  # once, not per variant of the spec
        _WARNED.add((name, str(codec.path)))
        log.warning("model %s: its tokenizer has %d tokens (ids up to %d) but the model's vocabulary only %d "
                    "(tokens added, embeddings not resized?): texts with the extra tokens are refused",
                    name, size, size - 1, vocab_size)


def _variant(name: str, source: Any, options: Mapping[str, Any], **config: int) -> ModelSpec:
    """`hf_model` for another architecture config: what `ModelSpec.configure` calls."""
    return hf_model(name, source, config=config, **options)


def _seeded_examples(sample: Callable[..., dict[str, np.ndarray]]) -> list[tuple[None, dict[str, np.ndarray]]]:
    """The embedding check's examples without a tokenizer: one seeded batch of 16."""
    return [(None, sample(16, np.random.default_rng(0)))]


def _load_config(source: Any, revision: str) -> tuple[Path | None, Any]:
    """The model's directory (None for a config) and its config: a `PlainConfig` where
    config.json (or the dict of its fields) can be read without transformers, which imports
    PyTorch (`zoo_hf.config`), else transformers' own."""
    if isinstance(source, Mapping):
        described = plain(source)
        if described is not None:
            return None, described
        model_type = source.get("model_type")
        if not isinstance(model_type, str):
            raise ZooError("the config has no model_type, which names the model's family (bert, gpt2, ...), as "
                           "config.json's does")
        fields = {k: v for k, v in source.items() if k != "model_type"}
        return None, _transformers_config(lambda auto: auto.for_model(model_type, **fields), "the config",
                                          model_type)
    if not isinstance(source, (str, os.PathLike)):
        from transformers import PretrainedConfig

        if not isinstance(source, PretrainedConfig):
            raise ZooError(f"source {source!r} is not a directory, a hub id, a dict of config.json's fields or a "
                           f"transformers config")
        return None, source
    directory = resolve(source, revision)
    described = read(directory)
    if described is not None:
        return directory, described
    return directory, _transformers_config(
        lambda auto: auto.from_pretrained(directory, local_files_only=True, trust_remote_code=False),
        f"{directory}/config.json")


def _transformers_config(load: Callable[[Any], Any], what: str, model_type: str | None = None) -> Any:
    import transformers

    try:
        return load(transformers.AutoConfig)
    except (ValueError, KeyError, OSError) as exc:  # an unknown model_type, custom code, a broken file
        # transformers' own words for an unknown type list every type it knows, in one line
        reason = (f"its model type {model_type!r} is not one transformers {transformers.__version__} knows (a newer "
                  f"one may)" if model_type is not None and model_type not in transformers.CONFIG_MAPPING
                  else str(exc).splitlines()[0])
        raise UnsupportedError(f"{what} is not a config this transformers can build without running the model's "
                               f"own code: {reason}") from None


def _configured(base: Any, overrides: Mapping[str, int]) -> Any:
    """A copy of `base` with architecture overrides (through transformers' attribute aliases)."""
    unknown = sorted(set(overrides) - set(ARCHITECTURE))
    if unknown:
        raise ZooError(f"config {unknown} cannot be changed here; architecture keys: {', '.join(ARCHITECTURE)}")
    if isinstance(base, PlainConfig):  # its `transformers()` turns the cache off
        return base.configured(overrides)
    config = copy.deepcopy(base)
    for key, value in overrides.items():
        setattr(config, key, value)
    # one forward pass, nothing to reuse: a key/value cache is only state for exporters to trip on
    config.use_cache = False
    return config


def _input_names(config: Any, task: str) -> tuple[str, ...]:
    """The inputs, a prefix of `tasks.INPUTS`: token ids, the attention mask, and token
    types where the config has more than one (BERT's sentence pairs; `module.build`
    checks that the forward takes each).

    Causal language models take token ids alone: they are right-padded, which cannot
    change the logits at an item's own positions, and `zoo generate` feeds one input."""
    if task == "text-generation":
        return ("input_ids",)
    return tasks.INPUTS if getattr(config, "type_vocab_size", 0) > 1 else tasks.INPUTS[:2]


def _inputs(config: Any, names: tuple[str, ...]) -> tuple[TensorSpec, ...]:
    highest = {"input_ids": config.vocab_size - 1, "attention_mask": 1,
               "token_type_ids": getattr(config, "type_vocab_size", 1) - 1}
    return tuple(TensorSpec(n, "int64", ("batch", "seq"), value_range=(0, highest[n])) for n in names)


def _longest(config: Any, max_length: int) -> int:
    """The longest sequence: `max_length`, within the positions the model has."""
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None:  # relative or rotary positions: no table to run past
        return max_length
    if config.model_type in PADDING_OFFSET_POSITIONS:
        positions -= (config.pad_token_id or 0) + 1
    return max(1, min(positions, max_length))


def _pad_id(config: Any) -> int:
    for key in ("pad_token_id", "eos_token_id"):
        value = getattr(config, key, None)
        value = value[0] if isinstance(value, (list, tuple)) and value else value
        if isinstance(value, int):
            return value
    return 0


def _outputs(task: str, pooling: str | None, config: Any) -> tuple[TensorSpec, Callable | None]:
    """The task's output and its per-item JSON."""
    labels = [str(config.id2label.get(i, f"LABEL_{i}")) for i in range(config.num_labels)]
    if task == "feature-extraction":
        if pooling == "none":
            return TensorSpec("last_hidden_state", "float32", ("batch", "seq", config.hidden_size)), text.hidden_states
        return TensorSpec("sentence_embedding", "float32", ("batch", config.hidden_size)), text.embeddings
    if task == "text-classification":
        function = text.score_function(config.problem_type, config.num_labels)
        return (TensorSpec("logits", "float32", ("batch", config.num_labels), labels=tuple(labels)),
                partial(text.classifications, labels=labels, function=function))
    if task == "token-classification":
        return (TensorSpec("logits", "float32", ("batch", "seq", config.num_labels)),
                partial(text.token_labels, labels=labels))
    return TensorSpec("logits", "float32", ("batch", "seq", config.vocab_size)), None  # fill-mask, text-generation


#: sentence-transformers' pooling modes (1_Pooling/config.json's keys), as `_sentence_transformers`
#: names them: "mean" and "cls" are `tasks.POOLINGS`, the rest are refused by name
POOLING_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
                 "pooling_mode_max_tokens": "max",
                 "pooling_mode_mean_sqrt_len_tokens": "the mean scaled by the square root of the length",
                 "pooling_mode_weightedmean_tokens": "a position-weighted mean",
                 "pooling_mode_lasttoken": "the last token"}


def _sentence_transformers(directory: Path) -> dict[str, Any]:
    """What a sentence-transformers folder says: its pooling ("mean", "cls", or the modes
    it names that zoo_hf does not build, in words: `POOLING_MODES`) and the file and keys
    that say so, normalization, length, and any module after the transformer that zoo_hf
    would leave out (a Dense projection)."""
    found: dict[str, Any] = {}
    modules = _json(directory / "modules.json") or []
    for m in modules:
        kind = m.get("type", "").rsplit(".", 1)[-1]
        if kind == "Pooling":
            path = Path(m.get("path", "")) / "config.json"
            config = _json(directory / path) or {}
            keys = [k for k, v in config.items() if k.startswith("pooling_mode_") and v]
            modes = [POOLING_MODES.get(k, k.removeprefix("pooling_mode_")) for k in keys]
            found["pooling"] = " and ".join(modes) or "no mode"
            found["pooling_source"] = f"{path.as_posix()}: {', '.join(keys) or 'no pooling_mode_ set'}"
        elif kind not in ("Transformer", "Normalize"):
            found.setdefault("other_modules", []).append(kind)
    if modules:
        found["normalize"] = any(m.get("type", "").endswith(".Normalize") for m in modules)
    st = _json(directory / "sentence_bert_config.json")
    if st and isinstance(st.get("max_seq_length"), int):
        found["max_length"] = st["max_seq_length"]
    return found


def _json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _describe(config: Any, task: str, pooling: str | None, normalize: bool | None, directory: Path | None,
              source: Any, real: bool) -> str:
    arch = f"{config.model_type} ({config.num_hidden_layers} layers x {config.hidden_size})"
    what = {"feature-extraction": f"{pooling} pooling{', L2-normalized' if normalize else ''}" if pooling != "none"
            else "token embeddings"}.get(task, task)
    weights = f"weights from {source if isinstance(source, str) else directory}" if real else "random init"
    return f"transformers {arch}, {what}; {weights}"


def embedding_check(name: str, examples: Callable[[], list[tuple[tuple[str, ...] | None, Mapping[str, np.ndarray]]]],
                    reference, runner, precision: str = "fp32") -> dict[str, Any]:
    """Embeddings must point where PyTorch's do: every example's cosine with the
    reference reaches `MIN_COSINE` at the artifact's precision (what retrieval needs).

    `examples`: batches of inputs, each with the texts it holds (`TextCodec.examples`), or
    None for token ids; the worst embedding is named in the refusal."""
    min_cosine = MIN_COSINE.get(precision, MIN_COSINE["fp32"])
    worst, where, count = np.inf, "", 0
    for texts, inputs in examples():
        want = np.asarray(reference(inputs)["sentence_embedding"], dtype=np.float64)
        got = np.asarray(runner(inputs)["sentence_embedding"], dtype=np.float64)
        cosine = np.sum(want * got, axis=1) / (np.linalg.norm(want, axis=1) * np.linalg.norm(got, axis=1))
        cosine = np.where(np.isnan(cosine), -np.inf, cosine)  # a NaN embedding is the worst there is
        count += len(cosine)
        i = int(cosine.argmin())
        if cosine[i] < worst:
            worst = float(cosine[i])
            where = (f"example {i + 1} of {len(cosine)}" if texts is None else
                     f"{texts[i]!r} ({'alone' if len(texts) == 1 else f'in a batch of {len(texts)}'})")
    if not worst >= min_cosine:
        raise ToleranceError(f"{name} [{precision}]: the embedding of {where} through the artifact has cosine "
                             f"{worst:.6f} with PyTorch's, below {min_cosine}")
    return {"examples": count, "min_cosine": worst, "threshold": min_cosine, "worst": where}

"""What a zoo_hf spec can ask of transformers, known without importing PyTorch: the tasks
and the Auto class each builds, the poolings, the inputs passed on. The spec (spec.py)
is made from these and a config; the module (module.py, and torch with it) is imported
only when a model is built."""

from __future__ import annotations

from typing import Any

from zoo.errors import UnsupportedError

from .config import PlainConfig

#: task -> the transformers Auto class that builds its model, and that class's public
#: mapping from config class to model class.
TASKS = {
    "feature-extraction": ("AutoModel", "MODEL_MAPPING"),
    "text-classification": ("AutoModelForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING"),
    "token-classification": ("AutoModelForTokenClassification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING"),
    "fill-mask": ("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING"),
    "text-generation": ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING"),
}
POOLINGS = ("mean", "cls", "none")
#: the only inputs passed on, in this order (BERT's); the spec lists a prefix of them.
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


#: encoder-only classes of encoder-decoder families, built for feature-extraction where a
#: checkpoint's config names one in `architectures` (what `save_pretrained` of such a model
#: writes): the Auto classes would build the whole encoder-decoder model for its config.
ENCODER_ONLY = ("T5EncoderModel", "MT5EncoderModel", "UMT5EncoderModel")
#: families whose causal-LM classes are causal only with `is_decoder=True` in the config
#: (bidirectional encoders otherwise), besides those with a masked-LM class
#: (`MODEL_FOR_MASKED_LM_MAPPING`: BERT, RoBERTa, ELECTRA ... every one of them so).
DECODER_BY_CONFIG = ("bert-generation",)


#: model types whose sequence classifier scores each item's last token that is not padding
#: (found by comparing input_ids with pad_token_id), so that transformers refuses a batch of
#: more than one without a pad_token_id (transformers 5.x; tests/test_hf_classifiers.py
#: checks the installed one)
PAD_TO_CLASSIFY = ("arcee", "axk1", "axk2", "biogpt", "bloom", "cohere_compass_text", "ctrl", "deepseek_v2",
                   "deepseek_v3", "diffllama", "doge", "exaone4", "falcon", "gemma", "gemma2", "gemma3",
                   "gemma3_text", "glm", "glm4", "gpt-sw3", "gpt2", "gpt_bigcode", "gpt_neo", "gpt_neox", "gpt_oss",
                   "gptj", "helium", "hunyuan_v1_dense", "hunyuan_v1_moe", "jamba", "jetmoe", "llama", "minicpm3",
                   "minimax", "ministral", "ministral3", "mistral", "mistral4", "mixtral", "modernbert-decoder",
                   "mpt", "nemotron", "olmo", "olmo2", "olmo3", "openai-gpt", "opt", "persimmon", "phi", "phi3",
                   "phimoe", "qwen2", "qwen2_moe", "qwen3", "qwen3_5", "qwen3_5_text", "qwen3_moe", "qwen3_next",
                   "seed_oss", "smollm3", "stablelm", "starcoder2", "t5gemma", "zamba", "zamba2")


#: the heads whose trained weights mean one task (labels): a checkpoint saved with one and
#: registered for another task is warned about. A masked or causal LM checkpoint is not:
#: embeddings from one (feature-extraction) are an ordinary use.
TRAINED_HEADS = {"ForSequenceClassification": "text-classification", "ForTokenClassification": "token-classification"}


def saved_head(config: Any) -> tuple[str, str] | None:
    """(class, task) of the task head the checkpoint's `architectures` name, if one of
    TRAINED_HEADS."""
    for name in getattr(config, "architectures", None) or ():
        for suffix, task in TRAINED_HEADS.items():
            if isinstance(name, str) and name.endswith(suffix):
                return name, task
    return None


def model_class(config: Any, task: str) -> str:
    """The name of the transformers class that builds `task` for `config`: the task's Auto
    class, or for feature-extraction the encoder-only class a checkpoint names."""
    if task == "feature-extraction":
        for name in getattr(config, "architectures", None) or ():
            if name in ENCODER_ONLY:
                return name
    return TASKS[task][0]


def check_task(config: Any, task: str) -> None:
    """That transformers has a `task` model for `config` that zoo_hf can export (without
    importing its code): not an encoder-decoder model, and a causal one for
    text-generation. A `PlainConfig`'s family says it without importing transformers."""
    if task not in TASKS:
        raise UnsupportedError(f"task {task!r} is not one zoo_hf builds; tasks: {', '.join(TASKS)}")
    if not isinstance(getattr(config, "vocab_size", None), int):  # ViT, CLIP, wav2vec2 ... : no token ids to take
        raise UnsupportedError(f"{config.model_type!r} is not a text model (its config has no vocab_size): zoo_hf "
                               f"exports models that take token ids; vision, audio and multimodal ones are not "
                               f"supported (docs/hf.md, Not supported)")
    auto, mapping = TASKS[task]
    name = model_class(config, task)
    if name != auto:  # an encoder-only class the checkpoint names
        import transformers

        if not hasattr(transformers, name):
            raise UnsupportedError(f"this transformers has no {name}, which the config's architectures name")
        return
    # a T5EncoderModel's own config says is_encoder_decoder False, yet the Auto classes map
    # its type to the whole T5Model: the config class's default says what the family is
    # (False for every PlainConfig family)
    if getattr(config, "is_encoder_decoder", False) or getattr(type(config), "is_encoder_decoder", False) is True:
        own = [e for e in ENCODER_ONLY if e.lower() == f"{config.model_type.replace('-', '')}encodermodel"]
        encoder = f" (its encoder saved as {own[0]} is, for feature-extraction)" if own else ""
        raise UnsupportedError(f"{config.model_type!r} is an encoder-decoder model (two input streams, generation "
                               f"with a cache), which zoo_hf does not export{encoder}: see docs/hf.md, Not supported")
    if not _has_model(config, task):
        raise UnsupportedError(f"transformers has no {task} model ({auto}) for model type {config.model_type!r}")
    if task == "text-generation":
        _check_causal(config)


def _has_model(config: Any, task: str) -> bool:
    if isinstance(config, PlainConfig):
        return task in config.family.tasks
    import transformers

    return type(config) in getattr(transformers, TASKS[task][1])


def _check_causal(config: Any) -> None:
    """A text-generation model must be causal: right padding may then not change the logits
    at a prompt's own positions (docs/hf.md). GPT-2-like families are causal by nature;
    encoder families' causal-LM classes (BertLMHeadModel ...) attend both ways unless the
    config says `is_decoder=True`, and XLM has its own `causal` switch."""
    causal = getattr(config, "causal", None)
    if isinstance(causal, bool) and config.model_type == "xlm":
        if not causal:
            raise UnsupportedError("text-generation needs a causal model, and this xlm config has causal=False "
                                   "(bidirectional): set causal=True in its config")
        return
    encoder = _has_model(config, "fill-mask") or config.model_type in DECODER_BY_CONFIG
    if encoder and not getattr(config, "is_decoder", False):
        raise UnsupportedError(f"text-generation needs a causal model, and a {config.model_type!r} model is a "
                               f"bidirectional encoder unless its config says is_decoder=True: set is_decoder=True "
                               f"(config.json or the config object) for a {config.model_type} decoder")


def missing_pad_token(config: Any, task: str) -> bool:
    """Whether `task` is a sequence classifier of a `PAD_TO_CLASSIFY` type whose config has
    no pad_token_id (where transformers looks for it: the text config of a multimodal one)."""
    if task != "text-classification" or config.model_type not in PAD_TO_CLASSIFY:
        return False
    text_config = config.get_text_config() if hasattr(type(config), "get_text_config") else config
    return getattr(text_config, "pad_token_id", None) is None

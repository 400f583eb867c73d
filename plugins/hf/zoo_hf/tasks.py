"""What a zoo_hf spec can ask of transformers, known without importing PyTorch: the tasks
and the Auto class each builds, the poolings, the inputs passed on. The spec (spec.py)
is made from these and a config; the module (module.py, and torch with it) is imported
only when a model is built."""

from __future__ import annotations

from typing import Any

from zoo.errors import UnsupportedError

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


def check_task(config: Any, task: str) -> None:
    """That transformers has a `task` model for `config` (without importing its code)."""
    import transformers

    if task not in TASKS:
        raise UnsupportedError(f"task {task!r} is not one zoo_hf builds; tasks: {', '.join(TASKS)}")
    auto, mapping = TASKS[task]
    if type(config) not in getattr(transformers, mapping):
        raise UnsupportedError(f"transformers has no {task} model ({auto}) for model type {config.model_type!r}")

"""Text in and out: a model directory's `tokenizer.json` run by Hugging Face `tokenizers`
(the same Rust code `transformers`' fast tokenizers run), sample inputs, and one JSON
result per item for each task.

Lists of texts are padded to their longest item and truncated at the spec's longest
sequence; the attention mask keeps padding out of every real token's result. Models
without a mask input (causal language models) are right-padded, which cannot change
the logits at an item's own positions, and keep a long prompt's last tokens.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from zoo.errors import InputError

#: realistic inputs for `sample` and the embedding check: 3 to ~70 tokens, punctuation,
#: digits, accents, emoji, a question, a sentence past most models' common lengths.
SENTENCES = (
    "A man is playing a guitar.",
    "How do I reset my password?",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The stock market fell sharply on Tuesday after the central bank raised interest rates by half a point.",
    "Cats sleep.",
    "Is it going to rain in Paris tomorrow afternoon?",
    "Zürich's café served crème brûlée, naïvely délicieux.",
    "In 2023, revenue grew by 17.5% to $4.2 billion.",
    "I love pizza 🍕 and sushi 🍣!",
    "Tokenizers split rare words like 'electroencephalography' into pieces.",
    "The committee, after weeks of deliberation and several heated public hearings, finally approved the revised "
    "budget, which allocates more money to schools, public transport and the maintenance of bridges.",
    "Please turn off the lights when you leave the room.",
)
#: short texts, as search queries and chat turns often are: single words and the empty
#: string embed least faithfully at int8 (ONNX Runtime's dynamic int8 all-MiniLM-L6-v2:
#: "OK" and "thanks" 0.96, where every sentence above keeps 0.99)
QUERIES = ("", "OK", "yes", "no", "thanks", "hello", "why?", "Paris", "reset password", "cheap flights to Rome")
#: what the embedding check compares (`TextCodec.examples`)
EXAMPLES = SENTENCES + QUERIES


def decode_items(items: Sequence[bytes]) -> list[str]:
    """Each item as text; an item that is not UTF-8 is an InputError naming it."""
    if not items:
        raise InputError("give at least one text")
    texts = []
    for i, item in enumerate(items):
        try:
            texts.append(bytes(item).decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise InputError(f"item {i + 1} is not valid UTF-8 text: byte {exc.start} "
                             f"({bytes(item)[exc.start:exc.start + 1]!r}) {exc.reason}") from None
    return texts


#: an item that is a pair of texts, as transformers' text-classification pipeline takes one:
#: a cross-encoder's query and passage, an NLI premise and hypothesis
PAIR = ("text", "text_pair")


def paired(text: str, i: int) -> str | tuple[str, str]:
    """`text`, or the pair it asks for: a JSON object with exactly "text" and "text_pair"."""
    if not text.startswith("{"):
        return text
    try:
        item = json.loads(text)
    except ValueError:
        return text
    if not isinstance(item, dict) or set(item) != set(PAIR):
        return text
    if not all(isinstance(item[k], str) for k in PAIR):
        raise InputError(f"item {i + 1} is a pair of texts: {{\"text\": ..., \"text_pair\": ...}} takes two "
                         f"strings, got {', '.join(type(item[k]).__name__ for k in PAIR)}")
    return item["text"], item["text_pair"]


class TextCodec:
    """A directory's tokenizer.json for a spec's inputs (`names`), truncating at
    `max_length` tokens: from the end for classifiers and encoders, from the start for
    causal language models (`keep_last`), whose next token follows the prompt's end.

    `vocab_size`: the model's vocabulary (input_ids' value range is 0 to vocab_size - 1);
    a text with a token beyond it (a tokenizer with added tokens the model's embeddings
    were not resized for) is an InputError naming the token, as an artifact refuses it.
    `pairs`: an item `{"text": ..., "text_pair": ...}` is a pair of texts (a classifier's,
    as transformers' text-classification pipeline takes one); elsewhere it is the text it
    is: an embedding model embedded such a JSON record as a pair, which sentence-transformers
    has no notion of, and the two MiniLM models of the zoo disagreed on it (cosine 0.667)."""

    def __init__(self, path: Path, names: Sequence[str], max_length: int, pad_id: int | None, keep_last: bool,
                 vocab_size: int | None = None, pairs: bool = False):
        self.path, self.names, self.max_length = Path(path), tuple(names), max_length
        self.pad_id, self.keep_last, self.vocab_size, self.pairs = pad_id, keep_last, vocab_size, pairs

    def size(self) -> int:
        """The tokenizer's vocabulary: its highest token id (added tokens included) plus one."""
        return max(self.tokenizer.get_vocab(with_added_tokens=True).values(), default=-1) + 1

    def __getstate__(self) -> dict[str, Any]:  # a spec travels to benchmark workers; the tokenizer reloads there
        return {k: v for k, v in self.__dict__.items() if k != "tokenizer"}

    @cached_property
    def tokenizer(self):
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(self.path))
        # a tokenizer.json may carry the padding and truncation of its upload (all-MiniLM-L6-v2:
        # fixed 128); the spec's longest sequence and padding to the longest item replace them
        padding = tok.padding or {}
        pad_id = padding.get("pad_id", self.pad_id if self.pad_id is not None else 0)
        tok.enable_padding(pad_id=pad_id, pad_token=tok.id_to_token(pad_id) or padding.get("pad_token", "[PAD]"))
        tok.enable_truncation(max_length=self.max_length, direction="left" if self.keep_last else "right")
        return tok

    def encode(self, texts: Sequence[str | tuple[str, str]]) -> dict[str, np.ndarray]:
        """Texts, or pairs of texts (the second as the second segment: its own token type
        where the model has token types, the tokenizer's separators between them)."""
        encodings = self.tokenizer.encode_batch(list(texts))
        for i, e in enumerate(encodings):
            if not sum(e.attention_mask):
                raise InputError(f"item {i + 1} has no tokens: give at least one character of text")
            if self.vocab_size is not None:
                beyond = next((j for j, t in enumerate(e.ids) if t >= self.vocab_size), None)
                if beyond is not None:
                    raise InputError(f"item {i + 1}: token {e.tokens[beyond]!r} has id {e.ids[beyond]}, beyond the "
                                     f"model's vocabulary (ids 0 to {self.vocab_size - 1}): the tokenizer has tokens "
                                     f"(added ones) the model's embeddings were not resized for")
        fields = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}
        return {name: np.array([getattr(e, fields[name]) for e in encodings], dtype=np.int64) for name in self.names}

    def preprocess(self, items: Sequence[bytes]) -> dict[str, np.ndarray]:
        """UTF-8 texts -> the spec's int64 inputs, padded to the longest item. An item
        `{"text": ..., "text_pair": ...}` is a pair of texts where the codec takes `pairs`."""
        texts = decode_items(items)
        return self.encode([paired(t, i) for i, t in enumerate(texts)] if self.pairs else texts)

    def sample(self, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Real sentences, drawn with replacement, tokenized as `preprocess` does."""
        return self.encode([SENTENCES[i] for i in rng.integers(0, len(SENTENCES), size=batch)])

    def examples(self) -> list[tuple[tuple[str, ...], dict[str, np.ndarray]]]:
        """What the embedding check compares: (texts, inputs) for every text of `EXAMPLES`
        in one batch, padded to the longest, and for each short query alone, as a search
        box sends one. Dynamic int8 scales a tensor's activations by its range over the
        batch, so a text's embedding depends on the texts it is batched with."""
        return [(EXAMPLES, self.encode(EXAMPLES))] + [((t,), self.encode([t])) for t in QUERIES]

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids])

    def top_tokens(self, outputs: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
        """Fill-mask: the most likely token at every position (a [MASK]'s fill among them)."""
        best = np.asarray(outputs["logits"]).argmax(axis=-1)
        return [{"tokens": [self.tokenizer.id_to_token(int(i)) for i in row]} for row in best]


def random_sample(batch: int, rng: np.random.Generator, *, names: Sequence[str], vocab_size: int,
                  type_vocab_size: int, length: int, pad_id: int) -> dict[str, np.ndarray]:
    """Token ids drawn within the vocabulary for models without a tokenizer: each row
    `length`/2 to `length` tokens long, right-padded with `pad_id` to the longest and
    masked, as `preprocess` pads texts; with two token types, the second half of each row
    is the second segment. Causal models (no mask input) get full rows of one length."""
    lengths = rng.integers(max(1, length // 2), length + 1, size=batch)
    width = int(lengths.max())
    if "attention_mask" not in names:
        lengths[:] = width
    positions = np.arange(width)[None, :]
    real = positions < lengths[:, None]
    inputs = {"input_ids": np.where(real, rng.integers(0, vocab_size, size=(batch, width)), pad_id),
              "attention_mask": real,
              "token_type_ids": real & (positions >= (lengths[:, None] + 1) // 2) if type_vocab_size > 1
              else np.zeros_like(real)}
    return {name: inputs[name].astype(np.int64) for name in names}


def embeddings(outputs: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    return [{"embedding": [float(v) for v in row]} for row in np.asarray(outputs["sentence_embedding"])]


def hidden_states(outputs: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    return [{"last_hidden_state": row.tolist()} for row in np.asarray(outputs["last_hidden_state"], dtype=np.float64)]


def score_function(problem_type: str | None, num_labels: int) -> str:
    """What transformers' text-classification pipeline applies to the logits by default
    (`function_to_apply`): nothing to a regression's values, independent sigmoids to a
    multi-label classifier's and to a single logit's (a cross-encoder's relevance, a
    binary classifier), a softmax over several labels."""
    if problem_type == "regression":
        return "none"
    if problem_type == "multi_label_classification" or num_labels == 1:
        return "sigmoid"
    if problem_type == "single_label_classification" or num_labels > 1:
        return "softmax"
    return "none"  # no labels at all: the pipeline applies none either


def classifications(outputs: Mapping[str, np.ndarray], labels: Sequence[str],
                    function: str = "softmax") -> list[dict[str, Any]]:
    """The label of the highest score, that score and every label's, the scores being the
    logits through `function` (`score_function`: probabilities, or a regression's values)."""
    logits = np.asarray(outputs["logits"], dtype=np.float64)
    if function == "sigmoid":
        scores = 1 / (1 + np.exp(-logits))
    elif function == "softmax":
        scores = np.exp(logits - logits.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
    else:
        scores = logits
    return [{"label": labels[int(p.argmax())], "score": float(p.max()),
             "scores": {label: float(v) for label, v in zip(labels, p)}} for p in scores]


def token_labels(outputs: Mapping[str, np.ndarray], labels: Sequence[str]) -> list[dict[str, Any]]:
    """The most likely label of every position, padding included (the outputs do not say
    where an item ends; a list of one text has none)."""
    best = np.asarray(outputs["logits"]).argmax(axis=-1)
    return [{"labels": [labels[int(i)] for i in row]} for row in best]

"""A domain of the user's own (DNA sequences, text kind "dna") whose preprocess and
postprocess slip as their authors' do, on cue: an item spelling a slip's name makes the
plugin's code commit it for that request; any other item is a sequence of A, C, G and T."""

import numpy as np
import torch

import zoo
from zoo.errors import InputError

BASES = "ACGT"


class GcContent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Linear(4, 2)

    def forward(self, onehot: torch.Tensor) -> dict[str, torch.Tensor]:
        mean = onehot.mean(dim=1)
        return {"logits": self.head(mean), "gc": mean[:, 1:3].sum(dim=1, keepdim=True)}


def encode(sequences: list[str]) -> dict[str, np.ndarray]:
    onehot = np.zeros((len(sequences), 8, 4), np.float32)
    for i, sequence in enumerate(sequences):
        for j, base in enumerate(sequence[:8]):
            onehot[i, j, BASES.index(base)] = 1
    return {"onehot": onehot}


def preprocess(items: list[bytes]) -> dict[str, np.ndarray]:
    cue = items[0].decode()
    if cue == "rows":  # one row per item, forgotten: three rows for the batch
        return encode(["ACGT"] * 3)
    if cue == "missing":
        return {}
    if cue == "nothing":
        return None
    if cue == "raises":
        raise ValueError("a base table that was never filled")
    sequences = [item.decode() for item in items]
    for k, sequence in enumerate(sequences, 1):
        if not sequence or set(sequence) - set(BASES):
            raise InputError(f"dna item {k} is not a sequence of A, C, G and T")
    return encode(sequences)


CUE = {"last": ""}


def preprocess_noting_the_cue(items: list[bytes]) -> dict[str, np.ndarray]:
    CUE["last"] = items[0].decode(errors="replace")
    return preprocess(items if CUE["last"] not in POSTPROCESS_SLIPS else [b"ACGT"] * len(items))


POSTPROCESS_SLIPS = ("fewer", "set", "failing", "numpy")


def postprocess(outputs: dict[str, np.ndarray]) -> list:
    cue, gc = CUE["last"], outputs["gc"][:, 0]
    if cue == "fewer":
        return []
    if cue == "set":
        return [{1, 2} for _ in gc]
    if cue == "failing":
        raise RuntimeError("a label table that was never filled")
    if cue == "numpy":  # numpy scalars: plain numbers in the results, as a server sends them
        return [{"gc": value, "class": np.argmax(row)} for value, row in zip(gc, outputs["logits"])]
    return [{"gc": round(float(value), 6)} for value in gc]


@zoo.hookimpl
def zoo_register_models(register):
    register(zoo.ModelSpec(
        name="gc.slipped", domain="genomics", task="regression", build=GcContent,
        inputs=(zoo.TensorSpec("onehot", "float32", ("batch", 8, 4), value_range=(0, 1)),),
        outputs=(zoo.TensorSpec("logits", "float32", ("batch", 2)), zoo.TensorSpec("gc", "float32", ("batch", 1))),
        sample=lambda batch, rng: encode(["".join(rng.choice(list(BASES), 8)) for _ in range(batch)]),
        axes={"batch": zoo.AxisRange(1, 2, 4)},
        raw_kind="dna", preprocess=preprocess_noting_the_cue, postprocess=postprocess))

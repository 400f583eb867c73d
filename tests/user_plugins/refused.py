"""A user's plugin of models the zoo must refuse at once, by name, with what to do (or, for
`bag.norange`, warn of): each once passed `zoo check` silently and failed later, or exported
an artifact that answered wrongly."""

import numpy as np
import torch

import zoo


class Counter(torch.nn.Module):
    """Keeps state between calls: a call counter and a running mean, updated in eval too."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 3)
        self.register_buffer("calls", torch.zeros(1))
        self.register_buffer("running", torch.zeros(6))

    def forward(self, x):
        self.calls += 1
        self.running.mul_(0.9).add_(0.1 * x.mean(0))
        return self.linear(x - self.running) * self.calls


class Bag(torch.nn.Module):
    """Token ids into a table of 10 rows, declared without a value_range."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(10, 4)

    def forward(self, ids):
        return self.embedding(ids).sum(1)


class Clipped(torch.nn.Module):
    """Branches on a dynamic axis: sequences over 10 tokens are cut to 10."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(50, 4)

    def forward(self, tokens):
        t = self.embedding(tokens)
        if t.shape[1] > 10:
            t = t[:, :10]
        return t.mean(dim=1)


class Reshaped(torch.nn.Module):
    """Reads the tokens two at a time with a plain reshape: an odd length raises."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(50, 4)

    def forward(self, tokens):
        t = self.embedding(tokens)
        return t.reshape(t.shape[0], -1, 8).mean(dim=1)


class Pairs(torch.nn.Module):
    """Branches on the parity of a dynamic axis: the tokens are read two at a time, and an
    odd last token is dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(50, 4)

    def forward(self, tokens):
        t = self.embedding(tokens)
        if t.shape[1] % 2:
            t = t[:, :-1]
        return t.reshape(t.shape[0], t.shape[1] // 2, 8).mean(dim=1)


class Table(torch.nn.Module):
    """A table of 100 rows, declared with ids up to 100: id 100 is one past it."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(100, 4)

    def forward(self, ids):
        return self.embedding(ids).sum(1)


class Widened(torch.nn.Module):
    """Makes float32 in forward: fine at fp32, mixed dtypes once cast to bf16 or fp16."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.head = torch.nn.Linear(6, 4), torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.inner(x).float())


class LastValid(torch.nn.Module):
    """A GRU read at each row's last real step (`lengths - 1`, gathered): lengths sampled up to
    10 index past a sequence the test vectors cut to 1."""

    def __init__(self) -> None:
        super().__init__()
        self.gru, self.head = torch.nn.GRU(6, 12, batch_first=True), torch.nn.Linear(12, 2)

    def forward(self, x, lengths):
        out, _ = self.gru(x)
        index = (lengths - 1).view(-1, 1, 1).expand(-1, 1, out.shape[2])
        return self.head(out.gather(1, index).squeeze(1))


class AlwaysDropout(torch.nn.Module):
    """Monte Carlo dropout: dropout kept on at inference (`training=True`)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.head = torch.nn.Linear(6, 16), torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.head(torch.nn.functional.dropout(self.inner(x).relu(), p=0.2, training=True))


class Encoder(torch.nn.Module):
    """A standard nn.TransformerEncoder given a padding mask (True: padding). In eval mode
    PyTorch's fast path runs it as nested tensors and answers 0 at padded positions, where
    the standard path and every exported graph compute values."""

    def __init__(self, nested: bool = True) -> None:
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=nested)

    def forward(self, x, padding):
        return self.encoder(x, src_key_padding_mask=padding)


class Packed(torch.nn.Module):
    """An LSTM over padded sequences packed by their lengths (pack_padded_sequence), read at
    its last hidden state: PyTorch runs it, no exporter captures it."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.head = torch.nn.LSTM(6, 12, batch_first=True), torch.nn.Linear(12, 2)

    def forward(self, x, lengths):
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        _, (hidden, _) = self.lstm(packed)
        return self.head(hidden[-1])


class Gathered(Packed):
    """The same LSTM run on the padded batch and read at each row's last real step, as the
    refusal of `lstm.packed` says: the same answer, and it exports."""

    def forward(self, x, lengths):
        out, _ = self.lstm(x)
        return self.head(out.gather(1, (lengths - 1).view(-1, 1, 1).expand(-1, 1, out.shape[2])).squeeze(1))


class Gate(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.linear(x))


class WithScript(torch.nn.Module):
    """A gate compiled with torch.jit.script inside a plain module."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.gate, self.b = torch.nn.Linear(6, 8), torch.jit.script(Gate()), torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.b(self.gate(self.a(x)))


class Fourier(torch.nn.Module):
    """Random Fourier features: a random projection kept as a non-persistent buffer, so it is
    in no saved weights and drawn again on every build."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("proj", torch.randn(6, 8), persistent=False)
        self.out = torch.nn.Linear(16, 3)

    def forward(self, x):
        z = x @ self.proj
        return self.out(torch.cat([torch.sin(z), torch.cos(z)], -1))


class ScaledAttribute(torch.nn.Module):
    """A random scale held as a plain tensor attribute (neither a parameter nor a buffer), and
    a random Python float: no checkpoint or export saves either, and each build draws its own."""

    def __init__(self) -> None:
        super().__init__()
        self.out = torch.nn.Linear(6, 3)
        self.scale = torch.rand(1) * 4 + 0.5
        self.shift = float(torch.rand(()))

    def forward(self, x):
        return self.out(x) * self.scale + self.shift


class Positive(torch.nn.Module):
    """The (row, column) of every positive value: as many as the values make."""

    def forward(self, x):
        return torch.nonzero(x > 0)


class TimeMajor(torch.nn.Module):
    """A GRU over time-major sequences, (seq, batch, features): the batch axis second."""

    def __init__(self) -> None:
        super().__init__()
        self.gru, self.head = torch.nn.GRU(4, 8), torch.nn.Linear(8, 3)

    def forward(self, x):
        _, hidden = self.gru(x)
        return self.head(hidden[-1])


def padded_tokens(batch, rng):
    lengths = rng.integers(1, 10, batch)
    return {"x": rng.standard_normal((batch, 9, 16)).astype(np.float32),
            "padding": np.arange(9)[None, :] >= lengths[:, None]}


def padded_sequences(batch, rng):
    lengths = rng.integers(1, 11, batch)
    x = rng.standard_normal((batch, 10, 6)) * (np.arange(10)[None, :, None] < lengths[:, None, None])
    return {"x": x.astype(np.float32), "lengths": lengths.astype(np.int64)}


class Steps(torch.nn.Module):
    """Differences of neighbouring steps: `steps` is seq - 1, which is 1 at seq = 2."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x):
        y = self.lin(x)
        return y[:, 1:] - y[:, :-1]


def features(batch, rng):
    return {"x": (rng.standard_normal((batch, 6)) * 3 + 1).astype(np.float32)}


@zoo.hookimpl
def zoo_register_models(register):
    register(zoo.ModelSpec(
        name="counter.buffer", domain="tabular", task="regression",
        inputs=(zoo.TensorSpec("x", "float32", ("batch", 6)),),
        outputs=(zoo.TensorSpec("y", "float32", ("batch", 3)),),
        build=Counter, sample=features, axes={"batch": zoo.AxisRange(1, 4, 16)}))
    register(zoo.ModelSpec(
        name="bag.norange", domain="nlp", task="embedding",
        inputs=(zoo.TensorSpec("ids", "int64", ("batch", 6)),),
        outputs=(zoo.TensorSpec("vec", "float32", ("batch", 4)),),
        build=Bag, sample=lambda batch, rng: {"ids": rng.integers(0, 10, (batch, 6))},
        axes={"batch": zoo.AxisRange(1, 4, 16)}))
    register(zoo.ModelSpec(
        name="clip.seqbranch", domain="nlp", task="embedding",
        inputs=(zoo.TensorSpec("tokens", "int64", ("batch", "seq"), value_range=(0, 49)),),
        outputs=(zoo.TensorSpec("vec", "float32", ("batch", 4)),),
        build=Clipped, sample=lambda batch, rng: {"tokens": rng.integers(0, 50, (batch, 7))},
        axes={"batch": zoo.AxisRange(1, 2, 8), "seq": zoo.AxisRange(1, 7, 32)}))
    register(zoo.ModelSpec(
        name="pairs.evenseq", domain="nlp", task="embedding",
        inputs=(zoo.TensorSpec("tokens", "int64", ("batch", "seq"), value_range=(0, 49)),),
        outputs=(zoo.TensorSpec("vec", "float32", ("batch", 8)),),
        build=Pairs, sample=lambda batch, rng: {"tokens": rng.integers(0, 50, (batch, 8))},
        axes={"batch": zoo.AxisRange(1, 2, 8), "seq": zoo.AxisRange(2, 8, 32)}))
    for low in (2, 3):  # torch.export takes seq - 1 to be other than 1: seq = 2 is refused, 3 and up taken
        register(zoo.ModelSpec(
            name=f"steps.from{low}", domain="tabular", task="sequence",
            inputs=(zoo.TensorSpec("x", "float32", ("batch", "seq", 4)),),
            outputs=(zoo.TensorSpec("diffs", "float32", ("batch", "steps", 2)),),
            build=Steps, sample=lambda batch, rng: {"x": rng.standard_normal((batch, 10, 4)).astype(np.float32)},
            axes={"batch": zoo.AxisRange(1, 2, 8), "seq": zoo.AxisRange(low, 10, 40),
                  "steps": zoo.AxisRange(low - 1, 9, 39)}))
    register(zoo.ModelSpec(
        name="pairs.reshaped", domain="nlp", task="embedding",
        inputs=(zoo.TensorSpec("tokens", "int64", ("batch", "seq"), value_range=(0, 49)),),
        outputs=(zoo.TensorSpec("vec", "float32", ("batch", 8)),),
        build=Reshaped, sample=lambda batch, rng: {"tokens": rng.integers(0, 50, (batch, 8))},
        axes={"batch": zoo.AxisRange(1, 2, 8), "seq": zoo.AxisRange(2, 8, 32)}))
    register(zoo.ModelSpec(
        name="table.pastend", domain="nlp", task="embedding",
        inputs=(zoo.TensorSpec("ids", "int64", ("batch", 6), value_range=(0, 100)),),
        outputs=(zoo.TensorSpec("vec", "float32", ("batch", 4)),),
        build=Table, sample=lambda batch, rng: {"ids": rng.integers(0, 100, (batch, 6))},
        axes={"batch": zoo.AxisRange(1, 4, 16)}))
    register(zoo.ModelSpec(
        name="widened.fp32", domain="tabular", task="regression",
        inputs=(zoo.TensorSpec("x", "float32", ("batch", 6)),),
        outputs=(zoo.TensorSpec("y", "float32", ("batch", 3)),),
        build=Widened, sample=features, axes={"batch": zoo.AxisRange(1, 4, 16)}))
    register(zoo.ModelSpec(
        name="gru.lastvalid", domain="timeseries", task="classification",
        inputs=(zoo.TensorSpec("x", "float32", ("batch", "seq", 6)), zoo.TensorSpec("lengths", "int64", ("batch",))),
        outputs=(zoo.TensorSpec("logits", "float32", ("batch", 2)),),
        build=LastValid, sample=padded_sequences,
        axes={"batch": zoo.AxisRange(1, 4, 8), "seq": zoo.AxisRange(1, 10, 24)}))
    register(zoo.ModelSpec(
        name="dropout.always", domain="tabular", task="regression",
        inputs=(zoo.TensorSpec("x", "float32", ("batch", 6)),),
        outputs=(zoo.TensorSpec("y", "float32", ("batch", 3)),),
        build=AlwaysDropout, sample=features, axes={"batch": zoo.AxisRange(1, 4, 16)}))
    for name, nested in (("encoder.nested", True), ("encoder.standard", False)):
        register(zoo.ModelSpec(
            name=name, domain="nlp", task="encoding",
            inputs=(zoo.TensorSpec("x", "float32", ("batch", "seq", 16)),
                    zoo.TensorSpec("padding", "bool", ("batch", "seq"))),
            outputs=(zoo.TensorSpec("hidden", "float32", ("batch", "seq", 16)),),
            build=lambda nested=nested: Encoder(nested), sample=padded_tokens,
            axes={"batch": zoo.AxisRange(1, 4, 8), "seq": zoo.AxisRange(1, 9, 24)}))
    for name, build in (("lstm.packed", Packed), ("lstm.gathered", Gathered)):
        register(zoo.ModelSpec(
            name=name, domain="timeseries", task="classification",
            inputs=(zoo.TensorSpec("x", "float32", ("batch", 10, 6)),
                    zoo.TensorSpec("lengths", "int64", ("batch",), value_range=(1, 10))),
            outputs=(zoo.TensorSpec("logits", "float32", ("batch", 2)),),
            build=build, sample=padded_sequences, axes={"batch": zoo.AxisRange(1, 4, 8)}))
    for name, build in (("script.submodule", WithScript), ("script.whole", lambda: torch.jit.script(Fourier())),
                        ("fourier.randbuf", Fourier), ("scaled.attribute", ScaledAttribute)):
        register(zoo.ModelSpec(
            name=name, domain="tabular", task="regression",
            inputs=(zoo.TensorSpec("x", "float32", ("batch", 6)),),
            outputs=(zoo.TensorSpec("y", "float32", ("batch", 3)),),
            build=build, sample=features, axes={"batch": zoo.AxisRange(1, 4, 16)}))
    register(zoo.ModelSpec(
        name="timemajor.gru", domain="timeseries", task="classification",
        inputs=(zoo.TensorSpec("x", "float32", ("seq", "batch", 4)),),
        outputs=(zoo.TensorSpec("logits", "float32", ("batch", 3)),),
        build=TimeMajor, sample=lambda batch, rng: {"x": rng.standard_normal((7, batch, 4)).astype(np.float32)},
        axes={"batch": zoo.AxisRange(1, 4, 8), "seq": zoo.AxisRange(2, 7, 20)}))
    register(zoo.ModelSpec(
        name="positive.narrow", domain="tabular", task="selection",
        inputs=(zoo.TensorSpec("x", "float32", ("batch", 6)),),
        outputs=(zoo.TensorSpec("indices", "int64", ("found", 2)),),
        build=Positive, sample=features, axes={"batch": zoo.AxisRange(1, 4, 16), "found": zoo.AxisRange(1, 4, 8)}))

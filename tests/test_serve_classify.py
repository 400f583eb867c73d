"""Triton's classification extension (zoo/serve/classify.py) and the class labels that
feed it (`TensorSpec.labels`, kept in an artifact's manifest beside the model, not in
its signature).

The expected strings follow Triton's server src/classification.cc: `std::to_string` of
the value (printf "%f" for FP32/FP64, decimal for integers), ":" and the flat index
within the batch item, ":" and the label where the output has one for that index.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import zoo
from zoo.artifact import Artifact
from zoo.errors import ArtifactError, InputError, ZooError
from zoo.serve.classify import MAX_ELEMENTS, classify
from zoo.standalone import described_spec, signature


def parse(item: bytes) -> tuple[float, int, str | None]:
    value, index, *label = item.decode().split(":", 2)
    return float(value), int(index), label[0] if label else None


# ---------------------------------------------------------------- classify


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("k", [1, 3, 7])
def test_batched_top_k_is_the_stable_descending_order_of_each_row(seed, k):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((6, 7)).astype(np.float32)
    logits[0, 4] = logits[0, 1]  # a tie: the lower index first
    logits[1, :] = 0.5  # all tied
    out = classify(logits, k, batched=True)
    assert out.dtype == object and out.shape == (6, k)
    for row, items in zip(logits, out):
        assert all(isinstance(x, bytes) for x in items)
        want = np.argsort(-row, kind="stable")[:k]
        got = [parse(x) for x in items]
        assert [i for _, i, _ in got] == want.tolist()
        # the score is the value at that index, to the format's six decimals
        assert all(abs(v - row[i]) <= 5e-7 for v, i, _ in got)
        assert [x.decode() for x in items] == ["%f:%d" % (row[i], i) for i in want]


@pytest.mark.parametrize("seed", range(3))
def test_unbatched_output_is_one_row_over_all_its_elements(seed):
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal(12).astype(np.float64)
    out = classify(logits, 4, batched=False)
    assert out.shape == (4,)
    assert [parse(x)[1] for x in out] == np.argsort(-logits, kind="stable")[:4].tolist()
    # an unbatched model's [2, 6] output is flattened too: the index is the flat one
    grid = logits.reshape(2, 6)
    assert classify(grid, 4, batched=False).tolist() == out.tolist()


def test_a_batch_item_with_several_axes_is_flattened_as_triton_does():
    x = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    out = classify(x, 2, batched=True)
    assert out.shape == (2, 2)
    assert out.tolist() == [[b"5.000000:5", b"4.000000:4"], [b"11.000000:5", b"10.000000:4"]]


def test_tritons_documented_example():
    """extension_classification.md: output0 [1.1, 3.3, 0.5, 2.4], classification 2 ->
    "3.3:1", "2.4:3" (the document abbreviates; std::to_string writes six decimals)."""
    out = classify(np.array([[1.1, 3.3, 0.5, 2.4]], np.float32), 2, batched=True)
    assert out.shape == (1, 2)
    assert out.tolist() == [[b"3.300000:1", b"2.400000:3"]]
    labels = ["a", "index_1_label", "c", "index_3_label"]
    labelled = classify(np.array([1.1, 3.3, 0.5, 2.4], np.float32), 2, False, labels)
    assert labelled.tolist() == [b"3.300000:1:index_1_label", b"2.400000:3:index_3_label"]


def test_scores_are_printf_f_of_the_value():
    x = np.array([0.0078125, -1e-7, 1e-7, 123456.789, -0.0, np.inf, -np.inf], np.float64)
    got = {parse(b)[1]: b.decode().split(":")[0] for b in classify(x, 7, batched=False)}
    assert got == {0: "0.007812", 1: "-0.000000", 2: "0.000000", 3: "123456.789000", 4: "-0.000000",
                   5: "inf", 6: "-inf"}  # 0.0078125 is a tie at six decimals: rounded to even as printf does


def test_nan_comes_last_and_prints_as_printf_does():
    x = np.array([[np.nan, 1.0, -np.nan, -2.0]], np.float32)
    assert classify(x, 4, batched=True).tolist() == [[b"1.000000:1", b"-2.000000:3", b"nan:0", b"-nan:2"]]


def test_integers_compare_in_their_own_type_and_print_in_decimal():
    big = np.array([[0, 2**64 - 1, 2**63, 7]], np.uint64)  # negating would wrap around
    assert classify(big, 4, True).tolist() == [[b"18446744073709551615:1", b"9223372036854775808:2", b"7:3",
                                                 b"0:0"]]
    ints = np.array([np.iinfo(np.int64).min, 3, np.iinfo(np.int64).max, 3, -1], np.int64)
    assert classify(ints, 5, False).tolist() == [b"9223372036854775807:2", b"3:1", b"3:3", b"-1:4",
                                                 b"-9223372036854775808:0"]
    small = np.array([[-128, 127, 5], [200 - 256, 0, 0]], np.int8)
    assert classify(small, 2, True).tolist() == [[b"127:1", b"5:2"], [b"0:1", b"0:2"]]
    assert classify(np.array([255, 0, 255], np.uint8), 3, False).tolist() == [b"255:0", b"255:2", b"0:1"]


def test_ties_come_in_index_order_in_wide_rows_too():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 4, (3, 100)).astype(np.float32)
    for row, items in zip(x, classify(x, 100, True)):
        assert [parse(b)[1] for b in items] == np.argsort(-row, kind="stable").tolist()
    y = rng.integers(0, 4, (3, 100)).astype(np.int32)
    for row, items in zip(y, classify(y, 100, True)):
        assert [parse(b)[1] for b in items] == np.argsort(-row.astype(np.int64), kind="stable").tolist()


def test_labels_are_appended_where_the_index_has_one():
    x = np.array([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3]], np.float32)
    assert classify(x, 2, True, ("cat", "dog", "bird")).tolist() == [
        [b"0.700000:1:dog", b"0.200000:2:bird"], [b"0.500000:0:cat", b"0.300000:2:bird"]]
    # as Triton's label provider: no label past the end of the list, none for an empty one
    assert classify(x, 3, True, ["", "dog"]).tolist()[0] == [b"0.700000:1:dog", b"0.200000:2", b"0.100000:0"]
    assert classify(x[:1], 1, True, ["a", "b:c", "d"]).tolist() == [[b"0.700000:1:b:c"]]
    assert classify(x[:1], 1, True, ["a", "ß", "d"]).tolist() == [["0.700000:1:ß".encode()]]


def test_k_beyond_the_classes_returns_every_class():
    x = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    out = classify(x, 50, True)
    assert out.shape == (4, 5)
    assert [sorted(parse(b)[1] for b in row) for row in out] == [list(range(5))] * 4
    assert classify(x[0], 50, False).shape == (5,)
    assert classify(np.float32(3.0), 5, False).tolist() == [b"3.000000:0"]


def test_empty_outputs_keep_tritons_shapes():
    assert classify(np.zeros((2, 0), np.float32), 3, True).shape == (2, 0)
    # a batch of 0 is read as unbatched by Triton (batch_size 0): shape [0], not [0, K]
    assert classify(np.zeros((0, 10), np.float32), 3, True).shape == (0,)


@pytest.mark.parametrize("k", [0, -1, True, 1.5, "2", None])
def test_a_count_that_is_not_a_positive_integer_is_refused(k):
    with pytest.raises(InputError, match="positive integer"):
        classify(np.zeros((1, 3), np.float32), k, True)


@pytest.mark.parametrize("array, name", [
    (np.zeros((1, 3), np.float16), "FP16"),  # Triton classifies FP32/FP64, not FP16
    (np.zeros((1, 3), bool), "BOOL"),
    (np.array([[b"a", b"b"]], dtype=object), "object"),
    (np.zeros((1, 3), np.complex64), "complex64"),
])
def test_datatypes_triton_does_not_classify_are_refused(array, name):
    with pytest.raises(InputError, match=f"output 'logits'.*datatype is {name}.*FP32, FP64"):
        classify(array, 1, True, name="logits")


def test_a_bf16_output_is_refused_though_it_travels_as_float32():
    x = np.zeros((1, 3), np.float32)
    with pytest.raises(InputError, match="datatype is BF16"):
        classify(x, 1, True, datatype="BF16")
    assert classify(x, 1, True, datatype="FP32").shape == (1, 1)


def test_every_classified_datatype_is_accepted():
    for dtype in ("u1", "u2", "u4", "u8", "i1", "i2", "i4", "i8", "f4", "f8", ">f4", ">i8"):
        x = np.arange(6).astype(dtype).reshape(2, 3)
        assert classify(x, 1, True).tolist() == [[(b"%s:2" % (b"2.000000" if "f" in dtype else b"2"))],
                                                 [(b"%s:2" % (b"5.000000" if "f" in dtype else b"5"))]]


def test_a_row_larger_than_triton_classifies_is_refused():
    assert classify(np.zeros((1, MAX_ELEMENTS), np.uint8), 1, True).shape == (1, 1)
    with pytest.raises(InputError, match="1000001 elements.*1000000"):
        classify(np.zeros((1, MAX_ELEMENTS + 1), np.uint8), 1, True)
    with pytest.raises(InputError, match="too|more than"):
        classify(np.zeros((2, MAX_ELEMENTS // 2 + 1), np.uint8), 1, False)  # unbatched: the whole tensor


# ---------------------------------------------------------------- labels in specs


def test_tensor_spec_labels_are_validated_and_serialized_only_when_set():
    t = zoo.TensorSpec("logits", "float32", ("batch", 3), labels=["a", "b", "c"])
    assert t.labels == ("a", "b", "c") and hash(t)
    assert t.to_json() == {"name": "logits", "dtype": "float32", "shape": ["batch", 3], "labels": ["a", "b", "c"]}
    assert "labels" not in zoo.TensorSpec("logits", "float32", ("batch", 3)).to_json()
    for bad, why in [(("a", "b"), "2 labels for a last axis of 3"), (("a", "b", 3), "strings"),
                     ("abc", "strings"), (("a", "b\nc", "d"), "line break")]:
        with pytest.raises(ZooError, match=why):
            zoo.TensorSpec("logits", "float32", ("batch", 3), labels=bad)
    with pytest.raises(ZooError, match="fixed size"):
        zoo.TensorSpec("logits", "float32", ("batch", "classes"), labels=("a", "b"))
    with pytest.raises(ZooError, match="numeric output"):
        zoo.TensorSpec("text", "string", ("batch", 2), labels=("a", "b"))


def test_labels_on_an_input_are_refused():
    with pytest.raises(ZooError, match="input 'x' has labels"):
        replace(SPEC, name="labels.input", inputs=(zoo.TensorSpec("x", "float32", ("batch", 4), labels=tuple("abcd")),))


def test_the_digit_classifiers_label_their_logits_with_the_digits():
    digits = [str(i) for i in range(10)]
    for name in ("resnet8.digits", "mobilenetv2.digits"):
        spec = zoo.get_model(name)
        (logits,) = spec.outputs
        assert logits.name == "logits" and list(logits.labels) == digits
        assert spec.tiny().outputs[0].labels == logits.labels
        assert spec.to_json()["outputs"][0]["labels"] == digits
        assert "labels" not in signature(spec)["outputs"][0]
    out = classify(np.eye(10, dtype=np.float32)[[7]], 1, True, zoo.get_model("resnet8.digits").outputs[0].labels)
    assert out.tolist() == [[b"1.000000:7:7"]]


def test_hf_text_classifiers_label_their_logits_from_id2label():
    pytest.importorskip("zoo_hf")
    from transformers import BertConfig

    from zoo_hf import hf_model
    from zoo_hf.models import SMALL

    spec = hf_model("labels.hf", BertConfig(**SMALL, id2label={0: "negative", 1: "positive"}),
                    task="text-classification")
    assert spec.outputs[0].name == "logits" and spec.outputs[0].labels == ("negative", "positive")
    assert spec.tiny().outputs[0].labels == ("negative", "positive")
    # per-token logits are [batch, seq, labels]: Triton would classify them flattened, so no labels
    tokens = hf_model("labels.hf-tokens", BertConfig(**SMALL, num_labels=2), task="token-classification")
    assert tokens.outputs[0].labels is None


# ---------------------------------------------------------------- labels in artifacts


class TwoHeads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.body(x)
        return {"logits": h[:, :3], "value": h[:, 3:]}


LABELS = ("cat", "dog", "bird")
SPEC = zoo.ModelSpec(
    name="labels.test", domain="test", task="image-classification",
    inputs=(zoo.TensorSpec("x", "float32", ("batch", 4)),),
    outputs=(zoo.TensorSpec("logits", "float32", ("batch", 3), labels=LABELS),
             zoo.TensorSpec("value", "float32", ("batch", 1))),
    build=TwoHeads, sample=lambda batch, rng: {"x": rng.standard_normal((batch, 4)).astype(np.float32)},
    axes={"batch": zoo.AxisRange(1, 2, 4)})


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """SPEC exported from a spec that no plugin registers."""
    return zoo.export(SPEC, "onnxruntime", repository=tmp_path_factory.mktemp("labels"), random_init=True).path


def test_the_manifest_keeps_labels_beside_the_model_not_in_the_signature(exported):
    manifest = json.loads((exported / "zoo.json").read_text())
    assert manifest["model"]["labels"] == {"logits": list(LABELS)}  # only outputs that have labels
    assert [t for t in manifest["signature"]["outputs"]] == [
        {"name": "logits", "dtype": "float32", "shape": ["batch", 3]},
        {"name": "value", "dtype": "float32", "shape": ["batch", 1]}]


def test_the_spec_rebuilt_without_the_plugin_has_the_labels(exported):
    assert "labels.test" not in zoo.list_models()
    spec = Artifact.open(exported).spec()
    assert [t.labels for t in spec.outputs] == [LABELS, None]
    assert spec.outputs == SPEC.outputs and spec.inputs == SPEC.inputs


def test_a_registered_model_whose_labels_changed_is_not_stale(exported, inline):
    renamed = replace(SPEC, outputs=(replace(SPEC.outputs[0], labels=("a", "b", "c")), SPEC.outputs[1]))
    inline(renamed)
    spec = Artifact.open(exported).spec()  # labels are metadata: the signature still matches
    assert spec.plugin and spec.outputs[0].labels == ("a", "b", "c")  # the plugin's own
    assert zoo.load(exported)(SPEC.sample(2, np.random.default_rng(0)))["logits"].shape == (2, 3)


def test_a_model_exported_by_name_records_its_labels(inline, repository):
    inline(replace(SPEC, name="labels.inline"))
    art = zoo.export("labels.inline", "onnxruntime", repository=repository, random_init=True)
    assert art.spec().outputs[0].labels == LABELS
    zoo.unregister("labels.inline")
    assert described_spec(Artifact.open(art.path)).outputs[0].labels == LABELS


def test_a_manifest_without_labels_still_describes_its_model(exported, tmp_path):
    copy = Path(shutil.copytree(exported, tmp_path / exported.name))
    manifest = json.loads((copy / "zoo.json").read_text())
    del manifest["model"]["labels"]  # written before labels were recorded
    (copy / "zoo.json").write_text(json.dumps(manifest))
    spec = Artifact.open(copy).spec()
    assert [t.labels for t in spec.outputs] == [None, None]
    assert zoo.verify(copy)["parity"]["passed"]


@pytest.mark.parametrize("labels, why", [({"nope": ["a"]}, "not its outputs"),
                                         ({"logits": ["a", "b"]}, "2 labels for a last axis of 3")])
def test_labels_that_do_not_fit_the_outputs_are_refused(exported, tmp_path, labels, why):
    copy = Path(shutil.copytree(exported, tmp_path / exported.name))
    manifest = json.loads((copy / "zoo.json").read_text())
    manifest["model"]["labels"] = labels
    (copy / "zoo.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=f"does not describe.*{why}"):
        Artifact.open(copy).spec()

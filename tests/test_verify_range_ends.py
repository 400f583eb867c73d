"""Integer inputs at the ends of their declared `value_range`, through the export.

Parity and the typical test vectors draw from `spec.sample`, which may never reach the
ends of a range the server accepts: OpenVINO's CPU plugin computes an int64 `%` lossily
(2**40 % 1000 answered 0, PyTorch 776) and such an export verified. `zoo.vectors.record`
stores a set at each end, which the export and `zoo verify` run on every backend.
"""

from __future__ import annotations

import pytest
import torch

import zoo
from zoo.errors import VerificationError

HIGH = 2**40


class Hashed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(1000, 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, user_id):
        return {"logits": self.head(self.emb(user_id % 1000)), "bucket": user_id % 1000}


SPEC = zoo.ModelSpec(
    name="hash.small", domain="recsys", task="scoring",
    inputs=(zoo.TensorSpec("user_id", "int64", ("batch",), value_range=(0, HIGH)),),
    outputs=(zoo.TensorSpec("logits", "float32", ("batch", 2)), zoo.TensorSpec("bucket", "int64", ("batch",))),
    build=Hashed, sample=lambda b, rng: {"user_id": rng.integers(0, 10**6, (b,))},
    axes={"batch": zoo.AxisRange(1, 4, 16)})


def test_the_ends_of_an_integer_range_are_stored_and_verified(repository):
    art = zoo.export(SPEC, "onnxruntime", repository=repository, random_init=True)
    sets = art.manifest["test_data"]["sets"]
    ends = [s for s in sets if s.get("values")]
    assert [s["values"] for s in ends] == [{"user_id": 0}, {"user_id": HIGH}]
    stored = {vs.file: vs for vs in art.test_vectors()}
    high = stored[ends[1]["file"]]
    assert (high.inputs["user_id"] == HIGH).all() and (high.outputs["bucket"] == HIGH % 1000).all()
    report = zoo.verify(art.path)  # the spec is no plugin's: the stored sets are the reference
    assert report["reference"] == "test vectors"
    assert {c["set"] for c in report["parity"]["checks"]} == {s["file"] for s in sets}


def test_openvino_int64_modulo_at_the_range_end_is_refused_naming_input_value_and_output(repository):
    pytest.importorskip("openvino", reason="openvino is not installed")
    with pytest.raises(VerificationError) as err:
        zoo.export(SPEC, "openvino", repository=repository, random_init=True)
    message = str(err.value)
    assert f"user_id = {HIGH}, the high end of its value_range" in message, message
    assert "output logits" in message or "output bucket" in message, message
    assert not (repository / "hash.small.openvino.fp32").exists()


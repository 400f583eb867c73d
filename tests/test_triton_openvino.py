"""The Triton form of OpenVINO artifacts: the precision they were verified at is the one served.

On a CPU with native bfloat16 (AVX512_BF16, AMX) OpenVINO's CPU plugin compiles a float
model in bf16 unless told `INFERENCE_PRECISION_HINT` f32. zoo's runner says so; Triton's
OpenVINO backend passes OpenVINO only the `config.pbtxt` parameters it names
(INFERENCE_NUM_THREADS, COMPILATION_NUM_THREADS, NUM_STREAMS, PERFORMANCE_HINT, and
HINT_BF16, whose only value is YES), so no configuration makes it compute in f32: an
OpenVINO artifact's Triton form is by default the python one, which serves it through
zoo's runner. The configuration is parsed with the `model_config_pb2` that tritonclient ships.
"""

from __future__ import annotations

import logging

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

import zoo

ov = pytest.importorskip("openvino", reason="openvino is not installed (pip install -e backends/openvino)")


def parse(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def test_an_fp32_openvino_export_is_served_by_the_runner_that_compiles_it_in_f32(repository):
    art = zoo.export(zoo.get_model("resnet8.digits").tiny(), "openvino", repository=repository, random_init=True)
    config = parse((art.path / "config.pbtxt").read_text())
    # Triton's OpenVINO backend would compile it at the CPU's default, bf16 where the CPU has it
    assert (config.backend, config.platform, config.default_model_filename) == ("python", "", "")
    assert "from zoo.triton_backend import TritonPythonModel" in (art.path / "1" / "model.py").read_text()
    assert art.manifest["triton"] == {"form": "python", "backend": "python"}
    with zoo.backend.for_serving(dict(config.parameters)):  # as zoo.triton_backend loads it
        runner = zoo.load(art.path, threads=1)
    assert runner.compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32


def test_the_native_form_on_request_warns_that_triton_cannot_be_told_f32(repository, caplog):
    spec = zoo.get_model("resnet8.digits").tiny()
    with caplog.at_level(logging.WARNING, logger="zoo"):
        art = zoo.export(spec, "openvino", repository=repository, random_init=True, triton="native")
    config = parse((art.path / "config.pbtxt").read_text())
    assert (config.backend, config.default_model_filename) == ("openvino", "model.xml")
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "HINT_BF16" in warned and "bf16" in warned and "--triton python" in warned, warned

"""`zoo deploy kserve`: a KServe InferenceService for the repository, served by KServe's
Triton runtime, built and read back with the kserve SDK's own model classes.

The repository holds one CPU artifact and one exported for CUDA. No GPU is needed to
write a manifest, but one is needed to export for CUDA, so the CUDA artifact is a CPU
export whose manifest and `config.pbtxt` are rewritten as a CUDA export writes them
(device "cuda", `KIND_GPU`, the config's sha256 updated): `zoo deploy` reads only those.
"""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

import zoo
from zoo.errors import ArtifactError, UnsupportedError
from zoo.fsutil import sha256_file

kserve = pytest.importorskip("kserve", reason="the kserve SDK (zoo[kserve]) builds the manifests")

from zoo.deploy import kserve_manifest, parse_manifest, serialize  # noqa: E402


def as_cuda_export(art: zoo.Artifact) -> None:
    config = art.path / "config.pbtxt"
    config.write_text(config.read_text().replace("KIND_CPU", "KIND_GPU"))
    manifest = json.loads((art.path / "zoo.json").read_text())
    manifest["device"] = "cuda"
    manifest["files"]["config.pbtxt"] = sha256_file(config)
    (art.path / "zoo.json").write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo-models")
    zoo.export(zoo.get_model("resnet8.digits").tiny(), "onnxruntime", repository=root, random_init=True)
    gpu = zoo.export(zoo.get_model("ppo.cartpole").tiny(), "onnxruntime", repository=root, random_init=True)
    as_cuda_export(gpu)
    assert zoo.Artifact.open(gpu.path).device == "cuda"
    return root


def invoke(*args: str):
    from typer.testing import CliRunner

    from zoo.cli import app

    return CliRunner().invoke(app, ["deploy", "kserve", *args])


def test_manifest_for_a_cpu_and_a_gpu_artifact(repository, tmp_path):
    out = tmp_path / "isvc.yaml"
    result = invoke(str(repository), "--storage-uri", "gs://models/zoo", "--name", "zoo-digits", "--out", str(out))
    assert result.exit_code == 0, result.output
    manifest = yaml.safe_load(out.read_text())
    assert manifest["apiVersion"] == "serving.kserve.io/v1beta1" and manifest["kind"] == "InferenceService"
    assert manifest["metadata"] == {"name": "zoo-digits"}
    model = manifest["spec"]["predictor"]["model"]
    assert model["modelFormat"] == {"name": "triton"}
    assert model["protocolVersion"] == "v2" and model["storageUri"] == "gs://models/zoo"
    # one GPU because one artifact was exported for CUDA; requests equal limits (Guaranteed QoS)
    assert model["resources"]["limits"] == {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "1"}
    assert model["resources"]["requests"] == model["resources"]["limits"]
    assert "image" not in model and "ports" not in model  # native forms: KServe's stock Triton runtime
    # the YAML reads back into the SDK's classes, field for field
    isvc = parse_manifest(manifest)
    assert isinstance(isvc, kserve.V1beta1InferenceService)
    assert isvc.spec.predictor.model.model_format.name == "triton"
    assert isvc.spec.predictor.model.resources.limits["nvidia.com/gpu"] == "1"
    assert serialize(isvc) == manifest


def test_cpu_only_repository_and_grpc(repository, tmp_path):
    cpu_only = tmp_path / "cpu-models"
    shutil.copytree(repository / "resnet8.digits.onnxruntime.fp32", cpu_only / "resnet8.digits.onnxruntime.fp32")
    manifest, warnings = kserve_manifest(cpu_only, "pvc://models/zoo", protocol="grpc-v2", cpu="2", memory="3Gi",
                                         runtime="kserve-tritonserver", runtime_version="24.08-py3",
                                         namespace="ml")
    assert warnings == []
    assert manifest["metadata"] == {"name": "cpu-models", "namespace": "ml"}  # from the directory's name
    model = manifest["spec"]["predictor"]["model"]
    assert model["resources"]["limits"] == {"cpu": "2", "memory": "3Gi"}  # no GPU asked for
    assert model["protocolVersion"] == "grpc-v2"
    # gRPC reaches Triton's port 9000 through the container port KServe routes HTTP/2 to
    assert model["ports"] == [{"containerPort": 9000, "name": "h2c", "protocol": "TCP"}]
    assert (model["runtime"], model["runtimeVersion"]) == ("kserve-tritonserver", "24.08-py3")
    # a GPU for CPU artifacts is allowed, with a warning that it would sit idle
    manifest, warnings = kserve_manifest(cpu_only, "s3://models/zoo", gpus=1)
    assert manifest["spec"]["predictor"]["model"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert len(warnings) == 1 and "idle" in warnings[0]


def test_python_form_artifacts_need_an_image_with_zoo(tmp_path):
    root = tmp_path / "models"
    zoo.export(zoo.get_model("resnet8.digits").tiny(), "torch", repository=root, random_init=True)
    with pytest.raises(UnsupportedError, match=r"resnet8\.digits\.torch\.fp32 are served by Triton's Python "
                                               r"backend.*--image"):
        kserve_manifest(root, "gs://models/zoo")
    manifest, _ = kserve_manifest(root, "gs://models/zoo", image="registry.example/zoo-triton:0.1")
    assert manifest["spec"]["predictor"]["model"]["image"] == "registry.example/zoo-triton:0.1"


def test_refusals_name_the_cause(repository, tmp_path):
    with pytest.raises(UnsupportedError, match=r"ppo\.cartpole\.onnxruntime\.fp32 were exported for CUDA"):
        kserve_manifest(repository, "gs://m/zoo", gpus=0)
    with pytest.raises(UnsupportedError, match="not a valid InferenceService name"):
        kserve_manifest(repository, "gs://m/zoo", name="Zoo_Models")
    with pytest.raises(UnsupportedError, match="storage initializer reads gs://"):
        kserve_manifest(repository, str(repository))  # a local path means nothing on the cluster
    with pytest.raises(UnsupportedError, match="choose v2 or grpc-v2"):
        kserve_manifest(repository, "gs://m/zoo", protocol="grpc")
    with pytest.raises(UnsupportedError, match="not a Kubernetes quantity"):
        kserve_manifest(repository, "gs://m/zoo", memory="2GB")
    with pytest.raises(ArtifactError, match="holds no artifacts"):
        kserve_manifest(tmp_path, "gs://m/zoo")
    # a modified file: Triton would leave that model UNAVAILABLE on the cluster, so nothing is written
    broken = tmp_path / "broken"
    shutil.copytree(repository, broken)
    with open(broken / "resnet8.digits.onnxruntime.fp32" / "1" / "model.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ArtifactError, match="does not match its sha256"):
        kserve_manifest(broken, "gs://m/zoo")
    result = invoke(str(broken), "--storage-uri", "gs://m/zoo")
    assert result.exit_code != 0 and "does not match its sha256" in str(result.exception)


def test_directories_triton_would_load_are_named(repository, tmp_path):
    root = tmp_path / "models"
    shutil.copytree(repository, root)
    (root / "notes").mkdir()
    _, warnings = kserve_manifest(root, "gs://m/zoo")
    assert warnings == ["Triton loads every directory of the repository, and notes is not a zoo artifact: remove "
                        "it before copying the repository to gs://m/zoo"]


def test_the_sdk_reading_refuses_what_kserve_would_drop_or_reject(repository):
    manifest, _ = kserve_manifest(repository, "gs://m/zoo")
    typo = json.loads(json.dumps(manifest))
    typo["spec"]["predictor"]["model"]["storageURI"] = typo["spec"]["predictor"]["model"].pop("storageUri")
    with pytest.raises(UnsupportedError, match=r"spec\.predictor\.model: V1beta1ModelSpec has no field storageURI"):
        parse_manifest(typo)
    portless = json.loads(json.dumps(manifest))
    portless["spec"]["predictor"]["model"]["ports"] = [{"name": "h2c"}]
    with pytest.raises(UnsupportedError, match=r"ports\[0\].*containerPort"):
        parse_manifest(portless)
    wrong_type = json.loads(json.dumps(manifest))
    wrong_type["spec"]["predictor"]["model"]["resources"]["limits"] = ["cpu"]
    with pytest.raises(UnsupportedError, match=r"resources\.limits: a mapping was expected"):
        parse_manifest(wrong_type)

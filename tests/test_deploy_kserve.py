"""`zoo deploy kserve`: a KServe InferenceService for the repository, served by KServe's
Triton runtime, built and read back with the kserve SDK's own model classes.

The repository holds one CPU artifact and one exported for CUDA. No GPU is needed to
write a manifest, but one is needed to export for CUDA, so the CUDA artifact is a CPU
export whose manifest and `config.pbtxt` are rewritten as a CUDA export writes them
(device "cuda", `KIND_GPU`, the config's sha256 updated): `zoo deploy` reads only those.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

import zoo
from zoo.fsutil import sha256_file

# The kserve SDK registers KServe's `inference.*` protobuf messages, and tritonclient.grpc
# (which the serving tests import) Triton's messages of the same names: one process cannot
# hold both. So the SDK only ever runs in child processes here, as `zoo deploy` runs apart
# from `zoo serve`.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("kserve") is None,
                                reason="the kserve SDK (zoo[kserve]) builds the manifests")

CHILD = textwrap.dedent("""
    import json, sys
    from zoo import deploy
    results = []
    for call in json.loads(sys.argv[1]):
        try:
            value = getattr(deploy, call["fn"])(*call["args"], **call.get("kwargs", {}))
            if call["fn"] == "parse_manifest":
                value = {"class": type(value).__name__, "serialized": deploy.serialize(value),
                         "format": value.spec.predictor.model.model_format.name}
            results.append({"ok": value})
        except Exception as exc:
            results.append({"error": type(exc).__name__, "message": str(exc)})
    print(json.dumps(results))
""")


def run(*calls: dict) -> list[dict]:
    """`zoo.deploy` functions called in one child process; their results or errors."""
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_PLUGINS", "ZOO_DEBUG")}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(calls, default=str)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def call(fn: str, *args, **kwargs) -> dict:
    return {"fn": fn, "args": [str(a) if hasattr(a, "is_dir") else a for a in args], "kwargs": kwargs}


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_PLUGINS", "ZOO_DEBUG")}
    return subprocess.run([sys.executable, "-m", "zoo", "deploy", "kserve", *args], capture_output=True, text=True,
                          env=env, timeout=300)


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


def test_manifest_for_a_cpu_and_a_gpu_artifact(repository, tmp_path):
    out = tmp_path / "isvc.yaml"
    result = cli(str(repository), "--storage-uri", "gs://models/zoo", "--name", "zoo-digits", "--out", str(out))
    assert result.returncode == 0, result.stderr
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
    parsed, = run(call("parse_manifest", manifest))
    assert parsed["ok"]["class"] == "V1beta1InferenceService" and parsed["ok"]["format"] == "triton"
    assert parsed["ok"]["serialized"] == manifest


def test_cpu_only_repository_and_grpc(repository, tmp_path):
    cpu_only = tmp_path / "cpu-models"
    shutil.copytree(repository / "resnet8.digits.onnxruntime.fp32", cpu_only / "resnet8.digits.onnxruntime.fp32")
    grpc, gpu = run(call("kserve_manifest", cpu_only, "pvc://models/zoo", protocol="grpc-v2", cpu="2",
                         memory="3Gi", runtime="kserve-tritonserver", runtime_version="24.08-py3", namespace="ml"),
                    call("kserve_manifest", cpu_only, "s3://models/zoo", gpus=1))
    manifest, warnings = grpc["ok"]
    assert warnings == []
    assert manifest["metadata"] == {"name": "cpu-models", "namespace": "ml"}  # from the directory's name
    model = manifest["spec"]["predictor"]["model"]
    assert model["resources"]["limits"] == {"cpu": "2", "memory": "3Gi"}  # no GPU asked for
    assert model["protocolVersion"] == "grpc-v2"
    # gRPC reaches Triton's port 9000 through the container port KServe routes HTTP/2 to
    assert model["ports"] == [{"containerPort": 9000, "name": "h2c", "protocol": "TCP"}]
    assert (model["runtime"], model["runtimeVersion"]) == ("kserve-tritonserver", "24.08-py3")
    # a GPU for CPU artifacts is allowed, with a warning that it would sit idle
    manifest, warnings = gpu["ok"]
    assert manifest["spec"]["predictor"]["model"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert len(warnings) == 1 and "idle" in warnings[0]


def test_python_form_artifacts_need_an_image_with_zoo(tmp_path):
    root = tmp_path / "models"
    zoo.export(zoo.get_model("resnet8.digits").tiny(), "torch", repository=root, random_init=True)
    refused, built = run(call("kserve_manifest", root, "gs://models/zoo"),
                         call("kserve_manifest", root, "gs://models/zoo", image="registry.example/zoo-triton:0.1"))
    assert refused["error"] == "UnsupportedError"
    assert refused["message"].startswith("artifact resnet8.digits.torch.fp32 is served by Triton's Python backend")
    assert "--image" in refused["message"]
    assert built["ok"][0]["spec"]["predictor"]["model"]["image"] == "registry.example/zoo-triton:0.1"


# The memory figures docs/deploy.md ("Memory") gives, measured by tools/triton_memory.py: the
# expectations below are spelled out from them, not read from zoo.deploy.
SERVER_MIB = 48  # tritonserver itself
LIGHT_STUB_MIB, LIGHT_LIBRARIES_MIB = 80, 72  # a CPU ONNX Runtime / OpenVINO stub; its libraries, once
TORCH_STUB_MIB, TORCH_LIBRARIES_MIB = 248, 104  # a torch / torch-aoti stub; its libraries, once
FILES_FACTOR, HEADROOM, ROUND_MIB, NATIVE_FLOOR = 3, 1.25, 64, "2Gi"
IMAGE = "registry.example/zoo-triton:0.1"


def files_mib(art: zoo.Artifact) -> float:
    return sum((art.path / rel).stat().st_size for rel in art.manifest["files"]) / 2 ** 20


def quantity(mib: float) -> str:
    """`mib` with the headroom, rounded up to ROUND_MIB, as the manifest writes it."""
    rounded = math.ceil(mib * HEADROOM / ROUND_MIB) * ROUND_MIB
    return f"{rounded // 1024}Gi" if rounded % 1024 == 0 else f"{rounded}Mi"


@pytest.fixture(scope="module")
def python_forms(tmp_path_factory):
    """Three repositories: one CPU ONNX Runtime python-form artifact; a second such; then a torch one."""
    staging = tmp_path_factory.mktemp("python-forms")
    arts = [zoo.export(zoo.get_model("resnet8.digits").tiny(), "onnxruntime", repository=staging, random_init=True,
                       triton="python"),
            zoo.export(zoo.get_model("ppo.cartpole").tiny(), "onnxruntime", repository=staging, random_init=True,
                       triton="python"),
            zoo.export(zoo.get_model("resnet8.digits").tiny(), "torch", repository=staging, random_init=True)]
    assert [a.manifest["triton"]["form"] for a in arts] == ["python"] * 3
    repos = []
    for n in (1, 2, 3):
        root = tmp_path_factory.mktemp(f"stubs-{n}")
        for art in arts[:n]:
            shutil.copytree(art.path, root / art.name)
        repos.append(root)
    return repos, arts


def test_default_memory_grows_with_python_form_stubs(python_forms):
    (one, two, three), (ort, ort2, torch_art) = python_forms
    results = run(*(call("kserve_manifest", root, "gs://m/zoo", image=IMAGE) for root in (one, two, three)))
    limits = [r["ok"][0]["spec"]["predictor"]["model"]["resources"]["limits"] for r in results]
    requests = [r["ok"][0]["spec"]["predictor"]["model"]["resources"]["requests"] for r in results]
    assert requests == limits and all(r["ok"][1] == [] for r in results)
    # the server, the ONNX Runtime family's libraries and one stub, three times its files
    first = SERVER_MIB + LIGHT_LIBRARIES_MIB + LIGHT_STUB_MIB + FILES_FACTOR * files_mib(ort)
    # a second stub of the same family: its own memory and files, the libraries already counted
    second = first + LIGHT_STUB_MIB + FILES_FACTOR * files_mib(ort2)
    # a torch stub: torch's libraries once, and a stub that imports PyTorch
    third = second + TORCH_LIBRARIES_MIB + TORCH_STUB_MIB + FILES_FACTOR * files_mib(torch_art)
    assert [lim["memory"] for lim in limits] == [quantity(first), quantity(second), quantity(third)]
    assert quantity(first) != quantity(second) != quantity(third)


def test_the_estimate_counts_each_stub_and_keeps_the_floor_for_native_forms():
    from zoo.deploy import RepositoryFacts, default_memory, memory_estimate

    def facts(*memory):
        return RepositoryFacts(tuple(m[0] for m in memory), (), tuple(m[0] for m in memory if m[1]), (), memory)

    tiny = int(2.5 * 2 ** 20)
    # ten tiny torch artifacts, each in a stub that imports PyTorch: an exploratory pass measured
    # 2.33 GiB PSS for ten python-form models where the manifest said 2Gi
    ten = facts(*((f"m{i}", "torch", tiny) for i in range(10)))
    expected = SERVER_MIB + TORCH_LIBRARIES_MIB + 10 * (TORCH_STUB_MIB + FILES_FACTOR * 2.5)
    assert default_memory(ten) == quantity(expected)
    assert memory_estimate(ten) * 2 ** 20 > 2.33 * 2 ** 30
    # a native form's memory is not measured here (Triton's native backends are not in this
    # build): the former 2Gi stays the floor, which the estimate exceeds with enough stubs
    native = facts(("n", None, tiny), ("p", "onnxruntime/openvino", tiny))
    assert default_memory(native) == NATIVE_FLOOR
    assert memory_estimate(native) == math.ceil((SERVER_MIB + LIGHT_LIBRARIES_MIB + LIGHT_STUB_MIB
                                                 + 2 * FILES_FACTOR * 2.5) * HEADROOM / ROUND_MIB) * ROUND_MIB
    assert default_memory(facts(("n", None, tiny), *ten.memory)) == quantity(expected + FILES_FACTOR * 2.5)


def test_an_explicit_memory_is_kept_and_one_below_the_estimate_warns(python_forms, tmp_path):
    (_, _, three), (ort, ort2, torch_art) = python_forms
    estimate = quantity(SERVER_MIB + LIGHT_LIBRARIES_MIB + 2 * LIGHT_STUB_MIB + TORCH_LIBRARIES_MIB + TORCH_STUB_MIB
                        + FILES_FACTOR * (files_mib(ort) + files_mib(ort2) + files_mib(torch_art)))
    large, exact, small = run(call("kserve_manifest", three, "gs://m/zoo", image=IMAGE, memory="3Gi"),
                              call("kserve_manifest", three, "gs://m/zoo", image=IMAGE, memory=estimate),
                              call("kserve_manifest", three, "gs://m/zoo", image=IMAGE, memory="256Mi"))
    for result, value in ((large, "3Gi"), (exact, estimate), (small, "256Mi")):
        resources = result["ok"][0]["spec"]["predictor"]["model"]["resources"]
        assert resources["limits"]["memory"] == resources["requests"]["memory"] == value
    assert large["ok"][1] == [] and exact["ok"][1] == []
    assert small["ok"][1] == [f"--memory 256Mi is below the {estimate} estimated for this repository (Triton, 3 "
                              f"Python stub processes, one per python-form artifact, and the models' files: "
                              f"docs/deploy.md, \"Memory\"): the pod may be OOM-killed; leave --memory out to "
                              f"write the estimate"]
    # the command writes the value given and prints the warning
    out = tmp_path / "isvc.yaml"
    result = cli(str(three), "--storage-uri", "gs://m/zoo", "--image", IMAGE, "--memory", "0.25Gi", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(out.read_text())["spec"]["predictor"]["model"]["resources"]["limits"]["memory"] == "0.25Gi"
    assert f"--memory 0.25Gi is below the {estimate} estimated" in " ".join(result.stderr.split())
    # without --memory the command writes the estimate, and has nothing to warn about
    result = cli(str(three), "--storage-uri", "gs://m/zoo", "--image", IMAGE, "--out", str(out))
    assert result.returncode == 0 and "warning" not in result.stderr, result.stderr
    assert yaml.safe_load(out.read_text())["spec"]["predictor"]["model"]["resources"]["limits"]["memory"] == estimate


def test_refusals_name_the_cause(repository, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(repository, broken)
    with open(broken / "resnet8.digits.onnxruntime.fp32" / "1" / "model.onnx", "ab") as f:
        f.write(b"\0")
    (tmp_path / "empty").mkdir()
    results = run(call("kserve_manifest", repository, "gs://m/zoo", gpus=0),
                  call("kserve_manifest", repository, "gs://m/zoo", name="Zoo_Models"),
                  call("kserve_manifest", repository, str(repository)),  # a local path means nothing on a cluster
                  call("kserve_manifest", repository, "gs://m/zoo", protocol="grpc"),
                  call("kserve_manifest", repository, "gs://m/zoo", memory="2GB"),
                  call("kserve_manifest", tmp_path / "empty", "gs://m/zoo"),
                  # a modified file: Triton would leave that model UNAVAILABLE on the cluster
                  call("kserve_manifest", broken, "gs://m/zoo"))
    expected = [("UnsupportedError", "artifact ppo.cartpole.onnxruntime.fp32 was exported for CUDA and needs a GPU"),
                ("UsageError", "--name 'Zoo_Models' is not a valid InferenceService name"),
                ("UsageError", "KServe's storage initializer reads gs://"),
                ("UsageError", "--protocol 'grpc': choose v2 or grpc-v2"),
                ("UsageError", "--memory '2GB' is not a Kubernetes quantity"),
                ("ArtifactError", "holds no artifacts: export some with `zoo export` first"),
                ("ArtifactError", "file 1/model.onnx does not match its sha256")]
    for got, (kind, text) in zip(results, expected):
        assert got.get("error") == kind and text in got["message"], got
    result = cli(str(broken), "--storage-uri", "gs://m/zoo")  # one line, nothing written
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.startswith("error: artifact resnet8.digits.onnxruntime.fp32: file 1/model.onnx does not "
                                    "match its sha256")


@pytest.mark.parametrize("option, value, says", [
    ("--namespace", "Bad Name!", "--namespace 'Bad Name!' is not a valid namespace (a DNS-1123 label)"),
    ("--namespace", "ml\n", "--namespace 'ml\\n' is not a valid namespace"),
    ("--storage-uri", "gs://", "--storage-uri 'gs://' names no bucket, claim or host after gs://"),
    ("--storage-uri", "s3:///zoo", "--storage-uri 's3:///zoo' names no bucket, claim or host after s3://"),
    ("--storage-uri", "gs://m/zoo\nkind: Pod", "holds spaces or control characters"),
    ("--image", "evil\nkind: Pod", "--image 'evil\\nkind: Pod' is not a valid image reference"),
    ("--image", "registry.example/zoo:a:b", "is not a valid image reference"),
    ("--runtime-version", "24.08 py3", "--runtime-version '24.08 py3' is not a valid image tag"),
    # KServe serves NAME as NAME-predictor-NAMESPACE.DOMAIN, a DNS label (kserve/kserve#4807, #4208)
    ("--name", "a" * 54, f"--name '{'a' * 54}' is 54 characters, over 53: KServe serves it as "
                         f"{'a' * 54}-predictor-NAMESPACE.DOMAIN"),
    ("--runtime", "Bad Name", "--runtime 'Bad Name' is not a ServingRuntime name"),
    ("--cpu", "0", "--cpu 0: give at least 1m"),
    ("--memory", "0", "--memory 0 is 0 bytes, less than the 48Mi tritonserver holds"),
    ("--memory", "0.5", "--memory 0.5 is 0.5 bytes, less than the 48Mi tritonserver holds before any model loads: "
                        "give a unit"),
    # a plain http(s) URI is one file to the storage initializer: only an archive of the repository works
    ("--storage-uri", "https://example.com/zoo", "KServe downloads an http(s) URI as one file"),
    ("--storage-uri", "gs://m/zoo?generation=1", "holds ?: the storage initializer would read it as part of the "
                                                 "object path"),
    ("--storage-uri", "https://example.com/zoo.tar.gz#top", "holds #"),
])
def test_values_kubernetes_would_reject_are_refused_in_one_line(repository, option, value, says):
    args = {"--storage-uri": "gs://m/zoo", option: value}
    result = cli(str(repository), *[part for pair in args.items() for part in pair])
    assert result.returncode != 0 and result.stdout == ""  # nothing written
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], result.stderr


@pytest.mark.parametrize("quantity, amount", [
    ("1e3", 1e3), ("1E3", 1e3), ("1.5e-3", 1.5e-3), ("2e+0", 2),  # a decimal exponent
    ("1E", 1e18), ("1Pi", 2 ** 50), ("+2", 2), ("1.", 1), ("500m", 0.5), ("2Gi", 2 ** 31),
])
def test_every_form_of_a_kubernetes_quantity_is_read(quantity, amount):
    """Kubernetes' grammar: <signedNumber><suffix>, the suffix binary SI, decimal SI, or
    e/E and a signed integer; `--cpu 1e3` was refused as not a quantity."""
    from zoo.deploy import quantity_bytes

    assert quantity_bytes(quantity) == pytest.approx(amount)


def test_a_cpu_with_a_decimal_exponent_is_written_as_given(repository):
    result, = run(call("kserve_manifest", repository, "gs://m/zoo", cpu="1e3"))
    assert result["ok"][0]["spec"]["predictor"]["model"]["resources"]["limits"]["cpu"] == "1e3", result


def test_directories_triton_would_load_are_named(repository, tmp_path):
    root = tmp_path / "models"
    shutil.copytree(repository, root)
    (root / "notes").mkdir()
    (result,) = run(call("kserve_manifest", root, "gs://m/zoo"))
    assert result["ok"][1] == ["Triton loads every directory of the repository, and notes is not a zoo artifact: "
                               "remove it before copying the repository to gs://m/zoo"]
    # hidden ones too: a replaced artifact's old copy left by an interrupted export made
    # Triton fail its start ("failed to load all models", --exit-on-error being its default)
    (root / "notes").rmdir()
    shutil.copytree(repository / "resnet8.digits.onnxruntime.fp32", root / ".resnet8.digits.onnxruntime.fp32.old-1a2b3c4d")
    (result,) = run(call("kserve_manifest", root, "gs://m/zoo"))
    assert result["ok"][1] == ["Triton loads every directory of the repository, and .resnet8.digits.onnxruntime.fp32"
                               ".old-1a2b3c4d is not a zoo artifact: remove it before copying the repository to "
                               "gs://m/zoo"]


def test_the_sdk_reading_refuses_what_kserve_would_drop_or_reject(repository):
    (built,) = run(call("kserve_manifest", repository, "gs://m/zoo"))
    manifest = built["ok"][0]
    typo = json.loads(json.dumps(manifest))
    typo["spec"]["predictor"]["model"]["storageURI"] = typo["spec"]["predictor"]["model"].pop("storageUri")
    portless = json.loads(json.dumps(manifest))
    portless["spec"]["predictor"]["model"]["ports"] = [{"name": "h2c"}]
    wrong_type = json.loads(json.dumps(manifest))
    wrong_type["spec"]["predictor"]["model"]["resources"]["limits"] = ["cpu"]
    typo_r, portless_r, wrong_r = run(call("parse_manifest", typo), call("parse_manifest", portless),
                                      call("parse_manifest", wrong_type))
    assert typo_r["message"] == ("InferenceService.spec.predictor.model: V1beta1ModelSpec has no field "
                                 "storageURI")
    assert portless_r["message"].startswith("InferenceService.spec.predictor.model.ports[0]:")
    assert "containerPort" in portless_r["message"]
    assert wrong_r["message"].startswith("InferenceService.spec.predictor.model.resources.limits: a mapping "
                                         "was expected")


def test_the_name_leaves_room_for_the_predictor_and_namespace(repository, tmp_path):
    long_name = tmp_path / ("m" * 70)
    long_name.mkdir()
    shutil.copytree(repository / "resnet8.digits.onnxruntime.fp32", long_name / "resnet8.digits.onnxruntime.fp32")
    longest, too_long, in_ml, default, default_ml = run(
        call("kserve_manifest", repository, "gs://m/zoo", name="a" * 53),
        call("kserve_manifest", repository, "gs://m/zoo", name="a" * 51, namespace="ml"),
        call("kserve_manifest", repository, "gs://m/zoo", name="a" * 50, namespace="ml"),
        call("default_name", long_name), call("default_name", long_name, "ml"))
    assert longest["ok"][0]["metadata"]["name"] == "a" * 53  # a-...-predictor: 63 characters
    assert too_long["message"].startswith(f"--name '{'a' * 51}' is 51 characters, over 50: KServe serves it as "
                                          f"{'a' * 51}-predictor-ml.DOMAIN, whose first label may have at most 63")
    assert in_ml["ok"][0]["metadata"] == {"name": "a" * 50, "namespace": "ml"}
    assert (default["ok"], default_ml["ok"]) == ("m" * 53, "m" * 50)


def test_storage_uris_kserve_reads_as_a_repository_are_accepted(repository):
    uris = ("https://example.com/zoo.tar.gz", "https://example.com/download?file=zoo.zip",
            "https://account.blob.core.windows.net/models/zoo", "https://account.file.core.windows.net/share/zoo")
    for uri, result in zip(uris, run(*(call("kserve_manifest", repository, uri) for uri in uris))):
        assert result["ok"][0]["spec"]["predictor"]["model"]["storageUri"] == uri, result


def test_runtime_version_with_an_image_is_refused_naming_the_image_kserve_would_run(repository):
    refused, digest, runtime = run(
        call("kserve_manifest", repository, "gs://m/zoo", image="registry.example/zoo:0.1",
             runtime_version="24.08-py3"),
        call("kserve_manifest", repository, "gs://m/zoo", image="registry.example/zoo@sha256:" + "a" * 64,
             runtime_version="24.08-py3"),
        call("kserve_manifest", repository, "gs://m/zoo", runtime="kserve-tritonserver", runtime_version="24.08-py3"))
    # KServe's UpdateImageTag replaces the last ":..." of the image (a tag, or a digest's hex)
    assert "so the pod would run registry.example/zoo:24.08-py3; give the tag in --image" in refused["message"]
    assert "would run registry.example/zoo@sha256:24.08-py3" in digest["message"]
    assert runtime["ok"][0]["spec"]["predictor"]["model"]["runtime"] == "kserve-tritonserver"


def test_an_out_that_cannot_be_written_is_a_usage_error_before_any_work(repository, tmp_path):
    (tmp_path / "afile").write_text("")
    for out, says in ((tmp_path, f"cannot write --out {tmp_path}: it is a directory; name the file to write, "
                                 f"e.g. {tmp_path / 'isvc.yaml'}"),
                      (tmp_path / "afile" / "isvc.yaml", f"cannot write --out {tmp_path / 'afile' / 'isvc.yaml'}: "
                                                         f"{tmp_path / 'afile'} is not a directory")):
        result = cli(str(repository), "--storage-uri", "gs://m/zoo", "--out", str(out))
        assert result.returncode == 2 and result.stdout == "", result.stderr
        assert result.stderr.strip().splitlines() == [f"error: {says}"]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing left behind


def test_a_namespace_that_leaves_no_room_for_a_name_is_refused_naming_its_limit(repository):
    """NAME-predictor-NAMESPACE is one DNS label: a namespace of over 51 characters leaves no
    room for a name; the default name was cut to nothing and the error named a --name never given."""
    for namespace in ("n" * 52, "n" * 60):
        result = cli(str(repository), "--storage-uri", "gs://m/zoo", "--namespace", namespace)
        assert result.returncode == 2 and result.stdout == "", result.stderr
        assert result.stderr.strip().splitlines() == [
            f"error: --namespace '{namespace}' is {len(namespace)} characters, over 51: KServe serves an "
            f"InferenceService as NAME-predictor-{namespace}.DOMAIN, whose first label may have at most 63 "
            f"characters, so the namespace leaves no room for a name"]
    longest, = run(call("kserve_manifest", repository, "gs://m/zoo", namespace="n" * 51))
    assert longest["ok"][0]["metadata"] == {"name": "z", "namespace": "n" * 51}  # "zoo-models0" cut to 1


# KServe's storage initializer (kserve_storage.Storage.download): http(s) URIs match `https?://(.+)/(.+)`
# and are one file, unpacked when `mimetypes` reads an archive from its path (or query); hf:// is
# ORG/MODEL[:REVISION]; Azure URIs are CONTAINER/PREFIX (`_parse_azure_uri`)
@pytest.mark.parametrize("uri, says", [
    ("https://host.tar.gz", "names no file to download: the storage initializer downloads an http(s) URI"),
    ("https://example.com/", "names no file to download"),
    ("https://example.com/?file=zoo.zip", "names no file to download"),
    ("http://h/x.TAR.GZ", "give the archive's extension in lower case"),
    ("https://example.com/zoo.tar.Z", "KServe downloads an http(s) URI as one file"),
    ("https://example.com/get.json?file=zoo.zip", "KServe downloads an http(s) URI as one file"),
    ("hf://org", "hf:// URIs name ORG/MODEL[:REVISION]"),
    ("hf://org/model/sub", "hf:// URIs name ORG/MODEL[:REVISION]"),
    ("hf://org/", "hf:// URIs name ORG/MODEL[:REVISION]"),
    ("hf://org/:main", "hf:// URIs name ORG/MODEL[:REVISION]"),
    ("https://acct.blob.core.windows.net/container", "names no container and path: Azure URIs are "
                                                      "https://ACCOUNT.blob.core.windows.net/CONTAINER/PATH"),
])
def test_storage_uris_the_storage_initializer_cannot_read_are_refused(repository, uri, says):
    refused, = run(call("kserve_manifest", repository, uri))
    assert refused.get("error") == "UsageError" and says in refused["message"], refused
    assert refused["message"].startswith(f"--storage-uri {uri!r}")


def test_archives_and_uris_the_storage_initializer_reads_are_accepted(repository):
    uris = ("https://example.com/zoo.tar.bz2", "https://example.com/zoo.tar.xz", "https://example.com/zoo.tbz2",
            "https://example.com/zoo.txz", "https://example.com/a/zoo.tar", "hf://org/model", "hf://org/model:abc123",
            "https://acct.blob.core.windows.net/container/", "https://acct.z12.blob.storage.azure.net/models/zoo")
    for uri, result in zip(uris, run(*(call("kserve_manifest", repository, uri) for uri in uris))):
        assert result["ok"][0]["spec"]["predictor"]["model"]["storageUri"] == uri, result


def test_an_out_inside_the_repository_is_refused(repository, tmp_path):
    """The manifest written into an artifact makes `zoo verify` and serving refuse it (a file its
    manifest does not list); one in a new directory of the repository is a directory Triton loads."""
    art = repository / "resnet8.digits.onnxruntime.fp32"
    (tmp_path / "link").symlink_to(repository)
    inside_art, new_dir, top, linked, outside, stdout = run(
        call("check_out", art / "isvc.yaml", repository),
        call("check_out", repository / "new" / "isvc.yaml", repository),
        call("check_out", repository / "isvc.yaml", repository),
        call("check_out", tmp_path / "link" / "isvc.yaml", repository),
        call("check_out", tmp_path / "isvc.yaml", repository), call("check_out", "-", repository))
    assert inside_art == {"error": "UsageError", "message": f"cannot write --out {art / 'isvc.yaml'}: it is inside "
                          f"the repository {repository}, which is copied whole to the storage Triton reads (a file "
                          f"in an artifact fails its check, a new directory is a model Triton fails to load); "
                          f"write it outside"}
    for refused in (new_dir, top, linked):
        assert refused.get("error") == "UsageError" and "inside the repository" in refused["message"], refused
    assert outside == stdout == {"ok": None}
    assert not (repository / "new").exists() and not (art / "isvc.yaml").exists()


def test_a_memory_below_the_native_floor_warns(repository):
    """A native form's memory is not measured: its floor, 2Gi, is what --memory is compared
    against, not the 128Mi estimate of its files."""
    small, between, floor = run(*(call("kserve_manifest", repository, "gs://m/zoo", memory=m)
                                  for m in ("256Mi", "1Gi", "2Gi")))
    for result, memory in ((small, "256Mi"), (between, "1Gi")):
        assert result["ok"][1] == [f"--memory {memory} is below the 2Gi written for a repository with native-form "
                                   f"artifacts, whose memory under Triton's native backends is not measured "
                                   f"(docs/deploy.md, \"Memory\"): the pod may be OOM-killed; leave --memory out "
                                   f"to write 2Gi"], result
    assert floor["ok"][1] == []


def test_a_triton_model_zoo_did_not_export_is_counted_as_its_config_says(repository, python_forms, tmp_path):
    """A hand-written Triton model (config.pbtxt and 1/model.onnx, no zoo.json) is served by Triton:
    the native floor applies, and the warning says zoo checks nothing of it (zoo serve skips it)."""
    (_, ort2, _) = python_forms[1]
    root = tmp_path / "models"
    shutil.copytree(ort2.path, root / ort2.name)
    own = root / "resnet8.digits.onnxruntime.fp32"
    shutil.copytree(repository / own.name, own)
    (own / "zoo.json").unlink()
    # a Python-backend one: a stub of its own, whose imports zoo does not know (counted as torch's)
    python_root = tmp_path / "python-models"
    shutil.copytree(ort2.path, python_root / ort2.name)
    (python_root / "echo" / "1").mkdir(parents=True)
    (python_root / "echo" / "config.pbtxt").write_text('name: "echo"\nbackend: "python"\n')
    (python_root / "echo" / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    echo_mib = sum(f.stat().st_size for f in (python_root / "echo").rglob("*") if f.is_file()) / 2 ** 20
    native, python = run(call("kserve_manifest", root, "gs://m/zoo", image=IMAGE),
                         call("kserve_manifest", python_root, "gs://m/zoo", image=IMAGE))
    manifest, warnings = native["ok"]
    assert manifest["spec"]["predictor"]["model"]["resources"]["limits"]["memory"] == NATIVE_FLOOR
    assert warnings == [f"{own.name} holds a config.pbtxt and no zoo.json: Triton serves it as its config.pbtxt "
                        f"says (platform onnxruntime_onnx), unchecked by zoo (a zoo artifact whose copy was cut short "
                        f"lacks zoo.json too: copy it again); its memory is counted as a native form's"]
    manifest, warnings = python["ok"]
    expected = quantity(SERVER_MIB + LIGHT_LIBRARIES_MIB + LIGHT_STUB_MIB + FILES_FACTOR * files_mib(ort2)
                        + TORCH_LIBRARIES_MIB + TORCH_STUB_MIB + FILES_FACTOR * echo_mib)
    assert manifest["spec"]["predictor"]["model"]["resources"]["limits"]["memory"] == expected
    assert warnings == ["echo holds a config.pbtxt and no zoo.json: Triton serves it as its config.pbtxt says "
                        "(backend python), unchecked by zoo (a zoo artifact whose copy was cut short lacks zoo.json "
                        "too: copy it again); its memory is counted as an unmeasured Python stub's"]


@pytest.mark.parametrize("option, value, says", [
    ("--cpu", "1Gi", "--cpu 1Gi: Gi is a suffix for bytes; give CPUs as a number or in thousandths, e.g. 2 or 500m"),
    ("--cpu", "1e999", "--cpu 1e999 is not a finite amount"),
    ("--memory", "1e999", "--memory 1e999 is not a finite amount"),
    ("--cpu", "2k", "--cpu 2k is 2000 CPUs, over 1024"),
    ("--memory", "100Ei", "--memory 100Ei is over 64Ti"),
    ("--memory", "47Mi", "--memory 47Mi is 49283072 bytes, less than the 48Mi"),
])
def test_resources_past_any_machine_are_refused(repository, option, value, says):
    result = cli(str(repository), "--storage-uri", "gs://m/zoo", option, value)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {says}"), result.stderr


TRITONSERVER = Path(__file__).resolve().parents[1] / "tools" / "tritonserver.py"


def test_triton_polls_hidden_directories_and_the_script_says_why_one_is_no_model(repository, tmp_path):
    """The warning's claim, held against the real tritonserver 2.51 (`make triton`): a hidden
    directory is polled as any other (a stale `.NAME.old-…` copy fails: its config names another
    model), and tools/tritonserver.py prints why a directory is no model, where it printed "None"."""
    sys.path.insert(0, str(TRITONSERVER.parent))
    from tritonserver import free_port, unavailable_reason

    if reason := unavailable_reason():
        pytest.skip(f"no Triton server: {reason}")
    helped = subprocess.run([sys.executable, str(TRITONSERVER), "--help"], capture_output=True, text=True, timeout=60)
    assert "then stop tritonserver and its Python stubs (docs/deploy.md)." in " ".join(helped.stdout.split())
    root = tmp_path / "models"
    stale = root / ".resnet8.digits.onnxruntime.fp32.old-1a2b3c4d"
    shutil.copytree(repository / "resnet8.digits.onnxruntime.fp32", stale)
    (root / "notes").mkdir()
    proc = subprocess.Popen([sys.executable, str(TRITONSERVER), str(root), "--http-port", str(free_port()),
                             "--grpc-port", str(free_port()), "--log", str(tmp_path / "triton.log")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            if line.startswith("Triton serving"):
                break
            lines.append(line.rstrip("\n"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert lines == [f"{stale.name}: not a model Triton can load: unexpected directory name '{stale.name}' for model "
                     f"'resnet8.digits.onnxruntime.fp32', directory name must equal model name",
                     "notes: not a model Triton can load: Invalid model name: Could not determine backend for model "
                     "'notes' with no backend in model configuration. Expected model name of the form "
                     "'model.<backend_name>'."]


def test_out_inside_the_repository_is_refused_and_a_dash_is_stdout(repository, tmp_path):
    art = repository / "resnet8.digits.onnxruntime.fp32"
    for out in (art / "isvc.yaml", repository / "new" / "isvc.yaml"):
        result = cli(str(repository), "--storage-uri", "gs://m/zoo", "--out", str(out))
        assert result.returncode == 2 and result.stdout == "", result.stderr
        assert result.stderr.strip().splitlines() == [f"error: cannot write --out {out}: it is inside the repository "
                                                      f"{repository}, which is copied whole to the storage Triton "
                                                      f"reads (a file in an artifact fails its check, a new directory "
                                                      f"is a model Triton fails to load); write it outside"]
    assert not (repository / "new").exists() and not (art / "isvc.yaml").exists()
    result = subprocess.run([sys.executable, "-m", "zoo", "deploy", "kserve", str(repository), "--storage-uri",
                             "gs://m/zoo", "--out", "-"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            env={k: v for k, v in os.environ.items() if k not in ("ZOO_PLUGINS", "ZOO_DEBUG")})
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["kind"] == "InferenceService"
    assert list(tmp_path.iterdir()) == []  # no file named -

"""Bad arguments to the public API: each a typed error naming what was wrong, before any
work, and never data lost to one (found by a tester). Small models, `random_init` exports,
no server: the client's tests answer through an httpx mock transport, which runs the
client's real request and response code."""

from __future__ import annotations

import importlib
import json
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

import zoo
from zoo.checkpoint import load_checkpoint
from zoo.client import Client
from zoo.errors import CheckpointError, InputError, StaleArtifactError, UsageError
from zoo.serve.protocol import HEADER_LENGTH, encode_request
from zoo.training.options import TrainOptions


class Mlp(torch.nn.Module):
    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 2))

    def forward(self, x):
        return self.net(x)


MLP = zoo.ModelSpec(
    name="mlp.api-errors", domain="tabular", task="regression",
    inputs=(zoo.TensorSpec("x", "float32", ("batch", 4)),), outputs=(zoo.TensorSpec("y", "float32", ("batch", 2)),),
    build=Mlp, sample=lambda batch, rng: {"x": rng.standard_normal((batch, 4)).astype(np.float32)},
    axes={"batch": zoo.AxisRange(1, 4, 8)})


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    """MLP exported for torch while registered, then unregistered."""
    zoo.register(MLP)
    try:
        return zoo.export(MLP.name, "torch", repository=tmp_path_factory.mktemp("repo"), random_init=True).path
    finally:
        zoo.unregister(MLP.name)


def checkpoint() -> zoo.Checkpoint:
    return zoo.Checkpoint(MLP.name, {}, Mlp().state_dict())


# -- Checkpoint.save replaces a checkpoint, nothing else ------------------------------


def test_a_checkpoint_replaces_an_empty_folder_or_a_checkpoint_and_nothing_else(tmp_path):
    folder = tmp_path / "userdata"
    (folder / "sub").mkdir(parents=True)
    (folder / "notes.txt").write_text("precious")
    with pytest.raises(CheckpointError, match=rf"cannot save a checkpoint to {folder}: it holds notes.txt, sub, "
                                              r"which saving would delete"):
        checkpoint().save(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt", "sub"]
    assert (folder / "notes.txt").read_text() == "precious"
    (tmp_path / "a file").write_text("x")
    with pytest.raises(CheckpointError, match="exists and is not a directory"):
        checkpoint().save(tmp_path / "a file")

    ckpt, other = checkpoint(), checkpoint()
    (tmp_path / "empty").mkdir()
    assert load_checkpoint(ckpt.save(tmp_path / "empty")).sha256 == ckpt.sha256
    first = ckpt.save(tmp_path / "new" / "ckpt")
    other.save(first)  # replaced: it held only a checkpoint
    assert load_checkpoint(first).sha256 == other.sha256 != ckpt.sha256


def test_saving_over_a_run_directory_or_its_resume_point_is_refused_and_training_still_saves(tmp_path):
    spec = zoo.get_model("resnet8.digits").tiny()
    out = tmp_path / "run"
    ckpt = zoo.train(spec, out=out, epochs=1, progress=False, options=TrainOptions(max_steps=1, tensorboard=False))
    held = sorted(p.name for p in out.iterdir())
    with pytest.raises(CheckpointError, match=rf"it holds {', '.join(held)}, .*\(a run directory: its checkpoint "
                                              rf"is {out / 'model'}\)"):
        ckpt.save(out)
    with pytest.raises(CheckpointError, match="training.json"):  # the resume point's optimizer and RNG state
        ckpt.save(out / "last")
    assert sorted(p.name for p in out.iterdir()) == held and (out / "last" / "training.json").is_file()
    # the run's own saves: model/ replaced on a resumed run, last/ rewritten
    zoo.train(spec, out=out, epochs=1, progress=False, options=TrainOptions(max_steps=2, tensorboard=False,
                                                                            resume=True))
    assert load_checkpoint(out).path == out / "model" and (out / "last" / "training.json").is_file()
    assert ckpt.save(out / "model") == out / "model"


def test_a_run_whose_model_or_last_folder_holds_other_files_is_refused_before_training(tmp_path, monkeypatch):
    (tmp_path / "run" / "model").mkdir(parents=True)
    (tmp_path / "run" / "model" / "notes.txt").write_text("the user's")
    monkeypatch.setattr(importlib.import_module("zoo.train"), "fit", None)  # training would fail: the refusal comes first
    with pytest.raises(CheckpointError, match=r"it holds notes.txt, which saving would delete"):
        zoo.train(zoo.get_model("resnet8.digits").tiny(), out=tmp_path / "run", epochs=1, progress=False)
    assert (tmp_path / "run" / "model" / "notes.txt").read_text() == "the user's"
    (tmp_path / "run" / "model" / "notes.txt").rename(tmp_path / "run" / "notes.txt")
    (tmp_path / "run" / "last").mkdir()
    (tmp_path / "run" / "last" / "data.csv").write_text("the user's")
    with pytest.raises(CheckpointError, match=r"last holds data.csv, which the run's resume point would replace"):
        zoo.train(zoo.get_model("resnet8.digits").tiny(), out=tmp_path / "run", epochs=1, progress=False)
    assert (tmp_path / "run" / "last" / "data.csv").read_text() == "the user's"


# -- verify: weights that no longer fit the registered model ----------------------------


def test_verify_with_a_wider_model_registered_under_the_same_name_is_a_stale_artifact(artifact):
    zoo.register(replace(MLP, build=lambda: Mlp(hidden=32)))  # the same name and signature, hidden width 32
    try:
        with pytest.raises(StaleArtifactError, match=r"the artifact's weights do not fit mlp.api-errors as registered "
                                                     r"now \(size mismatch for net.0.weight.*\): re-export it"):
            zoo.verify(artifact)
    finally:
        zoo.unregister(MLP.name)


# -- predict: one str or bytes is one item ---------------------------------------------


def text_spec(seen: list) -> zoo.ModelSpec:
    """A text model whose preprocessing records the items it is given."""

    def preprocess(items):
        seen.append(list(items))
        return {"x": np.zeros((len(items), 4), np.float32)}

    return replace(MLP, name="mlp.text", raw_kind="text", preprocess=preprocess,
                   postprocess=lambda outputs: [{"n": 1} for _ in outputs["y"]])


def test_predict_takes_a_lone_str_or_bytes_as_one_item():
    seen: list = []
    spec = text_spec(seen)
    fn = lambda inputs: {"y": np.zeros((len(inputs["x"]), 2), np.float32)}  # noqa: E731
    assert zoo.predict(spec, fn, "hello world") == [{"n": 1}]
    assert zoo.predict(spec, fn, "héllo".encode()) == [{"n": 1}]
    assert zoo.predict(spec, fn, ["a", b"b"]) == [{"n": 1}, {"n": 1}]
    assert seen == [[b"hello world"], ["héllo".encode()], [b"a", b"b"]]
    with pytest.raises(InputError, match="item 2 is int, not str or bytes"):
        zoo.predict(spec, fn, ["a", 7])  # was a buffer of seven zero bytes
    with pytest.raises(InputError, match="items is a list of str or bytes inputs, not NoneType"):
        zoo.predict(spec, fn, None)


# -- the client: what it sends -----------------------------------------------------------


def mock_client(requests: list) -> Client:
    """A client whose server is a function: metadata of a model of one FP32 input x that
    also takes x as domain-native items (as tests/raw_kind_plugin.py's "waveform"), and an
    answer of one JSON result per item."""

    def answer(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(200, json={
                "name": "m", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
                "zoo": {"domain_native": {"kind": "x", "outputs": ["result"], "max_items": 8}}})
        end = int(request.headers.get(HEADER_LENGTH, len(request.content)))
        head = json.loads(request.content[:end])
        requests.append(head)
        (sent,) = head["inputs"]
        outputs = [{"name": "result", "datatype": "BYTES", "shape": sent["shape"][:1],
                    "data": ['{"n": 1}'] * sent["shape"][0]}]
        return httpx.Response(200, json={"model_name": "m", "outputs": outputs})

    client = Client("http://zoo.test")
    client.http = httpx.Client(base_url="http://zoo.test", transport=httpx.MockTransport(answer))
    return client


def test_client_predict_takes_a_lone_str_as_one_item():
    requests: list = []
    with mock_client(requests) as client:
        assert client.predict("m", "hello world") == [{"n": 1}]
        assert client.predict("m", b"\x89PNG") == [{"n": 1}]
        with pytest.raises(InputError, match="item 1 is float"):
            client.predict("m", [0.5])
    assert [(r["inputs"][0]["shape"], r["inputs"][0]["datatype"]) for r in requests] == [([1], "BYTES")] * 2


def test_client_infer_sends_a_list_of_numbers_as_the_model_declares_it():
    requests: list = []
    with mock_client(requests) as client:
        client.infer("m", {"x": np.ones((1, 2), np.float32).tolist()})
    (sent,) = requests[0]["inputs"]
    assert (sent["name"], sent["shape"], sent["datatype"]) == ("x", [1, 2], "FP32")  # not numpy's FP64


def test_the_request_encoder_takes_tensors_and_lists_and_names_what_it_cannot():
    def sent(value, **kwargs) -> dict:
        body, headers = encode_request({"x": value}, **kwargs)
        end = int(headers.get(HEADER_LENGTH, len(body)))
        entry = json.loads(body[:end])["inputs"][0]
        return {"shape": entry["shape"], "datatype": entry["datatype"], "data": body[end:] or entry["data"]}

    floats = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert sent(floats.tolist()) == {"shape": [2, 3], "datatype": "FP64", "data": floats.astype(np.float64).tobytes()}
    assert sent(floats.tolist(), datatypes={"x": "FP32"})["data"] == floats.tobytes()
    assert sent(floats.tolist(), binary=False)["data"] == floats.reshape(-1).tolist()
    assert sent(torch.from_numpy(floats).requires_grad_()) == {"shape": [2, 3], "datatype": "FP32",
                                                               "data": floats.tobytes()}
    assert sent([[1, 2]])["datatype"] == "INT64"
    assert sent(["a", b"b"])["datatype"] == "BYTES"
    for bad, says in ((None, "input 'x' is NoneType"), (3.5, "input 'x' is float"),
                      ([[1.0], [2.0, 3.0]], "neither numbers of one shape"), (["a", 1], "neither numbers"),
                      (np.array([["a", 1]], dtype=object), "input 'x': item 2 is int")):
        with pytest.raises(InputError, match=says):
            encode_request({"x": bad})


# -- devices and threads -------------------------------------------------------------------


def test_an_unknown_device_is_the_same_usage_error_for_train_and_predict(tmp_path):
    spec = zoo.get_model("resnet8.digits").tiny()
    says = r"unknown device 'gpu': cpu or cuda\[:N\]"
    with pytest.raises(UsageError, match=says):
        zoo.train(spec, out=tmp_path / "run", epochs=1, progress=False, device="gpu")
    with pytest.raises(UsageError, match=says):
        TrainOptions().check_device("gpu")  # as `zoo train --nproc` checks it
    with pytest.raises(UsageError, match=says):
        zoo.predictor(model="resnet8.digits", device="gpu")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("threads", [0, -1, "2", 1.5, True])
def test_a_thread_count_that_is_not_a_positive_int_is_a_usage_error(artifact, threads):
    says = rf"threads must be a positive integer or None, got {threads!r}"
    with pytest.raises(UsageError, match=says):
        zoo.load(artifact, threads=threads)
    with pytest.raises(UsageError, match=says):
        zoo.verify(artifact, threads=threads)


def test_export_refuses_a_bad_model_or_repository_before_any_work(tmp_path):
    with pytest.raises(UsageError, match="model is a registered name or a zoo.ModelSpec, not None"):
        zoo.export(None, "torch", repository=tmp_path)
    (tmp_path / "a file").write_text("x")
    for repository in (tmp_path / "a file", tmp_path / "a file" / "below"):
        with pytest.raises(UsageError, match=rf"repository {repository}: {tmp_path / 'a file'} is a file"):
            zoo.export(MLP, "torch", repository=repository, random_init=True)
    with pytest.raises(UsageError, match="threads must be a positive integer"):
        zoo.export(MLP, "torch", repository=tmp_path / "repo", random_init=True, threads=0)
    assert not (tmp_path / "repo").exists()


def test_a_torch_artifact_sets_the_process_wide_thread_count_only_when_it_differs(artifact, monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    zoo.load(artifact, threads=torch.get_num_threads())
    zoo.load(artifact)
    assert calls == []
    zoo.load(artifact, threads=torch.get_num_threads() + 1)
    assert calls == [torch.get_num_threads() + 1]
    assert "process" in zoo.load.__doc__ and "torch.set_num_threads" in zoo.load.__doc__


def test_an_error_whose_first_line_only_introduces_the_next_keeps_both():
    from zoo.errors import first_line

    # torch.compile's: the cause was lost ("backend='inductor' raised:; the torch backend runs it eagerly")
    raised = RuntimeError("backend='inductor' raised:\nInternalTorchDynamoError: KeyError: u0\n\nSet TORCH_LOGS=...")
    assert first_line(raised) == "backend='inductor' raised: InternalTorchDynamoError: KeyError: u0"
    assert first_line(ValueError("shape mismatch\n  at line 3")) == "shape mismatch"
    assert first_line(ValueError("")) == "ValueError"


@pytest.mark.parametrize(("repository", "words"), [
    ("/proc/zoo-repo", "repository /proc/zoo-repo: "), ("", "repository must name a directory, not ''")])
def test_an_export_to_a_repository_it_cannot_write_is_refused_before_its_work(repository, words, monkeypatch):
    """The API checked the repository after building and checking the module (then a raw
    FileNotFoundError from /proc), where the command line refuses it at once; "" wrote the
    artifact into the current directory, unsaid."""
    def never(*args, **kwargs):
        raise AssertionError("the export started its work")

    monkeypatch.setattr(importlib.import_module("zoo.export"), "reference_module", never)
    with pytest.raises(UsageError, match=words):
        zoo.export(MLP, "onnxruntime", repository=repository, random_init=True)


def test_a_name_pattern_that_is_not_a_str_is_a_usage_error():
    with pytest.raises(UsageError, match="a model name pattern is a str"):
        zoo.list_models(123)

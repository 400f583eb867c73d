"""The `zoo` command as a user meets it: every bad input gets one clear line on stderr
and a non-zero exit, never a traceback; the read-only commands print what scripts parse.

The CLI runs in a subprocess (`python -m zoo`), in an empty working directory, so exit
codes, stderr and the default `exports/` and `checkpoints/` paths are real. Artifacts
are exported once per module through the Python API, from the tiny variant of
`resnet8.digits` at random init, and copied into each test that tampers with one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import zoo
from zoo.errors import ArtifactError, BackendUnavailableError, UnknownModelError, UnsupportedError, ZooError
from zoo.fsutil import sha256_file

MODEL = "resnet8.digits"
ARTIFACT = f"{MODEL}.onnxruntime.fp32"


@pytest.fixture
def zoo_cli(tmp_path):
    """Run `python -m zoo ARGS` in an empty directory with a clean plugin environment."""
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("ZOO_DEBUG", "ZOO_PLUGINS")}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "zoo", *args], cwd=workdir, env=env,
                              capture_output=True, text=True, timeout=300)

    run.cwd = workdir
    return run


@pytest.fixture
def fails(zoo_cli):
    """Run the CLI, expect a user error; return its one-line message (without "error: ")."""

    def run(*args: str) -> str:
        result = zoo_cli(*args)
        assert result.returncode != 0, f"zoo {' '.join(args)} succeeded:\n{result.stdout}"
        assert "Traceback" not in result.stderr
        lines = result.stderr.strip().splitlines()
        # "error:" is a ZooError; "internal error:" would mean an untyped failure leaked
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        return lines[0].removeprefix("error: ")

    return run


def succeeds(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


# ---------------------------------------------------------------- read-only commands


def test_list_json(zoo_cli):
    rows = json.loads(succeeds(zoo_cli("list", "--json")))
    assert [r["name"] for r in rows] == zoo.list_models()
    digits = next(r for r in rows if r["name"] == MODEL)
    assert digits["domain"] == "vision" and digits["task"] == "image-classification"
    assert digits["inputs"] == [{"name": "image", "dtype": "float32", "shape": ["batch", 1, 8, 8]}]
    assert digits["plugin"] == "zoo-vision (vision)"  # built-in plugins come through entry points too
    assert all("parameters" not in r for r in rows)  # listing builds no model; `zoo info` counts them


def test_info_json(zoo_cli):
    info = json.loads(succeeds(zoo_cli("info", "resnet18", "--json")))
    assert info["name"] == "resnet18"
    assert info["inputs"] == [{"name": "image", "dtype": "float32", "shape": ["batch", 3, 224, 224]}]
    assert info["outputs"] == [{"name": "logits", "dtype": "float32", "shape": ["batch", 1000]}]
    assert info["axes"]["batch"] == [1, 8, 256]
    assert info["parameters"] == 11_689_512  # the standard ResNet-18 (torchvision's count)
    assert info["recipe"] is None and info["dataset"] is None


def test_backends_json_lists_every_backend_and_says_why_not(zoo_cli):
    rows = json.loads(succeeds(zoo_cli("backends", "--json")))
    assert {r["backend"] for r in rows} == set(zoo.registry.backends())
    onnxruntime_cpu = next(r for r in rows if (r["backend"], r["device"]) == ("onnxruntime", "cpu"))
    assert onnxruntime_cpu["available"] and onnxruntime_cpu["precisions"] == ["fp32", "int8"]
    for row in rows:
        assert row["available"] or row["reason"], f"{row['backend']} on {row['device']} is unavailable without a reason"
    tensorrt = [r for r in rows if r["backend"] == "tensorrt"]
    assert tensorrt and all(r["device"] == "cuda" for r in tensorrt)
    if not zoo.get_backend("tensorrt").probe("cuda").ok:
        assert all(not r["available"] and "tensorrt" in r["reason"].lower() for r in tensorrt)


def table_rows(text: str) -> list[list[str]]:
    """The body rows of a rich table: cells split on the box-drawing bar, wrapped
    continuation lines (an empty first cell) dropped."""
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]
    return [row for row in rows if row[0]]


def test_backends_table_for_cuda(zoo_cli):
    rows = table_rows(succeeds(zoo_cli("backends", "--device", "cuda")))
    assert sorted(row[0] for row in rows) == sorted(zoo.registry.backends())
    assert all(row[1] == "cuda" for row in rows)
    if not torch.cuda.is_available():
        assert all(row[2] == "no" and row[5] for row in rows)  # not available, and a reason why
        assert "cuda" in next(row for row in rows if row[0] == "torch")[5].lower()


# ---------------------------------------------------------------- bad requests


def test_unknown_model(fails):
    message = fails("info", "nosuch.model")
    assert "unknown model 'nosuch.model'" in message and "zoo list" in message


@pytest.mark.parametrize("args", [("info", "resnet8.nosuch"), ("export", "resnet8.nosuch", "-b", "onnxruntime"),
                                  ("bench", "resnet8.nosuch"), ("bench", "nosuch*"), ("list", "resnet8.nosuch"),
                                  ("list", "nosuch*"), ("check", "resnet8.nosuch")])
def test_an_unknown_model_is_a_usage_error_in_every_command(args, tmp_path, monkeypatch, capsys):
    """An unknown model name exits 2, as any usage error does (README), with the one line
    naming the close matches; in process, through `main`'s own exit-code mapping."""
    from zoo.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["zoo", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1, lines
    assert ("did you mean resnet8.digits" if args[1] == "resnet8.nosuch" else "no model matches") in lines[0]


@pytest.mark.parametrize("name", ["resnet8.nosuch", "resnt8.digits", "resnet8.digit"])
def test_unknown_model_suggests_close_names(name):
    with pytest.raises(UnknownModelError, match="did you mean resnet8.digits"):
        zoo.get_model(name)


def test_unknown_backend(fails):
    message = fails("export", "resnet18", "--backend", "nosuch", "--random-init")
    assert "unknown backend 'nosuch'" in message and "onnxruntime" in message


def test_backend_that_does_not_run_on_the_device(fails):
    message = fails("export", "resnet18", "--backend", "tensorrt", "--random-init")
    assert "tensorrt" in message and "cpu" in message


@pytest.mark.skipif(zoo.get_backend("tensorrt").probe("cuda").ok, reason="TensorRT can run here")
def test_backend_not_available_here(fails, repository):
    message = fails("export", "resnet18", "--backend", "tensorrt", "--device", "cuda", "--random-init",
                    "--repository", str(repository))
    assert "cannot run on cuda here" in message and "tensorrt" in message.lower()
    assert not repository.exists()  # refused before anything was written


@pytest.mark.parametrize("backend", ["onnxruntime", "torch"])
def test_export_refuses_cuda_without_cuda(backend, repository):
    if zoo.get_backend(backend).probe("cuda").ok:
        pytest.skip(f"{backend} can run on CUDA here")
    with pytest.raises(BackendUnavailableError, match=f"backend {backend} cannot run on cuda here"):
        zoo.export("resnet18", backend, device="cuda", repository=repository, random_init=True)
    assert not repository.exists()


def test_precision_the_backend_does_not_support(fails):
    message = fails("export", "resnet18", "--backend", "onnxruntime", "--precision", "fp16", "--random-init")
    assert "does not support fp16 on cpu" in message and "fp32" in message


@pytest.mark.parametrize("backend, precision, device, says", [
    ("onnxruntime", "fp32", "tpu", "does not run on tpu"),
    ("torch", "int8", "cpu", "does not support int8 on cpu"),
    ("tensorrt", "fp32", "cpu", "does not run on cpu"),
])
def test_export_refuses_what_the_backend_does_not_support(backend, precision, device, says, repository):
    with pytest.raises(UnsupportedError, match=says):
        zoo.export("resnet18", backend, precision, device, repository=repository, random_init=True)


def test_missing_checkpoint_points_to_zoo_train(fails, zoo_cli):
    message = fails("export", MODEL, "--backend", "onnxruntime", "--repository", "exports")
    assert f"zoo train {MODEL}" in message and "--random-init" in message
    assert list(zoo_cli.cwd.iterdir()) == []  # no half artifact, no empty repository


@pytest.mark.parametrize("sizes, says", [
    ("1,x", "--batch-sizes: expected whole numbers separated by commas, got '1,x'"),
    ("65", "batch sizes [65] are outside resnet8.digits's exported range 1..64"),
])
def test_bench_bad_batch_sizes(fails, sizes, says):
    assert says in fails("bench", MODEL, "--batch-sizes", sizes, "--random-init")


@pytest.mark.parametrize("sizes", [[0], [-1], [1, 65]])
def test_benchmark_refuses_batch_sizes_outside_the_range(sizes, repository):
    with pytest.raises(ZooError, match="outside resnet8.digits's exported range 1..64"):
        zoo.benchmark(MODEL, ["onnxruntime"], sizes, repository=repository, random_init=True)
    assert not repository.exists()


def test_benchmark_refuses_no_batch_sizes(repository):
    # "nosuch" keeps today's behaviour cheap: the export fails at once and is reported
    # as a failed row, instead of the empty list being refused up front
    with pytest.raises(ZooError, match="batch size"):
        zoo.benchmark(MODEL, ["nosuch"], [], repository=repository)


def test_long_error_message_stays_on_one_line(fails, tmp_path):
    fails("verify", str(tmp_path / ("a" * 150) / ("b" * 100)))


def test_missing_artifact(tmp_path):
    with pytest.raises(ArtifactError, match="no artifact directory"):
        zoo.Artifact.open(tmp_path / "nothing-here")


# ---------------------------------------------------------------- tampered artifacts


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    repository = tmp_path_factory.mktemp("exports")
    art = zoo.export(zoo.get_model(MODEL).tiny(), "onnxruntime", repository=repository, random_init=True)
    return art.path


@pytest.fixture
def artifact(exported, tmp_path) -> Path:
    """A private copy of the exported artifact, to tamper with."""
    return Path(shutil.copytree(exported, tmp_path / "repo" / ARTIFACT, symlinks=True))


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def edit_manifest(artifact: Path, **changes) -> None:
    manifest = json.loads((artifact / "zoo.json").read_text())
    for key, change in changes.items():
        manifest[key] = change(manifest[key]) if callable(change) else change
    (artifact / "zoo.json").write_text(json.dumps(manifest))


def test_verify_accepts_the_untouched_artifact(zoo_cli, artifact):
    assert "verified" in succeeds(zoo_cli("verify", str(artifact)))


def test_verify_refuses_a_corrupted_model_file(fails, artifact):
    flip_byte(artifact / "1" / "model.onnx")
    message = fails("verify", str(artifact))
    assert "1/model.onnx" in message and "sha256" in message


@pytest.mark.parametrize("member", ["1/model.onnx", "weights.safetensors", "config.pbtxt"])
def test_any_corrupted_file_is_refused_on_open(artifact, member):
    flip_byte(artifact / member)
    with pytest.raises(ArtifactError, match="sha256"):
        zoo.Artifact.open(artifact)


def test_incomplete_or_unreadable_manifest(artifact):
    (artifact / "zoo.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="unreadable"):
        zoo.Artifact.open(artifact)
    (artifact / "zoo.json").unlink()
    with pytest.raises(ArtifactError, match="incomplete"):
        zoo.Artifact.open(artifact)


def outside_file(artifact: Path, name: str = "outside") -> tuple[Path, str]:
    """A real file beside the artifact, and its sha256, so a manifest can name it with a
    hash that matches: escaping must be refused for escaping, not for a bad hash."""
    path = artifact.parent / name
    shutil.copy(artifact / "1" / "model.onnx", path)
    return path, sha256_file(path)


def escape_files_dotdot(artifact: Path) -> None:
    _, digest = outside_file(artifact)
    edit_manifest(artifact, files=lambda files: {**files, "../outside": digest})


def escape_model_file_dotdot(artifact: Path) -> None:
    _, digest = outside_file(artifact)
    edit_manifest(artifact, model_file="../outside", files=lambda files: {**files, "../outside": digest})


def escape_files_absolute(artifact: Path) -> None:
    path, digest = outside_file(artifact)
    edit_manifest(artifact, files=lambda files: {**files, str(path): digest})


def escape_model_file_absolute(artifact: Path) -> None:
    # even an absolute path that points back inside: manifests name members relatively
    inside = str((artifact / "1" / "model.onnx").resolve())
    edit_manifest(artifact, model_file=inside, files=lambda files: {**files, inside: files["1/model.onnx"]})


def symlinked_model_file(artifact: Path) -> None:
    # a link to a byte-identical file outside: the hash matches, the link must not
    path, _ = outside_file(artifact)
    (artifact / "1" / "model.onnx").unlink()
    (artifact / "1" / "model.onnx").symlink_to(path)


def symlinked_version_directory(artifact: Path) -> None:
    outside = artifact.parent / "outside-version-dir"
    shutil.move(artifact / "1", outside)
    (artifact / "1").symlink_to(outside, target_is_directory=True)


ESCAPES = "escapes the artifact directory"
SYMLINK = "is a symbolic link, which is refused"


@pytest.mark.parametrize("tamper, refusal", [
    pytest.param(tamper, refusal, id=tamper.__name__) for tamper, refusal in [
        (escape_files_dotdot, ESCAPES),
        (escape_model_file_dotdot, ESCAPES),
        (escape_files_absolute, ESCAPES),
        (escape_model_file_absolute, ESCAPES),
        (symlinked_model_file, SYMLINK),
        (symlinked_version_directory, SYMLINK),
    ]])
def test_manifest_paths_cannot_escape_the_artifact(artifact, tamper, refusal):
    tamper(artifact)
    with pytest.raises(ArtifactError, match=refusal):
        zoo.Artifact.open(artifact)
    with pytest.raises(ArtifactError, match=refusal):
        zoo.load(artifact)


def test_verify_refuses_an_escaping_artifact(fails, artifact):
    escape_model_file_dotdot(artifact)
    assert f"manifest path '../outside' {ESCAPES}" in fails("verify", str(artifact))


def test_train_with_a_config_override(zoo_cli, fails):
    assert "needs --out" in fails("train", MODEL, "--config", "width=8", "--epochs", "1")
    assert "KEY=VALUE" in fails("train", MODEL, "--config", "width", "--out", "c")
    assert "unknown config ['depth']" in fails("train", MODEL, "--config", "depth=4", "--out", "c")
    result = zoo_cli("train", MODEL, "--config", "width=8", "--epochs", "1", "--out", "small")
    assert result.returncode == 0, result.stderr
    assert zoo.load_checkpoint(zoo_cli.cwd / "small", MODEL).config == {"width": 8}
    assert not (zoo_cli.cwd / "checkpoints").exists()


def test_train_refuses_an_unusable_out_before_training(zoo_cli, fails):
    (zoo_cli.cwd / "afile").write_text("")
    assert fails("train", MODEL, "--out", "afile", "--epochs", "1") == "--out afile: exists and is not a directory"
    assert fails("train", MODEL, "--out", "afile/run", "--epochs", "1") == "--out afile/run: afile is not a directory"
    assert sorted(p.name for p in zoo_cli.cwd.iterdir()) == ["afile"]  # nothing trained, nothing written


BENCH_WORKER_INTERRUPTED = """
import multiprocessing, os, signal, time
from zoo.bench.measure import run_in_child

def interrupted(job):
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C reaches the whole process group
    time.sleep(5)

ctx = multiprocessing.get_context("fork")
for parent_gone in (False, True):
    receive, send = ctx.Pipe(duplex=False)
    if parent_gone:  # the parent, interrupted too, closed its end first
        receive.close()
    proc = ctx.Process(target=run_in_child, args=(send, interrupted, {}))
    proc.start()
    send.close()
    proc.join()
    print(proc.exitcode)
"""


def test_a_bench_worker_interrupted_by_ctrl_c_exits_quietly():
    """The parent reports Ctrl-C (exit 130); its workers add no traceback, whether or not
    the parent has closed the pipe they answer on."""
    result = subprocess.run([sys.executable, "-c", BENCH_WORKER_INTERRUPTED], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and result.stdout.split() == ["130", "130"]


@pytest.mark.parametrize("command", [["generate", "gpt.pydoc", "-p", "hi"], ["predict", MODEL, "d.png"]])
def test_no_checkpoint_names_what_predict_and_generate_accept(fails, command):
    """They have no --random-init: untrained weights reach them as an artifact."""
    message = fails(*command)
    assert f"run `zoo train {command[1]}` first, pass --checkpoint DIR, or run untrained weights with --artifact" \
           in message and f"`zoo export {command[1]} -b onnxruntime --random-init`" in message


def test_predict_labels_each_file_result_by_its_path(zoo_cli, exported, tmp_path):
    from PIL import Image

    for name, shade in (("dark.png", 0), ("light.png", 255)):
        Image.new("L", (8, 8), shade).save(zoo_cli.cwd / name)
    lines = succeeds(zoo_cli("predict", "-", "-a", str(exported), "dark.png", "--image", "./light.png")).splitlines()
    assert [line.split(": ", 1)[0] for line in lines] == ["./light.png", "dark.png"]  # --image first, then items


def test_generate_bounds_max_new_tokens_by_the_models_context(zoo_cli, fails):
    spec = zoo.get_model("gpt.pydoc").tiny()
    zoo.Checkpoint(spec.name, dict(spec.config), spec.build().state_dict()).save(zoo_cli.cwd / "gpt")
    context = spec.axes["seq"].max
    for n in (context + 1, 100000):
        assert fails("generate", spec.name, "-p", "hi", "--checkpoint", "gpt", "-n", str(n)) == \
            f"--max-new-tokens must be from 1 to {context} (gpt.pydoc's context), got {n}"
    # usage errors (exit 2, as SettingError says), the count before the model is loaded
    for option, value, said in (("-n", "0", "--max-new-tokens must be at least 1, got 0"),
                                ("--temperature", "inf", "--temperature must be a finite number >= 0, got inf")):
        result = zoo_cli("generate", spec.name, "-p", "hi", "--checkpoint", "gpt", option, value)
        assert result.returncode == 2 and result.stderr.strip() == f"error: {said}", result.stderr
    longest = zoo_cli("generate", spec.name, "-p", "hi", "--checkpoint", "gpt", "-n", str(context))
    assert succeeds(longest).startswith("hi")


@pytest.mark.parametrize("command", [["check", "resnet8.digits"], ["export", "resnet8.digits", "-b", "onnxruntime"]])
def test_random_init_with_a_checkpoint_is_refused_not_ignored(command, tmp_path, monkeypatch, capsys):
    """--random-init asks for untrained weights and --checkpoint for trained ones: the
    checkpoint used to win silently (the artifact said "checkpoint ..."); now one line, exit 2."""
    from zoo.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["zoo", *command, "--checkpoint", str(tmp_path / "run"), "--random-init",
                                      "-r" if command[0] == "export" else "--precision",
                                      "out" if command[0] == "export" else "fp32"])
    with pytest.raises(SystemExit) as exit_:
        main()
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1, lines
    assert "--random-init and --checkpoint" in lines[0] and "give one" in lines[0]
    assert not (tmp_path / "out").exists()

"""Usage errors exit 2 in every command, with one line, before any work: a name no run can
know (backend, precision, device, int8 method, Triton form), a repository that is a file or
cannot be written, a --compare baseline that is not there. `zoo export`, `zoo bench` and
`zoo serve` through `zoo.cli.main`, as a user runs them (`zoo optimize`'s are in
test_optimize_usage.py). Also: the docs' `zoo optimize` examples and `zoo bench` columns
match what the commands do, and `zoo optimize` calls a gap noise only where the noise can
tell one."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import zoo
import zoo.optimize
from zoo import cli

ROOT = Path(__file__).resolve().parents[1]


def run_cli(tmp_path, monkeypatch, capsys, *args: str) -> tuple[int, list[str], str]:
    """`zoo ARGS` in `tmp_path` (with a regular file `afile` in it): exit code, stderr lines, stdout."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    monkeypatch.setattr(sys, "argv", ["zoo", *args])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    captured = capsys.readouterr()
    return exited.value.code, captured.err.strip().splitlines(), captured.out


EXPORT = ["export", "resnet8.digits", "--random-init"]


@pytest.mark.parametrize("args, message", [
    (["-b", "nosuch"], "--backend: unknown backend 'nosuch'; registered: onnxruntime"),
    (["-b", "onnxruntime", "--precision", "int4"], "--precision: unknown 'int4'; choose from fp32"),
    (["-b", "onnxruntime", "--device", "tpu"], "--device: unknown 'tpu'; choose from cpu"),
    (["-b", "onnxruntime", "--precision", "int8", "--quantization", "weird"],
     "--quantization: unknown 'weird'; choose static or dynamic"),
    (["-b", "onnxruntime", "--quantization", "dynamic"], "--quantization dynamic applies to int8 exports, not fp32"),
    (["-b", "onnxruntime", "--triton", "bogus"], "--triton: unknown 'bogus'; choose native or python"),
    (["-b", "onnxruntime", "-r", "afile"], "--repository afile: exists and is not a directory"),
    (["-b", "onnxruntime", "-r", "/proc/zz"], "--repository /proc/zz: /proc is not writable"),
    (["-b", "onnxruntime", "--triton-parameter", "enable_mem_arena"], "--triton-parameter takes KEY=VALUE"),
    (["-b", "onnxruntime", "--triton-parameter", "a b=1"], "Triton parameter key 'a b'"),
    (["-b", "onnxruntime", "--triton-parameter", 'k="x"'], "Triton parameter k: the value must be"),
])
def test_export_refuses_a_request_no_export_can_do_with_exit_2(tmp_path, monkeypatch, capsys, args, message):
    code, lines, _ = run_cli(tmp_path, monkeypatch, capsys, *EXPORT, *args)
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {message}"), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing exported, no repository made


BENCH = ["bench", "resnet8.digits", "--random-init", "--backends", "onnxruntime", "--batch-sizes", "1",
         "--min-time", "0.05", "--report-dir", "rep"]


@pytest.mark.parametrize("args, message", [
    (["-r", "afile"], "--repository afile: exists and is not a directory"),
    (["-r", "/proc/zz"], "--repository /proc/zz: /proc is not writable"),
    (["--compare", "nonexist.json"], "--compare: no benchmark report at nonexist.json"),
])
def test_bench_refuses_a_repository_or_baseline_it_cannot_use_before_the_run(tmp_path, monkeypatch, capsys, args,
                                                                             message):
    code, lines, _ = run_cli(tmp_path, monkeypatch, capsys, *BENCH, *args)
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {message}"), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # no report, no export


@pytest.mark.parametrize("command", [["train", "--out", "o"], ["check", "--random-init"]])
@pytest.mark.parametrize("pair, message", [
    # "internal error: not all arguments converted during string formatting", and "out_channels must be divisible
    # by groups" for 16.5: the value reached the plugin's build as given
    ("width=abc", "model resnet8.digits: config width takes an int (32 here), got 'abc'"),
    ("width=16.5", "model resnet8.digits: config width takes an int (32 here), got 16.5"),
    ("width=true", "model resnet8.digits: config width takes an int (32 here), got True"),
    ("nosuch=1", "model resnet8.digits: unknown config ['nosuch']; known: ['width']"),
])
def test_a_config_value_of_the_wrong_type_or_key_is_a_usage_error_in_every_command(tmp_path, monkeypatch, capsys,
                                                                                   command, pair, message):
    code, lines, _ = run_cli(tmp_path, monkeypatch, capsys, command[0], "resnet8.digits", *command[1:],
                             "--config", pair)
    assert code == 2 and lines == [f"error: {message}"], (code, lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.parametrize("command", [["train", "--out", "o"], ["check", "--random-init"]])
def test_a_config_pair_without_a_key_is_a_usage_error_in_every_command(tmp_path, monkeypatch, capsys, command):
    code, lines, _ = run_cli(tmp_path, monkeypatch, capsys, command[0], "resnet8.digits", *command[1:],
                             "--config", "width")
    assert code == 2 and lines == ["error: --config takes KEY=VALUE, got 'width'"], (code, lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.parametrize("args", [["export", "mlp8.mine", "-b", "onnxruntime", "--plugin", "my_models.py"],
                                  ["list", "--plugin=my_models.py"]])
def test_plugin_after_the_command_says_where_it_goes(tmp_path, monkeypatch, capsys, args):
    """`--plugin` is the `zoo` command's own option: after a subcommand, click says only
    "No such option: --plugin"; the line says where it goes."""
    code, lines, _ = run_cli(tmp_path, monkeypatch, capsys, *args)
    want = f"error: --plugin goes before the command: zoo --plugin my_models.py {args[0]} ..."
    assert code == 2 and lines == [want], lines


@pytest.mark.parametrize("args, code, message", [
    (["--device", "gpu"], 2, "--device: unknown 'gpu'; choose from cpu"),
    (["--precision", "FP32"], 2, "--precision: unknown 'FP32'; choose from fp32"),
    (["--precision", "int9"], 2, "--precision: unknown 'int9'; choose from fp32"),
])
def test_check_refuses_a_device_or_precision_nothing_knows_with_exit_2(tmp_path, monkeypatch, capsys, args, code,
                                                                        message):
    """An unknown device was an internal error; an unknown precision passed ("meets its spec")."""
    got, lines, _ = run_cli(tmp_path, monkeypatch, capsys, "check", "resnet8.digits", "--random-init", *args)
    assert got == code and len(lines) == 1 and lines[0].startswith(f"error: {message}"), lines


def test_check_on_cuda_without_cuda_is_the_machines_error(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, lines, _ = run_cli(tmp_path, monkeypatch, capsys, "check", "resnet8.digits", "--random-init",
                             "--device", "cuda")
    assert code == 1 and lines == ["error: --device cuda: CUDA is not available here (torch.cuda.is_available() is "
                                   "False); check on cpu"], lines


def test_check_refuses_a_config_its_checkpoint_was_not_trained_at(tmp_path, monkeypatch, capsys):
    """`-c width=8 --checkpoint DIR` of a width=32 checkpoint checked the width=32 model and
    said it met its spec."""
    from zoo import registry

    spec = registry.get_model("resnet8.digits")
    zoo.Checkpoint(spec.name, dict(spec.config), spec.build().state_dict()).save(tmp_path / "ckpt")
    code, lines, _ = run_cli(tmp_path, monkeypatch, capsys, "check", "resnet8.digits", "-c", "width=8",
                             "--checkpoint", "ckpt")
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: --config width=8 disagrees with --checkpoint ckpt, trained with width=32"), lines


def test_serve_says_a_repository_that_is_a_file_is_one(tmp_path, monkeypatch, capsys):
    code, lines, _ = run_cli(tmp_path, monkeypatch, capsys, "serve", "afile", "--port", "0", "--grpc-port", "0")
    assert code == 2 and len(lines) == 1, lines
    assert "afile is a file, not a directory" in lines[0] and "export a model first" not in lines[0]


@pytest.mark.parametrize("args, message", [
    (["--request-timeout", "0"], "--request-timeout must be a finite number > 0, got 0.0"),
    (["--request-timeout", "-1"], "--request-timeout must be a finite number > 0, got -1.0"),
    (["--request-timeout", "nan"], "--request-timeout must be a finite number > 0, got nan"),
    (["--max-queue-delay-ms", "nan"], "--max-queue-delay-ms must be a finite number >= 0, got nan"),
    (["--max-queue-delay-ms", "inf"], "--max-queue-delay-ms must be a finite number >= 0, got inf"),
    (["--max-queue-delay-ms", "-1"], "--max-queue-delay-ms must be a finite number >= 0, got -1.0"),
    (["--shutdown-timeout", "-5"], "--shutdown-timeout must be a finite number >= 0, got -5.0"),
    (["--shutdown-timeout", "inf"], "--shutdown-timeout must be a finite number >= 0, got inf"),
    (["--log-level", "bogus"], "--log-level: unknown 'bogus'; choose from debug, info, warning, error, critical"),
])
def test_serve_refuses_a_time_or_log_level_no_request_can_be_served_under(tmp_path, monkeypatch, capsys, args,
                                                                           message):
    """Each of these started a server that broke every request (or an internal error)."""
    (tmp_path / "repo").mkdir()
    code, lines, _ = run_cli(tmp_path, monkeypatch, capsys, "serve", "repo", "--grpc-port", "0", *args)
    assert code == 2 and lines == [f"error: {message}"], lines


def test_serve_says_an_empty_repository_holds_nothing_to_serve(tmp_path, monkeypatch, capsys):
    """Nothing to serve and nothing that can be loaded later: refused at once, as a missing
    repository is, instead of a server that stays unready; with model control, artifacts
    exported there later can still be loaded, so it serves (tests/test_serve_lifecycle.py)."""
    (tmp_path / "empty" / "notes").mkdir(parents=True)
    code, lines, _ = run_cli(tmp_path, monkeypatch, capsys, "serve", "empty", "--port", "8000", "--grpc-port", "0")
    assert code == 1 and lines == [
        "error: no artifact in the model repository empty (notes: a directory without zoo.json): export a model "
        "into it first (`zoo export MODEL -b BACKEND -r empty`), or serve it with --model-control to load "
        "artifacts exported there later"], lines


# ---------------------------------------------------------------- the docs say what runs


def _optimize_examples() -> list[tuple[str, str]]:
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        found += [(doc.name, line) for line in re.findall(r"^\s*(zoo optimize .*)$", doc.read_text(), re.M)]
    return found


def test_the_docs_optimize_examples_bound_only_a_model_with_a_task_metric():
    """`--max-metric-drop` on a model without a task metric is refused (exit 2): an example
    giving it must name a model that has one, or it fails as written."""
    examples = _optimize_examples()
    assert examples
    for doc, line in examples:
        model = line.split()[2]
        if "--max-metric-drop" in line:
            assert zoo.get_model(model).metric is not None, f"{doc}: {line}"


def test_the_docs_describe_every_column_of_the_bench_table(capsys):
    """The columns `zoo bench` prints in the terminal are the ones docs/benchmarks.md explains."""
    from zoo.cli_bench import print_bench

    row = {"model": "m", "backend": "onnxruntime", "precision": "fp32", "device": "cpu", "batch": 1, "status": "ok",
           "p50_ms": 1.0, "p90_ms": 1.0, "p99_ms": 1.0, "throughput": 1.0}
    print_bench({"results": [row], "environment": {"cpu": "cpu"}, "models": ["m"]})
    header = next(line for line in capsys.readouterr().out.splitlines() if "backend" in line)
    columns = [c.strip() for c in re.split(r"[┃│|]", header) if c.strip()]
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    explained = docs[docs.index("The columns"):docs.index("**The regression gate.**")]
    for column in columns:
        name = re.sub(r" \(.*\)$", "", column)  # "size MB (10^6 B)": its unit
        assert name in explained, f"the terminal column {column!r} is not explained in docs/benchmarks.md"


# ---------------------------------------------------------------- optimize's noise wording


def test_optimize_calls_a_gap_noise_only_where_the_noise_can_tell(tmp_path, monkeypatch, capsys):
    """A gap within twice the measured noise says so (as the docs word the rule); where twice
    the noise is over 100 %, an 8x gap would pass as noise, so it is inconclusive instead."""
    real = zoo.optimize.benchmark

    def planted(*args, **kwargs):  # real candidates, with planted figures to judge
        report = real(*args, **kwargs)
        ok = [r for r in report["results"] if r["status"] == "ok"]
        assert len(ok) == 3, report["results"]
        for r, (p50, noise) in zip(ok, [(1.0, 0.0), (1.05, 0.049), (8.374, 356.314)]):
            r.update(p50_ms=p50, noise=noise)
        return report

    monkeypatch.setattr(zoo.optimize, "benchmark", planted)
    code, lines, out = run_cli(tmp_path, monkeypatch, capsys, "optimize", "resnet8.digits", "--random-init",
                               "--backends", "torch,onnxruntime,openvino", "--precisions", "fp32",
                               "--min-time", "0.05", "--json")
    assert code is None or code == 0, lines
    reasons = [c["reason"] for c in json.loads(out)["candidates"] if c["decision"] == "slower"]
    assert any("+5.0%), within twice the measured noise (2 x 4.9%)" in r for r in reasons), reasons
    inconclusive = next(r for r in reasons if "+737.4%" in r)
    assert "inconclusive: the measured noise (35631.4%) is too large" in inconclusive
    assert "within" not in inconclusive


#: a command line that needs no PyTorch: a usage error, a missing artifact, a client of a server
NO_TORCH = [
    (["export", "resnet8.digits", "-b", "nosuch", "--random-init"], 2, "--backend: unknown backend 'nosuch'"),
    (["export", "resnet8.digits", "-b", "onnxruntime", "--precision", "int9"], 2, "--precision: unknown 'int9'"),
    (["bench", "resnet8.digits", "--backends", "nosuch"], 2, "--backends: unknown 'nosuch'"),
    (["bench", "resnet8.digits", "--ray", "head:port"], 2, "--ray"),
    (["verify", "no-such-artifact"], 1, "no artifact directory at"),
    (["train", "nosuch"], 2, "unknown model 'nosuch'"),
    (["train", "resnet8.digits", "--epochs", "0"], 2, "--epochs must be at least 1, got 0"),
    (["train", "resnet8.digits", "--precision", "fp8"], 2, "unknown precision 'fp8' for training"),
    (["train", "resnet8.digits", "--out", "o", "-c", "width=8", "-c", "depth=3"], 2, "unknown config ['depth']"),
    (["predict", "resnet8.digits.onnxruntime.fp32", "--tensor", "image=x.npy", "--url", "http://127.0.0.1:1"], 1,
     "no answer from http://127.0.0.1:1"),
]


@pytest.mark.parametrize("args, code, message", NO_TORCH, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_what_needs_no_pytorch_is_answered_without_importing_it(tmp_path, args, code, message):
    """A mistyped name or a client call answers in a fraction of a second, not after PyTorch's
    2 s of import: `zoo` is run as a user runs it, in a fresh process, and says afterwards
    which modules it imported."""
    np.save(tmp_path / "x.npy", np.zeros((1, 1, 8, 8), np.float32))
    script = ("import runpy, sys\n"
              f"sys.argv = ['zoo', *{args!r}]\n"
              "try:\n"
              "    runpy.run_module('zoo', run_name='__main__')\n"
              "except SystemExit as exc:\n"
              "    code = exc.code\n"
              "print('exit', code, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert message in done.stderr, done.stderr
    assert done.stdout.split()[-3:] == ["exit", str(code), "False"], (done.stdout, done.stderr)


@pytest.mark.parametrize("device", ["gpu", "cuda:0", ""])
def test_backends_refuses_a_device_no_backend_offers(tmp_path, monkeypatch, capsys, device):
    """`zoo backends --device gpu` exited 0 with a row per backend saying "does not run on gpu",
    and `--device ''` listed every device."""
    code, err, out = run_cli(tmp_path, monkeypatch, capsys, "backends", "--device", device)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: --device: unknown {device!r}"), err
    assert "cpu" in err[0] and not out


@pytest.mark.parametrize("value, message", [
    ("0,-1", "--preferred-batch-sizes: batch sizes are at least 1, got -1"),
    ("1,,2", "--preferred-batch-sizes '1,,2' has an empty item"),
    ("x", "--preferred-batch-sizes: expected whole numbers separated by commas, got 'x'"),
    ("4,4", "--preferred-batch-sizes names 4 twice"),
    ("", "--preferred-batch-sizes is empty"),
])
def test_serve_refuses_preferred_batch_sizes_no_batcher_can_use(tmp_path, monkeypatch, capsys, value, message):
    """`0,-1` and `1,,2` started a server (the batcher dropped what it could not use) and
    `x` was an exit-1 error: all usage errors before the server starts."""
    (tmp_path / "repo").mkdir()
    code, lines, _ = run_cli(tmp_path, monkeypatch, capsys, "serve", "repo", "--grpc-port", "0",
                             "--preferred-batch-sizes", value)
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {message}"), lines


@pytest.mark.parametrize("args, message", [
    (["--backends", ""], "--backends is empty"),
    (["--backends", "onnxruntime,,torch"], "--backends 'onnxruntime,,torch' has an empty item"),
    (["--backends", "nosuch"], "unknown backend 'nosuch'"),
    (["--min-time", "0"], "--min-time must be a finite number > 0, got 0.0"),
    (["--min-time", "nan"], "--min-time must be a finite number > 0, got nan"),
])
def test_demo_refuses_its_options_before_it_trains(tmp_path, monkeypatch, capsys, args, message):
    """These were found after the training (or `--backends ''` ran every default backend)."""
    import zoo.demo

    def train(*a, **k):
        raise AssertionError("the demo trained: the option should have been refused first")

    monkeypatch.setattr(zoo.demo, "train", train)
    code, lines, _ = run_cli(tmp_path, monkeypatch, capsys, "demo", *args)
    assert code == 2 and len(lines) == 1 and message in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_optimize_refuses_an_empty_item_in_its_lists(tmp_path, monkeypatch, capsys):
    """`--backends onnxruntime,,torch` was read as two backends."""
    code, lines, _ = run_cli(tmp_path, monkeypatch, capsys, "optimize", "resnet8.digits", "--random-init",
                             "--backends", "onnxruntime,,torch")
    assert code == 2 and lines == ["error: --backends 'onnxruntime,,torch' has an empty item: separate the values "
                                   "with single commas"], lines


@pytest.mark.parametrize("value, shown", [("", False), ("0", False), ("false", False), ("off", False),
                                          ("1", True), ("yes", True)])
def test_zoo_debug_0_leaves_tracebacks_out_as_unset_does(tmp_path, monkeypatch, capsys, value, shown):
    """`ZOO_DEBUG=0` turned tracebacks on: any value counted."""
    def broken():
        raise RuntimeError("a failure no ZooError names")

    monkeypatch.setenv("ZOO_DEBUG", value)
    monkeypatch.setattr(cli, "app", broken)
    monkeypatch.setattr(sys, "argv", ["zoo", "list"])
    if shown:
        with pytest.raises(RuntimeError, match="a failure no ZooError names"):
            cli.main()
        return
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 1
    assert capsys.readouterr().err.strip() == ("internal error: a failure no ZooError names (set ZOO_DEBUG=1 for the "
                                               "traceback)")


def test_version_prints_the_installed_version_without_importing_pytorch(tmp_path):
    from importlib.metadata import version

    script = ("import runpy, sys\n"
              "sys.argv = ['zoo', '--version']\n"
              "try:\n"
              "    runpy.run_module('zoo', run_name='__main__')\n"
              "except SystemExit as exc:\n"
              "    print('exit', exc.code, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines() == [f"zoo {version('zoo')}", "exit 0 False"], (done.stdout, done.stderr)


@pytest.mark.parametrize("args, code, message", [
    (["--checkpoint", "nonexist"], 1, "no checkpoint at nonexist"),
    (["--checkpoint", "nonexist", "--random-init"], 2, "--random-init and --checkpoint nonexist name different weights"),
    (["--checkpoint", "nonexist", "--scenario", "singlestream"], 1, "no checkpoint at nonexist"),
    ([], 1, "no checkpoint for resnet8.digits at checkpoints/resnet8.digits: run `zoo train resnet8.digits` first"),
])
def test_bench_refuses_weights_every_combination_would_refuse_before_the_run(tmp_path, monkeypatch, capsys, args,
                                                                             code, message):
    """Each row of the run failed with this line, after a report directory was made."""
    monkeypatch.setattr("zoo.checkpoint.default_path", lambda model: Path("checkpoints") / model)
    code_, lines, _ = run_cli(tmp_path, monkeypatch, capsys, "bench", "resnet8.digits", "--backends", "onnxruntime",
                              "--batch-sizes", "1", "--min-time", "0.05", *args)
    assert code_ == code and len(lines) == 1 and lines[0].startswith(f"error: {message}"), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # no report, no export


@pytest.mark.parametrize("given, why", [("nosuch.py", "no such file"), ("afile", "not a .py file")])
def test_a_plugin_path_that_names_no_python_file_is_a_usage_error(tmp_path, monkeypatch, capsys, given, why):
    """`zoo --plugin /nonexistent.py list` warned and listed the models without it, exit 0:
    a path typed on the command line is a typo there (ZOO_PLUGINS, set once, still warns)."""
    code, lines, out = run_cli(tmp_path, monkeypatch, capsys, "--plugin", given, "list")
    assert code == 2 and lines == [f"error: --plugin {given}: {why}; a plugin file is a Python module (README.md, "
                                   f"\"Writing a model plugin\")"], lines
    assert not out

"""`zoo bench`'s lists and names as a new user types them: a value given twice, an empty
item, an empty option, a rate LoadGen could not schedule, a directory that is not an
artifact, and the Python API given a string or a number where a list goes. Each is
refused before anything runs (exit 2, naming the option), or taken as the CLI takes it."""

from __future__ import annotations


import pytest
from typer.testing import CliRunner

import zoo
from zoo.bench import matrix
from zoo.cli import app
from zoo.errors import UsageError

SPEC = zoo.get_model("resnet8.digits").tiny()


def usage_error(tmp_path, monkeypatch, *args: str) -> str:
    """`zoo bench ARGS` in tmp_path: the UsageError's message (exit 2), with nothing written."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["bench", *args])
    assert isinstance(result.exception, UsageError), (result.exception, result.output)
    assert result.exception.exit_code == 2
    assert not [p for p in tmp_path.iterdir() if p.name != "exports"], list(tmp_path.iterdir())
    return str(result.exception)


@pytest.mark.parametrize("args, message", [
    # measured twice, then --compare failed after the whole run ("measures ... twice")
    (["--batch-sizes", "2,2"], "--batch-sizes names 2 twice; give each value once"),
    (["--lengths", "16,16"], "--lengths names 16 twice"),
    (["--backends", "onnxruntime,onnxruntime"], "--backends names onnxruntime twice"),
    (["--precision", "fp32,fp32"], "--precision names fp32 twice"),
    (["--device", "cpu,cpu"], "--device names cpu twice"),
    (["--scenario", "offline,offline"], "--scenario names offline twice"),
    (["--scenario", "single-stream,singlestream"], "--scenario names singlestream twice"),
    # silently skipped
    (["--batch-sizes", "1,,2"], "--batch-sizes '1,,2' has an empty item"),
    (["--backends", "torch,,onnxruntime"], "--backends 'torch,,onnxruntime' has an empty item"),
    (["--backends", ","], "--backends ',' has an empty item"),
    # exited 1 with "name at least one model, backend, precision, device and batch size"
    (["--backends", ""], "--backends is empty: name at least one"),
    (["--precision", ""], "--precision is empty"),
    (["--device", ""], "--device is empty"),
    (["--batch-sizes", ""], "--batch-sizes is empty"),
])
def test_a_repeated_or_empty_item_is_refused_naming_the_option(tmp_path, monkeypatch, args, message):
    assert message in usage_error(tmp_path, monkeypatch, "resnet8.digits", *args)


def test_a_model_named_twice_is_refused(tmp_path, monkeypatch):
    assert "MODEL names resnet8.digits twice" in usage_error(tmp_path, monkeypatch, "resnet8.digits,resnet8.digits")


@pytest.mark.parametrize("args, message", [
    # LoadGen holds the whole schedule in memory: 5e8 queries grew past 20 GB with no output
    (["--target-qps", "1e9", "--min-time", "0.5"], "--target-qps 1e+09 for --min-time 0.5 s: LoadGen would schedule "
                                                   "500,000,000 queries and hold them all in memory"),
    (["--target-qps", "1e6"], "lower --target-qps to 200,000 or less, or --min-time"),  # the default 10 s
])
def test_a_server_rate_loadgen_could_not_schedule_is_refused(tmp_path, monkeypatch, args, message):
    found = usage_error(tmp_path, monkeypatch, "resnet8.digits", "--backends", "onnxruntime", "--scenario", "server",
                        *args)
    assert message in found, found


def test_the_largest_schedule_is_a_bound_on_queries():
    from zoo.bench.loadgen import MAX_SERVER_QUERIES, max_server_qps

    assert max_server_qps(10.0) * 10.0 == MAX_SERVER_QUERIES
    assert max_server_qps(0.5) == 2 * max_server_qps(1.0)


def test_a_repository_or_a_directory_inside_an_artifact_is_not_called_an_incomplete_artifact(tmp_path, monkeypatch):
    art = tmp_path / "exports" / "resnet8.digits.onnxruntime.fp32"
    (art / "1").mkdir(parents=True)
    (art / "zoo.json").write_text("{}")
    repository = usage_error(tmp_path, monkeypatch, "--artifact", "exports")
    assert repository.startswith("--artifact exports is a repository, not an artifact directory: name one of its "
                                 "artifacts: resnet8.digits.onnxruntime.fp32"), repository
    inside = usage_error(tmp_path, monkeypatch, "--artifact", "exports/resnet8.digits.onnxruntime.fp32/1")
    assert inside.startswith("--artifact exports/resnet8.digits.onnxruntime.fp32/1 is a directory inside the "
                             "artifact exports/resnet8.digits.onnxruntime.fp32"), inside
    typo = usage_error(tmp_path, monkeypatch, "--artifact", "resnet8.digits.onnxruntime.fp33")
    assert "did you mean resnet8.digits.onnxruntime.fp32?" in typo, typo


def test_help_says_what_scenario_does_to_batch_sizes_and_why_compare_is_refused_with_it(tmp_path, monkeypatch):
    import typer

    bench = typer.main.get_command(app).commands["bench"]
    text = next(p.help for p in bench.params if p.name == "batch_sizes")
    assert "with --scenario, one value: the most rows per execution, default 8" in text, text
    compare = usage_error(tmp_path, monkeypatch, "resnet8.digits", "--scenario", "offline", "--compare", "b.json")
    assert "LoadGen runs each combination at its own sizes" not in compare
    assert compare.startswith("--compare does nothing with --scenario: the regression gate compares the timed "
                              "benchmark's rows"), compare
    artifact = usage_error(tmp_path, monkeypatch, "--artifact", "x", "--scenario", "offline")
    assert artifact.startswith("--artifact does nothing with --scenario: LoadGen runs export each "
                               "combination"), artifact


@pytest.fixture
def no_processes(monkeypatch):
    """Every combination "measured" at once: what the API made of its arguments is what is tested."""
    monkeypatch.setattr(matrix, "combination", lambda job, timeout: ("failed", f"not run: {job['batch_sizes']}"))


def test_the_api_takes_a_string_as_one_name_or_a_comma_list_and_a_number_as_one_batch(tmp_path, no_processes):
    one = zoo.benchmark(SPEC, backends="onnxruntime", batch_sizes=1, repository=tmp_path, random_init=True)
    assert [(r["backend"], r["error"]) for r in one["results"]] == [("onnxruntime", "not run: [1]")]
    assert one["options"]["backends"] == ["onnxruntime"] and one["options"]["batch_sizes"] == [1]
    two = zoo.benchmark(SPEC, backends="torch, onnxruntime", batch_sizes="1,4", precision="fp32", repository=tmp_path,
                        random_init=True)
    assert [(r["backend"], r["error"]) for r in two["results"]] == [("torch", "not run: [1, 4]"),
                                                                   ("onnxruntime", "not run: [1, 4]")]


def test_the_api_takes_a_checkpoint_object_as_its_directory(tmp_path, monkeypatch):
    # before: the object's repr went to the workers as a path ("no checkpoint at Checkpoint(model=...")
    asked = []
    monkeypatch.setattr(matrix, "combination", lambda job, timeout: asked.append(job["checkpoint"]) or ("failed", ""))
    spec = zoo.get_model(SPEC.name)
    saved = zoo.Checkpoint(spec.name, dict(spec.config), spec.build().state_dict())
    saved.save(tmp_path / "ckpt")
    zoo.benchmark(spec, backends="onnxruntime", batch_sizes=1, repository=tmp_path, checkpoint=saved)
    assert asked == [str(tmp_path / "ckpt")]
    unsaved = zoo.Checkpoint(spec.name, dict(spec.config), spec.build().state_dict())
    with pytest.raises(zoo.ZooError, match=r"checkpoint: a Checkpoint that was never saved; save it "):
        zoo.benchmark(spec, backends="onnxruntime", batch_sizes=1, repository=tmp_path, checkpoint=unsaved)


@pytest.mark.parametrize("options, message", [
    (dict(backends=["nope"]), "--backends: unknown 'nope'; choose from "),  # was a failed row
    (dict(backends="onnxruntime,onnxruntime"), "--backends names onnxruntime twice"),
    (dict(backends=""), "--backends is empty"),
    (dict(batch_sizes=[]), "--batch-sizes is empty"),
    (dict(batch_sizes=[1, 1]), "--batch-sizes names 1 twice"),
    (dict(batch_sizes="one"), "--batch-sizes: expected whole numbers"),
    (dict(batch_sizes=1.5), "--batch-sizes: expected whole numbers"),
    (dict(device="cpu,,cpu"), "--device 'cpu,,cpu' has an empty item"),
])
def test_the_api_refuses_what_the_cli_refuses_with_the_same_error(tmp_path, no_processes, options, message):
    with pytest.raises(UsageError) as refused:
        zoo.benchmark(SPEC, **{"backends": ["onnxruntime"], **options}, repository=tmp_path)
    assert message in str(refused.value)


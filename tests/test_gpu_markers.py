"""On a GPU machine a skipped GPU test is a failure, with its reason (issue 17, finding 5):
tests/conftest.py's own hooks, run by pytester on a suite of its own with CUDA declared
present (the one line that asks torch is replaced), so a GPU run where onnxruntime-gpu or
TensorRT failed to install cannot be reported as passed."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import skip_is_failure

pytest_plugins = ["pytester"]
CONFTEST = Path(__file__).with_name("conftest.py").read_text()
ASKS_TORCH = "HAS_CUDA = torch.cuda.is_available()"


@pytest.mark.parametrize("keywords, cuda, trt, missing, fails", [
    ({"needs_cuda"}, True, False, set(), True),
    ({"needs_cuda"}, False, False, set(), False),            # a CPU machine: skips
    ({"needs_tensorrt"}, True, False, set(), True),           # TensorRT failed to install: fails
    ({"needs_tensorrt"}, True, False, {"tensorrt"}, False),   # declared missing (ZOO_GPU_MISSING): skips
    ({"needs_tensorrt"}, True, True, {"tensorrt"}, True),     # present, yet skipped: fails
    ({"slow"}, True, False, set(), False),                   # not a GPU test
])
def test_which_skips_fail(keywords, cuda, trt, missing, fails):
    assert skip_is_failure(keywords, cuda, trt, missing) is fails


def run(pytester, has_cuda: bool, *env: str):
    assert CONFTEST.count(ASKS_TORCH) == 1
    pytester.makeconftest(CONFTEST.replace(ASKS_TORCH, f"HAS_CUDA = {has_cuda}"))
    pytester.makeini("[pytest]\nmarkers =\n    needs_cuda: x\n    needs_tensorrt: x\n")
    pytester.makepyfile(test_inner=(
        "import pytest\n"
        "@pytest.mark.needs_cuda\n"
        "def test_gpu():\n"
        "    pytest.skip('onnxruntime-gpu: libcudnn.so.9 not found')\n"
        "@pytest.mark.needs_tensorrt\n"
        "def test_trt():\n"
        "    pass\n"
        "def test_cpu():\n"
        "    pytest.skip('not a GPU test')\n"))
    for item in env:
        key, value = item.split("=")
        pytester._monkeypatch.setenv(key, value)
    return pytester.runpytest_subprocess("-rA", "-p", "no:randomly")


def test_a_skipped_gpu_test_fails_with_its_reason_where_cuda_is(pytester):
    result = run(pytester, True)
    # a skip by a marker happens at setup, so that failure counts as an error: not passed either way
    result.assert_outcomes(failed=1, errors=1, skipped=1)
    result.stdout.fnmatch_lines(["*a GPU test skipped on a machine with CUDA: *onnxruntime-gpu: libcudnn.so.9 not found*"])
    result.stdout.fnmatch_lines(["*a GPU test skipped on a machine with CUDA: *needs TensorRT*"])


def test_tensorrt_declared_missing_skips_and_a_cpu_machine_skips_them_all(pytester):
    run(pytester, True, "ZOO_GPU_MISSING=tensorrt").assert_outcomes(failed=1, skipped=2)
    run(pytester, False).assert_outcomes(skipped=3)

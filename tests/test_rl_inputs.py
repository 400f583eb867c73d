"""The rl plugin's tensor inputs and config: observations that are not finite numbers are
refused on the tensor paths (the API's check, an artifact's runner, `zoo predict
--tensor`) as the observation items are, for every policy; and the policy width's range."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

import zoo
from zoo.errors import InputError, UsageError
from zoo.inputs import check_inputs

pytest.importorskip("zoo_rl")
import zoo_rl
from zoo_rl import envs

FLOAT32_MAX = float(np.finfo(np.float32).max)


def _observation(spec, value) -> np.ndarray:
    row = np.zeros((2, spec.inputs[0].shape[1]), np.float32)
    row[1, 0] = value
    return row


@pytest.mark.parametrize("model", ["ppo.cartpole", "ppo.pendulum"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_observation_tensor_is_refused(model, value):
    """CartPole's velocities are unbounded, so its input had no value_range and a NaN gave
    NaN logits (exit 0, HTTP 200), while the same observation as a JSON item was refused."""
    spec = zoo.get_model(model)
    with pytest.raises(InputError) as info:
        check_inputs({"observation": _observation(spec, value)}, spec, model)
    assert f"input 'observation' has value {np.float32(value)} at index [1, 0]" in str(info.value)
    with pytest.raises(InputError, match="not a JSON array of|not a finite float32 number"):  # as the item path says
        spec.preprocess([f"[{value}{', 0' * (spec.inputs[0].shape[1] - 1)}]".encode()])


def test_unbounded_dimensions_take_every_finite_float32():
    """An unbounded dimension's range is float32's own: every observation the space holds
    passes, and only NaN and the infinities are refused."""
    open_env = envs.Environment("CartPole-v1", obs_low=(-math.inf,) * 4, obs_high=(math.inf,) * 4, num_actions=2)
    spec = zoo_rl.policy_spec("ppo.open", open_env)
    assert spec.inputs[0].value_range == (-FLOAT32_MAX, FLOAT32_MAX)
    assert zoo.get_model("ppo.cartpole").inputs[0].value_range == (-FLOAT32_MAX, FLOAT32_MAX)
    assert zoo.get_model("ppo.pendulum").inputs[0].value_range == (-8.0, 8.0)  # finite bounds: as they were
    for value in (1e30, -FLOAT32_MAX, FLOAT32_MAX):
        check_inputs({"observation": _observation(spec, value)}, spec, "ppo.open")
    with pytest.raises(InputError, match="has value nan at index \\[1, 0\\]"):
        check_inputs({"observation": _observation(spec, math.nan)}, spec, "ppo.open")


@pytest.fixture(scope="module")
def cartpole_artifact(tmp_path_factory):
    from zoo.registry import backends

    if not backends()["onnxruntime"].probe("cpu").ok:
        pytest.skip("onnxruntime cannot run here")
    spec = zoo.get_model("ppo.cartpole").tiny()
    return zoo.export(spec, "onnxruntime", repository=tmp_path_factory.mktemp("exports"), random_init=True)


def test_an_artifact_refuses_a_nan_observation(cartpole_artifact, tmp_path):
    runner = zoo.load(cartpole_artifact.path)
    ok = runner({"observation": np.zeros((1, 4), np.float32)})
    assert np.isfinite(ok["logits"]).all()
    with pytest.raises(InputError, match="input 'observation' has value nan at index \\[0, 0\\]"):
        runner({"observation": np.array([[np.nan, 0, 0, 0]], np.float32)})

    path = tmp_path / "nan.npy"
    np.save(path, np.array([[np.nan, 0, 0, 0]], np.float32))
    cmd = [sys.executable, "-m", "zoo", "predict", "-", "--artifact", str(cartpole_artifact.path),
           "--tensor", f"observation={path}"]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == "", (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "input 'observation' has value nan at index [0, 0]" in lines[0]


def test_zoo_serve_refuses_a_nan_observation_over_http_and_grpc(cartpole_artifact, tmp_path):
    """Triton's clients send FP32 tensors in binary, where NaN is a value like any other:
    400 (gRPC INVALID_ARGUMENT) naming the input, and the server still live."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    from serve_support import ServerProcess

    server = ServerProcess(cartpole_artifact.path.parent, log=tmp_path / "server.log").wait_ready()
    try:
        name = cartpole_artifact.path.name
        for client, module in ((httpclient.InferenceServerClient(f"127.0.0.1:{server.port}"), httpclient),
                               (grpcclient.InferenceServerClient(server.grpc_url), grpcclient)):
            good = module.InferInput("observation", [1, 4], "FP32")
            good.set_data_from_numpy(np.zeros((1, 4), np.float32))
            assert np.isfinite(client.infer(name, [good]).as_numpy("logits")).all()
            bad = module.InferInput("observation", [1, 4], "FP32")
            bad.set_data_from_numpy(np.array([[np.nan, 0, 0, 0]], np.float32))
            with pytest.raises(InferenceServerException) as info:
                client.infer(name, [bad])
            assert "input 'observation' has value nan at index [0, 0]" in str(info.value)
            assert client.is_server_live()
    finally:
        server.kill()


@pytest.mark.parametrize("hidden", [-1, 0])
def test_a_policy_width_below_one_is_a_usage_error(hidden):
    message = f"config hidden must be an integer of at least 1, not {hidden}"
    with pytest.raises(UsageError, match=f"ppo.cartpole: {message}"):
        zoo.get_model("ppo.cartpole", hidden=hidden)
    with pytest.raises(UsageError, match=f"ppo.mine: {message}"):
        zoo_rl.policy_spec("ppo.mine", envs.PENDULUM, hidden=hidden)


def test_cli_refuses_a_policy_width_below_one_in_one_line(tmp_path):
    cmd = [sys.executable, "-m", "zoo", "train", "ppo.cartpole", "--config", "hidden=-1", "--epochs", "1",
           "--out", str(tmp_path / "ckpt")]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == ["error: ppo.cartpole: config hidden must be an integer of at least 1, "
                                                "not -1"]

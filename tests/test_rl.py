"""The rl plugin: PPO's pieces, training to the stated return, determinism, the domain
check of exported policies, and observation inputs."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch

import zoo
from zoo.errors import InputError, ToleranceError
from zoo.train import module_fn
from zoo_rl import envs
from zoo_rl.ppo import gae


@pytest.mark.parametrize("env", [envs.CARTPOLE, envs.PENDULUM], ids=lambda e: e.id)
def test_environment_facts_match_gymnasium(env):
    game = gymnasium.make(env.id)
    assert np.allclose(game.observation_space.low, env.obs_low) and np.allclose(game.observation_space.high, env.obs_high)
    if env.discrete:
        assert game.action_space.n == env.num_actions
    else:
        assert game.action_space.shape == (env.action_dim,)
        assert (game.action_space.low, game.action_space.high) == (env.action_low, env.action_high)


def test_gae_matches_a_hand_computed_example():
    # two environments, three steps, gamma = lambda = 0.5. Env 0 is truncated at step 1
    # (bootstrapped from the value 4 of its last state), env 1 terminates at step 1.
    rewards = torch.tensor([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]])
    values = torch.tensor([[0.5, 2.0], [1.0, 1.0], [1.5, 0.0]])
    next_values = torch.tensor([[1.0, 1.0], [4.0, 9.0], [2.0, 3.0]])
    terminated = torch.tensor([[0.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    ended = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    # deltas: env 0: 1 + .5*1 - .5 = 1,  2 + .5*4 - 1 = 3,  3 + .5*2 - 1.5 = 2.5
    #         env 1: 1 + .5*1 - 2 = -.5, 1 + 0 - 1 = 0 (terminal), 1 + .5*3 - 0 = 2.5
    # A_t = delta_t + .25 * A_{t+1}, cut at step 1 where both episodes end
    want = torch.tensor([[1.0 + 0.25 * 3.0, -0.5 + 0.25 * 0.0], [3.0, 0.0], [2.5, 2.5]])
    assert torch.allclose(gae(rewards, values, next_values, terminated, ended, 0.5, 0.5), want)
    # lambda = 0 is the one-step TD error
    assert torch.allclose(gae(rewards, values, next_values, terminated, ended, 0.5, 0.0)[0], torch.tensor([1.0, -0.5]))


def _random_policy_return(env) -> float:
    rng = np.random.default_rng(0)

    def random_policy(inputs):
        return {"logits": rng.standard_normal((len(inputs["observation"]), env.num_actions))}

    return envs.mean_return(env, random_policy)


def test_a_short_tiny_ppo_run_beats_a_random_policy(tmp_path):
    spec = zoo.get_model("ppo.cartpole").tiny()
    ckpt = zoo.train(spec, out=tmp_path / "ckpt", epochs=60, progress=False)
    random_return = _random_policy_return(envs.CARTPOLE)
    assert random_return < 40
    assert ckpt.metrics["test_mean_return"] > max(3 * random_return, 100)


def test_training_is_reproducible_for_a_seed(tmp_path):
    spec = zoo.get_model("ppo.pendulum").tiny()  # also exercises observation normalization
    a = zoo.train(spec, out=tmp_path / "a", epochs=2, seed=5, progress=False)
    b = zoo.train(spec, out=tmp_path / "b", epochs=2, seed=5, progress=False)
    c = zoo.train(spec, out=tmp_path / "c", epochs=2, seed=6, progress=False)
    assert a.sha256 == b.sha256 != c.sha256
    assert a.metrics["train_return_history"] == b.metrics["train_return_history"]
    assert a.state["obs_norm.count"] > 0


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory):
    """ppo.cartpole trained at full size by its recipe: the checkpoint `zoo train` writes."""
    return zoo.train("ppo.cartpole", out=tmp_path_factory.mktemp("rl") / "ckpt", progress=False)


@pytest.mark.slow
def test_cartpole_reaches_its_stated_return(cartpole):
    spec = zoo.get_model("ppo.cartpole")
    assert cartpole.metrics["test_mean_return"] >= spec.recipe.target == 475
    # the metric is measured again, the same, from the written checkpoint
    module = zoo.load_checkpoint(cartpole.path, "ppo.cartpole").module(spec)
    assert spec.metric.evaluate(module_fn(module, spec)) == cartpole.metrics["test_mean_return"]


@pytest.mark.slow
def test_exported_policy_acts_like_pytorch_and_a_perturbed_one_fails(cartpole, tmp_path):
    spec = zoo.get_model("ppo.cartpole")
    art = zoo.export(spec, "onnxruntime", repository=tmp_path, checkpoint=cartpole)
    domain = art.manifest["domain"]
    assert domain["passed"] and domain["observations"] == 10_000 and domain["action_agreement"] >= 0.999
    assert domain["episodes"]["runner_returns"] == domain["episodes"]["reference_returns"]
    assert art.manifest["metric"]["artifact"] >= 475

    runner = zoo.load(art.path)
    rng = np.random.default_rng(0)

    def perturbed(inputs):  # what a slightly wrong export (noisy logits) would give
        out = dict(runner(inputs))
        out["logits"] = out["logits"] + rng.normal(0, 0.5, out["logits"].shape).astype(np.float32)
        return out

    reference = module_fn(cartpole.module(spec), spec)
    with pytest.raises(ToleranceError, match="agree with PyTorch's on"):
        spec.domain_check(reference, perturbed)


def test_continuous_domain_check_holds_actions_to_the_stated_tolerance():
    spec = zoo.get_model("ppo.pendulum").tiny()
    torch.manual_seed(0)
    reference = module_fn(spec.build().eval(), spec)
    report = spec.domain_check(reference, reference)
    assert report["action_agreement"] == 1.0 and report["max_action_difference"] == 0.0
    assert report["action_tolerance"] == pytest.approx(0.02)  # 0.5% of Pendulum's [-2, 2]

    def shifted(inputs):  # a bias of 0.03 torque units, beyond the tolerance
        out = dict(reference(inputs))
        return {**out, "action": out["action"] + np.float32(0.03)}

    with pytest.raises(ToleranceError, match="Pendulum-v1 policy"):
        spec.domain_check(reference, shifted)


@pytest.mark.parametrize("item, message", [
    (b"[0.1, 0.2, 0.3]", "has 3 numbers; CartPole-v1 observations are arrays of 4 numbers"),
    (b"[[0.1, 0.2, 0.3, 0.4]]", "is a nested JSON array; CartPole-v1 observations are flat arrays of 4 numbers"),
    (b'{"x": 1}', "has a JSON dict"),
    (b"[0.1, 0.2, 0.3, NaN]", "not a JSON array of 4 finite numbers"),
    (b"[0.1, 0.2, 0.3, 1e999]", "entry 3 is Infinity, not a finite float32 number"),
    (b'[0.1, "fast", 0.3, 0.4]', 'entry 1 is "fast", not a finite'),
    (b"[0.1, true, 0.3, 0.4]", "entry 1 is true"),
    (b"[9.0, 0.0, 0.0, 0.0]", "entry 0 = 9 is outside CartPole-v1's observation space [-4.8, 4.8]"),
    (b"[0.1, 0.2", "not a JSON array"),
    (b"\xff\xfe", "not UTF-8"),
])
def test_preprocess_rejects_bad_observations_naming_the_item(item, message):
    spec = zoo.get_model("ppo.cartpole")
    with pytest.raises(InputError, match="observation \\(item 2\\)") as info:
        spec.preprocess([b"[0, 0, 0, 0]", item])
    assert message in str(info.value)
    with pytest.raises(InputError, match="at least one"):
        spec.preprocess([])


def test_predict_from_observations():
    spec = zoo.get_model("ppo.pendulum").tiny()
    torch.manual_seed(0)
    fn = module_fn(spec.build().eval(), spec)
    batch = spec.preprocess([b"[1, 0, 0.5]", b"[-1.0, 0.0, -8]"])
    assert batch["observation"].dtype == np.float32 and batch["observation"].shape == (2, 3)
    results = zoo.predict(spec, fn, ["[1, 0, 0.5]", "[-1.0, 0.0, -8]"])
    assert [sorted(r) for r in results] == [["action", "value"]] * 2
    assert all(-2 <= r["action"][0] <= 2 for r in results)

    cartpole = zoo.get_model("ppo.cartpole").tiny()
    fn = module_fn(cartpole.build().eval(), cartpole)
    (result,) = zoo.predict(cartpole, fn, ["[0.01, -0.2, 0.03, 0.1]"])
    assert result["action"] == int(np.argmax(result["logits"])) and sum(result["probabilities"]) == pytest.approx(1)


# --- your own environment: `Environment.from_gymnasium` and `policy_spec` -------------

def test_environment_from_gymnasium_reads_the_spaces():
    from zoo_rl import Environment

    acrobot = Environment.from_gymnasium("Acrobot-v1")
    assert acrobot.obs_dim == 6 and acrobot.discrete and acrobot.num_actions == 3
    car = Environment.from_gymnasium("MountainCarContinuous-v0")
    assert not car.discrete and car.obs_dim == 2
    assert (car.action_dim, car.action_low, car.action_high) == (1, -1.0, 1.0)
    assert Environment.from_gymnasium("Pendulum-v1") == envs.PENDULUM  # as the built-in model writes it out


class _PlaneEnv(gymnasium.Env):
    """An environment whose action is a 2x2 matrix: no policy head here fits it."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gymnasium.spaces.Box(-1.0, 1.0, (2, 2), np.float32)


class _SkewedEnv(_PlaneEnv):
    action_space = gymnasium.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 2.0], np.float32))


class _CounterEnv(gymnasium.Env):
    """Whole-number observations in [0, 9]^3 that never terminate: each action counts one up."""

    observation_space = gymnasium.spaces.Box(0, 9, (3,), np.int64)
    action_space = gymnasium.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = self.np_random.integers(0, 10, 3)
        return self.state.copy(), {}

    def step(self, action):
        self.state[action] = (self.state[action] + 1) % 10
        return self.state.copy(), 1.0, False, False, {}


class _NeedsRenderModeEnv(_CounterEnv):
    def __init__(self, render_mode):  # gymnasium.make passes none: a TypeError, not a gymnasium.error
        self.render_mode = render_mode


class _WideEnv(_CounterEnv):
    observation_space = gymnasium.spaces.Box(-10.0, 10.0, (5,), np.float64)


@pytest.fixture
def registered_envs():
    ids = {"ZooTestPlane-v0": _PlaneEnv, "ZooTestSkewed-v0": _SkewedEnv, "ZooTestEndless-v0": _CounterEnv,
           "ZooTestRenderMode-v0": _NeedsRenderModeEnv, "ZooTestBadEntry-v0": "zoo_no_such_module:Env"}
    for env_id, cls in ids.items():
        gymnasium.register(env_id, entry_point=cls)
    timed = {"ZooTestCounter-v0": _CounterEnv, "ZooTestWide-v0": _WideEnv}
    for env_id, cls in timed.items():
        gymnasium.register(env_id, entry_point=cls, max_episode_steps=20)
    yield
    for env_id in [*ids, *timed]:
        gymnasium.registry.pop(env_id)


@pytest.mark.parametrize("env_id, message", [
    ("Blackjack-v1", "Blackjack-v1: the policy takes a 1-D Box observation, not Tuple(Discrete(32)"),
    ("FrozenLake-v1", "FrozenLake-v1: the policy takes a 1-D Box observation, not Discrete(16)"),
    ("ZooTestPlane-v0", "ZooTestPlane-v0: the policy takes a Discrete action (from 0) or a 1-D Box action, "
                        "not Box(-1.0, 1.0, (2, 2), float32)"),
    ("ZooTestSkewed-v0", "ZooTestSkewed-v0: the policy takes Box actions with one finite [low, high] for every "
                         "dimension"),
    ("ZooTestAbsent-v0", "Gymnasium cannot make environment 'ZooTestAbsent-v0'"),
    # any failure of gymnasium.make is the documented error, with the cause's first line
    ("ZooTestRenderMode-v0", "Gymnasium cannot make environment 'ZooTestRenderMode-v0': "),
    ("ZooTestBadEntry-v0", "Gymnasium cannot make environment 'ZooTestBadEntry-v0': No module named "
                           "'zoo_no_such_module'"),
    # an episode that never ends would hang the evaluation after training
    ("ZooTestEndless-v0", "ZooTestEndless-v0 has no time limit: register it with max_episode_steps"),
])
def test_an_unsupported_environment_is_refused_by_name(registered_envs, env_id, message):
    from zoo.errors import ZooError
    from zoo_rl import Environment

    with pytest.raises(ZooError) as info:
        Environment.from_gymnasium(env_id)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_an_environment_without_a_time_limit_is_refused_however_it_is_described(registered_envs):
    from zoo.errors import ZooError

    by_hand = envs.Environment("ZooTestEndless-v0", obs_low=(0.0,) * 3, obs_high=(9.0,) * 3, num_actions=3)
    with pytest.raises(ZooError, match="ZooTestEndless-v0 has no time limit"):
        envs.mean_return(by_hand, lambda inputs: {"logits": np.zeros((len(inputs["observation"]), 3))})


def test_observation_bounds_are_checked_on_every_path(registered_envs):
    import zoo_rl
    from zoo.inputs import check_inputs

    counter = zoo_rl.policy_spec("ppo.counter", zoo_rl.Environment.from_gymnasium("ZooTestCounter-v0"))
    assert counter.preprocess([b"[1, 2.0, 9]"])["observation"].tolist() == [[1, 2, 9]]
    with pytest.raises(InputError, match="observation \\(item 1\\): entry 1 is 2.5; ZooTestCounter-v0 observations "
                                         "are whole numbers"):
        counter.preprocess([b"[1, 2.5, 9]"])
    # the tensor path (zoo serve, an artifact's runner) refuses what an observation item is refused for
    wide = zoo_rl.policy_spec("ppo.wide", zoo_rl.Environment.from_gymnasium("ZooTestWide-v0"))
    assert wide.inputs[0].value_range == (-10.0, 10.0)
    with pytest.raises(InputError, match="input .observation. has value 1e\\+30 at index \\[0, 4\\]; it takes "
                                         "values from -10 to 10"):
        check_inputs({"observation": np.array([[0, 0, 0, 0, 1e30]], np.float32)}, wide, "ppo.wide")
    assert zoo.get_model("ppo.pendulum").inputs[0].value_range == (-8.0, 8.0)  # one range: the widest dimension's
    assert zoo.get_model("ppo.cartpole").inputs[0].value_range[1] == float(np.finfo(np.float32).max)  # unbounded


@pytest.mark.parametrize("env_id", ["Acrobot-v1", "MountainCarContinuous-v0"])
def test_a_policy_spec_for_another_environment_passes_the_spec_check(env_id):
    import zoo_rl
    from zoo.check import check

    env = zoo_rl.Environment.from_gymnasium(env_id)
    spec = zoo_rl.policy_spec(f"ppo.{env_id.lower()}", env)
    # the defaults are the built-in models' of the same kind of action, with no stated target
    want = zoo.get_model("ppo.cartpole" if env.discrete else "ppo.pendulum")
    assert spec.recipe.epochs == want.recipe.epochs and spec.recipe.target is None
    assert spec.trainer.keywords["ppo"] == want.trainer.keywords["ppo"]
    assert "int8" not in spec.tolerances  # offered only with a stated return_drop
    assert "int8" in zoo_rl.policy_spec("ppo.x", env, return_drop=10.0).tolerances
    assert spec.tiny().config == {"hidden": 8} and env_id in spec.tiny().description
    torch.manual_seed(0)
    assert check(spec, spec.build().eval()).passed


def test_a_policy_for_another_environment_exports_to_onnxruntime(tmp_path):
    import zoo_rl
    from zoo.registry import backends

    if not backends()["onnxruntime"].probe("cpu").ok:
        pytest.skip("onnxruntime cannot run here")
    spec = zoo_rl.policy_spec("ppo.acrobot", zoo_rl.Environment.from_gymnasium("Acrobot-v1"))
    art = zoo.export(spec.tiny(), "onnxruntime", repository=tmp_path, random_init=True)
    assert art.manifest["domain"]["passed"] and art.manifest["domain"]["environment"] == "Acrobot-v1"

"""zoo model plugin: rl. PPO policies trained here in Gymnasium environments.

- `ppo.cartpole`: a categorical policy for CartPole-v1 (greedy mean return >= 475 of 500).
- `ppo.pendulum`: a Gaussian policy for Pendulum-v1's torque in [-2, 2] (greedy mean
  return >= -300; a random policy gets about -1200).

Both train with the plugin's own PPO loop (`spec.trainer`, see `ppo.py`); the Recipe's
`epochs` are PPO iterations (one rollout of `num_envs * num_steps` transitions and its
minibatch updates each) and its `batch_size` is the minibatch size. The exported module
is the greedy policy: raw float32 `observation` in (its normalization is part of the
module), float outputs out: `logits` or the action mean `action`, and the critic's `value`
(the discounted return it expects, in reward units). The argmax is the domain code's.

Another environment: `policy_spec(name, Environment.from_gymnasium("Acrobot-v1"))` is a
registrable policy with CartPole's PPO settings (discrete actions) or Pendulum's
(continuous), or your own `ppo` and `recipe` (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import zoo
from zoo import AxisRange, Metric, ModelSpec, Recipe, TensorSpec, Tolerance
from zoo.errors import UsageError

from . import domain, envs
from .config import PPOConfig
from .envs import Environment

#: logits and actions are O(1-10), values O(10-100) (hence the rtol): fp32 backends agree to ~1e-5.
POLICY_TOLERANCES = {"fp32": Tolerance(1e-4, 1e-4), "fp16": Tolerance(2e-2, 1e-2), "bf16": Tolerance(1e-1, 5e-2)}
BATCH = AxisRange(1, 8, 256)  # 1: one controller's step; larger: many environments at once
COMPARE_BATCH = 64  # the batch the domain check compares recorded observations in (within BATCH)


# The policy module and the PPO loop are imported when a model is built or trained, and
# torch with them: registering the models (and serving an artifact that is not a PyTorch
# program) imports no PyTorch.
def actor_critic(*args, **kwargs):
    from .policy import ActorCritic

    return ActorCritic(*args, **kwargs)


def train_ppo(*args, **kwargs):
    from .ppo import train

    return train(*args, **kwargs)


def policy_tolerances(return_drop: float) -> dict[str, Tolerance]:
    """POLICY_TOLERANCES and int8's: dynamic int8 moves logits by up to ~1.6 (of ~20) on a
    batch whose activation range is wide, so elements are bounded loosely; the greedy
    mean return may fall by at most `return_drop` (measured: unchanged), and the domain
    check holds actions and episode returns to its int8 bounds (domain.INT8)."""
    return {**POLICY_TOLERANCES, "int8": Tolerance(2.5, 0.1, metric_drop=return_drop)}


#: rl-baselines3-zoo's tuned CartPole-v1 PPO (hyperparams/ppo.yml): 100k steps of short
#: rollouts, each passed over 20 times; steadier late in training than longer rollouts.
#: The default for a discrete action space.
DISCRETE_PPO = PPOConfig(num_envs=8, num_steps=32, update_epochs=20, gamma=0.98, gae_lambda=0.8, ent_coef=0.0)
DISCRETE_RECIPE = Recipe(epochs=390, batch_size=256, lr=1e-3, schedule="linear", seed=0)
#: after rl-baselines3-zoo's Pendulum-v1 PPO (gamma 0.9: the swing-up is a short-horizon
#: task; 10 passes over 2048-step rollouts), with rewards scaled to O(1) for the critic and
#: normalized observations (the angular velocity spans [-8, 8]). The default for a
#: continuous action space.
CONTINUOUS_PPO = PPOConfig(num_envs=4, num_steps=512, update_epochs=10, gamma=0.9, gae_lambda=0.95,
                           ent_coef=0.0, reward_scale=0.1, normalize_obs=True)
CONTINUOUS_RECIPE = Recipe(epochs=60, batch_size=256, lr=1e-3, schedule="linear", seed=0)


def policy_spec(name: str, env: Environment, *, hidden: int = 64, ppo: PPOConfig | None = None,
                recipe: Recipe | None = None, return_drop: float | None = None,
                description: str | None = None) -> ModelSpec:
    """A PPO actor-critic policy for `env` (an `Environment`, e.g. `Environment.from_gymnasium`).

    `ppo` and `recipe` default to CartPole's settings for a discrete action space and
    Pendulum's for a continuous one (no stated target return). `return_drop` is how far
    the greedy mean return may fall at int8; without it int8 is not offered, since what a
    return means (and so what loss is acceptable) depends on the environment.
    """
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
        # -1 failed inside torch as an internal error; 0 trained, silently, a policy of constant outputs
        raise UsageError(f"{name}: config hidden must be an integer of at least 1, not {hidden!r}")
    config = ppo or (DISCRETE_PPO if env.discrete else CONTINUOUS_PPO)
    recipe = recipe or (DISCRETE_RECIPE if env.discrete else CONTINUOUS_RECIPE)
    tolerances = POLICY_TOLERANCES if return_drop is None else policy_tolerances(return_drop)
    head = (TensorSpec("logits", "float32", ("batch", env.num_actions)) if env.discrete
            else TensorSpec("action", "float32", ("batch", env.action_dim)))
    gaussian = "" if env.discrete else "Gaussian "
    return ModelSpec(
        name=name,
        domain="rl",
        task="continuous-control" if not env.discrete else "discrete-control",
        description=description or f"PPO {gaussian}actor-critic MLP ({hidden}x{hidden} tanh) trained here on {env.id}",
        # the observation space's widest bounds, float32's largest where unbounded: the server and the
        # tensor API refuse NaN, infinities and values past them, as the observation items are refused
        # (per dimension, and whole numbers, only there: value_range is one range for the whole tensor)
        inputs=(TensorSpec("observation", "float32", ("batch", env.obs_dim), value_range=env.obs_range),),
        outputs=(head, TensorSpec("value", "float32", ("batch",))),
        axes={"batch": BATCH},
        build=partial(actor_critic, env.obs_dim, hidden, num_actions=env.num_actions, action_dim=env.action_dim,
                      low=env.action_low, high=env.action_high, reward_scale=config.reward_scale),
        sample=partial(envs.sample, env),
        config={"hidden": hidden},
        tiny_config={"hidden": 8},
        variant=partial(policy_spec, name, env, ppo=ppo, recipe=recipe, return_drop=return_drop,
                        description=description),
        metric=Metric("mean_return", evaluate=partial(envs.mean_return, env), higher_is_better=True),
        recipe=recipe,
        trainer=partial(train_ppo, env=env, ppo=config),
        domain_check=partial(domain.domain_check, env, COMPARE_BATCH),
        tolerances=tolerances,
        quantization="dynamic" if "int8" in tolerances else None,  # an MLP on unbounded observations: scales per call
        raw_kind="observation",
        preprocess=partial(domain.preprocess, env),
        postprocess=partial(domain.postprocess, env),
    )


def ppo_cartpole(hidden: int = 64) -> ModelSpec:
    return policy_spec("ppo.cartpole", envs.CARTPOLE, hidden=hidden, recipe=replace(DISCRETE_RECIPE, target=475.0),
                       return_drop=25.0)  # 5% of the maximum return, 500


def ppo_pendulum(hidden: int = 64) -> ModelSpec:
    return policy_spec("ppo.pendulum", envs.PENDULUM, hidden=hidden,
                       recipe=replace(CONTINUOUS_RECIPE, target=-300.0),
                       return_drop=30.0)  # ~20% of the trained policy's -145; a random policy gets ~-1200


@zoo.hookimpl
def zoo_register_models(register):
    register(ppo_cartpole())
    register(ppo_pendulum())

"""The Gymnasium environments the policies act in.

What an observation and an action are for each environment (written out here for the
built-in models, and checked against Gymnasium by the tests, so registering them does
not import Gymnasium; read from Gymnasium by `Environment.from_gymnasium` for any other),
seeded greedy episodes through any numpy-in/numpy-out callable, and realistic
observations for tracing and parity.

Every episode is seeded, so a metric measured twice on the same weights is the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from zoo.errors import UnsupportedError, ZooError, first_line
from zoo.arrays import as_numpy

ArrayFn = Callable[[Mapping[str, np.ndarray]], Mapping[str, Any]]

#: seeds of the greedy evaluation episodes behind the `mean_return` metric.
EVAL_SEEDS = tuple(range(10_000, 10_020))


@dataclass(frozen=True)
class Environment:
    """A Gymnasium environment id and the spaces the policy sees (inf: unbounded)."""

    id: str
    obs_low: tuple[float, ...]
    obs_high: tuple[float, ...]
    num_actions: int = 0  # Discrete(n); 0 for a continuous Box action space
    action_dim: int = 0  # Box((action_dim,)) between action_low and action_high
    action_low: float = -1.0
    action_high: float = 1.0
    obs_integer: bool = False  # an integer Box: observations are whole numbers

    @classmethod
    def from_gymnasium(cls, env_id: str) -> Environment:
        """The spaces of `gymnasium.make(env_id)`: a 1-D Box observation, and a Discrete
        action (starting at 0) or a 1-D Box action with one finite [low, high] for every
        dimension (what the policy's outputs are). Any other space is refused by name, and
        so is an environment without a time limit (see `make`)."""
        from gymnasium import spaces

        game = _make(env_id)
        game.close()
        obs, act = game.observation_space, game.action_space
        if not (isinstance(obs, spaces.Box) and len(obs.shape) == 1):
            raise UnsupportedError(f"{env_id}: the policy takes a 1-D Box observation, not {obs}")
        facts: dict[str, Any] = {"obs_low": tuple(map(float, obs.low)), "obs_high": tuple(map(float, obs.high)),
                                 "obs_integer": bool(np.issubdtype(obs.dtype, np.integer))}
        if isinstance(act, spaces.Discrete) and act.start == 0:
            facts["num_actions"] = int(act.n)
        elif isinstance(act, spaces.Box) and len(act.shape) == 1:
            low, high = np.unique(act.low), np.unique(act.high)
            # the policy clips its action mean to one [low, high]; unbounded actions have no such clip
            if len(low) != 1 or len(high) != 1 or not np.isfinite([low[0], high[0]]).all():
                raise UnsupportedError(f"{env_id}: the policy takes Box actions with one finite [low, high] "
                                       f"for every dimension, not {act}")
            facts.update(action_dim=int(act.shape[0]), action_low=float(low[0]), action_high=float(high[0]))
        else:
            raise UnsupportedError(f"{env_id}: the policy takes a Discrete action (from 0) or a 1-D Box action, "
                                   f"not {act}")
        if not _time_limited(game):
            raise _endless(env_id)
        return cls(env_id, **facts)

    @property
    def obs_dim(self) -> int:
        return len(self.obs_low)

    @property
    def discrete(self) -> bool:
        return self.num_actions > 0

    @property
    def action_output(self) -> str:
        """The exported policy's action output: logits, or the (clipped) action mean."""
        return "logits" if self.discrete else "action"

    @property
    def obs_range(self) -> tuple[float, float]:
        """One [low, high] that holds every observation in float32: the least low and the
        greatest high, rounded outwards, and float32's largest finite magnitude on a side
        that is unbounded (or beyond it). Never open: NaN and the infinities fall outside
        every such range, so the tensor paths refuse them as the observation items are
        refused, for CartPole's unbounded velocities too (zoo.inputs compares every element).
        One range for all dimensions, as `TensorSpec.value_range` takes one."""
        return _float32_edge(min(self.obs_low), -1), _float32_edge(max(self.obs_high), 1)

    def make(self):
        """A new instance; ZooError where Gymnasium cannot make it, or where nothing ends its
        episodes: evaluation runs every episode to its end."""
        game = _make(self.id)
        if not _time_limited(game):
            game.close()
            raise _endless(self.id)
        return game

    def make_vector(self, num_envs: int):
        """`num_envs` copies stepped in this process; an episode that ends is reset in the
        same step, with its last observation kept in `info["final_obs"]` (for bootstrapping
        the value of a truncated episode)."""
        from gymnasium.vector import AutoresetMode, SyncVectorEnv

        return SyncVectorEnv([self.make for _ in range(num_envs)], autoreset_mode=AutoresetMode.SAME_STEP)

    def greedy_actions(self, outputs: Mapping[str, Any]) -> np.ndarray:
        """Actions from the exported policy's outputs (numpy, or torch tensors on any device):
        argmax of the logits, or the action mean."""
        head = as_numpy(outputs[self.action_output])
        if self.discrete:
            return head.argmax(-1)
        return np.clip(head, self.action_low, self.action_high).astype(np.float32)

    def random_action(self, rng: np.random.Generator):
        if self.discrete:
            return int(rng.integers(self.num_actions))
        return rng.uniform(self.action_low, self.action_high, self.action_dim).astype(np.float32)


def _float32_edge(bound: float, side: int) -> float:
    """`bound` as a float32 rounded outwards (`side` -1: down, 1: up), or float32's largest
    finite magnitude where it is beyond that (an unbounded side is infinite)."""
    largest = float(np.finfo(np.float32).max)
    if abs(bound) >= largest:
        return math.copysign(largest, bound)
    value = np.float32(bound)
    if (float(value) - bound) * side < 0:  # rounded inwards: one float32 step out, still below `largest`
        value = np.nextafter(value, np.float32(side * np.inf))
    return float(value)


def _make(env_id: str):
    import gymnasium

    try:
        game = gymnasium.make(env_id)
    except Exception as exc:  # unregistered, a missing extra (box2d), a broken entry point, a required kwarg
        raise ZooError(f"Gymnasium cannot make environment {env_id!r}: {first_line(exc)}") from None
    return game


def _time_limited(game) -> bool:
    """Whether a TimeLimit wrapper (what `max_episode_steps` in the registration adds) ends
    the episodes: without one, an environment that never terminates hangs every evaluation."""
    import gymnasium
    from gymnasium.wrappers import TimeLimit

    while isinstance(game, gymnasium.Wrapper):
        if isinstance(game, TimeLimit):
            return True
        game = game.env
    return False


def _endless(env_id: str) -> ZooError:
    return ZooError(f"{env_id} has no time limit: register it with max_episode_steps "
                    f"(gymnasium.register({env_id!r}, ..., max_episode_steps=N)), so that every episode ends")


CARTPOLE = Environment("CartPole-v1", obs_low=(-4.8, -math.inf, -0.41887903, -math.inf),
                       obs_high=(4.8, math.inf, 0.41887903, math.inf), num_actions=2)
PENDULUM = Environment("Pendulum-v1", obs_low=(-1.0, -1.0, -8.0), obs_high=(1.0, 1.0, 8.0),
                       action_dim=1, action_low=-2.0, action_high=2.0)


def episode_returns(env: Environment, fn: ArrayFn, seeds=EVAL_SEEDS) -> list[float]:
    """The undiscounted return of one greedy episode per seed. The episodes run side by
    side, `fn` called once per step on the observations of the episodes still running, so
    an evaluation costs one call per step rather than one per step and episode (batch-1
    latency, the number that matters for control, is what `zoo bench` measures)."""
    games = [env.make() for _ in seeds]
    obs = [game.reset(seed=int(seed))[0] for game, seed in zip(games, seeds)]
    returns = [0.0] * len(games)
    running = list(range(len(games)))
    while running:
        batch = np.stack([obs[i] for i in running]).astype(np.float32)
        still = []
        for i, action in zip(running, env.greedy_actions(fn({"observation": batch}))):
            obs[i], reward, terminated, truncated, _ = games[i].step(action)
            returns[i] += float(reward)
            if not (terminated or truncated):  # TimeLimit truncates: CartPole at 500 steps, Pendulum at 200
                still.append(i)
        running = still
    for game in games:
        game.close()
    return returns


def mean_return(env: Environment, fn: ArrayFn) -> float:
    """The `mean_return` metric: 20 greedy episodes with fixed seeds."""
    return float(np.mean(episode_returns(env, fn)))


def sample(env: Environment, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Observations the environment produces: states of a seeded random-action rollout,
    reset (with a new seed from `rng`) whenever an episode ends."""
    game = env.make()
    obs, _ = game.reset(seed=int(rng.integers(1 << 31)))
    rows = []
    while len(rows) < batch:
        rows.append(obs)
        obs, _, terminated, truncated, _ = game.step(env.random_action(rng))
        if terminated or truncated:
            obs, _ = game.reset(seed=int(rng.integers(1 << 31)))
    game.close()
    return {"observation": np.stack(rows).astype(np.float32)}


def record_observations(env: Environment, fn: ArrayFn, count: int, seed: int, num_envs: int = 16) -> np.ndarray:
    """`count` observations met by the greedy policy `fn` acting in `num_envs` seeded copies
    of the environment (batched across copies, to be quick)."""
    envs = env.make_vector(num_envs)
    obs, _ = envs.reset(seed=seed)
    rows = []
    for _ in range(math.ceil(count / num_envs)):
        obs = obs.astype(np.float32)
        rows.append(obs)
        obs, *_ = envs.step(env.greedy_actions(fn({"observation": obs})))
    envs.close()
    return np.concatenate(rows)[:count]

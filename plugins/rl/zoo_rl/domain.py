"""The domain around an exported policy: raw observations in, actions out, and the check
that an export acts like the PyTorch policy it came from.

Output parity (the core's) bounds the difference of logits; what matters to a controller
is the action taken, and whether the exported policy still balances the pole or swings
the pendulum up. `domain_check` measures both: action agreement on 10,000 observations
met by the reference policy, and the return of a few seeded episodes run through the
export at batch 1, as a control loop runs it.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from zoo.errors import InputError, ToleranceError
from zoo.arrays import as_numpy

from .envs import Environment, episode_returns, record_observations

ArrayFn = Callable[[Mapping[str, np.ndarray]], Mapping[str, Any]]

RECORDED = 10_000  # observations the actions are compared on
RECORD_SEED = 20_000
CHECK_SEEDS = (30_000, 30_001, 30_002)  # episodes run through both policies
MIN_AGREEMENT = 0.999  # fraction of recorded observations where the actions must agree
#: continuous actions agree when within this fraction of the action range (0.02 for Pendulum's [-2, 2]).
ACTION_TOLERANCE = 0.005
#: an episode's return through the export may differ from the reference's by this much
#: (relative to the reference's, plus one unit): a rare near-tie can change a late action.
RETURN_RTOL, RETURN_ATOL = 0.01, 1.0
#: int8 moves logits by ~1-5% of their range, so where two actions are near-tied (CartPole
#: spends much of an episode balanced) the choice flips: dynamic int8 agreed on 96% of the
#: recorded observations and kept CartPole's greedy return at 500. At int8 the actions
#: are held to these looser bounds, and the returns (here and the spec's metric_drop) to
#: what a controller needs.
INT8 = {"min_agreement": 0.9, "action_tolerance": 0.05, "return_rtol": 0.05, "return_atol": 5.0}


def thresholds(precision: str) -> dict[str, float]:
    """The bounds the check holds an artifact of `precision` to."""
    if precision == "int8":
        return dict(INT8)
    return {"min_agreement": MIN_AGREEMENT, "action_tolerance": ACTION_TOLERANCE,
            "return_rtol": RETURN_RTOL, "return_atol": RETURN_ATOL}


def _batched(fn: ArrayFn, observations: np.ndarray, env: Environment, batch: int) -> np.ndarray:
    outputs = [fn({"observation": observations[i:i + batch]}) for i in range(0, len(observations), batch)]
    return np.concatenate([env.greedy_actions(o) for o in outputs])


def domain_check(env: Environment, batch: int, reference: ArrayFn, runner: ArrayFn,
                 precision: str = "fp32") -> dict[str, Any]:
    """Actions agree on >= 99.9% of recorded observations, and seeded episodes through the
    runner reach the reference's return (int8: the looser `INT8` bounds); raises
    `ToleranceError` otherwise."""
    bounds = thresholds(precision)
    min_agreement = bounds["min_agreement"]
    observations = record_observations(env, reference, RECORDED, RECORD_SEED)
    want, got = _batched(reference, observations, env, batch), _batched(runner, observations, env, batch)
    report: dict[str, Any] = {"environment": env.id, "observations": len(observations)}
    if env.discrete:
        agree = want == got
    else:
        bound = bounds["action_tolerance"] * (env.action_high - env.action_low)
        difference = np.abs(want.astype(np.float64) - got.astype(np.float64)).reshape(len(want), -1).max(1)
        agree = difference <= bound
        report.update(action_tolerance=bound, max_action_difference=float(difference.max()))
    agreement = float(agree.mean())
    report.update(action_agreement=agreement, required_agreement=min_agreement)
    if agreement < min_agreement:
        raise ToleranceError(f"{env.id} policy: the export's actions agree with PyTorch's on {agreement:.2%} of "
                             f"{len(observations)} recorded observations, below the required {min_agreement:.1%} "
                             f"at {precision}")
    ref_returns = episode_returns(env, reference, CHECK_SEEDS)
    run_returns = episode_returns(env, runner, CHECK_SEEDS)
    report["episodes"] = {"seeds": list(CHECK_SEEDS), "reference_returns": ref_returns, "runner_returns": run_returns}
    for seed, a, b in zip(CHECK_SEEDS, ref_returns, run_returns):
        if abs(a - b) > bounds["return_rtol"] * abs(a) + bounds["return_atol"]:
            raise ToleranceError(f"{env.id} policy: the export's episode (seed {seed}) returned {b:.2f}, "
                                 f"PyTorch's {a:.2f}: beyond {bounds['return_rtol']:.0%} + "
                                 f"{bounds['return_atol']:g} at {precision}")
    report["passed"] = True
    return report


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a finite number")


def _observation(env: Environment, item: bytes, n: int) -> np.ndarray:
    where = f"observation (item {n})"
    try:
        values = json.loads(bytes(item).decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise InputError(f"{where} is not UTF-8 text") from None
    except ValueError as exc:  # JSONDecodeError, or NaN/Infinity
        raise InputError(f"{where} is not a JSON array of {env.obs_dim} finite numbers: {exc}") from None
    if isinstance(values, list) and any(isinstance(v, list) for v in values):  # "has 1 numbers", it said
        raise InputError(f"{where} is a nested JSON array; {env.id} observations are flat arrays of "
                         f"{env.obs_dim} numbers, one observation per item")
    if not isinstance(values, list) or len(values) != env.obs_dim:
        got = f"{len(values)} numbers" if isinstance(values, list) else f"a JSON {type(values).__name__}"
        raise InputError(f"{where} has {got}; {env.id} observations are arrays of {env.obs_dim} numbers")
    row = np.empty(env.obs_dim, dtype=np.float32)
    for j, (v, lo, hi) in enumerate(zip(values, env.obs_low, env.obs_high)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not _fits_float32(v):
            raise InputError(f"{where}: entry {j} is {json.dumps(v)[:40]}, not a finite float32 number")
        if not lo <= v <= hi:
            raise InputError(f"{where}: entry {j} = {v:g} is outside {env.id}'s observation space [{lo:g}, {hi:g}]")
        if env.obs_integer and not float(v).is_integer():
            raise InputError(f"{where}: entry {j} is {v!r}; {env.id} observations are whole numbers")
        row[j] = v
    return row


def _fits_float32(v: int | float) -> bool:
    return abs(v) <= float(np.finfo(np.float32).max)  # False for inf, NaN and huge integers


def preprocess(env: Environment, items: Sequence[bytes]) -> dict[str, np.ndarray]:
    """JSON arrays of numbers (one observation each) -> the `observation` batch."""
    if not items:
        raise InputError(f"give at least one {env.id} observation (a JSON array of {env.obs_dim} numbers)")
    return {"observation": np.stack([_observation(env, item, n) for n, item in enumerate(items, 1)])}


def postprocess(env: Environment, outputs: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    """One result per observation: the greedy action (with the action probabilities and
    logits of a discrete policy) and the critic's value estimate."""
    actions = env.greedy_actions(outputs)
    values = as_numpy(outputs["value"]).astype(np.float64)
    if not env.discrete:
        return [{"action": a.tolist(), "value": float(v)} for a, v in zip(actions, values)]
    logits = as_numpy(outputs["logits"]).astype(np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return [{"action": int(a), "probabilities": p.tolist(), "logits": lg.tolist(), "value": float(v)}
            for a, p, lg, v in zip(actions, probs, logits, values)]

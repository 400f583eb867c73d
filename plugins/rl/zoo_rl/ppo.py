"""Proximal Policy Optimization (Schulman et al., 2017, arXiv:1707.06347), written out.

One iteration ("epoch" in the zoo's Recipe) = collect `num_envs * num_steps` transitions
with the current stochastic policy, compute advantages by GAE(lambda) (Schulman et al.,
2016, arXiv:1506.02438), then `update_epochs` passes of minibatch Adam steps on the
clipped surrogate objective + value loss - entropy bonus. The details follow CleanRL's
`ppo.py` and "The 37 Implementation Details of PPO" (Huang et al., 2022): per-minibatch
advantage normalization, global gradient-norm clipping, Adam eps 1e-5, learning rate
annealed over the run, and bootstrapping the value of time-limit truncated episodes
(Pardo et al., 2018, "Time Limits in Reinforcement Learning") rather than treating a
truncation as a terminal state.

Deterministic on CPU for a seed: the environments, action sampling and minibatch order
draw from seeded generators, so two runs give identical weights.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
from zoo.checkpoint import Checkpoint
from zoo.errors import UnsupportedError, ZooError
from zoo.spec import ModelSpec
from zoo.tensors import cpu_state_dict
from zoo.training import Run
from zoo.training.state import TrainingState, capture_rng, restore_rng

from .config import PPOConfig
from .envs import Environment, mean_return
from .policy import ActorCritic


ROLLOUT_KEYS = ("x", "actions", "log_probs", "values", "rewards", "next_values", "terminated", "ended")


def gae(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor, terminated: torch.Tensor,
        ended: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Generalized advantage estimates for a (steps, envs) rollout.

    `next_values[t]` is V of the state reached at step t (the episode's last state when
    it ended there); `terminated` stops bootstrapping from it (a true terminal state),
    `ended` (terminated or truncated) stops the advantage flowing back across episodes:

        delta_t = r_t + gamma * (1 - terminated_t) * V(s_{t+1}) - V(s_t)
        A_t     = delta_t + gamma * lam * (1 - ended_t) * A_{t+1}
    """
    advantages = torch.zeros_like(rewards)
    following = torch.zeros_like(rewards[0])
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + gamma * (1.0 - terminated[t]) * next_values[t] - values[t]
        following = delta + gamma * lam * (1.0 - ended[t]) * following
        advantages[t] = following
    return advantages


def _lr_factor(schedule: str, progress: float) -> float:
    """Learning-rate multiplier at `progress` (0 at the start of the run, 1 at the end)."""
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if schedule == "constant":
        return 1.0
    raise ZooError(f"unknown schedule {schedule!r} in the PPO recipe (linear | cosine | constant)")


def _rollout(module: ActorCritic, env: Environment, envs, obs: np.ndarray, ppo: PPOConfig,
             gen: torch.Generator, device: str, episodes: dict[str, Any]):
    """Act for `num_steps` steps: the (steps, envs) batch to learn from, and the next observation."""
    steps: dict[str, list[torch.Tensor]] = {k: [] for k in ROLLOUT_KEYS}
    norm = module.obs_norm

    def tensor(array) -> torch.Tensor:
        return torch.as_tensor(np.asarray(array, dtype=np.float32), device=device)

    for _ in range(ppo.num_steps):
        raw = tensor(obs)
        if ppo.normalize_obs:
            norm.update(raw)
        with torch.no_grad():
            x = norm(raw)  # kept normalized as acted on, so the update sees what the policy saw
            action, log_prob = module.act(x, gen)
            value = module.value(x)
        sent = action.cpu().numpy()
        obs, reward, terminated, truncated, info = envs.step(
            sent if env.discrete else np.clip(sent, env.action_low, env.action_high))
        ended = terminated | truncated
        reached = obs.copy()  # the state each step reached: an ended episode's last state
        for i in np.flatnonzero(ended):
            reached[i] = info["final_obs"][i]
        with torch.no_grad():
            next_value = module.value(norm(tensor(reached)))
        episodes["running"] += reward
        for i in np.flatnonzero(ended):
            episodes["returns"].append(float(episodes["running"][i]))
            episodes["running"][i] = 0.0
        row = (x, action, log_prob, value, tensor(reward * ppo.reward_scale), next_value, tensor(terminated), tensor(ended))
        for key, item in zip(ROLLOUT_KEYS, row):
            steps[key].append(item)
    return {k: torch.stack(v) for k, v in steps.items()}, obs


def _update(module: ActorCritic, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor], ppo: PPOConfig,
            minibatch: int, gen: torch.Generator) -> dict[str, float]:
    """`update_epochs` passes of clipped-surrogate minibatch steps over one rollout."""
    advantages = gae(batch["rewards"], batch["values"], batch["next_values"], batch["terminated"],
                     batch["ended"], ppo.gamma, ppo.gae_lambda)
    returns = advantages + batch["values"]  # the value targets (TD(lambda) returns)
    flat = {"x": batch["x"].flatten(0, 1), "actions": batch["actions"].flatten(0, 1),
            "log_probs": batch["log_probs"].flatten(0, 1), "advantages": advantages.flatten(), "returns": returns.flatten()}
    n = len(flat["advantages"])
    stats: dict[str, list[float]] = {"policy_loss": [], "value_loss": [], "entropy": [], "approx_kl": [], "clip_fraction": []}
    for _ in range(ppo.update_epochs):
        order = torch.randperm(n, generator=gen, device=gen.device)
        for start in range(0, n, minibatch):
            idx = order[start:start + minibatch]
            log_prob, entropy = module.log_prob_entropy(flat["x"][idx], flat["actions"][idx])
            log_ratio = log_prob - flat["log_probs"][idx]
            ratio = log_ratio.exp()
            adv = flat["advantages"][idx]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - ppo.clip, 1 + ppo.clip)).mean()
            value_loss = 0.5 * (module.value(flat["x"][idx]) - flat["returns"][idx]).square().mean()
            loss = policy_loss - ppo.ent_coef * entropy.mean() + ppo.vf_coef * value_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), ppo.max_grad_norm)
            optimizer.step()
            with torch.no_grad():  # the low-variance KL estimator, k3 in Schulman's note
                stats["approx_kl"].append(((ratio - 1) - log_ratio).mean().item())
                stats["clip_fraction"].append(((ratio - 1).abs() > ppo.clip).float().mean().item())
            stats["policy_loss"].append(policy_loss.item())
            stats["value_loss"].append(value_loss.item())
            stats["entropy"].append(entropy.mean().item())
    return {k: float(np.mean(v)) for k, v in stats.items()}


#: iterations between resume points (a resume point is a few kB; the atomic write's fsync dominates)
SAVE_EVERY = 10


def train(spec: ModelSpec, run: Run, *, env: Environment, ppo: PPOConfig) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The `spec.trainer` of a PPO policy: `run.epochs` PPO iterations, then the greedy
    `mean_return` over the evaluation episodes. Returns (state dict, metrics).

    Uses the core's `Run` like the supervised loop: its device, progress bar, TensorBoard
    scalars and resume points (`last/`, with --resume). A resumed run continues the
    policy, optimizer, observation statistics and random generators exactly; the
    environments restart from fresh episodes seeded by the iteration (their simulator
    state is not part of the resume point), so it follows the same distribution rather
    than the same episodes as an uninterrupted run.

    Runs PyTorch on one CPU thread: the networks are a few thousand parameters, so
    intra-op threads only add synchronization (and contention on a shared machine)."""
    unsupported = {"--precision": run.options.precision != "fp32", "--compile": run.options.compile,
                   "--accumulate": run.options.accumulate != 1, "--nproc": run.world.distributed,
                   "--grad-checkpointing": run.options.grad_checkpointing, "--patience": run.options.patience is not None,
                   "--max-steps": run.options.max_steps is not None, "--batch-size": run.options.batch_size is not None,
                   "--clip-grad-norm (PPO clips at its own max_grad_norm)": run.options.clip_grad_norm is not None,
                   "--val-fraction (PPO evaluates by episodes)": run.options.val_fraction is not None,
                   "--channels-last": run.options.channels_last is not None, "--profile": run.options.profile,
                   "--threads other than 1 (PPO runs on one thread)": run.options.threads not in (None, 1)}
    named = [k for k, v in unsupported.items() if v]
    if named:
        raise UnsupportedError(f"{spec.name}: the PPO trainer does not take {', '.join(named)} "
                               f"(a few-thousand-parameter policy trains in fp32 in one process)")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(spec, run, env, ppo)
    finally:
        torch.set_num_threads(threads)


def _train(spec: ModelSpec, run: Run, env: Environment, ppo: PPOConfig):
    from zoo.train import module_fn

    recipe, device, seed, epochs = spec.recipe, run.device, run.seed, run.epochs
    assert recipe is not None
    torch.manual_seed(seed)
    module = spec.build().to(device).train()
    if recipe.optimizer != "adamw":
        raise ZooError(f"{spec.name}: the PPO trainer uses adamw, not {recipe.optimizer!r}")
    optimizer = torch.optim.AdamW(module.parameters(), lr=recipe.lr, eps=1e-5, weight_decay=recipe.weight_decay)
    gen = torch.Generator(device).manual_seed(seed)
    episodes: dict[str, Any] = {"running": np.zeros(ppo.num_envs), "returns": []}
    history: list[float | None] = []
    start_iteration, seconds = 0, 0.0
    resumed = run.resume_state()
    if resumed is not None:
        module.load_state_dict(resumed.checkpoint.state)
        optimizer.load_state_dict(resumed.optimizer)
        restore_rng(resumed.rng, gen)
        start_iteration = resumed.epoch
        history, episodes["returns"], seconds = (resumed.run["history"], resumed.run["returns"],
                                                 resumed.run["seconds"])
    envs = env.make_vector(ppo.num_envs)
    # environment i is seeded with seed + i (a resumed run: re-seeded by its iteration)
    obs, _ = envs.reset(seed=seed + 1000 * start_iteration)
    stats: dict[str, float] = {}
    with run.progress(epochs) as update:
        update(advance=start_iteration)
        for iteration in range(start_iteration, epochs):
            start = time.perf_counter()
            for group in optimizer.param_groups:
                group["lr"] = recipe.lr * _lr_factor(recipe.schedule, iteration / epochs)
            seen = len(episodes["returns"])
            batch, obs = _rollout(module, env, envs, obs, ppo, gen, device, episodes)
            stats = _update(module, optimizer, batch, ppo, recipe.batch_size, gen)
            seconds += time.perf_counter() - start
            finished = episodes["returns"][seen:]  # episodes that ended in this rollout
            history.append(round(float(np.mean(finished)), 2) if finished else None)
            recent = np.mean(episodes["returns"][-10:]) if episodes["returns"] else float("nan")
            env_steps = (iteration + 1) * ppo.num_envs * ppo.num_steps
            run.log(env_steps, {"train/episode_return": history[-1], "train/lr": optimizer.param_groups[0]["lr"],
                                **{f"train/{k}": v for k, v in stats.items()}})
            update(status=f"iteration {iteration + 1}/{epochs} return {recent:.1f} (last 10 episodes) "
                          f"kl {stats['approx_kl']:.4f}")
            if (iteration + 1) % SAVE_EVERY == 0 or iteration + 1 == epochs:
                run.save_last(TrainingState(
                    Checkpoint(spec.name, dict(spec.config), cpu_state_dict(module), {"iteration": iteration + 1}),
                    iteration + 1, iteration + 1, optimizer.state_dict(), None, None, capture_rng(gen),
                    {"history": history, "returns": episodes["returns"], "seconds": seconds}))
            if run.on_epoch_end is not None:
                run.on_epoch_end(iteration + 1, {"train/episode_return": history[-1]})
    envs.close()
    module.eval()
    env_steps = epochs * ppo.num_envs * ppo.num_steps
    metrics = {"test_mean_return": mean_return(env, module_fn(module, spec, device)),
               "train_seconds": round(seconds, 2), "iterations": epochs, "env_steps": env_steps,
               "samples_per_second": round(env_steps / seconds, 1) if seconds else None,
               "episodes": len(episodes["returns"]), "train_return_history": history, "last_update": stats,
               "env": env.id, "ppo": asdict(ppo)}
    return cpu_state_dict(module), metrics

"""PPO's hyper-parameters, apart from the training loop (ppo.py), so that the plugin
states its models' settings without importing PyTorch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PPOConfig:
    """PPO hyper-parameters beyond the Recipe (which gives the iterations as `epochs`, the
    minibatch size as `batch_size`, the learning rate, its schedule and the seed)."""

    num_envs: int = 8  # environments stepped together (gymnasium.vector.SyncVectorEnv)
    num_steps: int = 128  # steps per environment per iteration: the rollout length
    update_epochs: int = 4  # passes over each rollout
    gamma: float = 0.99  # discount
    gae_lambda: float = 0.95  # GAE's bias/variance trade-off
    clip: float = 0.2  # the surrogate's ratio clip epsilon
    ent_coef: float = 0.0  # entropy bonus weight
    vf_coef: float = 0.5  # value loss weight
    max_grad_norm: float = 0.5  # global gradient-norm clip
    reward_scale: float = 1.0  # rewards are multiplied by this for learning (not for reported returns)
    normalize_obs: bool = False  # learn the policy's running observation normalization

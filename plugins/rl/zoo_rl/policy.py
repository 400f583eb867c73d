"""The actor-critic network PPO trains, and the greedy policy it exports.

Separate actor and critic MLPs with tanh activations and orthogonal initialization, as in
"The 37 Implementation Details of Proximal Policy Optimization" (Huang et al., 2022) and
CleanRL's `ppo.py` / `ppo_continuous_action.py`: the policy head starts near uniform (gain
0.01) so early exploration is broad, the value head at gain 1.

Observations are normalized by running statistics that live in registered buffers, so
the exported module takes raw environment observations and the normalization travels
with the weights (checkpoint, ONNX, torch.export) instead of living in a wrapper.

`forward` is the exported greedy policy: float outputs only (logits, or the action mean
clipped to the action bounds, and the value), so backend parity compares floats and the
action choice (argmax) happens in the domain code.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class RunningNorm(nn.Module):
    """Observation normalization by running mean and variance (Chan et al.'s parallel
    update, as in SB3's `RunningMeanStd`), clipped to +-`clip` standard deviations."""

    def __init__(self, dim: int, clip: float = 10.0, eps: float = 1e-8):
        super().__init__()
        self.clip, self.eps = clip, eps
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.tensor(0.0))  # observations seen (0: identity)

    @torch.no_grad()
    def update(self, batch: torch.Tensor) -> None:
        n = batch.shape[0]
        mean, var = batch.mean(0), batch.var(0, unbiased=False)
        total = self.count + n
        delta = mean - self.mean
        m2 = self.var * self.count + var * n + delta.square() * self.count * n / total
        self.mean += delta * n / total
        self.var.copy_(m2 / total)
        self.count.fill_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ((x - self.mean) / torch.sqrt(self.var + self.eps)).clamp(-self.clip, self.clip)


def _layer(n_in: int, n_out: int, gain: float) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(n_in: int, hidden: int, n_out: int, out_gain: float) -> nn.Sequential:
    return nn.Sequential(_layer(n_in, hidden, math.sqrt(2)), nn.Tanh(),
                         _layer(hidden, hidden, math.sqrt(2)), nn.Tanh(),
                         _layer(hidden, n_out, out_gain))


class ActorCritic(nn.Module):
    """A categorical policy (`num_actions` > 0) or a diagonal Gaussian policy over a box
    [`low`, `high`]^`action_dim` with a state-independent log standard deviation."""

    def __init__(self, obs_dim: int, hidden: int = 64, num_actions: int = 0, action_dim: int = 0,
                 low: float = -1.0, high: float = 1.0, init_log_std: float = 0.0, reward_scale: float = 1.0):
        super().__init__()
        if (num_actions > 0) == (action_dim > 0):
            raise ValueError("give either num_actions (discrete) or action_dim (continuous)")
        self.discrete = num_actions > 0
        self.low, self.high = low, high
        self.reward_scale = reward_scale  # the critic learns scaled returns; `forward` reports true ones
        self.obs_norm = RunningNorm(obs_dim)
        self.actor = _mlp(obs_dim, hidden, num_actions or action_dim, out_gain=0.01)
        self.critic = _mlp(obs_dim, hidden, 1, out_gain=1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The greedy policy: (logits or the clipped action mean, value in reward units)."""
        x = self.obs_norm(observation)
        head = self.actor(x)
        if not self.discrete:
            head = head.clamp(self.low, self.high)
        return head, self.critic(x).squeeze(-1) / self.reward_scale

    def distribution(self, x: torch.Tensor) -> torch.distributions.Distribution:
        """The stochastic policy at normalized observations `x`."""
        head = self.actor(x)
        if self.discrete:
            return torch.distributions.Categorical(logits=head)
        return torch.distributions.Normal(head, self.log_std.exp().expand_as(head))

    def value(self, x: torch.Tensor) -> torch.Tensor:
        """The critic at normalized observations, in the scaled reward units it learns in."""
        return self.critic(x).squeeze(-1)

    def log_prob_entropy(self, x: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probability of `actions` and the entropy, summed over action dimensions."""
        dist = self.distribution(x)
        if self.discrete:
            return dist.log_prob(actions), dist.entropy()
        return dist.log_prob(actions).sum(-1), dist.entropy().sum(-1)

    @torch.no_grad()
    def act(self, x: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A sampled action (unclipped: the environment step clips it, and the log-prob is of
        what was sampled) and its log-probability, drawn from a seeded generator."""
        head = self.actor(x)
        if self.discrete:
            log_probs = torch.log_softmax(head, -1)
            action = torch.multinomial(log_probs.exp(), 1, generator=generator).squeeze(-1)
            return action, log_probs.gather(-1, action[:, None]).squeeze(-1)
        std = self.log_std.exp().expand_as(head)
        action = head + std * torch.randn(head.shape, generator=generator, device=head.device)
        return action, torch.distributions.Normal(head, std).log_prob(action).sum(-1)

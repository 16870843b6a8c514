"""Data Agent (Yang et al., ICML 2026): a PPO actor-critic that scores samples, as in the released code.

State = the sample's penultimate feature from the training forward pass; action a ∈ (0,1) ~ Beta(α, β) with
α, β = softplus(·)+1 is the sample's selection score (top-⌊ρN⌋ next epoch, weight 1/ρ). Reward (their
`compute_reward`): r = a·(w·l + (1−w)·u), l = label-smoothed CE clipped at the batch 95th percentile and
min-max normalised, u = H(softmax z)/log C, w = Var(l)/(Var(l)+Var(u)); r is normalised by running
statistics of batch means. PPO every 10 batches: GAE(γ, λ) over the sequence of batches, advantages scaled
by their std without centring, K full-batch epochs, clip 0.2, no entropy bonus. Read at Jackbrocp/Data-Agent
(PPO.py, train.py, normalization.py, dataloader.py). The reward is in `framework.samplers.reward`.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributions import Beta

from framework.samplers.policies import Step, TopKPolicy, gumbel_top_k, top_k
from framework.samplers.reward import (
    RewardNormalizer,
    adaptive_weight,
    composite_reward,
    difficulty,
    reward_from,
    sample_pieces,
    uncertainty,
)
from framework.samplers.table import ScoreTable

# the reward's pieces lived here first: importing them from here still works
__all__ = ["BetaActor", "Critic", "DataAgentPolicy", "PPOAgent", "RewardNormalizer", "adaptive_weight", "batch_rank",
           "composite_reward", "difficulty", "uncertainty"]


def _orthogonal(layer: nn.Linear, gain: float, generator: torch.Generator) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain=gain, generator=generator)
    nn.init.zeros_(layer.bias)
    return layer


class BetaActor(nn.Module):
    """s → 128 → 128 (ReLU) → (α, β), both softplus + 1 (a unimodal Beta); heads initialised with gain 0.01."""

    def __init__(self, state_dim: int, hidden: int = 128, generator: torch.Generator | None = None):
        super().__init__()
        g = generator or torch.Generator().manual_seed(0)
        with torch.random.fork_rng(devices=[]):  # nn.Linear's own init would draw from the global RNG
            self.fc1 = _orthogonal(nn.Linear(state_dim, hidden), 1.0, g)
            self.fc2 = _orthogonal(nn.Linear(hidden, hidden), 1.0, g)
            self.alpha = _orthogonal(nn.Linear(hidden, 1), 0.01, g)
            self.beta = _orthogonal(nn.Linear(hidden, 1), 0.01, g)

    def forward(self, s: Tensor) -> tuple[Tensor, Tensor]:
        h = F.relu(self.fc2(F.relu(self.fc1(s))))
        return F.softplus(self.alpha(h)).squeeze(-1) + 1.0, F.softplus(self.beta(h)).squeeze(-1) + 1.0

    def dist(self, s: Tensor) -> Beta:
        return Beta(*self(s), validate_args=False)  # α, β > 1 by construction: the checks cost time only


class Critic(nn.Module):
    """s → 128 → 128 (ReLU) → V(s), orthogonal init with gain 1."""

    def __init__(self, state_dim: int, hidden: int = 128, generator: torch.Generator | None = None):
        super().__init__()
        g = generator or torch.Generator().manual_seed(1)
        with torch.random.fork_rng(devices=[]):
            self.net = nn.Sequential(
                _orthogonal(nn.Linear(state_dim, hidden), 1.0, g), nn.ReLU(),
                _orthogonal(nn.Linear(hidden, hidden), 1.0, g), nn.ReLU(),
                _orthogonal(nn.Linear(hidden, 1), 1.0, g),
            )

    def forward(self, s: Tensor) -> Tensor:
        return self.net(s).squeeze(-1)


# -- PPO -------------------------------------------------------------------------------------------------------
class PPOAgent:
    """Actor, critic, their Adam optimisers (lr 3e-4, eps 1e-5, wd 5e-4), the rollout buffer and a private
    RNG for sampling actions (the global RNG is never touched, so the agent cannot perturb training)."""

    BUFFER = ("states", "actions", "log_probs", "values", "rewards")

    def __init__(
        self, state_dim: int, seed: int = 0, lr_actor: float = 3e-4, lr_critic: float = 3e-4,
        eps_clip: float = 0.2, k_epochs: int = 4, gamma: float = 0.99, gae_lambda: float = 0.95,
        centre: bool = False, hidden: int = 128, fused: bool = False,
    ):
        g = torch.Generator().manual_seed(seed)
        self.state_dim = state_dim
        self.actor, self.critic = BetaActor(state_dim, hidden, g), Critic(state_dim, hidden, g)
        self.lr_actor, self.lr_critic = lr_actor, lr_critic
        self.fused = fused
        fast = {"fused": True} if fused else {}  # one kernel per step instead of a loop over the tensors
        self.opt_actor = torch.optim.Adam(self.actor.parameters(), lr=lr_actor, eps=1e-5, weight_decay=5e-4, **fast)
        self.opt_critic = torch.optim.Adam(self.critic.parameters(), lr=lr_critic, eps=1e-5, weight_decay=5e-4, **fast)
        self.eps_clip, self.k_epochs, self.gamma, self.gae_lambda = eps_clip, k_epochs, gamma, gae_lambda
        self.centre = centre
        self.rng_state = torch.Generator().manual_seed(seed + 7_919).get_state()
        self.buffer: dict[str, list[Tensor]] = {k: [] for k in self.BUFFER}

    @property
    def device(self) -> torch.device:
        return next(self.actor.parameters()).device

    def to(self, device: torch.device | str) -> PPOAgent:
        self.actor.to(device)
        self.critic.to(device)
        for opt in (self.opt_actor, self.opt_critic):
            for state in opt.state.values():
                for k, v in state.items():
                    if isinstance(v, Tensor) and (k != "step" or self.fused):  # fused Adam keeps its step there
                        state[k] = v.to(device)
        return self

    @torch.no_grad()
    def act(self, states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Sample actions for `states` (B, d); returns (actions, log-probs, values), all (B,)."""
        dist = self.actor.dist(states)
        a = self.sample(dist)
        return a, dist.log_prob(a), self.critic(states)

    def sample(self, dist: Beta) -> Tensor:
        """Actions from `dist`, drawn on the CPU from the agent's private RNG (the global RNG is left as it was)."""
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self.rng_state)
            a = Beta(dist.concentration1.cpu(), dist.concentration0.cpu(), validate_args=False).sample()
            self.rng_state = torch.get_rng_state()
        return a.clamp(1e-6, 1 - 1e-6).to(dist.concentration1.device)  # exactly 0 or 1 has log-prob ±inf

    def store(self, states: Tensor, actions: Tensor, log_probs: Tensor, values: Tensor, rewards: Tensor) -> None:
        for k, v in zip(self.BUFFER, (states, actions, log_probs, values, rewards), strict=True):
            self.buffer[k].append(v.detach())

    def __len__(self) -> int:
        return len(self.buffer["rewards"])

    def advantages(self) -> Tensor:
        """GAE over the sequence of stored batches, samples aligned by position, bootstrap 0, no terminals;
        a batch whose size differs from the next one's sees that batch's mean value (as the released code)."""
        rewards, values = self.buffer["rewards"], self.buffer["values"]
        out: list[Tensor] = []
        gae = torch.zeros_like(rewards[-1])
        for t in reversed(range(len(rewards))):
            r, v = rewards[t], values[t]
            if t == len(rewards) - 1:
                nxt = torch.zeros_like(v)
            else:
                nxt = values[t + 1]
                if nxt.numel() != v.numel():
                    nxt = torch.full_like(v, float(nxt.mean()))
            if gae.numel() != v.numel():
                gae = torch.zeros_like(v)
            gae = r + self.gamma * nxt - v + self.gamma * self.gae_lambda * gae
            out.insert(0, gae)
        return torch.cat(out)

    def update(self) -> dict[str, float]:
        """K clipped-surrogate actor steps and MSE critic steps on the whole buffer, then clear it."""
        if not len(self):
            return {}
        adv = self.advantages()
        states, actions = torch.cat(self.buffer["states"]), torch.cat(self.buffer["actions"])
        old_logp, values = torch.cat(self.buffer["log_probs"]), torch.cat(self.buffer["values"])
        returns = adv + values
        if self.centre:  # baseline-subtracted: an action is pushed up only if it did better than the average
            adv = adv - adv.mean()
        adv = adv / (adv.std() + 1e-8)  # the released code scales without centring
        actor_loss = critic_loss = 0.0
        for _ in range(self.k_epochs):
            ratio = torch.exp(self.actor.dist(states).log_prob(actions) - old_logp)
            loss_a = -torch.min(ratio * adv, ratio.clamp(1 - self.eps_clip, 1 + self.eps_clip) * adv).mean()
            self.opt_actor.zero_grad()
            loss_a.backward()
            self.opt_actor.step()
            loss_c = F.mse_loss(self.critic(states), returns)
            self.opt_critic.zero_grad()
            loss_c.backward()
            self.opt_critic.step()
            actor_loss, critic_loss = actor_loss + loss_a.item(), critic_loss + loss_c.item()
        self.buffer = {k: [] for k in self.BUFFER}
        return {"actor_loss": actor_loss / self.k_epochs, "critic_loss": critic_loss / self.k_epochs}

    def lr_decay(self, epoch: int, num_epochs: int) -> None:
        """lr·(1 − 0.99·e/(E−1)) after epoch e (the code's `lr_decay(epoch)` with max_step = E)."""
        factor = 1.0 if num_epochs <= 1 else 1 - 0.99 / (num_epochs - 1) * epoch
        for opt, lr in ((self.opt_actor, self.lr_actor), (self.opt_critic, self.lr_critic)):
            for group in opt.param_groups:
                group["lr"] = lr * factor

    def state_dict(self) -> dict[str, Any]:
        return {
            "state_dim": self.state_dim, "actor": self.actor.state_dict(), "critic": self.critic.state_dict(),
            "opt_actor": self.opt_actor.state_dict(), "opt_critic": self.opt_critic.state_dict(),
            "rng_state": self.rng_state.clone(), "buffer": {k: [t.cpu() for t in v] for k, v in self.buffer.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        device = self.device
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.opt_actor.load_state_dict(state["opt_actor"])
        self.opt_critic.load_state_dict(state["opt_critic"])
        self.rng_state = state["rng_state"].clone()
        self.buffer = {k: [t.to(device) for t in state["buffer"][k]] for k in self.BUFFER}


def batch_rank(values: Tensor) -> Tensor:
    """Each value's rank within the batch scaled to (0, 1]: (1 + #smaller) / B, ties sharing the lowest rank."""
    return (torch.searchsorted(values.sort().values, values) + 1).float() / values.numel()


class DataAgentPolicy(TopKPolicy):
    """Top-⌊ρN⌋ by the agent's latest action, weight 1/ρ; the agent acts on every training step's features.

    Defaults are the released code's; `variant`, `centred`, `temperature` and `staleness` go beyond it (off by
    default). Raw actions drift upwards over training, so hard top-k on stale scores freezes selection onto one half
    of the data (docs/data_agent.md); "ranked" scores keep fresh and stale scores comparable.

    Args:
        ratio: fraction ρ of the samples kept in each pruning epoch, in (0, 1].
        delta: fraction δ of the epochs that prune, in [0, 1]; from epoch ⌊δE⌋ on, full data with weight 1.
        rescale: weight the kept samples' losses by 1/ρ, so the effective step matches full data; False: weight 1.
        update_every: training steps of stored transitions between PPO updates (≥ 1).
        label_smoothing: label smoothing ε of the cross-entropy the agent's reward is computed from.
        reward_norm: normalise rewards by a running mean and std before PPO sees them.
        learn: train the agent with PPO; False freezes its initial policy (an ablation).
        variant: "faithful" (the raw action is the score) or "ranked" (its rank within the step's batch, in (0, 1]).
        lr_actor: Adam lr of the PPO actor.
        lr_critic: Adam lr of the PPO critic.
        k_epochs: PPO epochs over each update's stored transitions.
        eps_clip: PPO's ratio clip ε.
        gamma: PPO's discount factor γ.
        gae_lambda: λ of generalised advantage estimation.
        seed: seed of the agent's networks and sampling; None: 0.
        centred: subtract the mean from PPO's advantages.
        temperature: τ > 0 samples the subset by Gumbel-top-k, probability ∝ exp(z/τ) of the scores; 0: top-k.
        staleness: λ added to a sample's standardised score per epoch it went unseen, so it is re-scored; 0: none.
    """

    needs = ("index", "logits", "targets", "features")

    def __init__(
        self, ratio: float = 0.5, delta: float = 0.875, rescale: bool = True, update_every: int = 10,
        label_smoothing: float = 0.1, reward_norm: bool = True, learn: bool = True, variant: str = "faithful",
        lr_actor: float = 3e-4, lr_critic: float = 3e-4, k_epochs: int = 4, eps_clip: float = 0.2,
        gamma: float = 0.99, gae_lambda: float = 0.95, seed: int | None = None, centred: bool = False,
        temperature: float = 0.0, staleness: float = 0.0,
    ):
        super().__init__(ratio, delta, rescale)
        if variant not in ("faithful", "ranked"):
            raise ValueError(f"variant={variant!r}; valid: 'faithful', 'ranked'")
        if not (math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"temperature={temperature} must be a finite number >= 0 (0: deterministic top-k)")
        if not (math.isfinite(staleness) and staleness >= 0):
            raise ValueError(f"staleness={staleness} must be a finite number >= 0 (0: no staleness bonus)")
        self.temperature, self.staleness = float(temperature), float(staleness)
        if update_every < 1:
            raise ValueError(f"update_every={update_every} must be >= 1 batch")
        self.update_every, self.label_smoothing, self.reward_norm = update_every, label_smoothing, reward_norm
        self.learn, self.variant, self.seed = learn, variant, seed
        self.ppo = dict(lr_actor=lr_actor, lr_critic=lr_critic, k_epochs=k_epochs, eps_clip=eps_clip,
                        gamma=gamma, gae_lambda=gae_lambda, centre=centred)
        self.agent: PPOAgent | None = None
        self.normalizer = RewardNormalizer()
        self.agent_s = 0.0  # seconds in the agent's own compute (act, reward, PPO updates): the method's cost

    def build(self, state_dim: int) -> PPOAgent:
        self.agent = PPOAgent(state_dim, seed=self.seed or 0, **self.ppo)
        return self.agent

    def select(self, table: ScoreTable, epoch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        if not (self.temperature or self.staleness):
            return super().select(table, epoch, generator)  # the released code's top-k
        k, scores = self.planned_count(table.n), table.scores
        if self.staleness:
            z = (scores - scores.mean()) / scores.std().clamp_min(1e-12)
            scores = z + self.staleness * (epoch - 1 - table.last_seen).clamp_min(0)
        pick = gumbel_top_k(scores, k, self.temperature, generator) if self.temperature else top_k(scores, k, generator)
        return pick, self._rescaled(k, self.rescale)

    def observe(self, step: Step, table: ScoreTable, epoch: int) -> dict[str, float]:
        start = time.perf_counter()
        states = step["features"].detach().float().flatten(1)
        agent = self.agent if self.agent is not None else self.build(states.shape[1])
        if agent.device != states.device:
            agent.to(states.device)
        actions, log_probs, values = agent.act(states)
        scores = batch_rank(actions) if self.variant == "ranked" else actions
        reward, info = reward_from(*sample_pieces(step, self.label_smoothing), actions)
        if self.reward_norm:
            reward = self.normalizer(reward)
        info["action_mean"] = float(actions.mean())
        if self.learn:
            agent.store(states, actions, log_probs, values, reward)
            if len(agent) >= self.update_every:
                info.update(agent.update())
        self.agent_s += time.perf_counter() - start
        table.update(step["index"], scores, epoch)  # the bookkeeping: one vectorised scatter
        return info

    def end_epoch(self, epoch: int, num_epochs: int) -> dict[str, float]:
        if self.agent is None:
            return {}
        start = time.perf_counter()
        info = self.agent.update() if self.learn else {}
        self.agent.lr_decay(epoch, num_epochs)
        self.agent_s += time.perf_counter() - start
        return info

    def state_dict(self) -> dict[str, Any]:
        agent = None if self.agent is None else self.agent.state_dict()
        return {"agent": agent, "normalizer": self.normalizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.normalizer.load_state_dict(state["normalizer"])
        if state["agent"] is not None:
            agent = self.agent if self.agent is not None else self.build(int(state["agent"]["state_dim"]))
            agent.load_state_dict(state["agent"])

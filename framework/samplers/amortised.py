"""The Data Agent on an amortised schedule (`data_agent_amortised`; not the paper's): it acts and learns once per
epoch instead of on every training step.

The released agent acts on every step's features and runs PPO every 10 steps, so its cost is fixed per sample and
is more than half of a small model's fit. Here a step only hands its (gathered) features, logits and targets to a
buffer. At the end of an epoch that is followed by a pruning epoch, in one batched no-grad pass, the actor scores
every sample the epoch trained on (each sample's state is its feature from its own training step, as in the paper),
the reward is computed over the epoch's samples as one batch, and PPO makes one update on a seeded subsample of
them (one step, so GAE reduces to r − V). The epoch's samples are then re-scored in the table, and the selection is
`data_agent_staleness`'s: the top ⌊ρN⌋ of the standardised scores plus λ per epoch unseen. Epochs after the
annealing point never select again, so they cost the agent nothing. The epoch's samples are taken in index order
(repeats dropped), so the result does not depend on how the steps grouped them: the same on 1 or 2 DDP ranks.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from framework.samplers.agent import DataAgentPolicy, PPOAgent
from framework.samplers.policies import Step
from framework.samplers.reward import composite_reward
from framework.samplers.table import ScoreTable

FIELDS = ("index", "features", "logits", "targets")


def epoch_batch(steps: list[Step]) -> Step:
    """The epoch's steps as one batch in sample-index order, each sample once (its last occurrence: a DDP
    padding duplicate counts once), so any grouping of the same samples into steps and ranks gives the same batch."""
    index = torch.cat([s["index"].reshape(-1).long().cpu() for s in steps])
    rows = torch.arange(index.numel())
    last = torch.full((int(index.max()) + 1,), -1, dtype=torch.long).scatter_reduce(0, index, rows, reduce="amax")
    keep = last[last >= 0]  # in index order
    out = {"index": index[keep]}
    for key in FIELDS[1:]:
        values = torch.cat([s[key].to(steps[-1][key].device) for s in steps])  # a resumed epoch's: on the CPU
        out[key] = values[keep.to(values.device)]
    return out


class AmortisedAgentPolicy(DataAgentPolicy):
    """The Data Agent acting and learning once per epoch, on the samples the epoch trained on.

    `update_size`: samples in the one PPO update per epoch, a seeded subsample of the epoch's (all of them if
    fewer; `None`: all), so the update's cost does not grow with the data. `hidden`: the width of the actor's and
    critic's two layers (the paper's 128). `staleness` λ (as `data_agent_staleness`) brings left-out samples back.
    The other arguments are `DataAgentPolicy`'s.
    """

    def __init__(
        self, ratio: float = 0.5, delta: float = 0.875, rescale: bool = True, label_smoothing: float = 0.1,
        learn: bool = True, lr_actor: float = 3e-4, lr_critic: float = 3e-4, k_epochs: int = 2,
        eps_clip: float = 0.2, seed: int | None = None, staleness: float = 0.5, update_size: int | None = 128,
        hidden: int = 32, fused: bool = True, learn_every: int = 4,
    ):
        super().__init__(ratio, delta, rescale, label_smoothing=label_smoothing, learn=learn, lr_actor=lr_actor,
                         lr_critic=lr_critic, k_epochs=k_epochs, eps_clip=eps_clip, seed=seed, staleness=staleness)
        if update_size is not None and update_size < 2:
            raise ValueError(f"update_size={update_size} must be >= 2 samples (or None: the whole epoch)")
        if learn_every < 1:
            raise ValueError(f"learn_every={learn_every} must be >= 1 epoch")
        self.learn_every = int(learn_every)
        if hidden < 1:
            raise ValueError(f"hidden={hidden} must be >= 1")
        self.update_size, self.hidden, self.fused = update_size, int(hidden), bool(fused)
        self.steps: list[Step] = []  # this epoch's step fields, until the epoch's end
        self.pending: dict[str, Tensor] | None = None  # the last epoch's scores, for the table at the next select
        self.subsample_state: Tensor | None = None  # the update's subsample RNG (never the global one)

    def build(self, state_dim: int) -> PPOAgent:
        self.agent = PPOAgent(state_dim, seed=self.seed or 0, hidden=self.hidden, fused=self.fused, **self.ppo)
        return self.agent

    def observe(self, step: Step, table: ScoreTable, epoch: int) -> dict[str, float]:
        start = time.perf_counter()
        self.steps.append({k: step[k].detach() for k in FIELDS})
        self.agent_s += time.perf_counter() - start
        return {}

    def end_epoch(self, epoch: int, num_epochs: int) -> dict[str, float]:
        steps, self.steps = self.steps, []
        if not steps or not self.prunes(epoch + 1, num_epochs):
            return {}  # no selection follows: scoring would buy nothing
        start = time.perf_counter()
        batch = epoch_batch(steps)
        states = batch["features"].float().flatten(1)
        agent = self.agent if self.agent is not None else self.build(states.shape[1])
        if agent.device != states.device:
            agent.to(states.device)
        actions, info = self._act_and_learn(agent, states, batch, self.learn and epoch % self.learn_every == 0)
        self.pending = {"index": batch["index"], "scores": actions.cpu(), "epoch": torch.tensor(epoch)}
        agent.lr_decay(epoch, num_epochs)
        self.agent_s += time.perf_counter() - start
        return info

    def select(self, table: ScoreTable, epoch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        if self.pending is not None:  # the last epoch's scores, computed at its end
            table.update(self.pending["index"], self.pending["scores"], int(self.pending["epoch"]))
            self.pending = None
        return super().select(table, epoch, generator)

    def _act_and_learn(self, agent: PPOAgent, states: Tensor, batch: Step, learn: bool) -> tuple[Tensor, dict]:
        """One no-grad pass of the actor over the epoch's states; with `learn`, the reward over the epoch and one
        PPO update."""
        with torch.no_grad():
            dist = agent.actor.dist(states)
            actions = agent.sample(dist)
        info = {"action_mean": float(actions.mean())}
        if not learn:
            return actions, info
        with torch.no_grad():
            reward, more = composite_reward(batch["logits"], batch["targets"], actions, self.label_smoothing)
        info.update(more)
        reward = (reward - reward.mean()) / reward.std().clamp_min(1e-8) if reward.numel() > 1 else reward * 0
        pick = self._subsample(actions.numel(), actions.device)
        with torch.no_grad():
            log_probs, values = dist.log_prob(actions)[pick], agent.critic(states[pick])
        agent.store(states[pick], actions[pick], log_probs, values, reward[pick])
        info.update(agent.update())
        return actions, info

    def _subsample(self, n: int, device: torch.device) -> Tensor:
        if self.update_size is None or n <= self.update_size:
            return torch.arange(n, device=device)
        g = torch.Generator()
        if self.subsample_state is None:
            g.manual_seed((self.seed or 0) + 104_729)
        else:
            g.set_state(self.subsample_state)
        pick = torch.randperm(n, generator=g)[: self.update_size].sort().values
        self.subsample_state = g.get_state()
        return pick.to(device)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["steps"] = [{k: v.cpu() for k, v in s.items()} for s in self.steps]
        state["pending"] = None if self.pending is None else {k: v.clone() for k, v in self.pending.items()}
        state["subsample_state"] = None if self.subsample_state is None else self.subsample_state.clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        device = self.agent.device if self.agent is not None else torch.device("cpu")
        self.steps = [{k: v.to(device) for k, v in s.items()} for s in state.get("steps", [])]
        pending = state.get("pending")
        self.pending = None if pending is None else {k: v.clone() for k, v in pending.items()}
        sub = state.get("subsample_state")
        self.subsample_state = None if sub is None else sub.clone()

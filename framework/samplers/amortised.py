"""The Data Agent on an amortised schedule (`data_agent_amortised`; not the paper's): it acts once per epoch and
learns every few epochs instead of on every training step.

The released agent acts on every step's features and runs PPO every 10 steps, so its cost is fixed per sample and
is more than half of a small model's fit. Here a step only hands its (gathered) features, logits and targets to a
buffer. At the end of an epoch that is followed by a pruning epoch, in one batched no-grad pass, the actor scores
every sample the epoch trained on (each sample's state is its feature from its own training step, as in the paper),
and on every `learn_every`-th epoch the reward is computed over the epoch's samples as one batch and PPO makes one
update on a seeded subsample of them (one step, so GAE reduces to r − V; `LeanPPOAgent`). The epoch's samples
are then re-scored in the table, and the selection is `data_agent_staleness`'s: the top ⌊ρN⌋ of the standardised
scores plus λ per epoch unseen. Epochs after the annealing point never select again, so they cost the agent nothing.
The epoch's samples are taken in index order (repeats dropped), so the result does not depend on how the steps
grouped them: the same on 1 or 2 DDP ranks.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import Tensor

from framework.rng import to_generator
from framework.samplers.agent import DataAgentPolicy, PPOAgent
from framework.samplers.policies import Step
from framework.samplers.reward import composite_reward
from framework.samplers.table import ScoreTable

FIELDS = ("index", "features", "logits", "targets")


def index_order(steps: list[Step]) -> tuple[Tensor, Tensor]:
    """The epoch's sample indices in increasing order, each once, and where each one's last occurrence sits in the
    steps' concatenation (a DDP padding duplicate counts once), so any grouping of the same samples into steps and
    ranks orders them the same."""
    index = torch.cat([s["index"].reshape(-1) for s in steps]).long().cpu()
    ordered, order = torch.sort(index, stable=True)  # equal indices keep their order: the last one is the latest
    if ordered.numel() > 1:
        last = torch.ones_like(ordered, dtype=torch.bool)
        torch.ne(ordered[1:], ordered[:-1], out=last[:-1])
        if not bool(last.all()):
            ordered, order = ordered[last], order[last]
    return ordered, order


def epoch_batch(steps: list[Step], keys: tuple[str, ...] = FIELDS[1:],
                ordered: tuple[Tensor, Tensor] | None = None) -> Step:
    """The epoch's steps as one batch in sample-index order, each sample once (`ordered`: `index_order(steps)`, if
    already computed)."""
    index, order = ordered if ordered is not None else index_order(steps)
    out = {"index": index}
    for key in keys:
        values = torch.cat([s[key].to(steps[-1][key].device) for s in steps])  # a resumed epoch's: on the CPU
        out[key] = values.index_select(0, order.to(values.device))
    return out


def scatter_rows(steps: list[Step], key: str, order: Tensor, out: Tensor) -> Tensor:
    """`epoch_batch`'s rows of `key` (flattened to 2-D, in `out`'s dtype) written straight into `out` (the first
    `order.numel()` rows): each step's rows copied once to their places, with no concatenation in between."""
    sizes = [s[key].shape[0] for s in steps]
    place = torch.full((sum(sizes),), -1, dtype=torch.long)
    place[order] = torch.arange(order.numel())
    dropped = order.numel() < place.numel()  # a sample's earlier occurrences (DDP padding) are not copied
    for step, where in zip(steps, place.split(sizes), strict=True):
        rows = step[key].flatten(1).to(out.device, out.dtype)
        if dropped:
            keep = where >= 0
            rows, where = rows[keep.to(rows.device)], where[keep]
        out.index_copy_(0, where.to(out.device), rows)
    return out[: order.numel()]


def beta_log_prob(x: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
    """log Beta(x; α, β), written out: `torch.distributions.Beta` goes through a two-class Dirichlet, about twice the
    ops forward and backward, which is most of a small update's time."""
    return ((alpha - 1) * x.log() + (beta - 1) * torch.log1p(-x) + torch.lgamma(alpha + beta) - torch.lgamma(alpha)
            - torch.lgamma(beta))


class LeanPPOAgent(PPOAgent):
    """The same actor, critic, Adam optimisers and clipped PPO objective, for one batch of one-step transitions at a
    time: the actor's and the critic's losses go through one backward (their parameters are disjoint, so each gets
    the gradient it had alone), the Beta is sampled as X/(X+Y) from two Gamma draws on the agent's own generator
    (no fork of the global RNG), and nothing is buffered between calls."""

    def sample_beta(self, alpha: Tensor, beta: Tensor) -> Tensor:
        g = torch.Generator()
        g.set_state(self.rng_state)
        x = torch._standard_gamma(to_generator(alpha, g), generator=g)  # the op behind torch.distributions.Gamma
        y = torch._standard_gamma(to_generator(beta, g), generator=g)
        self.rng_state = g.get_state()
        return (x / (x + y)).clamp(1e-6, 1 - 1e-6).to(alpha.device)  # exactly 0 or 1 has log-prob ±inf

    def learn(self, states: Tensor, actions: Tensor, old_logp: Tensor, values: Tensor, rewards: Tensor
              ) -> dict[str, float]:
        """K clipped-surrogate steps of the actor and MSE steps of the critic on one batch of one-step transitions
        (GAE with bootstrap 0 reduces to r − V; advantages scaled by their std, centred only with `centre`)."""
        adv = rewards - values
        if self.centre:
            adv = adv - adv.mean()
        adv = adv / (adv.std() + 1e-8)
        actor, critic = list(self.actor.parameters()), list(self.critic.parameters())
        total = torch.zeros(2)
        for _ in range(self.k_epochs):
            ratio = torch.exp(beta_log_prob(actions, *self.actor(states)) - old_logp)
            loss_a = -torch.min(ratio * adv, ratio.clamp(1 - self.eps_clip, 1 + self.eps_clip) * adv).mean()
            loss_c = (self.critic(states) - rewards).square().mean()
            grads = torch.autograd.grad(loss_a + loss_c, actor + critic)
            for p, grad in zip(actor + critic, grads, strict=True):
                p.grad = grad
            self.opt_actor.step()
            self.opt_critic.step()
            total += torch.stack([loss_a.detach(), loss_c.detach()]).cpu()
        actor_loss, critic_loss = (total / self.k_epochs).tolist()
        return {"actor_loss": actor_loss, "critic_loss": critic_loss}


def _room(buffer: Tensor | None, rows: int, like: Tensor) -> Tensor:
    """`buffer` if it holds `rows` rows of `like`'s width on its device, else a new float32 one of that many rows."""
    width, device = like.shape[1], like.device
    if buffer is not None and buffer.shape[0] >= rows and buffer.shape[1] == width and buffer.device == device:
        return buffer
    return torch.empty(rows, width, device=device)


class AmortisedAgentPolicy(DataAgentPolicy):
    """The Data Agent acting once per epoch on the samples the epoch trained on, and learning every `learn_every`-th
    epoch.

    `update_size`: samples in that PPO update, a seeded subsample of the epoch's (all of them if fewer; `None`: all),
    so the update's cost does not grow with the data. At these sizes an update costs its number of operations, not
    its rows (256 rows cost ~1.1× 128), so fewer, larger updates (every 8th epoch on 256) learn from as many
    transitions as every 4th on 128 for about half the time. `hidden`: the width of the actor's and critic's two
    layers (the paper's 128). `staleness` λ (as `data_agent_staleness`) brings left-out samples back. The other
    arguments are `DataAgentPolicy`'s.
    """

    def __init__(
        self, ratio: float = 0.5, delta: float = 0.875, rescale: bool = True, label_smoothing: float = 0.1,
        learn: bool = True, lr_actor: float = 3e-4, lr_critic: float = 3e-4, k_epochs: int = 2,
        eps_clip: float = 0.2, seed: int | None = None, staleness: float = 0.5, update_size: int | None = 256,
        hidden: int = 32, fused: bool = True, learn_every: int = 8,
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
        # the epoch's features in index order: a buffer kept across epochs, each step's rows copied into it once
        self.states: Tensor | None = None
        self.pending: dict[str, Tensor] | None = None  # the last epoch's scores, for the table at the next select
        self.subsample_state: Tensor | None = None  # the update's subsample RNG (never the global one)

    def build(self, state_dim: int) -> LeanPPOAgent:
        self.agent = LeanPPOAgent(state_dim, seed=self.seed or 0, hidden=self.hidden, fused=self.fused, **self.ppo)
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
        index, order = index_order(steps)
        batch = epoch_batch(steps, ("logits", "targets"), (index, order))
        self.states = _room(self.states, order.numel(), steps[-1]["features"].flatten(1))
        states = scatter_rows(steps, "features", order, self.states)
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

    def _act_and_learn(self, agent: LeanPPOAgent, states: Tensor, batch: Step, learn: bool
                       ) -> tuple[Tensor, dict]:
        """One no-grad pass of the actor over the epoch's states; with `learn`, the reward over the epoch and one
        PPO update."""
        with torch.no_grad():
            alpha, beta = agent.actor(states)
            actions = agent.sample_beta(alpha, beta)
        info = {"action_mean": float(actions.mean())}
        if not learn:
            return actions, info
        with torch.no_grad():
            reward, more = composite_reward(batch["logits"], batch["targets"], actions, self.label_smoothing)
            reward = (reward - reward.mean()) / reward.std().clamp_min(1e-8) if reward.numel() > 1 else reward * 0
            pick = self._subsample(actions.numel(), actions.device)
            chosen, taken = states[pick], actions[pick]
            old_logp, values = beta_log_prob(taken, alpha[pick], beta[pick]), agent.critic(chosen)
        info.update(more)
        info.update(agent.learn(chosen, taken, old_logp, values, reward[pick]))
        return actions, info

    def _subsample(self, n: int, device: torch.device) -> Tensor:
        if self.update_size is None or n <= self.update_size:
            return torch.arange(n, device=device)
        g = torch.Generator()
        if self.subsample_state is None:
            g.manual_seed((self.seed or 0) + 104_729)
        else:
            g.set_state(self.subsample_state)
        pick = torch.randperm(n, generator=g, device=g.device)[: self.update_size].sort().values
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

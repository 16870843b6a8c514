"""The Data Agent on an amortised schedule (`data_agent_amortised`; not the paper's): it acts once per epoch and
learns every few epochs instead of on every training step.

The released agent acts on every step's features and runs PPO every 10 steps, so its cost is fixed per sample and
is more than half of a small model's fit. Here the agent does not change within an epoch, so a step reduces what it
trained on to a few numbers per sample, each rank on its own rows: the actor's Beta parameters (α, β) on the sample's
feature from its own training step (the paper's state) and, in a learning epoch, its label-smoothed CE and predictive
uncertainty. Only these are all-gathered (24 bytes a sample instead of its feature and logits), plus the features of
the PPO update's subsample: the `update_size` samples with the smallest seeded key among those trained so far. At the
end of an epoch that is followed by a pruning epoch the actions are drawn for every sample the epoch trained on, and
on every `learn_every`-th epoch the reward is computed over the epoch's samples as one batch and PPO makes one update
on the subsample (one step, so GAE reduces to r − V; `LeanPPOAgent`). The epoch's samples are then re-scored in the
table, and the selection is `data_agent_staleness`'s: the top ⌊ρN⌋ of the standardised scores plus λ per epoch
unseen. Epochs after the annealing point never select again, so they cost the agent nothing. The epoch's samples are
taken in index order (repeats dropped) and every rank holds the same gathered numbers, so every rank selects the
same, and the result does not depend on how the steps grouped them beyond the float rounding of the actor's matmul.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from framework.rng import to_generator
from framework.samplers.agent import DataAgentPolicy, PPOAgent
from framework.samplers.policies import Step
from framework.samplers.reward import reward_from, sample_pieces
from framework.samplers.step import RankGather
from framework.samplers.table import ScoreTable


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


class AmortisedAgentPolicy(DataAgentPolicy):
    """The Data Agent acting once per epoch on the samples the epoch trained on, and learning every `learn_every`-th
    epoch.

    At these sizes an update costs its number of operations, not its rows (256 rows cost ~1.1× 128), so fewer,
    larger updates (every 8th epoch on 256) learn from as many transitions as every 4th on 128 in about half the time.

    Args:
        ratio: fraction ρ of the samples kept in each pruning epoch, in (0, 1].
        delta: fraction δ of the epochs that prune, in [0, 1]; from epoch ⌊δE⌋ on, full data with weight 1.
        rescale: weight the kept samples' losses by 1/ρ, so the effective step matches full data; False: weight 1.
        label_smoothing: label smoothing ε of the cross-entropy the agent's reward is computed from.
        learn: train the agent with PPO; False freezes its initial policy (an ablation).
        lr_actor: Adam lr of the PPO actor.
        lr_critic: Adam lr of the PPO critic.
        k_epochs: PPO epochs over each update's transitions.
        eps_clip: PPO's ratio clip ε.
        seed: seed of the agent's networks, sampling and update subsample; None: 0.
        staleness: λ added to a sample's standardised score per epoch it went unseen, so it is re-scored; 0: none.
        update_size: samples in each PPO update, a seeded subsample of the epoch's (≥ 2); None: all (small data only).
            A bounded size keeps the update's cost and the features held through the epoch independent of the data.
        hidden: width of the actor's and critic's two hidden layers (the paper's 128).
        fused: use the fused (single-kernel) Adam step for the agent's optimisers.
        learn_every: make a PPO update at the end of every N-th epoch (≥ 1).
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
        # this epoch's per-sample numbers, gathered: index, and (α, β) or (α, β, CE, uncertainty) as "values"
        self.records: list[Step] = []
        self.subsample: Step | None = None  # the update's subsample so far: index (sorted), features (own dtype)
        self.pending: dict[str, Tensor] | None = None  # the last epoch's scores, for the table at the next select
        self._keys: tuple[int, Tensor] | None = None  # (epoch, each sample's subsample key): rebuilt from the seed
        self._num_epochs: int | None = None

    def build(self, state_dim: int) -> LeanPPOAgent:
        self.agent = LeanPPOAgent(state_dim, seed=self.seed or 0, hidden=self.hidden, fused=self.fused, **self.ppo)
        return self.agent

    def learns(self, epoch: int) -> bool:
        """Whether the end of `epoch` makes a PPO update."""
        return self.learn and epoch % self.learn_every == 0

    def observe(self, step: Step, table: ScoreTable, epoch: int) -> dict[str, float]:
        """A global step in one process (every rank's rows already concatenated)."""
        return self.observe_local(step, RankGather(), table, epoch, self._num_epochs)

    def observe_local(self, step: Step, gather: Callable[[Step], Step], table: ScoreTable, epoch: int,
                      num_epochs: int | None) -> dict[str, float]:
        """Reduce this rank's rows to (α, β[, CE, uncertainty]) and gather only those, with the features of the rows
        that enter the update's subsample; nothing at all in an epoch that no selection follows."""
        if num_epochs is not None:
            self._num_epochs = num_epochs
            if not self.prunes(epoch + 1, num_epochs):
                return {}
        start = time.perf_counter()
        states = step["features"].detach().flatten(1)
        agent = self.agent if self.agent is not None else self.build(states.shape[1])
        if agent.device != states.device:
            agent.to(states.device)
        learning = self.learns(epoch)
        with torch.no_grad():
            values = list(agent.actor(states.float()))
            if learning:  # the reward's per-sample pieces (its batch statistics come at the epoch's end)
                values.extend(sample_pieces(step, self.label_smoothing))
        local = step["index"].reshape(-1).long()
        rows = gather({"index": local, "values": torch.stack(values, 1)})
        self.records.append(rows)
        if learning:
            self._keep_subsample(local, states, rows["index"], gather, table.n, epoch)
        self.agent_s += time.perf_counter() - start
        return {}

    def _epoch_keys(self, n: int, epoch: int) -> Tensor:
        """Each sample's key for the update's subsample in `epoch`: a seeded permutation (never the global RNG)."""
        if self._keys is None or self._keys[0] != epoch or self._keys[1].numel() != n:
            g = torch.Generator().manual_seed((self.seed or 0) * 1_000_003 + epoch + 104_729)
            self._keys = (epoch, torch.randperm(n, generator=g, device=g.device))
        return self._keys[1]

    def _keep_subsample(self, local: Tensor, states: Tensor, gathered: Tensor, gather: Callable[[Step], Step],
                        n: int, epoch: int) -> None:
        """Keep the features of the `update_size` smallest-key samples trained so far this epoch (a sample's later
        occurrence replaces its earlier one): each rank sends only its own rows that enter, in one gather."""
        kept = self.subsample
        index = gathered.reshape(-1).long().cpu()
        old = kept["index"] if kept is not None else index.new_empty(0)
        merged, order = index_order([{"index": old}, {"index": index}])  # the last occurrence of each sample
        if self.update_size is not None and merged.numel() > self.update_size:
            smallest = torch.sort(self._epoch_keys(n, epoch)[merged]).indices[: self.update_size].sort().values
            merged, order = merged[smallest], order[smallest]
        source = order - old.numel()  # < 0: a kept row (at order); else the row of this gathered step
        fresh = source[source >= 0].sort().values
        rows, rank = local.numel(), getattr(gather, "rank", 0)
        owner = torch.div(fresh, rows, rounding_mode="floor")
        counts = torch.bincount(owner, minlength=max(1, index.numel() // rows))
        width = int(counts.max()) if fresh.numel() else 0
        features = states.new_empty((merged.numel(), states.shape[1]))
        if kept is not None and bool((source < 0).any()):
            features[(source < 0).to(states.device)] = kept["features"].to(states.device)[order[source < 0]
                                                                                          .to(states.device)]
        if width:
            send = states.new_zeros((width, states.shape[1]))
            mine = fresh[owner == rank] - rank * rows
            send[: mine.numel()] = states[mine.to(states.device)]
            got = gather({"features": send})["features"]
            first = torch.cumsum(counts, 0) - counts  # where each rank's entries start in `fresh`
            slot = owner * width + torch.arange(fresh.numel()) - first[owner]
            at = torch.full((index.numel(),), -1, dtype=torch.long)
            at[fresh] = slot
            features[(source >= 0).to(states.device)] = got[at[source[source >= 0]].to(got.device)]
        self.subsample = {"index": merged, "features": features}

    def end_epoch(self, epoch: int, num_epochs: int) -> dict[str, float]:
        self._num_epochs = num_epochs
        records, self.records = self.records, []
        subsample, self.subsample = self.subsample, None
        if not records or not self.prunes(epoch + 1, num_epochs):
            return {}  # no selection follows: scoring would buy nothing
        start = time.perf_counter()
        index, order = index_order(records)
        device = records[-1]["values"].device  # a resumed epoch's first records are on the CPU
        values = torch.cat([r["values"].to(device) for r in records]).index_select(0, order.to(device))
        agent = self.agent
        assert agent is not None
        with torch.no_grad():
            actions = agent.sample_beta(values[:, 0].contiguous(), values[:, 1].contiguous())
        info = {"action_mean": float(actions.mean())}
        if self.learns(epoch) and subsample is not None and values.shape[1] == 4:
            info.update(self._learn(agent, index, values, actions, subsample))
        self.pending = {"index": index, "scores": actions.cpu(), "epoch": torch.tensor(epoch)}
        agent.lr_decay(epoch, num_epochs)
        self.agent_s += time.perf_counter() - start
        return info

    def select(self, table: ScoreTable, epoch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        if self.pending is not None:  # the last epoch's scores, computed at its end
            table.update(self.pending["index"], self.pending["scores"], int(self.pending["epoch"]))
            self.pending = None
        return super().select(table, epoch, generator)

    def _learn(self, agent: LeanPPOAgent, index: Tensor, values: Tensor, actions: Tensor, subsample: Step
               ) -> dict[str, float]:
        """The reward over the epoch's samples (standardised over them) and one PPO update on the subsample."""
        alpha, beta, losses, unsure = (column.contiguous() for column in values.unbind(1))
        with torch.no_grad():
            reward, info = reward_from(losses, unsure, actions)
            reward = (reward - reward.mean()) / reward.std().clamp_min(1e-8) if reward.numel() > 1 else reward * 0
            pick = torch.searchsorted(index, subsample["index"]).to(actions.device)
            chosen, taken = subsample["features"].to(actions.device).float(), actions[pick]
            old_logp, baseline = beta_log_prob(taken, alpha[pick], beta[pick]), agent.critic(chosen)
        info.update(agent.learn(chosen, taken, old_logp, baseline, reward[pick]))
        return info

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["records"] = [{k: v.cpu() for k, v in r.items()} for r in self.records]
        state["subsample"] = None if self.subsample is None else {k: v.cpu() for k, v in self.subsample.items()}
        state["pending"] = None if self.pending is None else {k: v.clone() for k, v in self.pending.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("steps"):
            raise ValueError("this data_agent_amortised checkpoint was written in the middle of an epoch by an older "
                             "version, which kept the epoch's raw features; this version keeps (α, β, CE, "
                             "uncertainty) per sample and cannot rebuild them: resume from a checkpoint written at "
                             "an epoch's end")
        super().load_state_dict(state)
        self.records = [{k: v.clone() for k, v in r.items()} for r in state.get("records", [])]
        sub = state.get("subsample")
        self.subsample = None if sub is None else {k: v.clone() for k, v in sub.items()}
        pending = state.get("pending")
        self.pending = None if pending is None else {k: v.clone() for k, v in pending.items()}

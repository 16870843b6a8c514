"""`DataSelection`: dynamic data selection (Data Agent, InfoBatch, random, ...) in any Lightning fit.

Add it to the Trainer's callbacks with a policy; any map-style dataset, tuple or dict batches (the callback
owns the sampler, so it knows each batch's samples). `training_step` returns `{"loss": losses.mean(),
"per_sample_loss": losses}` (the callback adds mean((w − 1)·ℓ) to the loss: the step trains on the selection's
weights w); the Data Agent also reads `logits` and `features` from it or from the layer `head=` names (see
`framework.samplers.step`; the older contract, a dict batch's `weight` and a step returning `losses` it
weighted itself, still works). It serves the training DataLoader itself: the user's, with its sampler replaced by
a `SelectionSampler` and every other setting kept (pruned epochs are shorter; Lightning's distributed sampler is
switched off). It all-gathers the step's scores across ranks (one collective, each field in its own dtype), steps
the Data Agent's optimisers, logs `selection/cost` (sample passes relative to full data) every epoch and
checkpoints everything for exact mid-epoch resume. An LR schedule must be told `planned_steps(trainer)`. Too few
epochs for the policy to act is warned about in `setup`; a missing per-sample signal fails at the first
`training_step`, before any optimizer step. Nothing of the user's module or data module is replaced: for the fit the
callback takes the place of the trainer's training-data source and wraps its strategy's `training_step` (the hook on
a `head=` layer lives only inside each step), and puts both back at teardown and on an exception or interrupt.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor
from torch.utils.data import DataLoader

from framework.callbacks.selection_swaps import SelectionSource, Swaps
from framework.samplers.policies import FullPolicy, SelectionPolicy, schedule_warning
from framework.samplers.selection import SelectionSampler, epochs_for_steps, planned_batches, selection_loader
from framework.samplers.step import HeadCapture, RankGather, batch_len, reweight, step_fields, with_sequence_losses
from framework.samplers.table import ScoreTable


class DataSelection(L.Callback):
    """Runs a data-selection `policy` over a Lightning fit: which samples each epoch trains on, and their weights.

    Args:
        policy: the selection policy (`sampler=`); None: every sample, weight 1.
        num_epochs: epochs the policy plans for (annealing from epoch ⌊δE⌋); None: from max_epochs or max_steps.
        seed: seed of the selections; None: the module's or data module's `seed` attribute, else 0.
        align_schedule: advance step-interval LR schedulers past batches an epoch skipped, so they end on time.
        head: dotted name of the classifier layer (e.g. "net.fc") read for `logits`/`features` the step does not return.
            A language model's head (`model.lm_head`) also gives per-sample losses from `labels` or `input_ids`.
        shift_labels: those labels are next-token (causal LM); False for a masked LM's unshifted labels.
    """

    def __init__(self, policy: SelectionPolicy | None = None, num_epochs: int | None = None, seed: int | None = None,
                 align_schedule: bool = True, head: str | None = None, shift_labels: bool = True):
        if num_epochs is not None and num_epochs < 1:
            raise ValueError(f"num_epochs={num_epochs} must be >= 1 (or None: the trainer's max_epochs)")
        self.policy = policy or FullPolicy()
        self.num_epochs, self.seed, self.align_schedule = num_epochs, seed, align_schedule
        self.table: ScoreTable | None = None
        self.sampler: SelectionSampler | None = None
        self.n, self.batch_size, self.world_size = 0, 0, 1
        self._reset_counters()
        self._resume: tuple[int, int] | None = None  # (epoch, batches already trained in it)
        self._pending: dict[str, Any] | None = None  # a checkpoint's state that arrived before setup
        self._swaps = Swaps()  # what the fit changed on the trainer, to put back
        self._dataloader: DataLoader | None = None
        self.head, self.shift_labels = head, shift_labels
        self._index = self._weight = torch.empty(0)  # the current batch's samples and their loss weights
        self._fields: dict[str, Tensor] = {}  # the current step's per-sample fields (from training_step)

    def _reset_counters(self) -> None:
        self.open_epoch: int | None = None  # the epoch with trained batches whose end-of-epoch work is pending
        self.batches_done = self.epoch_samples = self.samples_seen = 0
        self.history: list[dict[str, float]] = []  # one row per finished epoch
        self.overhead_s = 0.0
        self._logged: dict[str, tuple[float, int]] = {}  # per-step scalars summed until the epoch's end

    # -- installation ---------------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        trainer.reload_dataloaders_every_n_epochs = 1  # epoch length changes: Lightning must re-measure it
        connector = trainer._accelerator_connector
        if trainer.world_size > 1 and connector.use_distributed_sampler:
            rank_zero_warn("DataSelection shards the data itself; turning off Trainer(use_distributed_sampler)")
            connector.use_distributed_sampler = False  # its wrapper would fix the epoch length at the first one
        source = trainer.fit_loop._data_source  # where Lightning asks for the training loader
        owner = source.instance
        if not isinstance(owner, (L.LightningModule, L.LightningDataModule)) or (
                owner is pl_module and not is_overridden("train_dataloader", pl_module)):
            raise TypeError("DataSelection serves the training DataLoader itself, built from the one a "
                            "LightningDataModule or LightningModule `train_dataloader()` returns, so it needs that "
                            "hook, not `trainer.fit(train_dataloaders=...)`")
        self._reset_counters()
        self._resume = None
        base = owner.train_dataloader()
        if not isinstance(base, DataLoader) or base.batch_size is None:
            raise TypeError(
                "DataSelection needs the training data as a DataLoader with a batch_size returned by a "
                f"LightningDataModule or LightningModule `train_dataloader()`; got {type(base).__name__}"
            )
        self.n, self.batch_size, self.world_size = len(base.dataset), int(base.batch_size), trainer.world_size
        seed = self.seed if self.seed is not None else int(getattr(owner, "seed", 0) or 0)
        if hasattr(self.policy, "seed") and self.policy.seed is None:
            self.policy.seed = seed
        epochs = self._epochs(trainer)
        warning = schedule_warning(self.policy, epochs)
        if warning:
            rank_zero_warn(f"DataSelection: {warning}")
        self.table = ScoreTable(self.n, self.policy.initial_score)
        self.sampler = SelectionSampler(
            self.table, self.policy, epochs, seed=seed, rank=trainer.global_rank, world_size=trainer.world_size
        )
        self._dataloader = selection_loader(base, self.sampler, self.batch_size)
        self._swaps.undo()  # a fit that ended without teardown (e.g. a second fit after a crash in another callback)
        self._swaps.set(trainer.fit_loop, "_data_source", SelectionSource(source, lambda: self._loader(trainer)))
        self._wrap_strategy_step(trainer, pl_module)
        if self._pending is not None:
            self._apply_state(self._pending)
            self._pending = None

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._swaps.undo()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._swaps.undo()  # Lightning calls no teardown hook on an exception or a KeyboardInterrupt

    def _wrap_strategy_step(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Read each step's per-sample fields (and weigh its loss) as `training_step` returns, before backward: around
        the strategy's `training_step`, which Lightning calls for every strategy, so the module stays untouched."""
        capture = HeadCapture(pl_module, self.head) if self.head else None
        original = trainer.strategy.training_step

        def training_step(*args: Any, **kwargs: Any) -> Any:
            with capture or contextlib.nullcontext():  # the head's hook exists during this step only
                outputs = original(*args, **kwargs)
            return self._read_step(outputs, args[0] if args else kwargs.get("batch"), capture)

        self._swaps.set(trainer.strategy, "training_step", training_step)

    def _read_step(self, outputs: Any, batch: Any, capture: HeadCapture | None) -> Any:
        start = time.perf_counter()
        name = type(self.policy).__name__
        if capture is not None and capture.sequence_logits is not None:  # a language model's head: per-row losses
            outputs = with_sequence_losses(outputs, batch, capture.sequence_logits, self.shift_labels)
            capture.sequence_logits = None  # the logits stay alive no longer than the step
        if self.policy.needs != ("index",):  # full and random data need no feedback
            captured = capture.fields if capture is not None else {}
            self._fields = step_fields(outputs, batch, self.policy.needs, self._index, captured, name)
        if isinstance(outputs, dict) and "per_sample_loss" in outputs or not isinstance(batch, dict):
            if not bool((self._weight == 1).all()):
                outputs = reweight(outputs, self._weight, name)
        self.overhead_s += time.perf_counter() - start
        return outputs

    def _epochs(self, trainer: L.Trainer) -> int:
        if self.num_epochs:
            return int(self.num_epochs)
        if trainer.max_epochs not in (None, -1):
            return int(trainer.max_epochs)
        if trainer.max_steps not in (None, -1):
            batches = trainer.max_steps * trainer.accumulate_grad_batches
            return epochs_for_steps(self.policy, self.n, batches, self.batch_size, trainer.world_size)
        raise ValueError("DataSelection needs the run's length to place the annealing epoch: set num_epochs, "
                         f"trainer max_epochs or max_steps (got max_epochs={trainer.max_epochs}, "
                         f"max_steps={trainer.max_steps})")

    def _loader(self, trainer: L.Trainer) -> DataLoader:
        """The loader for the epoch about to start: finish the previous epoch if its end hook never ran
        (a run resumed from its last batch), select, and skip what a resumed run already trained on."""
        assert self.sampler is not None and self._dataloader is not None
        epoch = trainer.current_epoch
        if self.open_epoch is not None and self.open_epoch < epoch:
            self._finish_epoch(trainer, trainer.lightning_module, self.open_epoch)
        self.sampler.set_epoch(epoch)  # Lightning measures len() before it calls set_epoch itself
        if self._resume is not None and self._resume[0] == epoch:
            self.sampler.skip_samples(self._resume[1] * self.batch_size)
        self._resume = None
        return self._dataloader  # one loader for the whole fit: its sampler is the one that changes

    def planned_steps(self, trainer: L.Trainer) -> int:
        """Optimizer steps the whole run will take under the selection schedule (min with max_steps)."""
        if self.sampler is None:
            raise RuntimeError("planned_steps() is known once the callback is set up (from configure_optimizers)")
        per_epoch = planned_batches(self.policy, self.n, self.sampler.num_epochs, self.batch_size, self.world_size)
        steps = sum(math.ceil(b / trainer.accumulate_grad_batches) for b in per_epoch)
        return min(steps, trainer.max_steps) if trainer.max_steps not in (None, -1) else steps

    # -- per step ---------------------------------------------------------------------------------------------
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        start = time.perf_counter()
        assert self.sampler is not None
        if isinstance(batch, dict) and "index" in batch:
            self._index = batch["index"]
        else:  # the samples this callback's sampler yielded for this batch, in order
            self._index = self.sampler.batch_indices(self.batches_done, self.batch_size)
            size = batch_len(batch)
            if size is not None and size != self._index.numel():
                raise ValueError(f"batch {batch_idx} holds {size} samples, but the selection sampler yielded "
                                 f"{self._index.numel()} for it: the collate_fn must keep one row per sample")
        self._weight = self.sampler.batch_weights(self._index)
        if isinstance(batch, dict):
            batch["weight"] = self._weight.to(pl_module.device)
        self.overhead_s += time.perf_counter() - start

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        start = time.perf_counter()
        assert self.table is not None
        epoch = trainer.current_epoch
        count = len(self._index) * trainer.world_size
        if self.policy.needs != ("index",):  # full and random data need no feedback
            assert self.sampler is not None
            gather = RankGather(pl_module.all_gather, trainer.global_rank, trainer.world_size, pl_module.device)
            info = self.policy.observe_local(self._fields, gather, self.table, epoch, self.sampler.num_epochs)
            for key in ("action_mean", "w"):  # summed here, logged once per epoch: a log() call per step costs
                if key in info:  # more than the table update (every rank holds the same gathered values)
                    total, n = self._logged.get(key, (0.0, 0))
                    self._logged[key] = (total + info[key], n + 1)
        self.open_epoch = epoch
        self.batches_done += 1
        self.epoch_samples += count
        self.samples_seen += count
        self.overhead_s += time.perf_counter() - start

    # -- per epoch --------------------------------------------------------------------------------------------
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.open_epoch is None:
            return
        row = self._finish_epoch(trainer, pl_module, self.open_epoch)
        for key in ("cost", "epoch_fraction"):
            pl_module.log(f"selection/{key}", row[key], on_step=False, on_epoch=True, sync_dist=True)
        for key, (total, n) in self._logged.items():
            pl_module.log(f"selection/{key}", total / n, on_step=False, on_epoch=True, sync_dist=True)
        self._logged = {}

    def _finish_epoch(self, trainer: L.Trainer, pl_module: L.LightningModule, epoch: int) -> dict[str, float]:
        start = time.perf_counter()
        assert self.sampler is not None
        info = self.policy.end_epoch(epoch, self.sampler.num_epochs)
        if self.align_schedule:
            self._advance_schedulers(trainer, epoch)
        if trainer.world_size > 1 and self.policy.state_dict():  # remove any numerical drift between replicas
            self.policy.load_state_dict(trainer.strategy.broadcast(self.policy.state_dict(), src=0))
        row = {"epoch": epoch, "samples": self.epoch_samples, "batches": self.batches_done,
               "progress": self._progress(), "pruning": float(self.sampler.pruning),
               "pruned": float(self.n - self.sampler.kept if self.sampler.pruning else 0),  # left out of its selection
               "epoch_fraction": self.epoch_samples / self.n, **info}
        self.history.append(row)
        self.open_epoch, self.batches_done, self.epoch_samples = None, 0, 0
        row["cost"] = self.cost()
        self.overhead_s += time.perf_counter() - start
        return row

    def _advance_schedulers(self, trainer: L.Trainer, epoch: int) -> None:
        """Step the step-interval schedulers over the batches this epoch was planned to have but did not."""
        assert self.sampler is not None
        if epoch >= self.sampler.num_epochs or self.batches_done < math.ceil(len(self.sampler) / self.batch_size):
            return  # past the plan, or an epoch cut short by max_steps: nothing to align
        planned = planned_batches(self.policy, self.n, self.sampler.num_epochs, self.batch_size, self.world_size)
        acc = trainer.accumulate_grad_batches
        missing = math.ceil(planned[epoch] / acc) - math.ceil(self.batches_done / acc)
        for config in trainer.lr_scheduler_configs if missing > 0 else []:
            if config.interval == "step":
                for _ in range(missing):
                    config.scheduler.step()

    def _progress(self) -> float:
        """The fraction of this rank's current shard trained so far (1.0 for a finished epoch)."""
        assert self.sampler is not None
        return min(1.0, self.batches_done * self.batch_size / max(1, len(self.sampler)))

    def cost(self) -> float:
        """Sample passes so far relative to full data over the same training progress in epochs (padding
        included): a run stopped a tenth into a half-data epoch has spent half of a tenth of an epoch."""
        epochs = sum(row["progress"] for row in self.history)
        if self.open_epoch is not None and self.sampler is not None:
            epochs += self._progress()
        return self.samples_seen / (self.n * epochs) if epochs else 0.0

    def results(self) -> dict[str, float]:
        """What `framework.train` merges into results.json."""
        if self.table is None:
            return {}
        return {"selection/cost": self.cost(), "selection/samples_seen": float(self.samples_seen),
                "selection/pruned": float(sum(row.get("pruned", 0.0) for row in self.history)),  # whole epochs
                "selection/epochs": float(len(self.history)), "selection/overhead_s": self.overhead_s}

    # -- checkpoint -------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.table is None or self.sampler is None:
            return {}
        return {
            "n": self.n, "table": self.table.state_dict(), "sampler": self.sampler.state_dict(),
            "policy": self.policy.state_dict(), "open_epoch": self.open_epoch, "batches_done": self.batches_done,
            "epoch_samples": self.epoch_samples, "samples_seen": self.samples_seen,
            "history": [dict(r) for r in self.history],  # (not overhead_s: a wall-clock time is not state)
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        if self.table is None:
            self._pending = state
        else:
            self._apply_state(state)

    def _apply_state(self, state: dict[str, Any]) -> None:
        assert self.table is not None and self.sampler is not None
        if int(state["n"]) != self.n:
            raise ValueError(f"checkpoint selected from {state['n']} training samples, this run has {self.n}")
        self.table.load_state_dict(state["table"])
        self.sampler.load_state_dict(state["sampler"])
        self.policy.load_state_dict(state["policy"])
        self.open_epoch, self.batches_done = state["open_epoch"], int(state["batches_done"])
        self.epoch_samples, self.samples_seen = int(state["epoch_samples"]), int(state["samples_seen"])
        self.history = [dict(r) for r in state["history"]]
        if self.open_epoch is not None:
            self._resume = (int(self.open_epoch), self.batches_done)


def with_selection(
    callbacks: dict[str, L.Callback] | None, policy: SelectionPolicy, seed: int | None = None
) -> dict[str, L.Callback]:
    """Hand `policy` to the DataSelection among `callbacks`, adding one (key 'data_selection') if none is there."""
    callbacks = dict(callbacks or {})
    found = [cb for cb in callbacks.values() if isinstance(cb, DataSelection)]
    if found:
        found[0].policy = policy
        if found[0].seed is None:
            found[0].seed = seed
    else:
        callbacks["data_selection"] = DataSelection(policy, seed=seed)
    return callbacks


def stepping_batches(trainer: L.Trainer) -> int | float:
    """Total optimizer steps for an LR schedule: a DataSelection's plan if one is attached, else Lightning's."""
    for cb in trainer.callbacks:
        if isinstance(cb, DataSelection) and cb.sampler is not None:
            return cb.planned_steps(trainer)
    return trainer.estimated_stepping_batches

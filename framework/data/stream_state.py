"""The state every streamed training loader shares (`framework.data.streaming` for text, `image_stream` for images):
the rank and world size, the epoch, equal steps on every rank, and the per-rank positions a checkpoint holds."""

from __future__ import annotations

import logging
from typing import Any

from framework.errors import InputError

log = logging.getLogger(__name__)

def shard_order_epoch(seed: int | None, epoch: int) -> int:
    """The `datasets` epoch whose file order this (seed, epoch) reads: `set_epoch(e)` shuffles the files by
    `default_rng(e)` (e=0 keeps them in order), identically on every rank."""
    return 1 + (seed or 0) * 1_000_003 + epoch


#: whole files go to ranks only when the ranks' bytes then differ by at most this ratio
EVEN_SHARES = 1.1


def share_strategy(source: Any, split: str, world: int) -> dict[str, str]:
    """How ranks share a split: whole files when their number divides the world size and each rank's files hold
    about as many bytes (within `EVEN_SHARES`: `datasets` gives rank r the files r, r + world, ...); otherwise 1 row
    in `world` of every file, so ranks read as much data however uneven the files (each parses them all). A Hub
    dataset's file sizes are not known here: `datasets`' own choice (whole files when their number divides)."""
    import inspect

    from datasets.distributed import split_dataset_by_node

    if world < 2 or "strategy" not in inspect.signature(split_dataset_by_node).parameters:
        return {}
    if source.repo_id:
        return {"strategy": "auto"}
    size = {path: n for path, n, _ in source.stats}
    files = source.files[split]
    if len(files) % world == 0:
        shares = [sum(size[f] for f in files[r::world]) for r in range(world)]
        if min(shares) > 0 and max(shares) <= EVEN_SHARES * min(shares):
            return {"strategy": "shards"}
    return {"strategy": "examples"}


class ResumableStream:
    """What a streamed training loader shares, text or images: the rank and world size from the trainer, the epoch,
    equal steps on every rank (`_any`), and the per-rank positions Lightning's stateful-loader hooks save and
    restore. A subclass records `_after[(epoch, batches done)]` (its position after them) as it yields batches,
    starts from `_resume` when that is set, and counts into `totals`."""

    def __init__(self, trainer: Any, totals: dict[str, int]):
        self.trainer = trainer
        self.rank, self.world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        self.epoch = 0  # set_epoch's, when no trainer says which
        self._resume: dict[str, Any] | None = None
        self._after: dict[tuple[int, int], dict[str, Any]] = {}  # (epoch, batches done) → position after them
        self.totals = totals  # this rank's, over the whole run
        self.rank_totals: list[dict[str, int]] | None = None  # every rank's, as gathered at the last checkpoint

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _current_epoch(self) -> int:
        return self.trainer.current_epoch if self.trainer is not None else self.epoch

    def _any(self, decision: bool) -> bool:
        """True on every rank when any rank's `decision` is (one all-reduce of one number per step under DDP)."""
        if self.world > 1:
            return bool(self.trainer.strategy.reduce_boolean_decision(decision, all=False))
        return decision

    def _vote(self, fresh: bool, failed: bool) -> tuple[bool, bool]:
        """(any rank fresh, any rank failed), the same on every rank: one all-reduce of two numbers per step."""
        if self.world <= 1:
            return fresh, failed
        import torch

        mine = torch.tensor([int(fresh), int(failed)], device=self.trainer.strategy.root_device)
        both = self.trainer.strategy.reduce(mine, reduce_op="max")
        return bool(both[0]), bool(both[1])

    def _stop_on(self, bad: InputError | None) -> None:
        """A bad line under data.strict=true: said in the log (by the rank that read it), then the run's
        interruption: a checkpoint of the last step, the resume command, the interruption's exit code."""
        from framework.callbacks.safety import GracefulInterrupt

        why = (f"{bad}; fix or remove the line, then resume with the command below and data.allow_changed=true (the "
               "file changed)") if bad is not None else "another rank read a bad line (data.strict=true): see its log"
        if bad is not None:
            log.error("%s", why)  # the console and train.log (the edge prints no error line for an interruption)
        trainer = self.trainer
        stopper = next((c for c in getattr(trainer, "callbacks", None) or () if isinstance(c, GracefulInterrupt)), None)
        if stopper is None:
            raise bad or InputError(why)
        stopper.stop_now(trainer)

    def _consumed(self) -> int:
        """Batches of this epoch the run has trained on (Lightning has fetched one more than that)."""
        if self.trainer is None:
            return max(k[1] for k in self._after) if self._after else 0
        return self.trainer.fit_loop.epoch_loop.batch_progress.current.processed

    def state_dict(self) -> dict[str, Any]:
        """Every rank's position after the last batch trained on (the checkpoint is rank 0's, so the positions are
        gathered: every rank writes it at the same step)."""
        epoch = self._current_epoch()
        mine = dict(self._after.get((epoch, self._consumed()), {"epoch": epoch, "batches": 0, "totals": self.totals}))
        ranks = [mine]
        if self.world > 1:
            import torch.distributed as dist

            ranks = [None] * self.world
            dist.all_gather_object(ranks, mine)
        self.rank_totals = [dict(r.get("totals") or {}) for r in ranks]  # every rank's counts, for the record
        return {"world": self.world, "ranks": ranks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Start from this rank's position in `state`; InputError when it holds another number of ranks' positions
        mid-epoch (each rank's share of the files depends on the world size)."""
        ranks = (state or {}).get("ranks") or []
        if ranks and len(ranks) != self.world:
            if any(r.get("batches") for r in ranks):
                raise InputError(f"data.streaming: the checkpoint was written mid-epoch by {len(ranks)} rank(s), and "
                                 f"this run has {self.world}; resume on {len(ranks)} (each rank's share of the files "
                                 "depends on how many there are), or from an epoch's end")
            ranks = []
        self._resume = dict(ranks[self.rank]) if ranks else None
        self.totals = dict(self._resume.get("totals", self.totals)) if self._resume else self.totals


__all__ = ["EVEN_SHARES", "ResumableStream", "shard_order_epoch", "share_strategy"]

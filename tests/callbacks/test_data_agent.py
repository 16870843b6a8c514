"""DataSelection inside real Lightning fits: epoch lengths, annealing, LR plan, cost, exact mid-epoch resume."""

import functools

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from framework.callbacks.selection import DataSelection
from framework.data.digits import ArrayDataset
from framework.data.resumable import SplitData
from framework.models.convnet import MLP
from framework.modules.classifier import Classifier
from framework.optim.schedulers import warmup_cosine
from framework.registry import SAMPLERS, load_catalog
from framework.samplers import DataAgentPolicy, InfoBatchPolicy, RandomPolicy, TopKPolicy

torch.set_num_threads(1)
load_catalog()
AGENTS = ["data_agent", "data_agent_staleness"]  # the faithful port and the variant: the same guarantees


class TinyData(SplitData):
    """160 random 8×8 'images' in 4 classes, batch 16: 10 full batches, 5 at ρ = 0.5."""

    num_classes, input_shape = 4, [1, 8, 8]

    def __init__(self, n: int = 160, batch_size: int = 16, seed: int = 0):
        super().__init__()
        self.n, self.batch_size, self.seed = n, batch_size, seed

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(self.seed)
        y = torch.randint(0, 4, (self.n,), generator=g)
        x = torch.randn(self.n, 1, 8, 8, generator=g) + y.float()[:, None, None, None]
        self.train_set, self.val_set = ArrayDataset(x, y), ArrayDataset(x[:32], y[:32])


class Recorder(L.Callback):
    """Which sample indices (and weights) each training batch carried, by (epoch, batch)."""

    def __init__(self):
        self.batches, self.weights = {}, {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        key = (trainer.current_epoch, batch_idx)
        self.batches[key] = batch["index"].tolist()
        self.weights[key] = batch["weight"].tolist()

    def per_epoch(self):
        out = {}
        for epoch, _ in self.batches:
            out[epoch] = out.get(epoch, 0) + 1
        return out


def module() -> Classifier:
    torch.manual_seed(0)
    return Classifier(
        functools.partial(MLP, hidden=16), num_classes=4, input_shape=[1, 8, 8],
        optimizer=lambda ps: torch.optim.SGD([p for _, p in ps], lr=0.05, momentum=0.9),
        scheduler=functools.partial(warmup_cosine, warmup_steps=2, min_lr_ratio=0.0),
    )


def fit(policy, tmp_path, epochs=4, callbacks=(), ckpt_path=None, selection=None, **trainer_kw):
    selection = selection or DataSelection(policy, seed=0)
    recorder = Recorder()
    trainer = L.Trainer(
        max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=bool(callbacks), num_sanity_val_steps=0,
        limit_val_batches=0, default_root_dir=tmp_path, callbacks=[selection, recorder, *callbacks], **trainer_kw,
    )
    lm = module()
    trainer.fit(lm, datamodule=TinyData(), ckpt_path=ckpt_path)
    return trainer, lm, selection, recorder


def test_pruned_epochs_are_shorter_and_training_anneals_to_full_data(tmp_path):
    trainer, _, selection, rec = fit(RandomPolicy(ratio=0.5, delta=0.5), tmp_path)
    assert rec.per_epoch() == {0: 5, 1: 5, 2: 10, 3: 10}
    assert {w for k, ws in rec.weights.items() if k[0] < 2 for w in ws} == {2.0}
    assert {w for k, ws in rec.weights.items() if k[0] >= 2 for w in ws} == {1.0}
    seen = [sorted(i for k, b in rec.batches.items() if k[0] == e for i in b) for e in range(4)]
    assert len(set(seen[0])) == 80 and seen[2] == seen[3] == list(range(160))
    # cost actually spent = (⌊δE⌋·ρ + E − ⌊δE⌋) / E, logged every epoch
    assert selection.cost() == pytest.approx((2 * 0.5 + 2) / 4)
    assert [row["epoch_fraction"] for row in selection.history] == [0.5, 0.5, 1.0, 1.0]
    assert trainer.callback_metrics["selection/cost"] == pytest.approx(0.75)


def test_lr_schedule_length_comes_from_the_selection_plan(tmp_path):
    trainer, _, selection, _ = fit(TopKPolicy(ratio=0.5, delta=0.5), tmp_path)
    assert selection.planned_steps(trainer) == trainer.global_step == 30  # not 4 × 5 (first epoch's length)
    assert trainer.lr_scheduler_configs[0].scheduler.get_last_lr()[0] == pytest.approx(0.0, abs=1e-12)


def test_infobatch_schedule_is_aligned_to_epochs_despite_its_random_epoch_length(tmp_path):
    trainer, _, selection, rec = fit(InfoBatchPolicy(prune_ratio=0.5, delta=0.75), tmp_path)
    epochs = rec.per_epoch()
    assert epochs[0] == 10 and min(epochs[1], epochs[2]) < 10 and epochs[3] == 10
    assert trainer.global_step < 40 == selection.planned_steps(trainer)
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == 40  # stepped over the pruned batches


def test_data_agent_scores_every_trained_sample_and_logs_the_agent(tmp_path):
    trainer, _, selection, rec = fit(DataAgentPolicy(ratio=0.5, delta=0.5, update_every=2), tmp_path, epochs=2)
    first = {i for k, b in rec.batches.items() if k[0] == 0 for i in b}
    table = selection.table
    assert len(first) == 80  # top-k of all-equal initial scores: a seeded random half
    # ⌊δE⌋ = 1: epoch 1 is full data, so every sample's score is the action taken on it in epoch 1
    assert (table.last_seen == 1).all() and ((table.scores > 0) & (table.scores < 1)).all()
    assert 0 < float(trainer.callback_metrics["selection/action_mean"]) < 1


def _checkpointing(tmp_path):
    return ModelCheckpoint(dirpath=tmp_path, filename="step{step}", auto_insert_metric_name=False,
                           every_n_train_steps=1, save_top_k=-1)


@pytest.mark.parametrize("sampler", [*AGENTS, "data_agent_amortised"])
@pytest.mark.parametrize("resume_step", [7, 5], ids=["mid_epoch", "last_batch_of_epoch"])
def test_resume_replays_the_remaining_batches_and_ends_with_identical_model_and_agent(tmp_path, resume_step,
                                                                                       sampler):
    # the amortised agent (issue 28) learns at epoch ends: every one here, on a subsample
    often = dict(learn_every=1, update_size=32) if sampler == "data_agent_amortised" else dict(update_every=3)
    policy = functools.partial(SAMPLERS.build, sampler, ratio=0.5, delta=0.75, **often)
    full_dir, part_dir = tmp_path / "full", tmp_path / "part"
    trainer, lm, sel, rec = fit(policy(), full_dir, callbacks=[_checkpointing(full_dir)])
    ckpt = full_dir / f"step{resume_step}.ckpt"
    _, lm2, sel2, rec2 = fit(policy(), part_dir, callbacks=[_checkpointing(part_dir)], ckpt_path=str(ckpt))
    steps = sorted(rec.batches)  # (epoch, batch) in training order
    assert [rec2.batches[k] for k in sorted(rec2.batches)] == [rec.batches[k] for k in steps[resume_step:]]
    a, b = lm.state_dict(), lm2.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    agent, agent2 = sel.policy.agent, sel2.policy.agent
    for x, y in zip([*agent.actor.parameters(), *agent.critic.parameters()],
                    [*agent2.actor.parameters(), *agent2.critic.parameters()], strict=True):
        assert torch.equal(x, y)
    assert torch.equal(sel.table.scores, sel2.table.scores) and torch.equal(agent.rng_state, agent2.rng_state)
    assert sel.samples_seen == sel2.samples_seen and sel.cost() == sel2.cost()
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == trainer.global_step


def test_a_run_without_length_is_refused_naming_both_limits(tmp_path):
    trainer = L.Trainer(max_epochs=-1, max_steps=-1, accelerator="cpu", logger=False, default_root_dir=tmp_path)
    with pytest.raises(ValueError, match="max_epochs=-1, max_steps=-1"):
        DataSelection(RandomPolicy())._epochs(trainer)


def test_a_dataloader_passed_to_fit_is_refused_because_it_cannot_be_rebuilt(tmp_path):
    data = TinyData()
    data.setup()
    loader = DataLoader(data.train_set, batch_size=16)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, default_root_dir=tmp_path, callbacks=[DataSelection()])
    with pytest.raises(TypeError, match="not `trainer.fit\\(train_dataloaders=...\\)`"):
        trainer.fit(module(), train_dataloaders=loader)

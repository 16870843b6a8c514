"""How predictions change with the number of appended masks: accuracy, NLL and TV against a reference tail.

At the end of fit (and optionally after each validation) it asks the datamodule for held-out inputs
`prompt + [MASK]^(1+m)` (`datamodule.eval_batch(m, n_per_slot, seed)` returning tokens, answer,
answer_position, slot), takes the single-step argmax at the answer position, and writes `mask_sweep.json`
and `mask_sweep.png` into the run dir. Standalone: any Lightning module with a `model` (or `eval_model`)
mapping tokens to logits and a datamodule with `eval_batch` works.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor

from framework.losses.mask_agnostic import tv_distance
from framework.losses.mdlm import subs_log_probs


@torch.no_grad()
def answer_log_probs(model: Any, tokens: Tensor, position: int, mask_id: int, chunk: int = 512) -> Tensor:
    """SUBS log-probabilities at `position` for every row, computed in chunks (rows, vocab)."""
    out = []
    for start in range(0, tokens.shape[0], chunk):
        x = tokens[start : start + chunk]
        out.append(subs_log_probs(model(x)[:, position], x[:, position], mask_id))
    return torch.cat(out)


def mask_sweep(
    model: Any, datamodule: Any, ms: list[int], n_per_slot: int = 200, seed: int = 12345, reference_m: int = 2
) -> dict[str, Any]:
    """Accuracy / NLL / TV-to-reference at the answer, for each number m of appended masks, per needle slot."""
    was_training = model.training
    model.eval()
    mask_id = datamodule.mask_id
    reference = None
    table: dict[str, Any] = {"m": [], "acc": [], "nll": [], "tv": [], "eval_len": [], "acc_by_slot": {}}
    for m in sorted(set(ms) | {reference_m}):
        batch = datamodule.eval_batch(m, n_per_slot=n_per_slot, seed=seed)
        device = next(model.parameters()).device
        logp = answer_log_probs(model, batch["tokens"].to(device), batch["answer_position"], mask_id).float().cpu()
        answer = batch["answer"]
        correct = (logp.argmax(-1) == answer).float()
        probs = logp.exp()
        if m == reference_m:
            reference = probs
        table["m"].append(m)
        table["eval_len"].append(batch["tokens"].shape[1])
        table["acc"].append(correct.mean().item())
        table["nll"].append(-logp.gather(1, answer[:, None]).mean().item())
        table["_probs_" + str(m)] = probs
        slots = batch["slot"]
        table["acc_by_slot"][str(m)] = [correct[slots == s].mean().item() for s in slots.unique().tolist()]
    for m in table["m"]:
        table["tv"].append(tv_distance(table.pop("_probs_" + str(m)), reference).mean().item())
    model.train(was_training)
    keep = [i for i, m in enumerate(table["m"]) if m in ms]
    for key in ("m", "acc", "nll", "tv", "eval_len"):
        table[key] = [table[key][i] for i in keep]
    table["acc_by_slot"] = {k: v for k, v in table["acc_by_slot"].items() if int(k) in ms}
    table["reference_m"] = reference_m
    # the longest training row (prompt + answer + EOS tail); an evaluation longer than it is length extrapolation
    table["train_max_len"] = getattr(datamodule, "max_len", None)
    return table


def format_table(table: dict[str, Any]) -> str:
    head = "appended masks m " + " ".join(f"{m:>6d}" for m in table["m"])
    rows = [head]
    for key, label in (("acc", "accuracy"), ("nll", "answer NLL"), ("tv", f"TV to m={table['reference_m']}")):
        rows.append(f"{label:16s} " + " ".join(f"{v:6.3f}" for v in table[key]))
    if table.get("train_max_len") and table.get("eval_len"):  # mark the evaluations longer than every training row
        rows.append(f"{'beyond training':16s} " + " ".join(
            f"{'*' if n > table['train_max_len'] else '':>6s}" for n in table["eval_len"]))
    return "\n".join(rows)


def plot_sweep(table: dict[str, Any], png: Path, title: str = "") -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.4))
    ax1, ax2 = fig.subplots(1, 2)
    ax1.plot(table["m"], table["acc"], marker="o", label="accuracy")
    ax1.plot(table["m"], table["tv"], marker="s", label=f"TV to m={table['reference_m']}")
    ax1.set(xlabel="appended masks m", ylim=(-0.02, 1.02), title=title or "accuracy vs appended masks")
    ax1.legend()
    ax1.grid(alpha=0.3)
    for m, accs in table["acc_by_slot"].items():
        ax2.plot(range(len(accs)), accs, marker=".", label=f"m={m}")
    ax2.set(xlabel="needle slot (0 = farthest from the answer)", ylabel="accuracy", title="by needle distance")
    ax2.legend(fontsize=7, ncol=2)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


class MaskSweep(L.Callback):
    """Evaluates robustness to appended masks at the end of fit; `results()` feeds the run's results.json.

    Args:
        ms: numbers m of extra [MASK] tokens appended after the answer's mask, each ≥ 0; one table row per m.
        n_per_slot: held-out examples per needle slot for each m.
        seed: seed of the held-out examples, the same for every m.
        reference_m: the m whose predictions the TV column compares against; must be one of `ms`.
        out_dir: folder for `mask_sweep.json` and `.png`; None: the trainer's root dir (the run dir).
    """

    def __init__(
        self,
        ms: list[int] = (0, 2, 4, 8, 16, 32, 48, 64),
        n_per_slot: int = 200,
        seed: int = 12345,
        reference_m: int = 2,
        out_dir: str | None = None,
    ):
        if not ms or any(int(m) < 0 for m in ms):
            raise ValueError(f"ms={list(ms)} must be a non-empty list of mask counts >= 0")
        if reference_m not in ms:
            raise ValueError(f"reference_m={reference_m} must be one of ms={list(ms)} (TV is measured against it)")
        if n_per_slot < 1:
            raise ValueError(f"n_per_slot={n_per_slot} must be >= 1")
        self.ms, self.n_per_slot, self.seed, self.reference_m = list(ms), n_per_slot, seed, reference_m
        self.out_dir = out_dir
        self.table: dict[str, Any] | None = None

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        model = getattr(pl_module, "eval_model", None) or pl_module.model
        self.table = mask_sweep(model, trainer.datamodule, self.ms, self.n_per_slot, self.seed, self.reference_m)
        self._write(Path(self.out_dir or trainer.default_root_dir))

    @rank_zero_only
    def _write(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "mask_sweep.json").write_text(json.dumps(self.table, indent=2))
        plot_sweep(self.table, out / "mask_sweep.png")
        print(format_table(self.table))

    def results(self) -> dict[str, float]:
        """Flat metrics for results.json: mask/acc_m{m}, mask/tv_m{m}."""
        if self.table is None:
            return {}
        out = {f"mask/acc_m{m}": a for m, a in zip(self.table["m"], self.table["acc"], strict=True)}
        out.update({f"mask/tv_m{m}": t for m, t in zip(self.table["m"], self.table["tv"], strict=True)})
        return out

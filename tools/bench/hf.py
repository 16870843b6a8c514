"""Hugging Face models under the framework, side by side with their plain peers, in one run.

(a) Overhead: tokens/s of the framework's training step on a transformers Llama-shaped model (`hf_causal_lm`:
    hidden 256, 4 layers, 8 query / 2 KV heads; the `causal_lm` module with the callbacks every `framework.train`
    run adds: the NaN guard at its default, Ctrl-C handling, per-batch seeding) against a plain Lightning loop over
    the same transformers model (`model(input_ids=x, labels=x).loss`), both with AdamW at the same lr, same data.
    Rounds interleave the two; the median of each is reported. Goal: ours ≥ 0.95× plain.
(b) OLion's optimizer step on the same model against `torch.optim.Muon`'s (`optimizer=muon`: torch.optim.Muon on the
    hidden matrices, AdamW on the rest, the same split), the gradients of one real batch in place; ms/step is the
    median over `--rounds` interleaved rounds of `--steps` steps. Goal: OLion ≤ 1.0× Muon.
(c) The fine-tuning claim of OLion's paper ("mitigates optimizer mismatch when fine-tuning AdamW-pretrained
    checkpoints"): a Llama-shaped model (hidden 128, 4 layers, GQA, byte vocabulary) pretrained with AdamW on
    CPython's documentation prose, then fine-tuned on a different text, the standard library's source code, with
    AdamW, Muon and OLion, each at every lr of its grid over 3 seeds; each optimizer's row is its best lr (lowest
    mean validation bits per byte), mean ± std over the seeds, beside the pretrained model's own score. A best on the
    grid's edge adds an lr past it (up to two); a best still on an edge is marked so.

    python tools/bench/hf.py [--quick] [--rounds 5] [--steps 20] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from framework.callbacks.safety import GracefulInterrupt, StopOnNonFinite  # noqa: E402
from framework.checkpointing import StepSeeds  # noqa: E402
from framework.data.text import corpus_bytes  # noqa: E402
from framework.models.hf import HFCausalLM  # noqa: E402
from framework.modules.causal_lm import CausalLM  # noqa: E402
from framework.registry import OPTIMIZERS, load_catalog  # noqa: E402

LLAMA = {"model_type": "llama", "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 512}


def llama(hidden: int, layers: int, seed: int = 0) -> HFCausalLM:
    torch.manual_seed(seed)
    return HFCausalLM(config={**LLAMA, "hidden_size": hidden, "intermediate_size": 4 * hidden,
                              "num_hidden_layers": layers}, vocab_size=256)


def byte_rows(source: str, seq: int, rows: int, seed: int) -> torch.Tensor:
    """`rows` random windows of seq+1 bytes of a corpus (a fixed draw per seed)."""
    data = torch.frombuffer(bytearray(corpus_bytes(source)), dtype=torch.uint8).long()
    starts = torch.randint(0, len(data) - seq - 1, (rows,), generator=torch.Generator().manual_seed(seed))
    return torch.stack([data[s:s + seq + 1] for s in starts.tolist()])


class PlainLM(L.LightningModule):
    """What a Lightning user writes for a transformers causal LM."""

    def __init__(self, hf: torch.nn.Module, lr: float):
        super().__init__()
        self.hf, self.lr = hf, lr

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.hf(input_ids=batch, labels=batch).loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


class Clock(L.Callback):
    def __init__(self, warmup: int):
        self.warmup, self.start, self.seconds, self.steps = warmup, None, 0.0, 0

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if self.start is None and trainer.global_step == self.warmup:
            self.start = time.perf_counter()

    def on_train_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.seconds, self.steps = time.perf_counter() - self.start, trainer.global_step - self.warmup


def tokens_per_s(kind: str, batch: torch.Tensor, steps: int, warmup: int = 3) -> float:
    model = llama(256, 4)
    clock = Clock(warmup)
    if kind == "ours":
        module = CausalLM(model, optimizer=lambda p: torch.optim.AdamW([q for _, q in p], lr=1e-3))
        extra = [StopOnNonFinite(), GracefulInterrupt(), StepSeeds()]
        data = batch
    else:
        module, extra, data = PlainLM(model.hf, 1e-3), [], batch[:, :-1]  # HF shifts the labels itself
    loader = torch.utils.data.DataLoader([data[i] for i in range(len(data))] * (steps + warmup), batch_size=len(data))
    with tempfile.TemporaryDirectory() as tmp:
        L.Trainer(max_steps=steps + warmup, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, callbacks=[clock, *extra], default_root_dir=tmp,
                  accelerator="cpu").fit(module, loader)
    return clock.steps * data.shape[0] * (data.shape[1] - (1 if kind == "ours" else 0)) / clock.seconds


def overhead(rounds: int, steps: int) -> None:
    batch = byte_rows("pydoc", 128, 8, seed=0)
    runs: dict[str, list[float]] = {"plain Lightning loop": [], "framework (hf_causal_lm + causal_lm)": []}
    for _ in range(rounds):
        runs["plain Lightning loop"].append(tokens_per_s("plain", batch, steps))
        runs["framework (hf_causal_lm + causal_lm)"].append(tokens_per_s("ours", batch, steps))
    plain = statistics.median(runs["plain Lightning loop"])
    print("(a) training step on a transformers Llama (hidden 256, 4 layers, 8/2 heads), batch 8 x 128 bytes, AdamW\n")
    print("| loop | tokens/s (median) | x plain |\n|---|---|---|")
    for name, values in runs.items():
        print(f"| {name} | {statistics.median(values):.0f} | {statistics.median(values) / plain:.3f} |")
    print()


def optimizer_steps(rounds: int, steps: int) -> None:
    model = llama(256, 4)
    batch = byte_rows("pydoc", 128, 8, seed=0)
    F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten()).backward()
    named = [(n, p) for n, p in model.named_parameters()]
    start = {n: p.detach().clone() for n, p in named}
    opts = {"muon (torch.optim.Muon + AdamW)": OPTIMIZERS.build("muon", named, lr=0.02),
            "olion": OPTIMIZERS.build("olion", named, lr=0.02)}
    times: dict[str, list[float]] = {k: [] for k in opts}
    for _ in range(rounds):
        for name, opt in opts.items():
            opt.step()  # warm: state and workspaces exist
            begin = time.perf_counter()
            for _ in range(steps):
                opt.step()
            times[name].append((time.perf_counter() - begin) / steps * 1e3)
            with torch.no_grad():
                for n, p in named:
                    p.copy_(start[n])
    muon = statistics.median(times["muon (torch.optim.Muon + AdamW)"])
    hidden = sum(p.numel() for g in opts["olion"].param_groups for p, o in zip(g["params"], g["orthogonal"],
                                                                              strict=True) if o)
    print(f"(b) optimizer step on the same model ({hidden:,} parameters in the orthogonal branch; the same split for"
          f" both), {torch.get_num_threads()} threads\n")
    print("| optimizer | ms/step (median) | x muon |\n|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.2f} | {statistics.median(values) / muon:.3f} |")
    print()


def train(model: HFCausalLM, opt_name: str, lr: float, source: str, steps: int, seed: int) -> None:
    opt = OPTIMIZERS.build(opt_name, list(model.named_parameters()), lr=lr, weight_decay=0.0)
    data = byte_rows(source, 128, steps * 16, seed=1000 + seed)
    model.train()
    for step in range(steps):
        rows = data[step * 16:(step + 1) * 16]
        loss = F.cross_entropy(model(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


@torch.no_grad()
def bits_per_byte(model: HFCausalLM, rows: torch.Tensor) -> float:
    model.eval()
    loss = sum(F.cross_entropy(model(r[:, :-1]).flatten(0, 1), r[:, 1:].flatten()).item() for r in rows.split(32))
    return loss / len(rows.split(32)) / torch.log(torch.tensor(2.0)).item()


def _fine_tune(base: HFCausalLM, name: str, lr: float, steps: int, seeds: list[int], val_ft: torch.Tensor,
               val_pre: torch.Tensor) -> tuple[float, float, float]:
    """(mean, std of the fine-tuned bpb, mean bpb on the pretraining text after) of `base` fine-tuned per seed."""
    import copy

    scores, kept = [], []
    for seed in seeds:
        model = copy.deepcopy(base)
        train(model, name, lr, "stdlib", steps, seed)
        scores.append(bits_per_byte(model, val_ft))
        kept.append(bits_per_byte(model, val_pre))
    return statistics.mean(scores), statistics.stdev(scores) if len(scores) > 1 else 0.0, statistics.mean(kept)


def fine_tuning(quick: bool) -> None:
    pre_steps, ft_steps, seeds = (60, 20, [0]) if quick else (800, 150, [0, 1, 2])
    grids = ({"adamw": [1e-3], "muon": [1e-2], "olion": [1e-2]} if quick else
             {"adamw": [3e-4, 1e-3, 3e-3], "muon": [3e-3, 1e-2, 3e-2], "olion": [1e-3, 3e-3, 1e-2]})
    base = llama(128, 4)
    train(base, "adamw", 3e-3, "pydoc", pre_steps, seed=99)
    val_pre = byte_rows("pydoc", 128, 128, seed=7)
    val_ft = byte_rows("stdlib", 128, 128, seed=7)
    print(f"(c) fine-tuning an AdamW-pretrained Llama (hidden 128, 4 layers; {pre_steps} AdamW steps on pydoc prose,"
          f" then {ft_steps} steps of batch 16 x 128 bytes on stdlib source), {len(seeds)} seed(s) per lr\n")
    print(f"pretrained model: {bits_per_byte(base, val_pre):.3f} bpb on pydoc, {bits_per_byte(base, val_ft):.3f} bpb"
          " on stdlib before fine-tuning\n")
    print("| optimizer | lr grid | best lr | stdlib bpb (mean ± std) | pydoc bpb after (forgetting) |\n"
          "|---|---|---|---|---|")
    for name, grid in grids.items():
        results: dict[float, tuple[float, float, float]] = {}
        grid = list(grid)
        while True:
            for lr in grid:
                if lr not in results:
                    results[lr] = _fine_tune(base, name, lr, ft_steps, seeds, val_ft, val_pre)
            best = min(grid, key=lambda v: results[v][0])
            if quick or len(grid) >= len(grids[name]) + 2 or best not in (grid[0], grid[-1]):
                break  # an lr on the grid's edge adds one past it (twice at most), so a best is interior
            step = grid[1] / grid[0]
            grid = [grid[0] / step, *grid] if best == grid[0] else [*grid, grid[-1] * step]
        mean, std, kept = results[best]
        edge = " (grid edge)" if best in (grid[0], grid[-1]) else ""
        lrs = ", ".join(f"{v:g}" for v in grid)
        print(f"| {name} | {lrs} | {best:g}{edge} | {mean:.3f} ± {std:.3f} | {kept:.3f} |")
    print()


def main(argv: list[str] | None = None) -> int:
    import logging
    import warnings

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)  # the tables only: no trainer banners
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_catalog()
    rounds, steps = (1, 3) if args.quick else (args.rounds, args.steps)
    overhead(rounds, steps)
    optimizer_steps(rounds, steps)
    fine_tuning(args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())

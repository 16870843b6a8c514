"""OLion against AdamW on a chat fine-tune, with LoRA adapters and in full: held-out loss at equal steps, 3 seeds.

A byte-level Llama (hidden 128, 4 layers, 8 query / 2 KV heads) is pretrained with AdamW (600 steps) on CPython's
documentation prose, then fine-tuned on a chat set built from the standard library itself: the user asks what a
function or class does ("What does `json.dumps` do?"), the assistant answers with the first sentence of its
docstring, rendered in ChatML's layout with the loss on the assistant's answer only (the framework's `causal_lm`
module, labels -100 elsewhere). Every tenth question (in name order) is held out. Four ways to fine-tune, the same
steps and batches (150 steps of 8 rows): LoRA (PEFT, r 8, alpha 16, every linear layer but the head) with AdamW or
OLion, and every parameter with AdamW or OLion. Each way runs at every lr of its grid over 3 seeds (the seed draws
the batches and the adapters' init); its row is the lr with the lowest mean held-out loss, mean ± std over the
seeds, in nats per answer byte. A best on the grid's edge adds an lr past it (once); one still on an edge is marked.

    python tools/bench/chat_fine_tuning.py [--quick] [--steps 150] [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import inspect
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from framework.data.text import corpus_bytes  # noqa: E402
from framework.models.hf import HFCausalLM  # noqa: E402
from framework.models.peft_adapters import LoRA, attach  # noqa: E402
from framework.modules.causal_lm import CausalLM  # noqa: E402
from framework.registry import OPTIMIZERS, load_catalog  # noqa: E402

MODULES = ["os", "os.path", "shutil", "json", "re", "string", "textwrap", "collections", "itertools", "functools",
           "pathlib", "statistics", "math", "random", "datetime", "csv", "heapq", "bisect", "copy", "inspect",
           "argparse", "logging", "tempfile", "zipfile", "tarfile", "gzip", "hashlib", "base64", "struct", "socket",
           "subprocess", "threading", "queue", "time", "calendar", "difflib", "fnmatch", "glob", "operator", "typing",
           "urllib.parse", "html", "xml.etree.ElementTree", "sqlite3", "decimal", "fractions", "uuid", "pprint",
           "traceback", "warnings", "contextlib", "dataclasses", "enum", "abc", "io", "codecs", "unicodedata", "locale"]
SEQ = 192
WAYS = {  # name: (LoRA or not, optimizer, lr grid)
    "LoRA + AdamW": (True, "adamw", [1e-3, 3e-3, 1e-2]),
    "LoRA + OLion": (True, "olion", [1e-3, 3e-3, 1e-2]),
    "full AdamW": (False, "adamw", [3e-4, 1e-3, 3e-3]),
    "full OLion": (False, "olion", [3e-4, 1e-3, 3e-3]),
}


def chat_pairs() -> list[tuple[str, str]]:
    """(question, answer) pairs from the standard library: each public function or class with a docstring, asked
    about by its dotted name and answered with the docstring's first sentence; in name order, duplicates dropped."""
    import importlib

    pairs: dict[str, str] = {}
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name, obj in vars(module).items():
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
                continue
            doc = (inspect.getdoc(obj) or "").strip()
            first = " ".join(doc.split("\n\n")[0].split()).split(". ")[0].rstrip(".")
            if 20 <= len(first) <= 120 and first.isascii():
                pairs.setdefault(f"{module_name}.{name}", first + ".")
    return sorted(pairs.items())


def render(question: str, answer: str) -> tuple[list[int], list[int]]:
    """ChatML's layout as bytes, the labels the answer and its end marker, -100 elsewhere."""
    prompt = f"<|im_start|>user\nWhat does {question} do?<|im_end|>\n<|im_start|>assistant\n".encode()
    reply = f"{answer}<|im_end|>\n".encode()
    ids = list(prompt + reply)[:SEQ]
    return ids, ([-100] * len(prompt) + list(reply))[:SEQ]


def batch_of(rows: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
    """Rows padded to SEQ on the right (attention mask 0, labels -100 there)."""
    ids = torch.zeros(len(rows), SEQ, dtype=torch.long)
    labels = torch.full((len(rows), SEQ), -100, dtype=torch.long)
    mask = torch.zeros(len(rows), SEQ, dtype=torch.long)
    for i, (row_ids, row_labels) in enumerate(rows):
        ids[i, : len(row_ids)], labels[i, : len(row_ids)], mask[i, : len(row_ids)] = (
            torch.tensor(row_ids), torch.tensor(row_labels), 1)
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def llama(seed: int = 0) -> HFCausalLM:
    torch.manual_seed(seed)
    return HFCausalLM(config={"model_type": "llama", "hidden_size": 128, "intermediate_size": 512,
                              "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
                              "max_position_embeddings": 512}, vocab_size=256)


def pretrain(model: HFCausalLM, steps: int) -> None:
    """AdamW (lr 3e-3) on random windows of 129 bytes of the documentation prose, batch 16."""
    data = torch.frombuffer(bytearray(corpus_bytes("pydoc")), dtype=torch.uint8).long()
    g = torch.Generator().manual_seed(99)
    opt = OPTIMIZERS.build("adamw", list(model.named_parameters()), lr=3e-3, weight_decay=0.0)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - 129, (16,), generator=g).tolist()
        rows = torch.stack([data[s : s + 129] for s in starts])
        loss = F.cross_entropy(model(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def fine_tune(base: HFCausalLM, lora: bool, optimizer: str, lr: float, seed: int, train_rows: list, steps: int,
              batch: int) -> CausalLM:
    """`base` copied, LoRA adapters attached (or not), trained `steps` steps of `batch` rows drawn by `seed`."""
    model = copy.deepcopy(base)
    torch.manual_seed(seed)
    if lora:
        attach(model, LoRA(r=8, alpha=16.0, dropout=0.0))
    module = CausalLM(model)
    opt = OPTIMIZERS.build(optimizer, module.optimized_parameters(), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(1000 + seed)
    model.train()
    for _ in range(steps):
        picks = torch.randint(0, len(train_rows), (batch,), generator=g).tolist()
        loss = module.loss(batch_of([train_rows[i] for i in picks]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return module


@torch.no_grad()
def held_out_loss(module: CausalLM, rows: list) -> float:
    """Token-weighted mean CE over every held-out answer byte, nats."""
    module.model.eval()
    total, count = 0.0, 0
    for start in range(0, len(rows), 32):
        tokens, scored, _ = module.scored(batch_of(rows[start : start + 32]))
        total, count = total + tokens.sum().item(), count + int(scored.sum())
    module.model.train()
    return total / count


def best_on_grid(score, grid: list[float], extra: int = 2) -> tuple[float, list[float], dict[float, tuple]]:
    """The lr of `grid` with the lowest mean score; a best on an edge adds an lr past it, `extra` times at most."""
    results: dict[float, tuple] = {}
    grid = list(grid)
    for extension in range(extra + 1):
        for lr in grid:
            if lr not in results:
                results[lr] = score(lr)
        best = min(grid, key=lambda v: results[v][0])
        if extension == extra or len(grid) < 2 or best not in (grid[0], grid[-1]):
            break
        ratio = grid[1] / grid[0]
        grid = [grid[0] / ratio, *grid] if best == grid[0] else [*grid, grid[-1] * ratio]
    return best, grid, results


def main(argv: list[str] | None = None) -> int:
    import logging
    import warnings

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed, one lr per way, few steps")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_catalog()
    pre_steps, steps, seeds, batch = (40, 10, [0], 8) if args.quick else (600, args.steps, [0, 1, 2], 8)
    pairs = chat_pairs()
    rows = [render(q, a) for q, a in pairs]
    held, train_rows = rows[::10], [r for i, r in enumerate(rows) if i % 10]
    start = time.perf_counter()
    base = llama()
    pretrain(base, pre_steps)
    base_module = CausalLM(base)
    print(f"chat fine-tuning: {len(pairs)} standard-library questions ({len(train_rows)} trained on, {len(held)} held "
          f"out), ChatML as bytes, loss on the answers; a Llama of hidden 128, 4 layers pretrained with AdamW for "
          f"{pre_steps} steps on pydoc prose; {steps} steps of batch {batch} per run, {len(seeds)} seed(s) per lr, "
          f"{args.threads} threads\n")
    print(f"pretrained model before fine-tuning: held-out loss {held_out_loss(base_module, held):.3f} nats per "
          "answer byte\n")
    print("| way | trainable | lr grid | best lr | held-out loss (mean ± std) |\n|---|---|---|---|---|")
    for way, (lora, optimizer, grid) in WAYS.items():
        trainable = [0]

        def score(lr: float, lora=lora, optimizer=optimizer, trainable=trainable) -> tuple[float, float]:
            losses = []
            for seed in seeds:
                module = fine_tune(base, lora, optimizer, lr, seed, train_rows, steps, batch)
                trainable[0] = sum(p.numel() for _, p in module.optimized_parameters())
                losses.append(held_out_loss(module, held))
            return statistics.mean(losses), statistics.stdev(losses) if len(losses) > 1 else 0.0

        best, grid, results = best_on_grid(score, grid[1:2] if args.quick else grid, 0 if args.quick else 1)
        edge = " (grid edge)" if len(grid) > 1 and best in (grid[0], grid[-1]) else ""
        mean, std = results[best]
        print(f"| {way} | {trainable[0]:,} | {', '.join(f'{v:g}' for v in grid)} | {best:g}{edge} | "
              f"{mean:.3f} ± {std:.3f} |", flush=True)
    print(f"\n({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

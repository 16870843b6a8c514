"""Fine-tuning at real shapes (issue 52): peak memory and step time of full and LoRA fine-tuning, ours against TRL's
`SFTTrainer` (+ `peft_config`), side by side in one run.

Models are built from real checkpoints' configs with random weights (nothing is downloaded): SmolLM2-360M's shapes
for full fine-tuning, Llama-3.2-1B's for LoRA (r 16, alpha 32, every linear layer but the head). One chat batch of
1 x SEQ tokens (a generated conversation rendered with ChatML, the loss on the assistant's tokens), the same ids and
labels for every row; fp32 on a CPU, bf16 mixed on a GPU; a constant lr, gradient clipping at 1.0, no validation,
no checkpoint. Each configuration runs in a fresh process: `peak` is its peak RSS (VmHWM) on a CPU (the process'
whole footprint, imports included) or `torch.cuda.max_memory_allocated` on a GPU; `step` is the median time of the
optimizer steps after the first (forward, backward, step; a GPU synchronised). Rows:
- ours: the framework's `causal_lm` module on `hf_causal_lm` in Lightning's loop, AdamW or OLion, with `peft=lora`'s
  adapters for LoRA, each with and without `gradient_checkpointing`;
- peer: TRL's SFTTrainer with AdamW (`optim="adamw_torch"`), `peft_config` for LoRA, each with and without its
  `gradient_checkpointing` (non-reentrant, as ours).
Goals: ours <= 1.05x the peer's peak memory and >= 0.95x its tokens/s at the same settings (AdamW). Also printed:
OLion's optimizer state bytes against AdamW's on the full fine-tune (one momentum against two moments, AdamW's
branch for embeddings and norms included), and what checkpointing saves.

    python tools/bench/fine_tuning.py [--quick] [--steps 3] [--seq 2048] [--only full lora]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

#: public configs of the checkpoints whose shapes are measured (random weights)
SHAPES = {
    "SmolLM2-360M": {"hidden_size": 960, "num_hidden_layers": 32, "num_attention_heads": 15, "num_key_value_heads": 5,
                     "intermediate_size": 2560, "vocab_size": 49152, "tie_word_embeddings": True,
                     "rope_theta": 100000.0},
    "Llama-3.2-1B": {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                     "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True,
                     "rope_theta": 500000.0},
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 128, "vocab_size": 512, "tie_word_embeddings": True},
}
LORA = {"r": 16, "alpha": 32.0, "dropout": 0.0}
LR = {"adamw": 2e-5, "olion": 2e-5}


def chat_batch(vocab: int, seq: int) -> dict[str, list[int]]:
    """One row of `seq` token ids: generated user/assistant exchanges in ChatML's layout (role tokens, text, end
    token), the labels -100 everywhere but the assistant's answers; ids drawn from the vocabulary, seeded."""
    import random

    rng = random.Random(0)
    start, end, user, assistant = 1, 2, 3, 4
    ids, labels = [], []
    while len(ids) < seq:
        for role, n in ((user, rng.randint(20, 120)), (assistant, rng.randint(40, 300))):
            turn = [start, role] + [rng.randrange(8, vocab) for _ in range(n)] + [end]
            ids += turn
            labels += turn if role == assistant else [-100] * len(turn)
    return {"input_ids": ids[:seq], "labels": labels[:seq]}


def peak_memory(device) -> int:
    import torch

    if device == "cuda":
        return int(torch.cuda.max_memory_allocated())
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def build_model(shape: str, seq: int, checkpointing: bool, device: str):
    """The transformers Llama of `shape`, random weights (seeded), through the framework's `hf_causal_lm`."""
    import torch

    from framework.models.hf import HFCausalLM

    torch.manual_seed(0)
    config = {"model_type": "llama", "max_position_embeddings": max(seq, 2048), **SHAPES[shape]}
    return HFCausalLM(config=config, gradient_checkpointing=checkpointing, attn_implementation="sdpa").to(device)


def run_ours(cfg: dict) -> dict:
    """The framework's path: `causal_lm` on `hf_causal_lm` (+ `peft=lora`), Lightning's loop."""
    import functools

    import lightning as L
    import torch
    from torch.utils.data import DataLoader

    from framework.models.peft_adapters import LoRA, attach
    from framework.modules.causal_lm import CausalLM
    from framework.registry import OPTIMIZERS, load_catalog

    load_catalog()
    device = cfg["device"]
    model = build_model(cfg["shape"], cfg["seq"], cfg["checkpointing"], "cpu")
    if cfg["lora"]:
        attach(model, LoRA(**LORA))
    row = chat_batch(model.vocab_size, cfg["seq"])
    batch = {"input_ids": torch.tensor([row["input_ids"]]), "labels": torch.tensor([row["labels"]])}
    optimizer = functools.partial(OPTIMIZERS.get(cfg["optimizer"]), lr=LR[cfg["optimizer"]], weight_decay=0.0)
    module = CausalLM(model, optimizer=optimizer)
    times, state = [], {}

    class Timer(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if device == "cuda":
                torch.cuda.synchronize()
            self.t = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t)
            opt = trainer.optimizers[0]
            state["bytes"] = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                                 if torch.is_tensor(t) and t.dim() > 0)

    loader = DataLoader([batch] * cfg["steps"], batch_size=None)
    trainer = L.Trainer(max_steps=cfg["steps"], accelerator="gpu" if device == "cuda" else "cpu", devices=1,
                        precision="bf16-mixed" if device == "cuda" else "32-true", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, gradient_clip_val=1.0, callbacks=[Timer()])
    trainer.fit(module, loader)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"times": times, "peak": peak_memory(device), "state_bytes": state.get("bytes"), "trainable": trainable}


def run_trl(cfg: dict) -> dict:
    """TRL's SFTTrainer on the same transformers model, batch and settings (AdamW; peft_config for LoRA)."""
    import tempfile

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    device = cfg["device"]
    model = build_model(cfg["shape"], cfg["seq"], cfg["checkpointing"], "cpu").hf
    row = chat_batch(model.config.vocab_size, cfg["seq"])
    data = Dataset.from_list([row] * cfg["steps"])
    times = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if device == "cuda":
                torch.cuda.synchronize()
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - self.t)

    def collate(rows):  # SFTTrainer wants an attention mask (or position ids); one row, no padding: all ones
        ids = torch.tensor([r["input_ids"] for r in rows])
        return {"input_ids": ids, "labels": torch.tensor([r["labels"] for r in rows]),
                "attention_mask": torch.ones_like(ids)}

    peft_config = None
    if cfg["lora"]:
        from peft import LoraConfig

        peft_config = LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                                 target_modules="all-linear", task_type="CAUSAL_LM")
    with tempfile.TemporaryDirectory() as out:
        args = SFTConfig(output_dir=out, max_steps=cfg["steps"], per_device_train_batch_size=1,
                         learning_rate=LR["adamw"], weight_decay=0.0, lr_scheduler_type="constant", warmup_steps=0,
                         max_grad_norm=1.0, optim="adamw_torch", gradient_checkpointing=cfg["checkpointing"],
                         gradient_checkpointing_kwargs={"use_reentrant": False}, bf16=device == "cuda",
                         use_cpu=device != "cuda", report_to=[], save_strategy="no", logging_strategy="no",
                         max_length=cfg["seq"], packing=False, dataset_kwargs={"skip_prepare_dataset": True},
                         remove_unused_columns=False, dataloader_num_workers=0, seed=0)
        trainer = SFTTrainer(model=model, args=args, train_dataset=data, data_collator=collate,
                             processing_class=ids_tokenizer(), peft_config=peft_config, callbacks=[Timer()])
        trainer.train()
        trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    return {"times": times, "peak": peak_memory(device), "state_bytes": None, "trainable": trainable}


def ids_tokenizer():
    """A stand-in tokenizer for SFTTrainer, which wants one (pad and EOS); the batch comes tokenized already."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={"<pad>": 0, "<eos>": 1, "<unk>": 2}, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def child(cfg: dict) -> None:
    import torch

    torch.set_num_threads(cfg["threads"])
    out = (run_ours if cfg["who"] == "ours" else run_trl)(cfg)
    print("RESULT " + json.dumps(out), flush=True)


def measure(cfg: dict) -> dict:
    """One configuration in a fresh process (its own peak)."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg)], capture_output=True, text=True,
                          env=env, timeout=7200)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{cfg}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def table(title: str, shape: str, lora: bool, args: argparse.Namespace, device: str) -> dict:
    results = {}
    for checkpointing in (False, True):
        for who, optimizer in (("trl", "adamw"), ("ours", "adamw"), ("ours", "olion")):
            cfg = {"who": who, "optimizer": optimizer, "shape": shape, "lora": lora, "checkpointing": checkpointing,
                   "seq": args.seq, "steps": args.steps, "device": device, "threads": args.threads}
            results[(who, optimizer, checkpointing)] = r = measure(cfg)
            print(f"  measured {who} {optimizer} checkpointing={checkpointing}: peak {r['peak'] / 2**30:.2f} GiB, "
                  f"steps {', '.join(f'{t:.1f}' for t in r['times'])} s", file=sys.stderr, flush=True)
    print(f"\n{title}\n")
    print("| run | optimizer | checkpointing | trainable | peak memory (GiB) | step s | tokens/s | memory x peer | "
          "tokens/s x peer | goal |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for checkpointing in (False, True):
        peer = results[("trl", "adamw", checkpointing)]
        peer_step = statistics.median(peer["times"][1:] or peer["times"])
        for who, optimizer in (("trl", "adamw"), ("ours", "adamw"), ("ours", "olion")):
            r = results[(who, optimizer, checkpointing)]
            step = statistics.median(r["times"][1:] or r["times"])
            same = who == "ours" and optimizer == "adamw"
            name = "peer: TRL SFTTrainer" + (" + peft_config" if lora else "") if who == "trl" else \
                "ours: recipe=sft's module" + (" + peft=lora" if lora else "")
            print(f"| {name} | {optimizer} | {'yes' if checkpointing else 'no'} | {r['trainable']:,} | "
                  f"{r['peak'] / 2**30:.2f} | {step:.2f} | {args.seq / step:,.0f} | "
                  f"{r['peak'] / peer['peak']:.3f} | {peer_step / step:.3f} | "
                  f"{'<= 1.05 / >= 0.95' if same else ''} |")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, 128 tokens (a check that it runs)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per run (the first is warm-up)")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--only", nargs="+", choices=["full", "lora"], default=["full", "lora"])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.quick:
        args.seq, args.steps = 128, 2
    full, lora = ("tiny", "tiny") if args.quick else ("SmolLM2-360M", "Llama-3.2-1B")
    where = torch.cuda.get_device_name(0) if device == "cuda" else f"CPU, {args.threads} threads, fp32"
    print(f"fine-tuning at real shapes: one chat batch of 1 x {args.seq} tokens, {args.steps} steps per run (the "
          f"first is warm-up), {where}; random weights of each checkpoint's config; each run a fresh process")
    found = {}
    if "full" in args.only:
        found["full"] = table(f"(a) full fine-tuning, {full}'s shapes", full, False, args, device)
    if "lora" in args.only:
        found["lora"] = table(f"(b) LoRA (r 16, alpha 32, all-linear), {lora}'s shapes", lora, True, args, device)
    if "full" in found:
        res = found["full"]
        adamw, olion = res[("ours", "adamw", False)]["state_bytes"], res[("ours", "olion", False)]["state_bytes"]
        print(f"\n(c) optimizer state on the full fine-tune ({full}): AdamW {adamw / 2**30:.2f} GiB, OLion "
              f"{olion / 2**30:.2f} GiB: OLion/AdamW = {olion / adamw:.3f}")
    for part, res in found.items():
        for who, optimizer in (("trl", "adamw"), ("ours", "adamw"), ("ours", "olion")):
            off, on = res[(who, optimizer, False)], res[(who, optimizer, True)]
            print(f"(d) checkpointing, {part}, {who} {optimizer}: peak {off['peak'] / 2**30:.2f} -> "
                  f"{on['peak'] / 2**30:.2f} GiB ({on['peak'] / off['peak']:.3f}x), step "
                  f"{statistics.median(off['times'][1:] or off['times']):.2f} -> "
                  f"{statistics.median(on['times'][1:] or on['times']):.2f} s")


if __name__ == "__main__":
    main()

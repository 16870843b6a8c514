"""The mixed KV cache on a transformers model, side by side with kvpress and HF's own cache, in one run (issue 36).

A Llama-shaped transformers model (hidden 512, 8 layers, 8 query / 4 KV heads, fp32; random weights: speed and bytes
do not depend on them) decodes greedily after a prompt of 4k and 16k tokens, batch 1 and 4, with a KV-head
allocation at s = 0.5 and 0.75 (DuoAttention's window: 64 sink + 256 recent tokens), each in a fresh process
(`_kv_hf_worker.py`) on `--threads` threads:

* ours: `framework.serving.hf_attention.mixed_kv_cache` inside the model's forward (the prompt prefilled in full, as
  kvpress does, then the compressed heads truncated to the window);
* kvpress 0.5.5's `DuoAttentionPress`, handed the same heads as its pattern, in its own environment
  (`make kvpress-env`: it pins an older transformers), fed the same saved weights;
* the bound: HF's own `DynamicCache` holding only as many positions as ours holds on average, (1 − s)·L + s·W;
* HF's full cache.

Per row: decode tokens/s of the timed loop (`--steps` one-token steps after the prompt), the KV bytes each cache
holds at the end beside the theory, and each process's peak RSS.

Exact match at the same allocation: a Llama-shaped transformers model (hidden 128, 4 layers, 8 query / 4 KV heads)
learns pointer chasing through the CLI (`recipe=pointer_chase_lm model=hf_causal_lm`), DuoAttention's probe ranks
its KV heads (`recipe=rlkv_probe module=duo_attention data.train_task=lookup`, `init_from=` that run), and held-out
chains are decoded greedily by ours and by kvpress with the same heads compressed to 1 sink + 4 recent tokens
(DuoAttention's probe's ranking and a random one, s = 0.25, 0.5, 0.75). Ours prefills the prompt in full, as kvpress
does, and also as the probes evaluate (`prefill="streaming"`: the compressed heads masked from the first token).
kvpress masks only the prompt's keys, so its compressed heads also keep every token decoded after it; ours slides
(DuoAttention's constant-size streaming cache). The last column gives ours a recent window as long as what
kvpress's compressed heads hold at the end (its window + the tokens decoded): the same positions, nearly.

Goals (issue 36): our KV bytes = theory, kvpress's = the full cache's; ours ≥ 1.5× kvpress's tokens/s at 16k,
s = 0.5; ours ≥ 0.9× the bound; our exact match ≥ kvpress's at every allocation.

    python tools/bench/kv_cache_hf.py [--quick] [--threads 1] [--steps 64] [--n-eval 1000]
                                      [--kvpress .venv-kvpress/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from framework.data.pointer_chase import EOS, PAD, chase_rows, prompt_length  # noqa: E402
from framework.probes.allocation import HeadAllocation, select_full_heads  # noqa: E402
from framework.probes.rewards import exact_match  # noqa: E402

WORKER = Path(__file__).with_name("_kv_hf_worker.py")
SIZES = {"full": dict(hidden=512, layers=8, heads=8, kv_heads=4, contexts=(4096, 16384), window=(64, 256)),
         "quick": dict(hidden=64, layers=2, heads=4, kv_heads=2, contexts=(256, 1024), window=(4, 16))}


# the retrieval model of the exact-match rows, its training and DuoAttention's probe (steps: pointer_chase_lm's and
# tools/experiments/rlkv.py's); --quick: a 2-layer model and a handful of steps (the pipeline, not the numbers)
RETRIEVAL = {"full": dict(hidden=128, layers=4, heads=8, kv_heads=4, train_steps=2500, probe_steps=600),
             "quick": dict(hidden=32, layers=2, heads=4, kv_heads=2, train_steps=40, probe_steps=10)}
EM_WINDOW = (1, 4)  # tools/experiments/rlkv.py's: 1 sink + 4 recent of a 19-token prompt


def build_model(folder: Path, size: dict, seed: int = 0) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=size["hidden"], intermediate_size=4 * size["hidden"],
                         num_hidden_layers=size["layers"], num_attention_heads=size["heads"],
                         num_key_value_heads=size["kv_heads"], vocab_size=1024,
                         max_position_embeddings=2 * max(size["contexts"]))
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)


def measure(python: str, mode: str, folder: Path, spec: dict, tmp: Path) -> dict:
    path = tmp / f"spec_{mode}.json"
    path.write_text(json.dumps(spec))
    proc = subprocess.run([python, str(WORKER), mode, str(folder), str(path)], capture_output=True, text=True,
                          cwd=REPO, timeout=3600)
    if proc.returncode:
        raise RuntimeError(f"{mode} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cli(args: list[str], run_dir: Path) -> Path:
    cmd = [sys.executable, "-m", "framework.train", *args, "threads=1", "trainer.enable_progress_bar=false",
           f"hydra.run.dir={run_dir}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return run_dir


def retrieval_model(tmp: Path, size: dict) -> tuple[Path, torch.Tensor]:
    """Train the pointer-chasing Llama and probe it; return its save_pretrained folder and the probe's gates."""
    from framework.hub import load_weights_into
    from framework.models.hf import HFCausalLM

    config = {"model_type": "llama", "hidden_size": size["hidden"], "intermediate_size": 4 * size["hidden"],
              "num_hidden_layers": size["layers"], "num_attention_heads": size["heads"],
              "num_key_value_heads": size["kv_heads"]}
    model_args = ["model=hf_causal_lm", "model.config=" + json.dumps(config).replace('"', "")]
    base = cli(["recipe=pointer_chase_lm", *model_args, f"trainer.max_steps={size['train_steps']}"], tmp / "base")
    probe = cli(["recipe=rlkv_probe", *model_args, f"init_from={base}", "module=duo_attention",
                 "data.train_task=lookup", "optimizer.lr=0.02", f"trainer.max_steps={size['probe_steps']}",
                 "trainer.val_check_interval=null", "trainer.limit_val_batches=1"], tmp / "probe")
    spec = json.loads((base / "model_config.json").read_text())["config"]
    model = load_weights_into(HFCausalLM(**spec), base)
    folder = tmp / "retrieval"
    model.save_pretrained(folder)
    return folder, HeadAllocation.load(probe).tensor()


def exact_match_rows(python: dict[str, str], tmp: Path, size: dict, n_eval: int, threads: int) -> None:
    folder, probed = retrieval_model(tmp, size)
    rows = chase_rows(n_eval, torch.Generator().manual_seed(20_261_202))
    p = prompt_length(8)
    prompt, answer = rows[:, :p], rows[:, p:]
    base = {"context": p, "batch": n_eval, "steps": answer.shape[1], "threads": threads, "seed": 0,
            "sink": EM_WINDOW[0], "recent": EM_WINDOW[1], "bound_context": p, "prompts": prompt.tolist()}

    def em(mode: str, full: torch.Tensor, prefill: str = "full", recent: int = EM_WINDOW[1]) -> float:
        spec = {**base, "full": full.tolist(), "prefill": prefill, "recent": recent}
        run = measure(python[mode], mode, folder, spec, tmp)
        tokens = torch.tensor(run["tokens"])
        after = (tokens == EOS).long().cumsum(1) - (tokens == EOS).long() > 0  # as the probes decode: PAD after EOS
        return float(exact_match(tokens.masked_fill(after, PAD), answer).mean())

    full_cache = em("hf_full", torch.ones_like(probed, dtype=torch.bool))
    print(f"\nExact match on {n_eval} held-out pointer chases (Llama hidden {size['hidden']}, {size['layers']} layers, "
          f"{size['heads']}/{size['kv_heads']} heads, trained by recipe=pointer_chase_lm; compressed heads keep "
          f"{EM_WINDOW[0]} sink + {EM_WINDOW[1]} recent tokens); full cache: {full_cache:.3f}\n")
    wide = EM_WINDOW[1] + answer.shape[1]  # what kvpress's compressed heads hold at the end: its window + every new one
    print(f"| allocation | s | ours | kvpress | ours − kvpress | ours, prefill streaming | ours, recent {wide} |")
    print("|---|---|---|---|---|---|---|")
    rankings = {"DuoAttention probe": probed,
                "random": torch.rand(probed.shape, generator=torch.Generator().manual_seed(1))}
    for name, gates in rankings.items():
        for s in (0.25, 0.5, 0.75):
            full = select_full_heads(gates, s)
            ours, press, streaming = em("ours", full), em("kvpress", full), em("ours", full, "streaming")
            widened = em("ours", full, recent=wide)
            print(f"| {name} | {s:g} | {ours:.3f} | {press:.3f} | {ours - press:+.3f} | {streaming:.3f} |"
                  f" {widened:.3f} |", flush=True)


def theory_bytes(full: torch.Tensor, length: int, window: tuple[int, int], batch: int, head_dim: int) -> int:
    held = full.sum().item() * length + (~full).sum().item() * min(length, sum(window))
    return int(held * 2 * batch * head_dim * 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--n-eval", type=int, default=1000, help="held-out chains of the exact-match rows")
    parser.add_argument("--kvpress", default=str(REPO / ".venv-kvpress" / "bin" / "python"),
                        help="the python of kvpress's environment (make kvpress-env)")
    args = parser.parse_args(argv)
    if not Path(args.kvpress).is_file():
        print(f"error: no kvpress environment at {args.kvpress}: build it with `make kvpress-env`", file=sys.stderr)
        return 2
    size = SIZES["quick" if args.quick else "full"]
    steps = 8 if args.quick else args.steps
    head_dim = size["hidden"] // size["heads"]
    gates = torch.rand(size["layers"], size["kv_heads"], generator=torch.Generator().manual_seed(0))
    print(f"Llama (hidden {size['hidden']}, {size['layers']} layers, {size['heads']}/{size['kv_heads']} heads, fp32),"
          f" window {size['window']}, {steps} decode steps, {args.threads} thread(s)\n")
    print("| context | batch | s | ours tok/s | kvpress tok/s | ours / kvpress | bound tok/s | ours / bound "
          "| ours KV MiB | theory MiB | kvpress KV MiB | full KV MiB | peak RSS MiB ours / kvpress / full |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        folder = tmp / "model"
        build_model(folder, size)
        for context in size["contexts"]:
            for batch in (1, 4):
                base = {"context": context, "batch": batch, "steps": steps, "threads": args.threads, "seed": 0,
                        "sink": size["window"][0], "recent": size["window"][1]}
                everything = torch.ones_like(gates, dtype=torch.bool)
                full_run = measure(sys.executable, "hf_full", folder,
                                   {**base, "full": everything.tolist(), "bound_context": context}, tmp)
                for s in (0.5, 0.75):
                    full = select_full_heads(gates, s)
                    length = context - 1 + steps
                    bound = round((1 - s) * length + s * sum(size["window"])) - steps + 1
                    spec = {**base, "full": full.tolist(), "bound_context": bound}
                    ours = measure(sys.executable, "ours", folder, spec, tmp)
                    press = measure(args.kvpress, "kvpress", folder, spec, tmp)
                    bound_run = measure(sys.executable, "hf_bound", folder, spec, tmp)
                    mib = 2 ** 20
                    theory = theory_bytes(full, length, size["window"], batch, head_dim)
                    print(f"| {context} | {batch} | {s:g} | {ours['tokens_per_s']:.1f} | {press['tokens_per_s']:.1f} | "
                          f"{ours['tokens_per_s'] / press['tokens_per_s']:.2f} | {bound_run['tokens_per_s']:.1f} | "
                          f"{ours['tokens_per_s'] / bound_run['tokens_per_s']:.2f} | {ours['kv_bytes'] / mib:.2f} | "
                          f"{theory / mib:.2f} | {press['kv_bytes'] / mib:.2f} | {full_run['kv_bytes'] / mib:.2f} | "
                          f"{ours['peak_rss_mib']:.0f} / {press['peak_rss_mib']:.0f} / "
                          f"{full_run['peak_rss_mib']:.0f} |", flush=True)
        python = {"ours": sys.executable, "hf_full": sys.executable, "kvpress": args.kvpress}
        exact_match_rows(python, tmp, RETRIEVAL["quick" if args.quick else "full"],
                         64 if args.quick else args.n_eval, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One script, at most 8 minutes on one NVIDIA GPU, that runs what matters there and prints one markdown table.

recipes: every recipe at size=smoke in bf16-mixed (`framework.train` subprocesses); flagship:
tools/experiments/mask_agnostic.py --size gpu, steps capped; newton_schulz: sign(NS5(G)) in bf16 / fp32 vs float64;
kv_decode: tools/bench/kv_cache.py's decode on the device plus a cache-correctness check; fsdp2: char_lm under
trainer.strategy=fsdp2 on one device; draws: every kind of seeded draw in framework/ with a generator on the device
and on the CPU (mdlm_mask_agnostic's recipe check also needs its extra loss to have run); hf: transformers models
on the device (the mixed KV cache inside generate() against the hard-gated forward, a gated backward, a Mixtral
grown in place keeping its function), then the methods' recipes on tiny transformers configs at size=smoke in
bf16-mixed; images: the metrics CLI's timm feature extraction on the device (fp32 against the CPU's, bf16 autocast
against fp32) from a folder of PNG files, then `data=images model=timm` trained at size=smoke in bf16-mixed;
fine_tuning: the chunked loss against the whole logits' under bf16 autocast on the device, `peft=qlora` (a 4-bit
base from a saved folder, 3 steps of its adapters; refused by name on a CPU), and tools/bench/fine_tuning.py --quick
(ours against TRL at tiny shapes, bf16; its table in fine_tuning.md; not on a CPU). A failing check is a row with
ok = no and its last error line; exit 1 if any.

    python tools/gpu_check.py                            # on a lent GPU; the table also goes to runs/gpu_check/table.md
    python tools/gpu_check.py --device cpu --reduced     # the CPU-sized variant (about a minute on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tools" / "bench")]
import kv_cache as bench  # noqa: E402  (tools/bench/kv_cache.py: its model, window and table)

from framework.optim.newton_schulz import newton_schulz5  # noqa: E402
from framework.serving.kv_cache import MixedKVCache, kv_fraction, theoretical_speedup  # noqa: E402

CHECKS = ["recipes", "flagship", "newton_schulz", "kv_decode", "fsdp2", "draws", "hf", "images", "fine_tuning"]
REDUCED_RECIPES = ["char_lm", "data_agent_digits"]
#: a metric a recipe's results must hold: the part the check is for ran (the flagship's extra loss starts at step 2
#: of 4 at size=smoke, drawing on the step's generator on the device)
NEEDS = {"mdlm_mask_agnostic": "train/extra_loss"}
FLAGSHIP_STEPS = (2000, 300)  # of --size gpu's 6000 pretraining + 500 per arm: what fits next to the other checks
NS_SHAPES = [(384, 384), (768, 384), (1536, 384), (384, 1536)]  # tools/bench/optimizers.py's d=384 hidden matrices
NS_FLOOR = {torch.float32: 0.999, torch.bfloat16: 0.99}  # least sign agreement with float64 that passes
#: tiny transformers configs (built with from_config: nothing is downloaded)
HF_DIMS = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2}
HF_SHAPE = ", ".join(f"{k}: {v}" for k, v in HF_DIMS.items())  # as a command line's model.config={...}
HF_LLAMA = f"model.config={{model_type: llama, {HF_SHAPE}}}"
#: the methods on transformers models, each a `framework.train` command at size=smoke (--reduced: the first only),
#: with the metric that says the method's part ran (the probes' evaluation through the mixed cache, the growth
#: step, the mask-agnostic term, OLion's step: the loss)
HF_RECIPES = {
    "rlkv_probe_llama": (["recipe=rlkv_probe", "model=hf_causal_lm", HF_LLAMA], "val/acc_s0.5"),
    "olion_llama": (["recipe=char_lm", "model=hf_causal_lm", HF_LLAMA, "optimizer=olion"], "train/loss"),
    "mask_agnostic_bert": (["recipe=mdlm_mask_agnostic", "model=hf_masked_lm", "module.extra_loss_after=0",
                            f"model.config={{model_type: bert, {HF_SHAPE}}}"], "train/extra_loss"),
    "moe_growth_olmoe": (["recipe=moe_growth", "model=hf_causal_lm",
                          f"model.config={{model_type: olmoe, {HF_SHAPE}, num_experts: 4, num_experts_per_tok: 1}}"],
                         "growth/step"),
}


@dataclass
class Row:
    """One line of the table."""

    check: str
    setting: str
    result: str
    seconds: float
    ok: bool


@dataclass
class Plan:
    """What the command line asked for."""

    device: str
    reduced: bool
    out: Path
    timeout: float
    jobs: int
    flagship_steps: tuple[int, int] = FLAGSHIP_STEPS
    cuda: bool = True  # device == "cuda"

    def env(self) -> dict[str, str]:
        """Every subprocess's environment: offline, the cores shared by the jobs going at once."""
        threads = str(max(1, (os.cpu_count() or 1) // self.jobs))
        return {**os.environ, "OMP_NUM_THREADS": threads, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def last_error_line(text: str) -> str:
    """The last `error:` line, else the last line naming an Error/Exception, else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for pick in (lambda s: s.startswith("error:"), lambda s: "Error" in s or "Exception" in s, lambda s: True):
        found = [line for line in lines if pick(line)]
        if found:
            return found[-1]
    return "(no output)"


def run_cmd(cmd: list[str], plan: Plan, run_dir: Path) -> None:
    """Run one subprocess into a fresh `run_dir`, in its own process group (killed whole on timeout)."""
    shutil.rmtree(run_dir, ignore_errors=True)  # never read a previous run's results
    log = plan.out / "logs" / f"{run_dir.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(cmd, cwd=REPO, env=plan.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=plan.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output = proc.communicate()[0] + f"\nerror: timed out after {plan.timeout:.0f} s"
    log.write_text(output)
    if proc.returncode:
        raise RuntimeError(f"exit {proc.returncode}: {last_error_line(output)}")


def train_check(name: str, overrides: list[str], plan: Plan, marker: str = "", metric: str | None = None) -> str:
    """`python -m framework.train` at size=smoke, bf16-mixed, on the device; its results.json must be finite (and hold
    `metric`, where a recipe's check needs a part of it to have run)."""
    run_dir = plan.out / name
    accel = "gpu" if plan.cuda else "cpu"
    run_cmd([sys.executable, "-m", "framework.train", *overrides, "size=smoke", "trainer.precision=bf16-mixed",
             f"trainer.accelerator={accel}", "trainer.devices=1", f"hydra.run.dir={run_dir}"], plan, run_dir)
    results = json.loads((run_dir / "results.json").read_text())
    metrics = {k: v for k, v in {**results["metrics"], **results.get("initial_metrics", {})}.items()
               if isinstance(v, (int, float))}
    bad = [k for k, v in metrics.items() if not math.isfinite(v)]
    if not metrics or bad:
        raise RuntimeError(f"non-finite metrics: {bad}" if bad else "results.json holds no metrics")
    if metric and metric not in metrics:
        raise RuntimeError(f"results.json lacks {metric}: that part of the recipe did not run")
    log = (run_dir / "train.log").read_text()
    for needed in ["used: True"] * plan.cuda + [marker] * bool(marker):  # "GPU available: True (cuda), used: True"
        if needed not in log:
            raise RuntimeError(f"train.log lacks {needed!r}")
    shown = ", ".join(f"{k} {v:.4g}" for k, v in list(results["metrics"].items())[:2])
    return f"{results['global_step']} steps, {shown}, {results['seconds']} s train, all finite"


def check_flagship(plan: Plan) -> str:
    """The flagship experiment (mask_agnostic.py --size gpu); every accuracy and TV in summary.json finite."""
    out = plan.out / "flagship"
    if plan.cuda and not torch.cuda.is_available():  # its accelerator=auto would train on the CPU until the timeout
        raise RuntimeError("no CUDA device: --size gpu would run on the CPU")
    if plan.cuda:
        size = ["--pretrain-steps", str(plan.flagship_steps[0]), "--ft-steps", str(plan.flagship_steps[1])]
    else:  # its --smoke variant of the same plan (it forces accelerator=cpu)
        size = ["--smoke", *(["--arms", "mask_agnostic"] if plan.reduced else [])]
    script = "tools/experiments/mask_agnostic.py"
    run_cmd([sys.executable, script, "--size", "gpu", *size, "--out", str(out)], plan, out)
    data = json.loads((out / "summary.json").read_text())
    values = [x for sweep in data["sweeps"].values() for key in ("acc", "tv") for x in sweep[key]]
    if not values or not all(math.isfinite(x) for x in values):
        raise RuntimeError("non-finite or missing accuracy/TV in summary.json")
    if plan.cuda and not all("used: True" in log.read_text() for log in (out / "runs").rglob("train.log")):
        raise RuntimeError("a flagship run's train.log says the GPU was not used")
    acc = ", ".join(f"{name.split('/')[-1]} {sweep['acc'][0]:.3f}" for name, sweep in data["sweeps"].items())
    return f"acc at m=0: {acc}; {len(values)} acc/TV values finite; {data['minutes']} min; flagship/table.md"


def sync(device: str) -> None:
    """Wait for the device's queued work (timings on CUDA)."""
    if device == "cuda":
        torch.cuda.synchronize()


def check_newton_schulz(plan: Plan) -> str:
    """sign(NS5(G)) in bf16 and fp32 vs float64 on fixed random matrices: least agreement and ms per call."""
    shapes = [(m // 3, n // 3) for m, n in NS_SHAPES] if plan.reduced else NS_SHAPES
    reps = 1 if plan.reduced else 10
    agree: dict[torch.dtype, list[float]] = {torch.float32: [], torch.bfloat16: []}
    times: dict[torch.dtype, list[float]] = {torch.float32: [], torch.bfloat16: []}
    for i, shape in enumerate(shapes):
        g = torch.randn(shape, generator=torch.Generator().manual_seed(i), dtype=torch.float64).to(plan.device)
        ref = newton_schulz5(g, dtype=torch.float64).sign()
        for dtype in agree:
            agree[dtype].append((newton_schulz5(g, dtype=dtype).sign() == ref).double().mean().item())  # + warm-up
            sync(plan.device)
            start = time.perf_counter()
            for _ in range(reps):
                newton_schulz5(g, dtype=dtype)
            sync(plan.device)
            times[dtype].append((time.perf_counter() - start) / reps)
    low = {d: min(a) for d, a in agree.items()}
    cells = [f"{str(d)[6:]} agree {low[d]:.5f} (min), {1e3 * statistics.median(times[d]):.2f} ms/call" for d in agree]
    if any(low[d] < NS_FLOOR[d] for d in agree):
        raise RuntimeError("sign agreement below its floor: " + "; ".join(cells))
    return "; ".join(cells)


def decode_rate(model: torch.nn.Module, full: torch.Tensor, kv: list, length: int, steps: int) -> tuple[float, int]:
    """Tokens/s of `steps` one-token decode steps after `length` preloaded positions, and the KV bytes held."""
    cache = MixedKVCache(model, full, (bench.SINK, bench.RECENT), capacity=length + steps + 1)
    cache.preload(kv)
    token = torch.zeros(kv[0][0].shape[0], 1, dtype=torch.long, device=kv[0][0].device)
    with torch.no_grad():
        model(token, cache=cache)
        sync(token.device.type)
        start = time.perf_counter()
        for _ in range(steps):
            model(token, cache=cache)
        sync(token.device.type)
    return token.shape[0] * steps / (time.perf_counter() - start), cache.nbytes()


def cache_error(model: torch.nn.Module, full: torch.Tensor, device: str) -> float:
    """Max |logit| difference between decoding through the mixed cache and the gated masked forward."""
    seq = torch.randint(0, 256, (2, 112), generator=torch.Generator().manual_seed(0)).to(device)
    cache = MixedKVCache(model, full, (bench.SINK, bench.RECENT), capacity=seq.shape[1])
    with torch.no_grad():  # a 96-token prefill (longer than the 80-entry window), then 16 one-token steps
        parts = [model(seq[:, :96], cache=cache)] + [model(seq[:, t : t + 1], cache=cache) for t in range(96, 112)]
        ref = model(seq, gates=full.float().to(device), window=(bench.SINK, bench.RECENT))
    return (torch.cat(parts, dim=1) - ref).abs().max().item()


def check_kv_decode(plan: Plan) -> str:
    """The KV decode bench on the device (full vs mixed caches, kv_decode.md); the mixed cache's logits right."""
    from framework.models.transformer import TransformerLM
    from framework.probes.allocation import select_full_heads

    lengths, batches, steps, repeats = ([128, 512], [1], 4, 1) if plan.reduced else \
        (([4096, 16384, 65536], [1, 8], 64, 3) if plan.cuda else ([1024, 4096], [1, 4], 8, 3))
    torch.manual_seed(0)
    model = TransformerLM(**bench.MODEL, max_seq_len=max(lengths) + steps + 8).eval().to(plan.device)
    window, depth, kv_heads = bench.SINK + bench.RECENT, bench.MODEL["depth"], bench.MODEL["kv_heads"]
    scores = torch.rand(depth, kv_heads, generator=torch.Generator().manual_seed(1))
    alloc = {s: select_full_heads(scores, s) for s in (0.0, 0.5, 0.75)}
    error, rows = cache_error(model, alloc[0.5], plan.device), []
    for batch in batches:
        for length in lengths:
            shape = (batch, kv_heads, length, bench.MODEL["dim"] // bench.MODEL["heads"])
            kv = [(torch.randn(shape, device=plan.device), torch.randn(shape, device=plan.device))
                  for _ in range(depth)]
            runs = {s: [decode_rate(model, full, kv, length, steps) for _ in range(repeats)]
                    for s, full in alloc.items()}
            rate = {s: statistics.median(r for r, _ in got) for s, got in runs.items()}
            rows += [dict(batch=batch, length=length, sparsity=s, tokens_per_s=rate[s], kv_bytes=got[0][1],
                          kv_ratio=got[0][1] / runs[0.0][0][1], speedup=rate[s] / rate[0.0],
                          theory=theoretical_speedup(s, length, window),
                          kv_theory=kv_fraction(s, length + steps + 1, window)) for s, got in runs.items()]
    (plan.out / "kv_decode.md").write_text(bench.table(rows, steps) + f"\n\ndevice: {plan.device}\n")
    if error > 1e-3 or not all(math.isfinite(r["tokens_per_s"]) and r["tokens_per_s"] > 0 for r in rows):
        raise RuntimeError(f"mixed cache logits off by {error:.2e} (limit 1e-3) or a non-finite rate")
    last = [r for r in rows if r["length"] == lengths[-1] and r["batch"] == batches[-1]]
    speed = ", ".join(f"s={r['sparsity']:g} {r['tokens_per_s']:.0f} tok/s ({r['speedup']:.2f}x)" for r in last)
    return f"L={lengths[-1]} b={batches[-1]}: {speed}; cache vs masked forward max |dlogit| {error:.1e}"


def check_draws(plan: Plan) -> str:
    """Every kind of draw that takes a generator (framework/rng.py), driven by a generator on the device and by a CPU
    one, on the device's tensors: each runs and leaves its result on the tensors' device."""
    from framework.diffusion.sampling import gumbel_norm
    from framework.grow.ops import noisy_copy
    from framework.losses.mask_agnostic import MaskAgnosticLoss
    from framework.losses.mdlm import mask_tokens, stratified_times
    from framework.samplers.policies import gumbel_top_k
    from framework.serving.decoding import _pick

    dev = torch.device(plan.device)
    tokens, logits = torch.randint(0, 9, (4, 16), device=dev), torch.randn(4, 32, device=dev)
    loss = MaskAgnosticLoss(mask_id=10, pad_id=11, k_max=8, k_sampling="per_example", partial_target_prob=0.5)
    draws = {
        "mask_tokens": lambda g: mask_tokens(tokens, 0.5, 10, g),
        "stratified_times": lambda g: stratified_times(4, generator=g, device=dev),
        "mask_agnostic.sample_k2": lambda g: loss.sample_k2(4, g, dev),
        "mask_agnostic.reveal": lambda g: loss._reveal(tokens, g),
        "gumbel_norm": lambda g: gumbel_norm((4, 16), g, dev),
        "kv_cache.pick": lambda g: _pick(logits, 1.0, g),
        "noisy_copy": lambda g: noisy_copy(logits, 0.1, g),
        "gumbel_top_k": lambda g: gumbel_top_k(logits[0], 5, 1.0, g),
    }
    for where in sorted({"cpu", dev.type}):
        for name, draw in draws.items():
            out = draw(torch.Generator(device=where).manual_seed(0))
            if out.device.type != dev.type:
                raise RuntimeError(f"{name} with a {where} generator left its result on {out.device}, not {dev}")
    return f"{len(draws)} draws x generator on {' and '.join(sorted({'cpu', dev.type}))}: results on {dev}"


def check_hf(plan: Plan) -> str:
    """transformers models on the device: the mixed KV cache (a prompt in three chunks, then one-token steps) against
    the hard-gated forward without a cache, with its bytes; a left-padded row against itself alone; generate(); a
    gated backward; a Mixtral grown in depth (zero-initialised copies) and width (noise drawn on the CPU) in place,
    keeping its function."""
    from framework.grow.hf import grow_hf
    from framework.models.hf import HFCausalLM, cache_argument
    from framework.serving.hf_attention import cache_nbytes

    dev, window = torch.device(plan.device), (1, 4)
    torch.manual_seed(0)
    model = HFCausalLM(config={"model_type": "llama", **HF_DIMS}, vocab_size=96).eval().to(dev)
    full = torch.tensor([[True, False], [False, True]])
    seq = torch.randint(3, 96, (2, 56), generator=torch.Generator().manual_seed(0)).to(dev)
    cache = model.mixed_cache(full, window, capacity=56)
    for layer in cache.layers:
        layer.kv.prefill_chunk = 16  # the 40-token prompt in three chunks
    with torch.no_grad():
        parts = [model(seq[:, :40], cache=cache)] + [model(seq[:, t : t + 1], cache=cache) for t in range(40, 56)]
        reference = model(seq, gates=full.float().to(dev), window=window)
    error = (torch.cat(parts, dim=1) - reference).abs().max().item()
    held, theory = cache_nbytes(cache), (2 * 56 + 2 * sum(window)) * 2 * 2 * 16 * 4  # fp32 K and V, batch 2
    with torch.no_grad():  # a left-padded batch: the 25-token row as it is alone
        padded, mask = seq[:, :40].clone(), torch.ones(2, 40, dtype=torch.bool, device=dev)
        padded[1, :15], mask[1, :15] = 0, False
        batch_cache, alone_cache = model.mixed_cache(full, window), model.mixed_cache(full, window)
        both = model(padded, key_padding_mask=mask, cache=batch_cache)[1, 15:]
        alone = model(seq[1:, 15:40], cache=alone_cache)[0]
    pad_error = (both - alone).abs().max().item()
    generate_cache = model.mixed_cache(full, window, capacity=48)
    with torch.no_grad():
        out = model.hf.generate(seq[:, :40], max_new_tokens=8, min_new_tokens=8, do_sample=False,
                                **{cache_argument(model.hf): generate_cache})
    gates = torch.full((2, 2), 0.5, device=dev, requires_grad=True)
    model(seq[:, :24], gates=gates, window=window).logsumexp(-1).mean().backward()
    torch.manual_seed(0)
    moe = HFCausalLM(config={"model_type": "mixtral", **HF_DIMS, "num_local_experts": 4, "num_experts_per_tok": 2},
                     vocab_size=96).eval().to(dev)
    with torch.no_grad():
        before = moe(seq[:, :24])
        grow_hf(moe, depth_factor=2, zero_init_copies=True)
        deep = moe(seq[:, :24])
        grow_hf(moe, width_factor=2, noise_alpha=0.0)  # exact copies, top-k doubled: the same function
        wide = moe(seq[:, :24])
        grow_hf(moe, width_factor=2, noise_alpha=0.01, seed=1)  # noisy copies: runs, on the device, finite
        noisy = moe(seq[:, :24])
    growth_error = max((deep - before).abs().max().item(), (wide - before).abs().max().item())
    on_device = {p.device.type for p in moe.parameters()} == {dev.type}
    problems = [f"mixed cache off by {error:.1e} (limit 1e-3)"] * (error > 1e-3)
    problems += [f"a left-padded row off by {pad_error:.1e} from itself alone (limit 1e-3)"] * (pad_error > 1e-3)
    problems += [f"cache holds {held} bytes, theory {theory}"] * (held != theory)
    problems += [f"generate gave {tuple(out.shape)} on {out.device}"] * (out.shape != (2, 48) or out.device != dev)
    problems += ["a gate got no gradient"] * (gates.grad is None or not bool((gates.grad != 0).all()))
    problems += [f"growth changed the logits by {growth_error:.1e} (limit 1e-4)"] * (growth_error > 1e-4)
    problems += ["grown parameters off the device or non-finite logits"] * (
        not on_device or not bool(noisy.isfinite().all()))
    if problems:
        raise RuntimeError("; ".join(problems))
    return (f"cache vs hard-gated forward max |dlogit| {error:.1e}, {held} bytes = theory; left-padded row vs "
            f"alone {pad_error:.1e}; generate 8 tokens; "
            f"gates' grads; Mixtral 2->4 layers, 4->16 experts: logits within {growth_error:.1e}")


def digit_pngs(folder: Path, n: int = 60, size: int = 32) -> Path:
    """scikit-learn's first `n` digits as `size`-pixel PNG files in `folder/<digit>/` (an ImageFolder tree)."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    for i in range(n):
        sub = folder / str(digits.target[i])
        sub.mkdir(parents=True, exist_ok=True)
        pixels = (digits.images[i] * 16).clip(0, 255).astype(np.uint8)
        Image.fromarray(pixels).resize((size, size)).save(sub / f"{i:04d}.png")
    return folder


def check_images(plan: Plan) -> str:
    """The metrics CLI's extraction (`framework.metrics.image_features.ImageFeatures`, decoding in a worker) on the
    device: a timm model at its random initialisation (nothing downloaded) gives the CPU's features in fp32, and close
    ones under bf16 autocast."""
    import numpy as np
    import timm

    from framework.metrics import image_features as F

    folder = digit_pngs(plan.out / "images" / "digits")
    torch.manual_seed(0)
    net = timm.create_model("resnet10t", pretrained=False, num_classes=0).eval()
    cfg = timm.data.resolve_model_data_config(net)
    transform = timm.data.create_transform(**cfg, is_training=False)
    extractor = F.Extractor("resnet10t", "local/resnet10t-random-init", "none")

    def features(device: str, bf16: bool) -> np.ndarray:
        extract = F.ImageFeatures(extractor, device=device, bf16=bf16, batch_size=16, workers=1, progress=False)
        extract._built = (net.to(device), transform, tuple(cfg["input_size"]))  # the model, as model() builds it
        return extract.extract(F.folder_images(folder)).features

    cpu, dev, half = features("cpu", False), features(plan.device, False), features(plan.device, True)

    def cosine(a: np.ndarray, b: np.ndarray) -> float:
        return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())

    fp32, bf16 = cosine(cpu, dev), cosine(dev, half)
    if cpu.shape != dev.shape or fp32 < 0.999 or bf16 < 0.98:
        raise RuntimeError(f"features {dev.shape} on {plan.device} vs {cpu.shape} on cpu: min cosine fp32 {fp32:.5f} "
                           f"(floor 0.999), bf16 {bf16:.4f} (floor 0.98)")
    return (f"{len(cpu)} PNGs, {cpu.shape[1]}-dim features on {plan.device}: min cosine vs cpu {fp32:.5f}, "
            f"bf16 {bf16:.4f}")


def check_fine_tuning(plan: Plan) -> str:
    """The chunked loss and its gradients against the whole logits' under bf16 autocast; QLoRA's adapters training
    on a 4-bit base (CUDA), or its refusal naming the reason (CPU); the fine-tuning bench at its quick size (CUDA)."""
    from framework.models.hf import HFCausalLM
    from framework.models.peft_adapters import QLoRA, attach
    from framework.modules.causal_lm import CausalLM

    dev = torch.device(plan.device)
    torch.manual_seed(0)
    model = HFCausalLM(config={"model_type": "llama", **HF_DIMS}, vocab_size=512).to(dev)
    ids = torch.randint(3, 512, (2, 64), generator=torch.Generator().manual_seed(0)).to(dev)
    batch = {"input_ids": ids, "labels": torch.where(torch.arange(64, device=dev) < 20, -100, ids)}
    grads = []
    for chunked in (True, False):
        model.zero_grad()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = CausalLM(model, chunked_loss=chunked).loss(batch)
        loss.backward()
        grads.append((loss.detach().float(), torch.cat([p.grad.float().flatten() for p in model.parameters()])))
    loss_gap = (grads[0][0] - grads[1][0]).abs().item()
    grad_gap = ((grads[0][1] - grads[1][1]).norm() / grads[1][1].norm()).item()
    if loss_gap > 1e-2 or grad_gap > 2e-2:
        raise RuntimeError(f"chunked loss off the whole logits' by {loss_gap:.1e} (grads {grad_gap:.1e} relative)")
    done = f"chunked vs whole loss {loss_gap:.1e}, grads {grad_gap:.1e} relative (bf16)"
    if not plan.cuda:
        try:
            QLoRA()
        except ValueError as err:
            return f"{done}; peft=qlora refused: {str(err)[:60]}..."
        raise RuntimeError("peft=qlora was not refused without CUDA")
    folder = plan.out / "qlora_base"
    model.cpu().hf.save_pretrained(str(folder))
    spec = QLoRA(r=8, alpha=16.0, dropout=0.0)
    base = HFCausalLM(name_or_path=str(folder), quantization=spec.quantization())
    attach(base, spec)
    module = CausalLM(base)
    opt = torch.optim.AdamW([p for _, p in module.optimized_parameters()], lr=1e-2)
    start = {n: p.detach().clone() for n, p in module.optimized_parameters()}
    losses = []
    for _ in range(3):
        loss = module.loss(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    moved = sum(not torch.equal(p, start[n]) for n, p in module.optimized_parameters())
    if not all(math.isfinite(v) for v in losses) or not moved or not getattr(base.hf, "is_loaded_in_4bit", False):
        raise RuntimeError(f"qlora: losses {losses}, {moved} adapters moved, 4-bit base: "
                           f"{getattr(base.hf, 'is_loaded_in_4bit', False)}")
    run_dir = plan.out / "fine_tuning_bench"
    run_cmd([sys.executable, "tools/bench/fine_tuning.py", "--quick"], plan, run_dir)
    log = (plan.out / "logs" / f"{run_dir.name}.log").read_text()
    (plan.out / "fine_tuning.md").write_text(log)
    return f"{done}; qlora: 4-bit base, losses {', '.join(f'{v:.3f}' for v in losses)}, {moved} adapters moved; " \
        "bench --quick ran (fine_tuning.md)"


def guarded(check: str, setting: str, fn: Callable[[], str]) -> Row:
    """Run one check; any failure becomes a row with ok = no and its last error line."""
    start = time.perf_counter()
    try:
        result, ok = fn(), True
    except Exception as exc:  # noqa: BLE001 - every failure is a row, never a crash
        result, ok = last_error_line(f"{type(exc).__name__}: {exc}"), False
    row = Row(check, setting, result.replace("|", "\\|"), time.perf_counter() - start, ok)
    print(f"[gpu_check] {check}: {'ok' if ok else 'FAILED'} in {row.seconds:.1f} s - {row.result}", file=sys.stderr)
    return row


def settings(plan: Plan) -> dict[str, str]:
    """The setting column of each kind of check, saying where a CPU run differs from the GPU one."""
    dev = f"accelerator={'gpu' if plan.cuda else 'cpu'}, devices=1, bf16-mixed"
    pre, ft = plan.flagship_steps
    arms = "4 steps of the mask_agnostic arm only" if plan.reduced else "2 arms x 4 steps"
    return {
        "recipes": f"size=smoke, {dev}",
        "flagship": (f"--size gpu, pretrain {pre} + 2 arms x {ft} steps (capped from 6000 + 2 x 500), bf16-mixed"
                     if plan.cuda else f"--size gpu --smoke: the same plan at smoke size, 6 + {arms}, {dev}"),
        "newton_schulz": f"{'d=128' if plan.reduced else 'd=384'} hidden-matrix shapes, bf16/fp32 vs float64, floors "
                         f"{NS_FLOOR[torch.bfloat16]}/{NS_FLOOR[torch.float32]}, fp32 matmul "
                         f"{torch.get_float32_matmul_precision()}, {plan.device}" + ("" if plan.cuda else ", 1 thread"),
        "kv_decode": f"tools/bench/kv_cache.py's model, fp32, {plan.device}" + ("" if plan.cuda else ", 1 thread")
                     + (" (reduced: L 128/512, batch 1, 4 steps)" if plan.reduced else "") + "; table kv_decode.md",
        "draws": f"every kind of seeded draw in framework/, generators on cpu and {plan.device}",
        "hf": f"tiny transformers configs, fp32, {plan.device}; recipes at size=smoke, {dev}",
        "images": f"resnet10t (random init), 60 digit PNGs, fp32 vs cpu, bf16 autocast, {plan.device}; "
                  f"data=images model=timm at size=smoke, {dev}",
        "fine_tuning": f"tiny Llama, bf16 autocast, {plan.device}; " + (
            "peft=qlora r 8 on a 4-bit base, 3 steps; tools/bench/fine_tuning.py --quick" if plan.cuda else
            "peft=qlora's refusal on a CPU"),
        "fsdp2": "char_lm smoke, strategy=fsdp2, bf16-mixed, " + (
            "1 GPU, nccl" if plan.cuda else "1 CPU rank over gloo (the CPU stand-in for 1 GPU over NCCL)"),
    }


def recipe_names(args: argparse.Namespace) -> list[str]:
    """--recipes, else the reduced pair, else every registered recipe."""
    if args.recipes or args.reduced:
        return list(args.recipes or REDUCED_RECIPES)
    from framework.registry import RECIPES, load_catalog

    load_catalog()
    return RECIPES.names("*")


def run_all(plan: Plan, args: argparse.Namespace) -> list[Row]:
    """The timing checks alone first, then the subprocess checks `plan.jobs` at a time; rows in CHECKS order."""
    text, rows = settings(plan), {name: [] for name in CHECKS}
    if not plan.cuda:
        torch.set_num_threads(1)  # as tools/bench does: spinning threads on busy cores swamp these timings
    for name, fn in (("newton_schulz", check_newton_schulz), ("kv_decode", check_kv_decode), ("draws", check_draws),
                     ("hf", check_hf), ("images", check_images), ("fine_tuning", check_fine_tuning)):
        if name in args.checks:
            rows[name].append(guarded(name, text[name], lambda fn=fn: fn(plan)))
    if plan.cuda and torch.cuda.is_available():
        torch.cuda.empty_cache()  # leave the GPU's memory to the subprocesses
    jobs: list[tuple[str, str, Callable[[], str]]] = []
    if "flagship" in args.checks:  # the longest first: the others share the remaining workers meanwhile
        jobs.append(("flagship", "flagship", lambda: check_flagship(plan)))
    if "recipes" in args.checks:
        names = guarded("recipes", text["recipes"], lambda: " ".join(recipe_names(args)))
        if not names.ok:
            rows["recipes"].append(names)
        jobs += [("recipes", f"recipes/{n}", lambda n=n: train_check(n, [f"recipe={n}"], plan, metric=NEEDS.get(n)))
                 for n in (names.result.split() if names.ok else [])]
    if "fsdp2" in args.checks:
        backend = f"distributed_backend={'nccl' if plan.cuda else 'gloo'}"
        jobs.append(("fsdp2", "fsdp2", lambda: train_check(
            "fsdp2", ["recipe=char_lm", "trainer.strategy=fsdp2"], plan, backend) + f", {backend}"))
    if "hf" in args.checks:
        hf = list(HF_RECIPES.items())[: 1 if plan.reduced else None]
        jobs += [("hf", f"hf/{n}", lambda n=n, o=o, m=m: train_check(n, o, plan, metric=m)) for n, (o, m) in hf]
    if "images" in args.checks:
        tree = plan.out / "images" / "digits"
        jobs.append(("images", "images/timm_on_images", lambda: train_check("timm_on_images", [
            "recipe=selection_compare", "sampler=full", "data=images", f"data.source={digit_pngs(tree)}",
            "data.image_size=32", "model=timm", "model.name=resnet10t"], plan, metric="val/acc")))
    with ThreadPoolExecutor(max_workers=plan.jobs) as pool:
        futures = [(kind, pool.submit(guarded, check, text[kind], fn)) for kind, check, fn in jobs]
        for kind, future in futures:
            rows[kind].append(future.result())
    return [row for name in CHECKS for row in rows[name]]


def header(plan: Plan) -> str:
    """One line above the table: the command, device, torch, commit and date."""
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return (f"`python tools/gpu_check.py {' '.join(sys.argv[1:])}` on {gpu if plan.cuda else 'CPU'} "
            f"({os.cpu_count()} cores), torch {torch.__version__}, commit {commit.stdout.strip() or '?'}, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def table(rows: list[Row]) -> str:
    """The markdown table, one row per check."""
    lines = ["| check | setting | result | seconds | ok |", "|---|---|---|---|---|"]
    lines += [f"| {r.check} | {r.setting} | {r.result} | {r.seconds:.3g} | {'yes' if r.ok else 'no'} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run the checks, print and write the table; 1 when any row failed."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--reduced", action="store_true", help="the tiny CPU-sized variant: 2 recipes, smallest sizes")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "gpu_check")
    ap.add_argument("--timeout", type=float, default=420.0, help="seconds per subprocess before it is killed")
    ap.add_argument("--jobs", type=int, help="subprocess checks at a time (default: 4 on cuda, 2 on cpu)")
    ap.add_argument("--checks", nargs="+", choices=CHECKS, default=CHECKS, help="a subset, e.g. to rerun one")
    ap.add_argument("--recipes", nargs="+", help=f"default: all (--reduced: {' '.join(REDUCED_RECIPES)})")
    ap.add_argument("--flagship-steps", type=int, nargs=2, default=list(FLAGSHIP_STEPS), metavar=("PRETRAIN", "FT"))
    args = ap.parse_args(argv)
    cuda = args.device == "cuda"
    plan = Plan(args.device, args.reduced, args.out.resolve(), args.timeout, args.jobs or (4 if cuda else 2),
                tuple(args.flagship_steps), cuda)
    plan.out.mkdir(parents=True, exist_ok=True)
    rows = run_all(plan, args)
    text = header(plan) + "\n\n" + table(rows) + "\n"
    print(text)
    (plan.out / "table.md").write_text(text)
    return 0 if rows and all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

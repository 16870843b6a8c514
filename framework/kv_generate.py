"""`python -m framework.kv_generate MODEL --sparsity S --prompt TEXT`: greedy decoding of a transformers causal LM with
RLKV's mixed KV cache, inside transformers' own `generate()`.

MODEL is a Hub id or a folder of a transformers causal LM (what `framework.train` pushes for `model=hf_causal_lm`, or
any Llama / Qwen / Mistral / Mixtral checkpoint). The allocation comes from `--pattern` (a probe run dir, a
`head_allocation.json`, a DuoAttention or RLKV pattern folder, or a Hub repo holding `head_allocation.json`), by
default from MODEL's own repo (a probe run pushed with its model). At sparsity s the allocation's top (1 − s) of the
KV heads keep every position; the others keep the window: `--window SINK RECENT`, else the allocation's. The prompt
is `--prompt TEXT` (through the model's tokenizer) or `--ids "3 17 ..."` (token ids, for a model without one).
`--chat` sends `--prompt` as one user turn through the tokenizer's chat template, with the assistant's turn opened
(`add_generation_prompt=True`), as a chat / instruct model expects; without it the text goes in as it is.
It decodes on `--device` (default `auto`: the GPU where there is one, else the CPU) in `--dtype` (default float32;
bfloat16 or float16 halve the cache). Prints the new tokens (and their text), and the bytes the cache holds beside
the full cache's (every KV head keeping every position, keys and values each at their own head dim), and beside
transformers' own cache where that holds something else (an MLA model's compressed latents).

    python -m framework.kv_generate your-name/chase-llama-rlkv --sparsity 0.5 --ids "2 7 21 9 30" -n 9
    python -m framework.kv_generate your-name/smollm2-kv --sparsity 0.5 --prompt "What colour is the sky?" --chat

Exit codes: 0 done; 2 refused input (an allocation of another shape than the model's layers × KV heads, a sparsity
outside [0, 1], a window not shorter than the context, a prompt + new tokens past the model config's
max_position_embeddings, a model outside transformers' attention interface, an unknown model or pattern, a device
this machine does not have, `--chat` with `--ids` or on a tokenizer without a chat template); 1 the Hub failed.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import torch

from framework.devices import pick_device
from framework.errors import run_cli
from framework.models.hf import DTYPES


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m framework.kv_generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="Hub id or folder of a transformers causal LM")
    parser.add_argument("--pattern", default=None, help="the head allocation (default: the model's own repo)")
    parser.add_argument("--sparsity", type=float, default=None, help="fraction of KV heads compressed "
                        "(default: the allocation's)")
    parser.add_argument("--window", type=int, nargs=2, metavar=("SINK", "RECENT"), default=None)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", help="text, through the model's tokenizer")
    what.add_argument("--ids", help="space-separated token ids")
    parser.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template to --prompt (one "
                        "user turn, the assistant's turn opened)")
    parser.add_argument("-n", "--max-new-tokens", type=int, default=32)
    parser.add_argument("--revision", default=None)
    parser.add_argument("--device", default="auto", help="auto (the GPU where there is one, else the CPU), cpu, "
                        "cuda, cuda:N, ...")
    parser.add_argument("--dtype", default="float32", choices=list(DTYPES))
    return parser.parse_args(argv)


def check_context(window: tuple[int, int], context: int) -> None:
    """ValueError unless sink + recent is shorter than the `context` (prompt + new tokens)."""
    sink, recent = window
    if sink + recent >= context:
        raise ValueError(f"window sink={sink} + recent={recent} = {sink + recent} is not shorter than the context of "
                         f"{context} tokens (prompt + new tokens): the compressed heads would keep every position; "
                         "give a shorter --window or a longer context")


def check_positions(prompt: int, new: int, limit: int | None) -> None:
    """ValueError when the prompt and the new tokens need more positions than the model config's
    `max_position_embeddings` (`limit`; None: no limit). Past it an absolute position embedding fails in an index
    out of range (a device-side assert on a GPU) and rotary positions leave the range the model was trained on."""
    if limit is not None and prompt + new > limit:
        raise ValueError(f"the prompt's {prompt} tokens + {new} new tokens = {prompt + new} positions, more than the "
                         f"model config's max_position_embeddings={limit}: shorten the prompt or -n")


def prompt_ids(args: argparse.Namespace, tokenizer: Any | None) -> list[int]:
    """The token ids decoding starts from: `--ids` as given, or `--prompt` through `tokenizer` (with `--chat`: the
    chat template's rendering of one user turn with the generation prompt; the rendering holds the template's own
    special tokens, so the tokenizer adds none)."""
    if args.prompt is None:
        try:
            return [int(x) for x in args.ids.split()]
        except ValueError:
            raise ValueError(f"--ids {args.ids!r} must be space-separated integers") from None
    if tokenizer is None:
        raise ValueError(f"{args.model} has no tokenizer: give the prompt as token ids (--ids \"3 17 ...\")")
    text = args.prompt
    if args.chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"--chat: the tokenizer of {args.model} has no chat template (a base model's, not a chat "
                             "/ instruct model's): drop --chat to send the prompt as plain text, or use a chat model")
        text = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}], tokenize=False,
                                             add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def full_cache_nbytes(cache: Any) -> int:
    """Bytes the standard cache holds for the positions `cache` (a mixed KV cache) has seen: every KV head keeps every
    position (on a sliding layer the window - 1 a later query reaches), the keys and the values each at their own
    head dim and dtype, read from the buffers the attention handed the mixed cache (an MLA model's keys are qk_nope +
    qk_rope wide, its values v_head_dim)."""
    total = 0
    for layer in cache.layers:
        kv = layer.kv
        k = kv.k_full if kv.k_full is not None else kv.k_stream
        v = kv.v_full if kv.v_full is not None else kv.v_stream
        if k is not None:
            per_head = k.shape[3] * k.element_size() + v.shape[3] * v.element_size()
            positions = min(kv.length, kv.sliding - 1) if kv.sliding else kv.length
            total += k.shape[0] * (kv.n_full + kv.n_stream) * positions * per_head
    return total


def own_cache_nbytes(hf: torch.nn.Module, token: torch.Tensor) -> list[tuple[int, float]]:
    """transformers' own `DynamicCache` of `hf`, measured on one token: per layer (bytes a position, positions kept:
    infinite, or a sliding layer's window − 1). An MLA model (DeepSeek-V2/V3) caches its compressed latents there."""
    from transformers import DynamicCache

    from framework.models.hf import cache_argument

    own = DynamicCache(config=hf.config)
    with torch.no_grad():
        hf(input_ids=token, use_cache=True, **{cache_argument(hf): own})
    per_layer = []
    for layer in own.layers:
        tensors = (getattr(layer, name, None) for name in ("keys", "values"))
        keep = layer.sliding_window - 1 if getattr(layer, "is_sliding", False) else float("inf")
        per_layer.append((sum(x.nbytes for x in tensors if isinstance(x, torch.Tensor)), keep))
    return per_layer


def run(args: argparse.Namespace) -> dict[str, Any]:
    from framework.models.hf import HFCausalLM
    from framework.probes.allocation import HeadAllocation
    from framework.serving.hf_attention import cache_nbytes

    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens={args.max_new_tokens} must be >= 1")
    if args.chat and args.prompt is None:
        raise ValueError(f"--chat applies the chat template to --prompt TEXT, but the prompt came as --ids "
                         f"{args.ids!r}, already tokens: give the text as --prompt, or drop --chat")
    device = pick_device(args.device)
    model = HFCausalLM(name_or_path=args.model, revision=args.revision, dtype=args.dtype,
                       attn_implementation=None).eval().to(device)
    model.gate_shape  # noqa: B018 - refuses a model outside the attention interface, by name
    alloc = HeadAllocation.from_pretrained(args.pattern or args.model, None if args.pattern else args.revision)
    alloc.check_model(model)
    sparsity = alloc.sparsity if args.sparsity is None else args.sparsity
    full = alloc.full_heads(sparsity)  # ValueError outside [0, 1]
    window = tuple(args.window) if args.window else alloc.window
    tokenizer = model.tokenizer_for(name_or_path=args.model, revision=args.revision)
    ids = prompt_ids(args, tokenizer)
    if not ids or max(ids) >= model.vocab_size or min(ids) < 0:
        raise ValueError(f"the prompt's token ids {ids[:8]}... must be non-empty and lie in 0..{model.vocab_size - 1}")
    context = len(ids) + args.max_new_tokens
    check_positions(len(ids), args.max_new_tokens, model.max_seq_len)
    check_context(window, context)
    prompt = torch.tensor([ids], device=device)
    own_layers = own_cache_nbytes(model.hf, prompt[:, :1])
    cache = model.mixed_cache(full, window, capacity=context)
    with torch.no_grad():
        out = model.hf.generate(prompt, max_new_tokens=args.max_new_tokens, do_sample=False, cache=cache,
                                pad_token_id=model.hf.config.eos_token_id)
    new = out[0, len(ids):].tolist()
    held = cache_nbytes(cache)
    full_bytes = full_cache_nbytes(cache)
    own = sum(min(cache.get_seq_length(), keep) * nbytes for nbytes, keep in own_layers)
    print(f"tokens: {new}")
    if tokenizer is not None:
        print(f"text: {tokenizer.decode(new)!r}")
    print(f"kv cache: {held:,} bytes held for {cache.get_seq_length()} positions, the full cache {full_bytes:,} "
          f"({held / full_bytes:.3f} of it); {int(full.sum())} of {full.numel()} KV heads full at s={sparsity:g}, "
          f"window {window}, {args.dtype} on {device}")
    if own != full_bytes:  # an MLA model caches its compressed latents, not the per-head keys and values
        print(f"transformers' own cache holds {own:,} bytes for these positions (the mixed cache {held / own:.3f} "
              "times that): it caches other tensors than per-head keys and values (an MLA model's latents)")
    return {"prompt": ids, "tokens": new, "bytes": held, "full_bytes": full_bytes, "own_bytes": own,
            "device": str(device)}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return run_cli(lambda: run(args))


if __name__ == "__main__":
    raise SystemExit(main())

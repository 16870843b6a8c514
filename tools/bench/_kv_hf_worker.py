"""One decode measurement for `kv_cache_hf.py`, in a fresh process (so its peak memory is its own). It runs in the
project's environment (`ours`, `hf_full`, `hf_bound`) or in kvpress's (`kvpress`), and imports the framework only
for `ours`: kvpress's environment holds an older transformers.

    python tools/bench/_kv_hf_worker.py MODE MODEL_DIR SPEC_JSON

SPEC_JSON: {"context", "batch", "steps", "threads", "full": [[bool]] (layers x KV heads), "sink", "recent",
"bound_context", "seed", "prompts": optional [[ids]] to decode greedily instead of random ones, "prefill": ours'
prefill policy, default "full"}. Prints one JSON line:
decode tokens/s (the timed loop only: `steps` one-token steps after the prompt), the KV bytes the cache holds at the
end, the process's peak RSS, and the generated tokens.
"""

from __future__ import annotations

import json
import resource
import sys
import time

import torch


def kv_bytes_dynamic(cache) -> int:
    total = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def main() -> None:
    mode, folder, spec_path = sys.argv[1:4]
    spec = json.loads(open(spec_path).read())
    torch.set_num_threads(int(spec["threads"]))
    from transformers import AutoModelForCausalLM, DynamicCache

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()
    vocab = model.config.vocab_size
    if spec.get("prompts"):
        prompt = torch.tensor(spec["prompts"])
    else:
        g = torch.Generator().manual_seed(int(spec["seed"]))
        length = int(spec["bound_context"] if mode == "hf_bound" else spec["context"])
        prompt = torch.randint(0, vocab, (int(spec["batch"]), length), generator=g)
    full = torch.tensor(spec["full"], dtype=torch.bool)
    window = (int(spec["sink"]), int(spec["recent"]))
    steps = int(spec["steps"])
    with torch.no_grad():
        if mode == "ours":
            from framework.models.hf import cache_argument
            from framework.serving.hf_attention import cache_nbytes, mixed_kv_cache

            cache = mixed_kv_cache(model, full, window, capacity=prompt.shape[1] + steps,
                                   prefill=spec.get("prefill", "full"))
            key = cache_argument(model)
            model(input_ids=prompt[:, :-1], **{key: cache}, use_cache=True)

            def step(ids):
                return model(input_ids=ids, **{key: cache}, use_cache=True).logits[:, -1]

            def held():
                return cache_nbytes(cache)
        else:
            cache = DynamicCache()
            if mode == "kvpress":
                from kvpress import DuoAttentionPress

                class GivenPattern(DuoAttentionPress):
                    def post_init_from_model(self, model):  # its own loader downloads; ours is handed over
                        pass

                press = GivenPattern(head_compression_ratio=float((~full).float().mean()))
                press.sink_size, press.recent_size = window
                press.streaming_mask = ~full  # the same heads as ours, handed over as its pattern
                with press(model):
                    model.model(input_ids=prompt[:, :-1], past_key_values=cache)
            else:
                model.model(input_ids=prompt[:, :-1], past_key_values=cache)

            def step(ids):
                return model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1]

            def held():
                return kv_bytes_dynamic(cache)
        token = prompt[:, -1:]
        out = []
        begin = time.perf_counter()
        for _ in range(steps):
            token = step(token).argmax(-1, keepdim=True)
            out.append(token)
        seconds = time.perf_counter() - begin
    tokens = torch.cat(out, dim=1)
    print(json.dumps({"mode": mode, "tokens_per_s": prompt.shape[0] * steps / seconds, "kv_bytes": held(),
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "tokens": tokens.tolist()}))


if __name__ == "__main__":
    main()

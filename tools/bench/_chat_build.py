"""(e) of tools/bench/data.py: building a chat data set for training, ours against TRL's SFTTrainer, in one process.

Ours: `ChatData` from construction to the end of `prepare_data()` + `setup()` (read the JSON Lines, render each
conversation with the chat template, find the assistant's tokens, tokenize, best-fit pack, write the cache), once
on a ChatML template with `{% generation %}` markers and once on the stock one without them (the same text).
The peer: `datasets.load_dataset("json")` then `SFTTrainer._prepare_dataset` (SFTConfig(assistant_only_loss=True,
packing=True, packing_strategy="bfd", max_length=seq_len)): the `apply_chat_template(..., return_assistant_tokens_mask=
True)` map, the labels map and `pack_dataset`. The trainer (a 1-layer LlamaForCausalLM made from a config, nothing
downloaded) is built once per workload, outside the timer; each round reads a fresh file of new conversations into
a fresh `datasets` cache folder, so no map cache of an earlier round is reused. The pipelines alternate within a
round, the one that goes first turned every round. Kept beside tools/bench/data.py (a leading `_`: run_all.py does
not run it alone).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import statistics
import time
from pathlib import Path
from typing import Any

#: the stock ChatML of tools/bench/data.py with each assistant turn's content and end token inside `{% generation %}`
#: (the newline after `<|im_end|>` outside): the same text, and masks for `return_assistant_tokens_mask`
MARKED = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}{% if m['role'] == 'assistant' %}"
          "{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}{% else %}"
          "{{ m['content'] + '<|im_end|>' + '\n' }}{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
#: (name, conversations, exchanges (both ends included), seq_len) per size
WORKLOADS = {"quick": [("short", 300, (2, 6), 2048), ("long", 40, (20, 30), 8192)],
             "full": [("short", 5000, (2, 6), 2048), ("long", 500, (20, 30), 8192)]}
CHECKED = 200  # rows whose (input_ids, labels) are compared, ours against TRL's before packing
PIPELINES = ("ours_marked", "ours_stock", "trl")


def write_rows(path: Path, chats: list[list[dict[str, str]]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for messages in chats:
            f.write(json.dumps({"messages": messages}) + "\n")
    return path


def ours(source: Path, cache: Path, tokenizer: Any, seq_len: int, template: str | None) -> tuple[float, Any]:
    """Seconds for ChatData to build its cache from `source` (its setup's count lines kept off the output)."""
    from framework.data.user_chat import ChatData

    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        data = ChatData(source=str(source), seq_len=seq_len, packing=True, batch_size=1, cache_dir=str(cache),
                        chat_template=template)
        data.use_tokenizer(tokenizer)
        data.prepare_data()
        data.setup()
    return time.perf_counter() - start, data


def trainer(tokenizer: Any, seq_len: int, folder: Path) -> Any:
    """An SFTTrainer on a 1-layer Llama of the tokenizer's vocabulary (built from a config: nothing downloaded),
    with the settings whose dataset preparation is timed; it prepares a 4-row set once, here."""
    import datasets
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=seq_len)
    args = SFTConfig(output_dir=str(folder), assistant_only_loss=True, packing=True, packing_strategy="bfd",
                     max_length=seq_len, report_to="none", use_cpu=True, dataset_num_proc=None)
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}] * 4
    with contextlib.redirect_stdout(io.StringIO()):
        return SFTTrainer(model=LlamaForCausalLM(config), args=args, train_dataset=datasets.Dataset.from_list(rows),
                          processing_class=tokenizer)


def trl(sft: Any, source: Path, cache: Path, packing: bool = True) -> tuple[float, float, Any]:
    """(seconds in all, seconds of `load_dataset` alone, the prepared Dataset): `datasets` reads the JSON Lines into
    a fresh cache folder, then the trainer's own `_prepare_dataset` tokenizes, masks and packs (BFD)."""
    import datasets

    start = time.perf_counter()
    ds = datasets.load_dataset("json", data_files=str(source), split="train", cache_dir=str(cache))
    loaded = time.perf_counter()
    ds = sft._prepare_dataset(ds, sft.processing_class, sft.args, packing, None, "train")
    end = time.perf_counter()
    return end - start, loaded - start, ds


def tokens_of(ds: Any) -> int:
    import pyarrow.compute as pc

    return int(pc.sum(pc.list_value_length(ds.with_format("arrow")["input_ids"])).as_py() or 0)


def mask_check(chats: list[list[dict[str, str]]], built: dict[str, Any], sft: Any, stock: str,
               folder: Path) -> dict[str, Any]:
    """Rows (of the first CHECKED) whose (input_ids, labels) differ between ours (each template) and TRL's
    tokenization before packing (`_prepare_dataset` with packing off: cut to max_length as ours cuts), and rows
    whose text the two templates render differently."""
    import numpy as np

    rows = chats[:CHECKED]
    _, _, theirs = trl(sft, write_rows(folder / "check.jsonl", rows), folder / "cache", packing=False)
    tok = sft.processing_class
    out: dict[str, Any] = {"rows": len(rows), "trl_rows": len(theirs), "text_differs": sum(
        tok.apply_chat_template(m, tokenize=False) != tok.apply_chat_template(m, tokenize=False, chat_template=stock)
        for m in rows)}
    for key, data in built.items():
        try:
            renderer = data.renderer()
            docs = [renderer.document({"messages": m}, i) for i, m in enumerate(rows)]
        except Exception as err:  # noqa: BLE001 - ChatData's internals may move: say so, do not fail the bench
            out[key] = f"n/a ({type(err).__name__}: {err})"[:160]
            continue
        if len(theirs) != len(rows) or any(d is None for d in docs):
            out[key] = f"n/a (ours kept {sum(d is not None for d in docs)}, TRL {len(theirs)} of {len(rows)})"
            continue
        differ = 0
        for (ids, labels), ref in zip(docs, theirs, strict=True):
            labels = ids if labels is None else labels
            differ += not (np.array_equal(ids, ref["input_ids"]) and np.array_equal(labels, ref["labels"]))
        out[key] = differ
    return out


def run(words: Any, tokenizer: Any, stock: str, size: str, rounds: int, tmp: Path) -> list[dict[str, Any]]:
    """Each workload: `rounds` rounds of the three pipelines on a fresh file of new conversations, in turn."""
    import framework.data.user_chat  # noqa: F401 - imported before the clocks start (its imports are not the build)

    tok = copy.deepcopy(tokenizer)  # one instance for all three, its own template the marked one
    tok.chat_template = MARKED
    results = []
    for name, n, exchanges, seq_len in WORKLOADS[size]:
        sft = trainer(tok, seq_len, tmp / f"e_{name}_trainer")
        runs: dict[str, list[float]] = {k: [] for k in (*PIPELINES, "trl_load")}
        counts: dict[str, Any] = {}
        first: dict[str, Any] = {}
        for r in range(rounds):
            chats = words.chats(n, exchanges, system=True)
            source = write_rows(tmp / f"e_{name}" / f"r{r}" / "train.jsonl", chats)
            order = PIPELINES[r % 3:] + PIPELINES[:r % 3]
            for key in order:
                cache = tmp / f"e_{name}" / f"r{r}" / key
                if key == "trl":
                    secs, load, packed = trl(sft, source, cache)
                    runs["trl_load"].append(load)
                    counts.setdefault("trl", []).append((len(packed), tokens_of(packed)))
                else:
                    secs, data = ours(source, cache, tok, seq_len, None if key == "ours_marked" else stock)
                    meta = data.meta
                    chat = [meta[p].get("chat", {}) for p in ("train", "val")]
                    counts.setdefault(key, []).append((sum(meta[p]["rows"] for p in ("train", "val")),
                                                       sum(meta[p]["tokens"] for p in ("train", "val")),
                                                       sum(c.get("truncated", 0) for c in chat)))
                    if r == 0:
                        first[key] = data
                runs[key].append(secs)
            if r == 0:
                first_chats = chats
        check = mask_check(first_chats, first, sft, stock, tmp / f"e_{name}" / "check")
        results.append({"name": name, "n": n, "exchanges": exchanges, "seq_len": seq_len, "runs": runs,
                        "counts": counts, "check": check})
    return results


def print_results(results: list[dict[str, Any]], rounds: int) -> None:
    print(f"(e) chat data build: ours (ChatData: read the JSON Lines, render, mask, tokenize, best-fit pack, write the "
          "cache; timed from construction to the end of prepare_data() + setup()) against the peer, `datasets."
          "load_dataset(\"json\")` + TRL's SFTTrainer._prepare_dataset with SFTConfig(assistant_only_loss=True, "
          "packing=True, packing_strategy=\"bfd\", max_length=seq_len) (apply_chat_template with "
          "return_assistant_tokens_mask, labels, pack_dataset; the trainer built once, outside the timer); the same "
          "byte-level BPE tokenizer, ChatML with {% generation %} markers for TRL (and ours, marked row), the stock "
          f"marker-less ChatML for ours' second row (the same text); {rounds} rounds, each on a fresh file of new "
          "conversations (a system message, then user + assistant exchanges) and fresh caches, the three pipelines "
          "in turn and the first turned every round; seconds: the median; x peer: the median of the rounds' ratios; "
          "all on one thread. Conversations longer than seq_len are cut to it (ours counts them; TRL's bfd truncates "
          "them). Goal >= 1.0 (the stretch goal: 2x)\n")
    names = {"trl": "peer: datasets.load_dataset + TRL SFTTrainer._prepare_dataset (bfd)",
             "trl_prep": "(peer: _prepare_dataset alone, without load_dataset)",
             "ours_marked": "ours: ChatData, ChatML with {% generation %} markers",
             "ours_stock": "ours: ChatData, stock ChatML (no markers)"}
    for res in results:
        runs, n = res["runs"], res["n"]
        runs["trl_prep"] = [a - b for a, b in zip(runs["trl"], runs["trl_load"], strict=True)]
        lo, hi = res["exchanges"]
        trl_rows, trl_tokens = res["counts"]["trl"][0]
        rows, tokens, cut = res["counts"]["ours_marked"][0]
        print(f"{res['name']}: {n:,} conversations of {lo}-{hi} exchanges, seq_len {res['seq_len']}; round 1: "
              f"ours {tokens:,} tokens in {rows:,} packed rows (its training part and 5% held out, packed apart; "
              f"cut to seq_len: {cut}), TRL {trl_tokens:,} tokens in {trl_rows:,} rows; {len(runs['trl'])} rounds, "
              "both on one thread\n")
        print("| pipeline | seconds | rows/s | x peer | goal |\n|---|---|---|---|---|")
        for key in ("trl", "trl_prep", "ours_marked", "ours_stock"):
            secs = statistics.median(runs[key])
            ratio = statistics.median(p / s for p, s in zip(runs["trl"], runs[key], strict=True))
            shown, goal = ("", "") if key == "trl_prep" else (f"{ratio:.2f}", ">= 1.0" if key != "trl" else "")
            print(f"| {names[key]} | {secs:.2f} | {n / secs:,.0f} | {shown} | {goal} |")
        check = res["check"]
        print(f"\nmasks, the first {check['rows']} conversations of round 1 against TRL's tokenization before packing "
              f"(its {check['trl_rows']} rows): rows whose (input_ids, labels) differ: ours marked "
              f"{check['ours_marked']}, ours stock {check['ours_stock']}; rows the two templates render differently: "
              f"{check['text_differs']}\n")

"""The users' own data (issue 44), side by side with `datasets` + TRL in one run, on one thread.

A corpus of generated documents (pseudo-words drawn Zipf-like, lognormal lengths) and a byte-level BPE tokenizer
trained on it offline (`tokenizers`, wrapped in transformers' PreTrainedTokenizerFast, with a ChatML template):
(a) The training step reading `data=text` from files (TextData's own training loader over the packed rows of its
    on-disk cache) against the same step on the same batches already in memory as tensors: a TransformerLM under
    `causal_lm` in Lightning's loop, one fit alternating windows of the two sources on the same batches (so the
    process, the model and the minutes are shared), the source that comes first swapped every round; tokens/s is
    the median over the timed windows of each kind (warm-up excluded). Goal: >= 0.97x (the reader is never the
    bottleneck).
(b) Tokenize + pack: TextData building its cache (read, tokenize with the tokenizer's EOS after each document, pack,
    write) against `datasets.load_dataset("json")` + `Dataset.map(batched=True)` tokenizing + TRL's
    `pack_dataset(strategy="bfd")`, fresh caches each round; the median of the rounds. Goal: >= 1.0x. A second run on
    the caches each left (ours: the packed arrays; theirs: `datasets`' fingerprinted map caches) is timed too.
(c) Tokens used / tokens in the packed rows (rows x seq_len): `text` (goal >= 0.99) and `chat` (a generated set of
    conversations rendered with the ChatML template; ours best-fit over windows of 8,192 conversations, TRL's
    `apply_chat_template` tokenization as SFTTrainer does it, then BFD per `map` batch of 1,000), side by side.
(d) Streaming (`data.streaming=true`): the peak RSS (VmHWM, its high-water mark) of a fresh process reading one
    epoch of a corpus and of one 10x larger. Goal: the larger <= 1.1x the smaller. The map-style cache build's peak
    is shown beside.
(e) Chat data build (tools/bench/_chat_build.py): ChatData building its cache against `datasets` + TRL's SFTTrainer
    dataset preparation (assistant_only_loss, packing bfd), 5,000 conversations of 2-6 exchanges and 500 of 20-30,
    alternating rounds on fresh data and caches; the masks compared row by row. Goal: >= 1.0x (stretch: 2x).
(f) One big text file (tools/bench/_big_file.py): the peak RSS of packing it into the cache, of reading the cache as
    a training run does and of streaming one epoch, for a single .txt file of 100 MB and of 1 GB (--quick: 10 MB
    and 100 MB). Goal: each 1 GB peak <= 1.1x the 100 MB one.

    python tools/bench/data.py [--quick] [--rounds 5] [--only a b c d e f]
"""

from __future__ import annotations

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread: the tokenizer's own pools off, before it is imported
os.environ["RAYON_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import _big_file  # noqa: E402 - section (f), beside this file
import _chat_build  # noqa: E402 - section (e), beside this file

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SIZES = {"quick": {"name": "quick", "docs": 600, "chats": 600, "rss_mb": 0.5, "windows": 3, "window": 5},
         "full": {"name": "full", "docs": 6000, "chats": 4000, "rss_mb": 4.0, "windows": 8, "window": 5}}
DIM, DEPTH = 128, 2  # (a)'s model: small, so that a slow reader would show


# ---- generated data -----------------------------------------------------------------------------------------------
class Words:
    """Pseudo-words (syllables joined), drawn with Zipf-like frequencies; some end a sentence or a clause."""

    def __init__(self, seed: int = 0, vocab: int = 6000):
        self.rng = np.random.default_rng(seed)
        syllables = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"] + ["th", "st", "qu", "ng"]
        lengths = self.rng.integers(1, 4, vocab)
        words = ["".join(self.rng.choice(syllables, n)) for n in lengths]
        marks = self.rng.random(vocab)
        self.words = np.array([w + ("." if m < 0.04 else "," if m < 0.08 else "") for w, m in zip(words, marks,
                                                                                                  strict=True)],
                              dtype=object)
        weights = 1.0 / np.arange(1, vocab + 1) ** 1.1
        self.cdf = np.cumsum(weights) / weights.sum()

    def texts(self, n: int, median_words: float, sigma: float = 0.9) -> list[str]:
        lengths = np.maximum(1, self.rng.lognormal(np.log(median_words), sigma, n).astype(int))
        idx = np.minimum(np.searchsorted(self.cdf, self.rng.random(int(lengths.sum()))), len(self.cdf) - 1)
        words = self.words[idx]
        ends = np.cumsum(lengths)
        return [" ".join(words[e - n_:e]) for e, n_ in zip(ends, lengths, strict=True)]

    def chats(self, n: int, exchanges: tuple[int, int] = (1, 4), system: bool = False) -> list[list[dict[str, str]]]:
        """`n` conversations of `exchanges` (a range, both ends included) user + assistant turns each, after a system
        message if `system`."""
        turns = self.rng.integers(exchanges[0], exchanges[1] + 1, n)
        users, answers = iter(self.texts(int(turns.sum()), 25)), iter(self.texts(int(turns.sum()), 70))
        systems = iter(self.texts(n, 12) if system else [])
        return [([{"role": "system", "content": next(systems)}] if system else [])
                + [m for _ in range(k) for m in ({"role": "user", "content": next(users)},
                                                 {"role": "assistant", "content": next(answers)})] for k in turns]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def train_tokenizer(texts: list[str], folder: Path, vocab: int = 4096) -> Any:
    """A byte-level BPE trained on `texts` (offline), as a transformers tokenizer with EOS, pad and ChatML."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=specials[1:])
    fast.chat_template = CHATML
    fast.save_pretrained(folder)
    return fast


# ---- (b) tokenize + pack ------------------------------------------------------------------------------------------
def ours_build(source: Path, cache: Path, tokenizer: Any, seq_len: int) -> tuple[float, Any]:
    """Seconds for TextData to resolve and check the source, tokenize, pack and write its cache (or open it)."""
    from framework.data.user_text import TextData

    start = time.perf_counter()
    data = TextData(source=str(source), seq_len=seq_len, batch_size=4, cache_dir=str(cache))
    data.use_tokenizer(tokenizer)
    data.setup()
    return time.perf_counter() - start, data


def trl_build(source: Path, cache: Path, tokenizer: Any, seq_len: int, strategy: str = "bfd") -> tuple[float, Any]:
    """Seconds for `datasets` to read the JSON Lines, `map(batched=True)` tokenize (EOS after each document) and
    TRL to pack (`pack_dataset`); the packed Dataset."""
    import datasets
    from trl.data_utils import pack_dataset

    eos = tokenizer.eos_token_id

    def tokenize(batch: dict[str, list]) -> dict[str, list]:
        return {"input_ids": [ids + [eos] for ids in tokenizer(batch["text"], add_special_tokens=False)["input_ids"]]}

    start = time.perf_counter()
    ds = datasets.load_dataset("json", data_files=str(source), split="train", cache_dir=str(cache))
    ds = ds.map(tokenize, batched=True, remove_columns=ds.column_names)
    packed = pack_dataset(ds, seq_len, strategy=strategy)
    return time.perf_counter() - start, packed


def arrow_tokens(ds: Any, column: str = "input_ids") -> int:
    import pyarrow.compute as pc

    return int(pc.sum(pc.list_value_length(ds.with_format("arrow")[column])).as_py() or 0)


def pipelines(corpus: Path, tokenizer: Any, seq_len: int, rounds: int, tmp: Path) -> dict[str, Any]:
    runs: dict[str, list[float]] = {"ours": [], "bfd": [], "bfd_split": [], "tokenizer": []}
    texts = [json.loads(line)["text"] for line in corpus.read_text(encoding="utf-8").splitlines()]
    for r in range(rounds):
        start = time.perf_counter()
        for i in range(0, len(texts), 1000):
            tokenizer(texts[i:i + 1000], add_special_tokens=False)
        runs["tokenizer"].append(time.perf_counter() - start)
        # interleaved, the order turned every round, fresh caches each
        order = ["ours", "bfd", "bfd_split"]
        for key in order[r % 3:] + order[:r % 3]:
            if key == "ours":
                secs, data = ours_build(corpus, tmp / f"ours{r}", tokenizer, seq_len)
            else:
                secs, _ = trl_build(corpus, tmp / f"{key}{r}", tokenizer, seq_len, key)
            runs[key].append(secs)
    again_ours, _ = ours_build(corpus, tmp / "ours0", tokenizer, seq_len)
    again_trl, _ = trl_build(corpus, tmp / "bfd0", tokenizer, seq_len, "bfd")
    _, bfd = trl_build(corpus, tmp / "bfd0", tokenizer, seq_len, "bfd")
    _, split = trl_build(corpus, tmp / "bfd_split0", tokenizer, seq_len, "bfd_split")
    return {"runs": runs, "again": {"ours": again_ours, "bfd": again_trl}, "data": data, "bfd": bfd,
            "bfd_split": split}


def print_pipelines(res: dict[str, Any], corpus: Path, docs: int) -> None:
    data, meta = res["data"], res["data"].meta
    tokens = meta["train"]["tokens"] + meta["val"]["tokens"]
    mb = corpus.stat().st_size / 1e6
    peer = statistics.median(res["runs"]["bfd"])
    print(f"(b) tokenize + pack: {docs:,} documents, {mb:.1f} MB of JSON Lines, {tokens:,} tokens (BPE, vocabulary "
          f"{data.vocab_size}, EOS after each), seq_len {data.seq_len}; median of {len(res['runs']['ours'])} "
          "interleaved rounds, fresh caches each\n")
    print("| pipeline | seconds | tokens/s | x peer | goal |\n|---|---|---|---|---|")
    names = {"bfd": "peer: datasets load_dataset + map(batched=True) + TRL pack_dataset(bfd)",
             "bfd_split": "datasets + map + TRL pack_dataset(bfd_split)",
             "ours": "ours: TextData building its cache (data=text)"}
    for key in ("bfd", "bfd_split", "ours"):
        secs = statistics.median(res["runs"][key])
        goal = ">= 1.0" if key == "ours" else ""
        print(f"| {names[key]} | {secs:.2f} | {tokens / secs:,.0f} | {peer / secs:.2f} | {goal} |")
    secs = statistics.median(res["runs"]["tokenizer"])
    print(f"| (the tokenizer alone: the texts in memory, batches of 1,000) | {secs:.2f} | {tokens / secs:,.0f} | | |")
    again = res["again"]
    print(f"| ours, second run (the cache reused) | {again['ours']:.3f} | | {again['bfd'] / again['ours']:.1f} | |")
    print(f"| peer, second run (datasets' map caches reused) | {again['bfd']:.3f} | | 1.0 | |")
    print()


# ---- (c) packing efficiency ---------------------------------------------------------------------------------------
def chat_packing(source: Path, tokenizer: Any, seq_len: int, cache: Path) -> dict[str, Any]:
    """Ours (ChatData's cache) and TRL's (apply_chat_template per row as SFTTrainer, then BFD) on the same chats."""
    import datasets
    from trl.data_utils import pack_dataset

    from framework.data.user_chat import ChatData

    start = time.perf_counter()
    data = ChatData(source=str(source), seq_len=seq_len, batch_size=4, cache_dir=str(cache / "ours"))
    data.use_tokenizer(tokenizer)
    data.setup()
    ours_secs, meta = time.perf_counter() - start, data.meta

    def tokenize(row: dict[str, Any]) -> dict[str, list]:
        return {"input_ids": tokenizer.apply_chat_template(row["messages"], tokenize=True, return_dict=True)[
            "input_ids"]}

    start = time.perf_counter()
    ds = datasets.load_dataset("json", data_files=str(source), split="train", cache_dir=str(cache / "trl"))
    ds = ds.map(tokenize, remove_columns=ds.column_names)
    packed = pack_dataset(ds, seq_len, strategy="bfd")
    trl_secs = time.perf_counter() - start
    given = arrow_tokens(ds)
    return {"ours": meta, "ours_secs": ours_secs, "trl_secs": trl_secs, "trl_rows": len(packed),
            "trl_tokens": arrow_tokens(packed), "trl_given": given, "trl_docs": len(ds)}


def print_efficiency(text: dict[str, Any], chat: dict[str, Any], chats: int) -> None:
    data = text["data"]
    seq = data.seq_len
    print(f"(c) tokens used / tokens in the packed rows (rows x seq_len); text: the corpus of (b) at seq_len {seq} "
          f"(ours: the training part, {data.val_fraction:g} held out); chat: {chats:,} generated conversations "
          "(1-4 exchanges), ChatML, seq_len 1024\n")
    print("| data | packer | documents | tokens kept / given | rows | efficiency | x peer | goal |\n"
          "|---|---|---|---|---|---|---|---|")
    meta = data.meta
    given = meta["train"]["tokens"] + meta["val"]["tokens"]
    rows: list[tuple[str, str, int, str, int, float]] = []
    for key, name in (("bfd", "TRL pack_dataset(bfd) (peer)"), ("bfd_split", "TRL pack_dataset(bfd_split)")):
        packed = text[key]
        kept = arrow_tokens(packed)
        docs = meta["train"]["documents"] + meta["val"]["documents"]
        rows.append(("text", name, docs, f"{kept:,} / {given:,}", len(packed), kept / (len(packed) * seq)))
    train = data.meta["train"]
    rows.append(("text", "ours (data=text: in order, a document continues in the next row)", train["documents"],
                 f"{train['tokens']:,} / {train['tokens']:,}", train["rows"], train["efficiency"]))
    peer = rows[0][5]
    for kind, name, docs, tokens, n, eff in rows:
        goal = ">= 0.99" if name.startswith("ours") else ""
        print(f"| {kind} | {name} | {docs:,} | {tokens} | {n:,} | {eff:.4f} | {eff / peer:.3f} |"
              f" {goal} |")
    trl_eff = chat["trl_tokens"] / (chat["trl_rows"] * 1024)
    print(f"| chat | TRL: apply_chat_template + pack_dataset(bfd) per map batch of 1,000 (peer) | {chat['trl_docs']:,} "
          f"| {chat['trl_tokens']:,} / {chat['trl_given']:,} | {chat['trl_rows']:,} | {trl_eff:.4f} | 1.000 | |")
    ours, c = chat["ours"]["train"], chat["ours"]["train"]["chat"]
    print(f"| chat | ours (data=chat: best-fit decreasing over windows of 8,192) | {c['documents']:,} | "
          f"{ours['tokens']:,} / {c['tokens']:,} | {ours['rows']:,} | {ours['efficiency']:.4f} | "
          f"{ours['efficiency'] / trl_eff:.3f} | side by side |")
    print(f"\nchat tokenize + pack, for the record: ours {chat['ours_secs']:.2f} s (the assistant's tokens found in "
          f"one render), TRL {chat['trl_secs']:.2f} s (apply_chat_template, no mask; (e) times both with masks)\n")


# ---- (a) the training step: files vs tensors in memory -----------------------------------------------------------
class Alternating(torch.utils.data.IterableDataset):
    """The batches of one fit, `window` at a time from each source in turn: read from files by TextData's own loader
    (the reader's work happens in the fit's fetch, as in a run), then the same batches again from the copies held in
    memory (or memory first, with `files_first=False`). Both kinds train on the same batches, in the same process,
    model and minutes, so the only difference between their windows is where a batch comes from."""

    def __init__(self, loader: Any, memory: list[dict[str, torch.Tensor]], window: int, files_first: bool):
        super().__init__()
        self.loader, self.memory, self.window, self.files_first = loader, memory, window, files_first

    def __len__(self) -> int:
        return 2 * len(self.memory)

    def __iter__(self) -> Any:
        files = iter(self.loader)
        for start in range(0, len(self.memory), self.window):
            chunk = range(start, min(start + self.window, len(self.memory)))
            for kind in ("files", "memory") if self.files_first else ("memory", "files"):
                for i in chunk:
                    yield next(files) if kind == "files" else self.memory[i]


class Windows:
    """Lightning callback: the time at the start of every `window`-th step after `warmup`, and at the end."""

    def __new__(cls, warmup: int, window: int) -> Any:
        import lightning as L

        class _Windows(L.Callback):
            def __init__(self) -> None:
                self.marks: list[float] = []

            def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
                step = trainer.global_step
                if step >= warmup and (step - warmup) % window == 0:
                    self.marks.append(time.perf_counter())

            def on_train_end(self, trainer: Any, *args: Any) -> None:
                self.marks.append(time.perf_counter())

        return _Windows()


def paired_fit(data: Any, memory: list[dict[str, torch.Tensor]], window: int, files_first: bool,
               tmp: Path) -> dict[str, dict[str, list[float]]]:
    """One causal_lm fit on TransformerLM over `Alternating` batches: per kind, the tokens/s of each of its windows
    and Lightning's fetch time (its profiler's `train_dataloader_next`) of each of its steps. The first two windows
    (one of each kind) are warm-up and not counted."""
    import lightning as L
    from lightning.pytorch.profilers import SimpleProfiler

    from framework.models.transformer import TransformerLM
    from framework.modules.causal_lm import CausalLM

    torch.manual_seed(0)
    model = TransformerLM(vocab_size=data.vocab_size, dim=DIM, depth=DEPTH, heads=4, max_seq_len=data.seq_len)
    module = CausalLM(model, optimizer=lambda p: torch.optim.AdamW([q for _, q in p], lr=1e-3))
    warmup = 2 * window
    clock, profiler = Windows(warmup, window), SimpleProfiler(dirpath=str(tmp), filename="profile")
    batches = Alternating(data.train_dataloader(), memory, window, files_first)
    trainer = L.Trainer(max_steps=len(batches), logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[clock],
                        default_root_dir=str(tmp), accelerator="cpu", use_distributed_sampler=False,
                        num_sanity_val_steps=0, limit_val_batches=0, profiler=profiler)
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
    order = ("files", "memory") if files_first else ("memory", "files")
    out: dict[str, dict[str, list[float]]] = {k: {"tokens/s": [], "fetch_ms": []} for k in order}
    tokens = data.batch_size * data.seq_len * window
    for i, (a, b) in enumerate(zip(clock.marks, clock.marks[1:], strict=False)):
        out[order[i % 2]]["tokens/s"].append(tokens / (b - a))
    fetch = profiler.recorded_durations["[_TrainingEpochLoop].train_dataloader_next"]
    for step in range(warmup, min(len(fetch), len(batches))):
        out[order[(step // window) % 2]]["fetch_ms"].append(1e3 * fetch[step])
    return out


def reader(data: Any, rounds: int, windows: int, window: int, tmp: Path) -> dict[str, dict[str, list[float]]]:
    """`rounds` paired fits, which source comes first in each pair of windows swapped every round; `windows` timed
    windows of each kind per fit."""
    steps = (windows + 1) * window  # one warm-up window of each kind
    loader = data.train_dataloader()  # no trainer: rank 0 of 1, the order the run's sampler gives (seed 0, epoch 0)
    memory = []
    for batch in loader:
        memory.append(batch)
        if len(memory) == steps:
            break
    runs: dict[str, dict[str, list[float]]] = {k: {"tokens/s": [], "fetch_ms": []} for k in ("memory", "files")}
    for r in range(rounds):
        for kind, got in paired_fit(data, memory, window, r % 2 == 0, tmp).items():
            for key in got:
                runs[kind][key] += got[key]
    return runs


def print_reader(runs: dict[str, dict[str, list[float]]], data: Any, rounds: int) -> None:
    peer = statistics.median(runs["memory"]["tokens/s"])
    print(f"(a) training step, causal_lm on TransformerLM (dim {DIM}, {DEPTH} layers, vocabulary {data.vocab_size}), "
          f"batch {data.batch_size} x {data.seq_len} packed tokens, AdamW, 1 thread; {rounds} fits, each alternating "
          "windows of the same batches read from files and held in memory (the first source swapped every fit); "
          f"the median of {len(runs['files']['tokens/s'])} timed windows of each kind (warm-up excluded); `fetch`: "
          "the mean time Lightning spent getting each batch (its profiler's train_dataloader_next)\n")
    print("| reader | tokens/s (median) | fetch ms/step | step ms | x peer | goal |\n|---|---|---|---|---|---|")
    tokens = data.batch_size * data.seq_len
    for kind, name in (("memory", "peer: the same batches as tensors in memory"),
                       ("files", "ours: data=text from files (TextData's loader over the on-disk cache)")):
        speed, fetch = statistics.median(runs[kind]["tokens/s"]), statistics.mean(runs[kind]["fetch_ms"])
        goal = ">= 0.97" if kind == "files" else ""
        print(f"| {name} | {speed:,.0f} | {fetch:.2f} | {1e3 * tokens / speed:.0f} | {speed / peer:.3f} | {goal} |")
    extra = statistics.mean(runs["files"]["fetch_ms"]) - statistics.mean(runs["memory"]["fetch_ms"])
    step = 1e3 * tokens / peer
    print(f"\nthe reader's own share: {extra:.2f} ms more per step than tensors in memory, on a {step:.0f} ms step: "
          f"{step / (step + extra):.4f}x at most from the reader; the rest of the ratio above is the machine's noise\n")


# ---- (d) streaming peak RSS ---------------------------------------------------------------------------------------
def rss_child(folder: str, tokenizer_dir: str, mode: str, cache: str) -> None:
    """In a fresh process: one epoch of `folder` streamed (or its cache built); prints the peak RSS as JSON."""
    from transformers import AutoTokenizer

    from framework.data import streaming
    from framework.data.user_text import TextData

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    start = time.perf_counter()
    data = TextData(source=folder, seq_len=512, batch_size=8, cache_dir=cache, streaming=mode == "stream")
    data.use_tokenizer(tokenizer)
    before = maxrss_mb()
    rows = 0
    if mode == "stream":
        for batch in streaming.train_loader(data):
            rows += len(batch["input_ids"])
    else:
        data.setup()
        rows = len(data.train_set)
    print(json.dumps({"peak_mb": maxrss_mb(), "before_mb": before, "rows": rows,
                      "seconds": time.perf_counter() - start}))


def maxrss_mb() -> float:
    """This process's peak RSS: VmHWM, its own address space's high-water mark. `getrusage`'s ru_maxrss is not it
    in a child: Linux carries the parent's peak through fork and exec into it (a 1.6 GB parent read as 1.6 GB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss(words: Words, tokenizer_dir: Path, small_mb: float, tmp: Path) -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for name, scale in (("small", 1), ("10x", 10)):
        folder = tmp / f"rss_{name}"
        per_file = max(1, int(small_mb * scale * 1e6 / 4 / 1900))  # 4 files, ~1.9 kB a document
        for k in range(4):
            write_jsonl(folder / f"part{k}.jsonl", [{"text": t} for t in words.texts(per_file, 180)])
        for mode in ("stream", "cache"):
            cmd = [sys.executable, __file__, "--rss-child", str(folder), str(tokenizer_dir), mode,
                   str(tmp / f"rss_cache_{name}")]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
            out[(name, mode)] = {**json.loads(proc.stdout.strip().splitlines()[-1]),
                                 "mb": sum(p.stat().st_size for p in folder.iterdir()) / 1e6}
    return out


def print_rss(res: dict[tuple[str, str], dict[str, Any]]) -> None:
    print("(d) peak RSS of a fresh process reading one epoch (4 JSON Lines files, BPE, seq_len 512, batch 8), the "
          "corpus 10x larger beside; `before`: the RSS after imports and the tokenizer, before the first row\n")
    print("| reader | corpus | MB | rows | seconds | RSS before (MB) | peak RSS (MB) | x small | goal |\n"
          "|---|---|---|---|---|---|---|---|---|")
    names = {"stream": "data.streaming=true (one epoch)", "cache": "map-style cache build (PackWriter)"}
    for mode in ("stream", "cache"):
        small = res[("small", mode)]["peak_mb"]
        for size in ("small", "10x"):
            r = res[(size, mode)]
            goal = "<= 1.1" if mode == "stream" and size == "10x" else ""
            print(f"| {names[mode]} | {size} | {r['mb']:.1f} | {r['rows']:,} | {r['seconds']:.1f} | "
                  f"{r['before_mb']:.0f} | {r['peak_mb']:.0f} | {r['peak_mb'] / small:.3f} | {goal} |")
    print()


# ---- main ---------------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    import logging
    import warnings

    import lightning  # noqa: F401 - imported first: its import sets its loggers' levels, quietened below

    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", nargs="+", choices=list("abcdef"), default=list("abcdef"),
                        help="the sections to run (default: all)")
    parser.add_argument("--rss-child", nargs=4, metavar=("FOLDER", "TOKENIZER", "MODE", "CACHE"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--big-child", nargs=3, metavar=("FILE", "MODE", "CACHE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.rss_child:
        rss_child(*args.rss_child)
        return 0
    if args.big_child:
        _big_file.child(*args.big_child)
        return 0
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    size, only = SIZES["quick" if args.quick else "full"], set(args.only)
    rounds = 1 if args.quick else args.rounds
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        os.environ["HF_DATASETS_CACHE"] = str(tmp / "hf_datasets")
        words = Words(seed=0)
        texts = words.texts(size["docs"], 180)
        corpus = write_jsonl(tmp / "corpus" / "train.jsonl", [{"text": t} for t in texts])
        tokenizer = train_tokenizer(texts[:2000], tmp / "tokenizer")
        chats = write_jsonl(tmp / "chats" / "train.jsonl", [{"messages": m} for m in words.chats(size["chats"])])
        if only & set("abc"):
            text = pipelines(corpus, tokenizer, 512, rounds, tmp)  # first: (a) trains on the cache it builds
        if "a" in only:
            runs = reader(text["data"], rounds, size["windows"], size["window"], tmp)
            print_reader(runs, text["data"], rounds)
        if "b" in only:
            print_pipelines(text, corpus, size["docs"])
        if "c" in only:
            chat = chat_packing(chats, tokenizer, 1024, tmp / "chat")
            print_efficiency(text, chat, size["chats"])
        if "d" in only:
            print_rss(rss(words, tmp / "tokenizer", size["rss_mb"], tmp))
        if "e" in only:
            n = max(2, rounds) if args.quick else rounds  # two even when quick: the order turns once
            _chat_build.print_results(_chat_build.run(words, tokenizer, CHATML, size["name"], n, tmp), n)
        if "f" in only:
            sizes = (10, 100) if args.quick else (100, 1000)
            _big_file.print_results(_big_file.run(tmp, sizes, __file__), sizes)
    return 0


if __name__ == "__main__":
    sys.exit(main())

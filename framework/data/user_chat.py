"""`data=chat`: the user's chat rows (TRL's `messages` or `prompt`/`completion` shapes; `framework.data.chat`),
read, packed and cached as `data=text` reads, packs and caches text (`framework.data.user_text`).

What differs from text: each row is rendered with the model's tokenizer and chat template into one document whose
labels are -100 outside the assistant's / completion's tokens; a conversation is never split across rows (packed
rows hold whole conversations, best-fit decreasing as TRL's BFD packs, so the prompt of every target is in its
row); a row longer than `seq_len` is cut (counted in the run's log) or refused with `truncate=false`. The counts
(rows kept, skipped with no assistant turn, truncated) go to the log, `meta.json` and the run's record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from framework.data import sources
from framework.data.chat import SHAPES, TRAIN_ON, ChatRenderer, Document, detect_shape, template_columns
from framework.data.packing import BestFit, PackWriter, best_fit, chunks, fingerprint, token_dtype
from framework.data.user_text import TextData, held_out
from framework.errors import InputError

log = logging.getLogger("framework.run")
#: documents best-fit together (TRL's BFD runs per `map` batch of 1,000)
BFD_WINDOW = 8192
#: how the loss mask is found (in the cache's identity: a cache built another way is not reused)
MASK_VERSION = "one-render-1"


class ChatData(TextData):
    """The user's chat rows as packed (or one-per-row, padded) rows of `seq_len` with the loss on the answers.

    The shape (TRL's `messages` or `prompt`/`completion`) is found from the columns. Needs a model that brings a
    tokenizer (the framework's byte models have none).

    The settings it shares with `TextData` mean the same and are documented there.

    Args:
        columns: TRL's column names mapped to the source's (`{messages: conversations}`); None: TRL's names as is.
        train_on: tokens that get the loss: "assistant" (every assistant turn), "last" (the last one) or "all".
        truncate: cut a conversation longer than `seq_len` (counted in the log); False refuses it.
        chat_template: a Jinja chat template, or a file holding one, instead of the tokenizer's own; None: its own.
        template_kwargs: further row columns passed to the template as arguments (besides tools, documents, ...).
    """

    def __init__(
        self,
        source: str | None = None,
        columns: dict[str, str] | None = None,
        train_on: str = "assistant",
        truncate: bool = True,
        chat_template: str | None = None,
        template_kwargs: list[str] | None = None,
        revision: str | None = None,
        format: str | None = None,  # noqa: A002 - the user's word for it (data.format=json)
        split: str = "train",
        val_split: str | None = None,
        val_fraction: float = 0.05,
        seq_len: int | None = 512,
        packing: bool = True,
        batch_size: int = 8,
        seed: int | None = 0,
        num_workers: int = 0,
        cache_dir: str | None = None,
        streaming: bool = False,
        config: str | None = None,
        allow_changed: bool = False,
    ):
        if train_on not in TRAIN_ON:
            raise InputError(f"data.train_on={train_on!r}; valid: {', '.join(TRAIN_ON)}")
        self.column_map = dict(columns or {})
        self.train_on, self.truncate = train_on, bool(truncate)
        self.chat_template = _template(chat_template)
        self.template_kwargs = [str(c) for c in (template_kwargs or [])]
        self.shape, self.columns, self.template_columns = "", {}, {}
        super().__init__(source=source, column="messages", revision=revision, format=format, split=split,
                         val_split=val_split, val_fraction=val_fraction, seq_len=seq_len, packing=packing,
                         batch_size=batch_size, seed=seed, num_workers=num_workers, cache_dir=cache_dir,
                         streaming=streaming, config=config, allow_changed=allow_changed)

    def stream_bad_lines(self) -> str | None:
        """A chat stream reads JSON Lines through `datasets`' builder (a bad line stops it, refused by name)."""
        return None

    # ---- the tokenizer --------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """The tokenizer's vocabulary; asked of data with no tokenizer (a byte model's run), the refusal."""
        if self.tokenizer is None:
            raise InputError(no_tokenizer())
        return len(self.tokenizer)

    @vocab_size.setter
    def vocab_size(self, value: int) -> None:
        pass  # always the tokenizer's (`use_tokenizer` sets it)

    def use_tokenizer(self, tokenizer: Any) -> None:
        """Render with `tokenizer`; conversations and a tokenizer with no chat template are refused here, before
        the run writes anything."""
        super().use_tokenizer(tokenizer)
        self.renderer().check_template()

    def renderer(self) -> ChatRenderer:
        """A fresh renderer (its own counts) with this data's settings."""
        if self.tokenizer is None:
            raise InputError(no_tokenizer())
        return ChatRenderer(self.tokenizer, self.shape, self.columns, self.train_on, self.seq_len, self.truncate,
                            self.chat_template, self.template_columns)

    # ---- the source -----------------------------------------------------------------------------------------
    def _check(self, split: str, val_split: str | None) -> str | None:
        """Find the rows' shape from the columns (remembered per version of the source), then the text side's
        checks on its first column (every split there, not empty, UTF-8)."""
        key = fingerprint({"chat-columns": self.source.identity(), "split": split, "map": self.column_map})
        columns = (sources.remembered(self.root, key) or {}).get("columns") or self._peek(split)
        if columns is None:  # the split is missing, unreadable or empty: the text side's check says which
            self.column = self.column_map.get("messages", "messages")
            super()._check(split, val_split)
            columns = self._peek(split) or []
        self.shape, self.columns = detect_shape(columns, self.column_map)
        self.template_columns = template_columns(columns, self.template_kwargs)
        sources.remember(self.root, key, {"columns": columns})
        self.column = self.columns[SHAPES[self.shape][0]]
        return super()._check(split, val_split)

    def _peek(self, split: str) -> list[str] | None:
        """The columns of the split's first row; None where there is none to read."""
        if split not in sources.splits_of(self.source):
            return None
        try:
            first = next(iter(self.source.load(split)), None)
        except ValueError:
            return None
        return None if first is None else list(first)

    #: streamed (`data.streaming=true`, framework.data.streaming): rows keep whole conversations, next-fit in order
    split_documents = False

    def document_batches(self, rows: Any = None, split: str | None = None) -> Iterator[list[Document]]:
        """The documents of `rows` (a split opened by framework.data.streaming) or of `split`, a list per read batch
        (rows the renderer skips left out)."""
        renderer, split = self.renderer(), split or self.split
        rows = self.source.load(split) if rows is None else rows
        index = 0
        try:
            for batch in rows.iter(batch_size=1000):
                size = len(next(iter(batch.values()), []))
                wanted = [c for c in self.read_columns() if c in batch]
                docs = renderer.documents([{c: batch[c][k] for c in wanted} for k in range(size)], index)
                index += size
                yield [doc for doc in docs if doc is not None]
        except InputError:
            raise
        except ValueError as err:
            raise InputError(f"data.source={self.source.spec}: the {split} split cannot be read "
                             f"({' '.join(str(err).split())[:300]})") from None

    def read_columns(self) -> list[str]:
        """The columns a row's render reads: the shape's, then its template's (tools, documents, arguments)."""
        return list(dict.fromkeys([*self.columns.values(), *self.template_columns.values()]))

    def rows(self, split: str) -> Iterator[dict[str, Any]]:
        """The split's rows (the columns a render reads), in order."""
        data = self.source.load(split).select_columns(self.read_columns())
        try:
            yield from data
        except ValueError as err:
            raise InputError(f"data.source={self.source.spec}: the {split} split cannot be read "
                             f"({' '.join(str(err).split())[:300]})") from None

    def prompt_completions(self, split: str | None = None, limit: int | None = None
                           ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Each prompt/completion row's prompt ids (ending in the generation prompt) and completion ids (through
        its end token), for the probes that generate from a prompt and check the completion."""
        renderer = self.renderer()
        for i, row in enumerate(self.rows(split or self.split)):
            if limit is not None and i >= limit:
                return
            yield renderer.prompt_completion(row, i)

    # ---- packing --------------------------------------------------------------------------------------------
    def identity(self) -> dict[str, Any]:
        template = self.chat_template or getattr(self.tokenizer, "chat_template", None)
        return {**super().identity(), "kind": "chat", "shape": self.shape, "columns": self.columns,
                "train_on": self.train_on, "truncate": self.truncate, "packer": f"bfd-{BFD_WINDOW}",
                "template": hashlib.sha256(str(template).encode()).hexdigest()[:16],
                "template_columns": self.template_columns, "mask": MASK_VERSION}

    def _write(self, folder: Path) -> None:
        dtype = token_dtype(self.vocab_size)
        writers = {name: PackWriter(folder / name, self.seq_len, self.packing, split_documents=False, dtype=dtype)
                   for name in ("train", "val")}
        renderers = {name: self.renderer() for name in writers}
        fits = {name: BestFit(writer, self.seq_len, BFD_WINDOW if self.packing else 1)
                for name, writer in writers.items()}
        parts = [("train", self.split), ("val", self.val_split)] if self.val_split else [(None, self.split)]
        for part, split in parts:
            for start, chunk in chunks(self.rows(split), 1000):
                if part is not None:
                    for doc in renderers[part].documents(chunk, start):
                        fits[part].add(doc)
                    continue
                for name in ("train", "val"):  # the held-out rows by their index, each part's rows rendered together
                    keep = [i for i in range(len(chunk)) if (name == "val") == held_out(start + i, self.val_fraction)]
                    docs = renderers[name].documents([chunk[i] for i in keep], indices=[start + i for i in keep])
                    for doc in docs:
                        fits[name].add(doc)
        for name, fit in fits.items():
            fit.flush()
            stats = renderers[name].stats
            if not stats.documents:
                part = f"the {self.val_split} split" if name == "val" and self.val_split else f"the {name} part"
                raise InputError(f"data.source={self.source.spec}: {part} has no row left to train on: "
                                 f"{stats.line()}")
            writers[name].close(fingerprint=self.fingerprint, source=self.source.spec, chat=dataclasses.asdict(stats))

    # ---- prompt batches, for a module that generates from the prompts and checks the completions ---------------
    #: serve prompt batches (framework.probes.prompts) instead of packed rows: set by `use_prompts()`, or asked by
    #: the run's module (a head probe's `reads_prompts`); `max_new_tokens` is then the longest completion
    prompt_mode = False
    max_new_tokens: int | None = None
    prompt_counts: dict[str, Any] | None = None

    def use_prompts(self) -> None:
        """Serve each prompt/completion row as a prompt batch row (left-padded prompt, its mask, the completion as
        the answer), read into memory; a probe's run asks for it itself."""
        self.prompt_mode = True

    def serves_prompts(self) -> bool:
        module = self.trainer.lightning_module if self.trainer is not None else None
        return self.prompt_mode or bool(getattr(module, "reads_prompts", False))

    def _setup_prompts(self) -> None:
        from framework.probes.prompts import prompt_line, prompt_sets

        renderer = self.renderer()
        parts = [("train", self.split), ("val", self.val_split)] if self.val_split else [(None, self.split)]
        rows = ((part, i, row) for part, split in parts for i, row in enumerate(self.rows(split)))
        pairs = ((part or ("val" if held_out(i, self.val_fraction) else "train"), i, *renderer.prompt_completion(r, i))
                 for part, i, r in rows)
        sets, self.prompt_counts = prompt_sets(pairs, self.seq_len, self.truncate, self.pad_id, self.source.spec)
        self.train_set, self.val_set = sets["train"], sets["val"]
        self.max_new_tokens = self.prompt_counts["completion_tokens_max"]
        world = self.trainer.world_size if self.trainer is not None else 1
        if len(self.train_set) < self.batch_size * world:
            raise InputError(f"data.source={self.source.spec} gives {len(self.train_set)} training prompts, fewer "
                             f"than one batch of data.batch_size={self.batch_size} on each of {world} rank(s)")
        if self.trainer is None or self.trainer.is_global_zero:
            line = prompt_line(self.prompt_counts, self.seq_len)
            print(line)
            log.info(line)

    def prepare_data(self) -> None:
        if not self.serves_prompts():  # prompt batches are read into memory: nothing to pack ahead
            super().prepare_data()

    def train_dataloader(self) -> Any:
        if not self.serves_prompts():
            return super().train_dataloader()
        from framework.data.resumable import train_loader

        return train_loader(self.train_set, self.batch_size, self.seed, self.trainer, collate_fn=self.train_set.collate)

    def val_dataloader(self) -> Any:
        if not self.serves_prompts():
            return super().val_dataloader()
        from torch.utils.data import DataLoader

        return DataLoader(self.val_set, batch_size=self.batch_size, shuffle=False, collate_fn=self.val_set.collate)

    # ---- the run ------------------------------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self.serves_prompts():
            if self.prompt_counts is None:
                self._setup_prompts()
            return
        new = self.train_set is None
        super().setup(stage)
        if new and (self.trainer is None or self.trainer.is_global_zero):
            for name, meta in self.meta.items():
                line = f"data=chat {name}: {chat_line(meta)}"
                print(line)
                log.info(line)

    def record(self) -> dict[str, Any]:
        """The text record, with the shape, the mask and the chat counts (rows kept, skipped, truncated)."""
        if self.serves_prompts():
            self.setup()
            counts = self.prompt_counts
            return {**self.source.describe(), "fingerprint": self.fingerprint,
                    "format": f"chat (prompt/completion; {self.source.format}) as prompts", "columns": self.columns,
                    "tokenizer": self._tokenizer_identity["name_or_path"], "seq_len": self.seq_len,
                    "documents": counts["train"]["rows"], "val_documents": counts["val"]["rows"], "prompts": counts}
        record = super().record()
        return {**record, "format": f"chat ({self.shape}; {record['format']})", "columns": self.columns,
                "template_columns": self.template_columns, "train_on": self.train_on,
                "chat": self.meta["train"]["chat"] if self.meta else None}


def chat_line(meta: Mapping[str, Any]) -> str:
    """One line of a packed part's counts: rows kept, skipped, truncated, tokens, packing efficiency."""
    c = meta.get("chat", {})
    return (f"{c.get('documents', 0)} of {c.get('rows', 0)} rows kept; {c.get('no_assistant', 0)} skipped with no "
            f"assistant turn; {c.get('truncated', 0)} truncated to data.seq_len={meta.get('seq_len')} "
            f"({c.get('cut_out', 0)} of them skipped: no target left); {meta.get('tokens', 0)} tokens "
            f"({c.get('targets', 0)} targets) in {meta.get('rows', 0)} rows, packing efficiency "
            f"{meta.get('efficiency', 0.0):.3f}")


def no_tokenizer() -> str:
    """The refusal for chat data on a model without a tokenizer, naming the models that bring one."""
    from framework.registry import MODELS

    bring = [n for n in MODELS.names() if callable(getattr(MODELS.get(n), "tokenizer_for", None))]
    return ("data=chat renders each row with a tokenizer's chat template, and the model brings no tokenizer (the "
            "framework's own models read bytes; a fresh model.config= has none); use a model that brings one: "
            f"{' or '.join(bring) or 'hf_causal_lm'} with model.name_or_path=<a Hub id or folder with a tokenizer> "
            "(or model.tokenizer=<one> beside a fresh config)")


def _template(value: str | None) -> str | None:
    """A chat template given as Jinja text or as the path of a file holding it."""
    if value and "{" not in value:
        path = Path(value).expanduser()
        if not path.is_file():
            raise InputError(f"data.chat_template={value}: neither a Jinja template nor a file holding one")
        return path.read_text(encoding="utf-8")
    return value or None


__all__ = ["BFD_WINDOW", "BestFit", "ChatData", "best_fit", "chat_line", "no_tokenizer"]

"""Chat rows as training documents: TRL's two shapes, rendered with the model's own tokenizer, loss on the answers.

A row is a conversation (`messages`: a list of {role, content, ...} messages, rendered with the tokenizer's chat
template together with the row's `tools`, `documents` and template arguments) or a `prompt` / `completion` pair
(strings, or message lists); `columns` maps other column names onto these. Each conversation is rendered once, whole,
and the assistant's tokens are found in that render (`framework.data.chat_render`): by the template's
`{% generation %}` markers where it has them, else by where each assistant turn's words land (the template's
generation prompt is not a target; the words, reasoning, tool calls and the end-of-turn token are; the template's
whitespace after that token is not). A template where that cannot be found exactly is refused by name.
Prompt/completion strings are tokenized as a model sees them at inference: the prompt alone (with the BOS the
tokenizer adds), then the completion and EOS; rows where that differs from tokenizing the joined text are counted.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from framework.data.chat_render import Renderer
from framework.data.chat_rows import drop_none, leading_specials, messages_of, names_in, refusal, scalar
from framework.data.packing import encode
from framework.errors import InputError

#: the shapes, by the columns that make them (TRL's names); `columns` maps a shape's names to the file's
SHAPES = {"messages": ("messages",), "prompt/completion": ("prompt", "completion")}
TRAIN_ON = ("assistant", "last", "all")
IGNORE = -100
#: columns a row's template reads when present (TRL's names); `chat_template_kwargs` holds more arguments as a dict
TEMPLATE_COLUMNS = ("tools", "documents")
KWARGS_COLUMN = "chat_template_kwargs"

Document = tuple[np.ndarray, "np.ndarray | None"]
Spans = list[tuple[int, int]]


def detect_shape(columns: Iterable[str], column_map: Mapping[str, str] | None = None) -> tuple[str, dict[str, str]]:
    """The row shape the columns make (`messages` first) and {shape's name: column}; InputError naming both shapes
    and the columns there when neither fits."""
    present, column_map = list(columns), dict(column_map or {})
    unknown = sorted(set(column_map) - {n for names in SHAPES.values() for n in names})
    if unknown:
        raise InputError(f"data.columns names {', '.join(map(repr, unknown))}; the keys it maps are "
                         f"{', '.join(n for names in SHAPES.values() for n in names)} (e.g. data.columns="
                         "{messages: conversations} or {prompt: question, completion: answer})")
    for shape, names in SHAPES.items():
        mapped = {name: column_map.get(name, name) for name in names}
        if all(column in present for column in mapped.values()):
            return shape, mapped
    wanted = "; ".join(f"{shape} needs {' and '.join(repr(column_map.get(n, n)) for n in names)}"
                       for shape, names in SHAPES.items())
    raise InputError(f"the rows have columns {', '.join(map(repr, present)) or '(none)'}, and neither "
                     f"shape fits ({wanted}); map yours with data.columns={{messages: <column>}} or "
                     "{prompt: <column>, completion: <column>}")


def template_columns(present: Iterable[str], kwargs: Iterable[str] = ()) -> dict[str, str]:
    """{template argument: column} for a source with columns `present`: `tools`, `documents` and
    `chat_template_kwargs` where present, and each of `kwargs` (data.template_kwargs=), which must be there."""
    present = list(present)
    missing = [c for c in kwargs if c not in present]
    if missing:
        raise InputError(f"data.template_kwargs names {', '.join(map(repr, missing))}, which the rows do not have; "
                         f"their columns: {', '.join(map(repr, present))}")
    found = {c: c for c in (*TEMPLATE_COLUMNS, KWARGS_COLUMN) if c in present}
    return {**found, **{c: c for c in kwargs}}


@dataclasses.dataclass
class ChatStats:
    """What rendering did to the rows, for the run's log and record."""

    rows: int = 0
    documents: int = 0
    no_assistant: int = 0  # conversations with no assistant turn: skipped
    truncated: int = 0  # longer than seq_len: cut to it
    cut_out: int = 0  # truncated until no target was left: skipped
    split_tokens: int = 0  # a token merged across the start of a target span: the pieces tokenized apart
    boundary: int = 0  # prompt/completion strings whose joined text tokenizes otherwise at the boundary
    tokens: int = 0
    targets: int = 0

    def line(self) -> str:
        """One log line; the counts a user would want to act on are named even when 0."""
        return (f"chat: {self.documents} of {self.rows} rows kept ({self.tokens} tokens, {self.targets} targets); "
                f"{self.no_assistant} skipped with no assistant turn, {self.truncated} truncated to seq_len "
                f"({self.cut_out} of them skipped: no target left), {self.split_tokens} tokenized apart at a target's "
                f"start, {self.boundary} prompt/completion rows tokenized apart from their joined text")


class ChatRenderer:
    """Renders rows of `shape` (`detect_shape`) into Documents (ids, labels with -100 where no loss is taken) with
    `tokenizer` (a transformers tokenizer). `train_on`: `assistant` (every assistant turn / the completion), `last`
    (the last assistant turn), `all` (every token). A row longer than `seq_len` is cut and counted, or refused with
    `truncate=False`. `chat_template` (a Jinja string) replaces the tokenizer's own. `template_columns`: {template
    argument: column} of what else a row gives its template (`template_columns()`)."""

    def __init__(self, tokenizer: Any, shape: str, columns: Mapping[str, str], train_on: str = "assistant",
                 seq_len: int | None = None, truncate: bool = True, chat_template: str | None = None,
                 template_columns: Mapping[str, str] | None = None):
        if train_on not in TRAIN_ON:
            raise InputError(f"data.train_on={train_on!r}; valid: {', '.join(TRAIN_ON)}")
        if shape not in SHAPES:
            raise InputError(f"chat shape {shape!r}; valid: {', '.join(SHAPES)}")
        self.tokenizer, self.shape, self.columns, self.train_on = tokenizer, shape, dict(columns), train_on
        self.seq_len, self.truncate = seq_len, truncate
        self.template_columns = dict(template_columns or {})
        self.template = chat_template or getattr(tokenizer, "chat_template", None)
        self.name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        self.eos = getattr(tokenizer, "eos_token_id", None)
        self.stats = ChatStats()
        self._renderer: Renderer | None = None
        self._lead: list[int] | None = None

    def check_template(self, needed: bool | None = None) -> None:
        """Refuse conversations (`needed`; default: when the rows are `messages`) with no chat template to render
        them."""
        if (self.shape == "messages" if needed is None else needed) and not self.template:
            raise InputError(f"data=chat: the rows are conversations, but the tokenizer {self.name!r} has no chat "
                             "template; use a chat / instruct model's tokenizer, set data.chat_template= (a Jinja "
                             "template or a file holding one), or give the rows as prompt/completion strings")

    @property
    def renderer(self) -> Renderer:
        self.check_template(needed=True)
        if self._renderer is None:
            self._renderer = Renderer(self.tokenizer, self.template, self.name)
        return self._renderer

    # ---- rows to documents ---------------------------------------------------------------------------------------
    def document(self, row: Mapping[str, Any], index: int) -> Document | None:
        """Row `index` as a Document, or None when it is skipped (no assistant turn, or truncated to no target)."""
        return self.documents([row], index)[0]

    def documents(self, rows: list[Mapping[str, Any]], start: int = 0,
                  indices: list[int] | None = None) -> list[Document | None]:
        """The Documents of `rows` (numbered from `start`, or by `indices`), None where a row is skipped; tokenized
        together."""
        indices = list(range(start, start + len(rows))) if indices is None else indices
        laid = []
        for index, row in zip(indices, rows, strict=True):
            missing = [c for c in self.columns.values() if c not in row]
            if missing:
                raise InputError(f"data=chat: row {index} has no {', '.join(map(repr, missing))} column; its "
                                 f"columns: {', '.join(map(repr, row))}")
            self.stats.rows += 1
            laid.append(self._lay(row, index))
        encoded = self._encode([lay for lay in laid if lay is not None and isinstance(lay[0], str)])
        out = []
        for lay in laid:
            if lay is None:
                self.stats.no_assistant += 1
                out.append(None)
                continue
            ids, targets = next(encoded) if isinstance(lay[0], str) else lay
            out.append(self._finish(ids, targets, indices[len(out)]))
        return out

    def _finish(self, ids: np.ndarray, targets: Spans | None, index: int) -> Document | None:
        labels = None
        if targets is not None:
            labels = np.full(len(ids), IGNORE, dtype=np.int64)
            for a, b in targets:
                labels[a:b] = ids[a:b]
            if not (labels != IGNORE).any():  # only empty assistant turns: nothing to learn, never an empty mask
                self.stats.no_assistant += 1
                return None
        if self.seq_len is not None and len(ids) > self.seq_len:
            if not self.truncate:
                raise InputError(f"data=chat: row {index} is {len(ids)} tokens, longer than data.seq_len="
                                 f"{self.seq_len}; raise data.seq_len, or set data.truncate=true to cut such rows")
            self.stats.truncated += 1
            ids = ids[: self.seq_len]
            labels = None if labels is None else labels[: self.seq_len]
            if labels is not None and not (labels != IGNORE).any():
                self.stats.cut_out += 1
                return None
        self.stats.documents += 1
        self.stats.tokens += len(ids)
        self.stats.targets += len(ids) if labels is None else int((labels != IGNORE).sum())
        return ids, labels

    def prompt_completion(self, row: Mapping[str, Any], index: int) -> tuple[np.ndarray, np.ndarray]:
        """A row's prompt ids (what a model is given, ending in the generation prompt) and completion ids (what it
        should produce, through the end token): the probes generate from the first. A `prompt`/`completion` row's
        completion is its assistant turns; a `messages` row's is its last assistant turn, its prompt the conversation
        before it. Both are cut from the row's one render, where its training mask finds the assistant's tokens."""
        last = self.shape == "messages"
        lay = self._lay(row, index, train_on="last" if last else "assistant")
        if lay is None:
            raise InputError(f"data=chat: row {index}'s {'conversation' if last else 'completion'} has no assistant "
                             "turn to generate")
        ids, targets = next(self._encode([lay])) if isinstance(lay[0], str) else lay
        return ids[: targets[0][0]], ids[targets[0][0]: targets[-1][1]]

    # ---- rendering ---------------------------------------------------------------------------------------------
    def _lay(self, row: Mapping[str, Any], index: int, train_on: str | None = None
             ) -> tuple[str, Spans | None] | tuple[np.ndarray, Spans | None] | None:
        """A row as (text, target character spans; None = every token) to tokenize, or as (ids, target token spans)
        for prompt/completion strings, or None for a conversation with no assistant turn."""
        train_on = train_on or self.train_on
        if self.shape == "prompt/completion":
            prompt, completion = (scalar(row[self.columns[n]]) for n in ("prompt", "completion"))
            if isinstance(prompt, str) and isinstance(completion, str):
                return self._strings(prompt, completion, train_on)
            if isinstance(prompt, str) or isinstance(completion, str):
                raise InputError(f"data=chat: row {index}'s prompt and completion are a {type(prompt).__name__} "
                                 f"and a {type(completion).__name__}; give both as strings or both as message lists")
            first = messages_of(prompt, index, self.columns["prompt"])
            messages = first + messages_of(completion, index, self.columns["completion"], len(first))
            pick = [k for k, m in enumerate(messages) if k >= len(first) and m["role"] == "assistant"]
        else:
            messages = messages_of(row[self.columns["messages"]], index, self.columns["messages"])
            pick = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
        if not pick and train_on != "all":
            return None
        tools, documents, kwargs = self._arguments(row, index)
        text, spans = self._render(messages, tools, documents, kwargs, index, pick, train_on)
        return text, spans

    def _render(self, messages: list[dict[str, Any]], tools: Any, documents: Any, kwargs: dict[str, Any],
                index: int, pick: list[int], train_on: str) -> tuple[str, Spans | None]:
        renderer = self.renderer
        try:
            text, blocks = renderer.render(messages, tools, documents, kwargs, spans=renderer.markers)
            names = names_in(tools)
            if names and not any(n in text for n in names):
                raise InputError(f"data=chat: row {index}: the chat template of {self.name!r} does not write the "
                                 f"row's tools ({', '.join(names)}), so the model would call tools it never saw "
                                 "defined; set data.chat_template= to a template that renders its `tools` argument")
            if train_on == "all":
                return text, None
            if renderer.markers:  # the template's own markers decide
                if self.shape == "prompt/completion":  # the blocks of the completion: after the prompt's render
                    prompt = [m for k, m in enumerate(messages) if k < pick[0]]
                    cut = len(renderer.render(prompt, tools, documents, kwargs, generation=True)[0]) if prompt else 0
                    blocks = [b for b in blocks if b[0] >= cut]
                return text, blocks[-1:] if train_on == "last" else blocks
            found = renderer.spans(messages, tools, documents, kwargs, text, index)
        except InputError:
            raise
        except Exception as err:  # noqa: BLE001 - the template refused the row: say which row and field
            raise InputError(refusal(err, messages, index, self.name)) from None
        for k in pick:  # a turn's tool calls the template does not write would train an empty turn: refused
            names = names_in(messages[k].get("tool_calls"))
            if names and not any(n in text[found[k][0]:found[k][1]] for n in names):
                raise InputError(f"data=chat: row {index}: the chat template of {self.name!r} does not write "
                                 f"messages[{k}]'s tool_calls ({', '.join(names)}), so the model would learn an empty "
                                 "turn; set data.chat_template= to a template that renders tool calls")
        chosen = pick[-1:] if train_on == "last" else pick
        return text, [found[k] for k in chosen]

    def _arguments(self, row: Mapping[str, Any], index: int) -> tuple[Any, Any, dict[str, Any]]:
        """The row's tools, documents and other template arguments (JSON strings read; datasets' None fill
        dropped)."""
        values = {}
        for name, column in self.template_columns.items():
            value = row.get(column)
            if isinstance(value, str) and name in (*TEMPLATE_COLUMNS, KWARGS_COLUMN):
                try:
                    value = json.loads(value)
                except ValueError:
                    raise InputError(f"data=chat: row {index}'s {column!r} is a string that is not JSON; give "
                                     f"{name} as a list (or a JSON string of one)") from None
            values[name] = drop_none(value)
        kwargs = dict(values.pop(KWARGS_COLUMN, None) or {})
        kwargs.update({k: v for k, v in values.items() if k not in TEMPLATE_COLUMNS})
        return values.get("tools"), values.get("documents"), kwargs

    # ---- tokens -----------------------------------------------------------------------------------------------
    def _encode(self, lays: list[tuple[str, Spans | None]]) -> Iterator[tuple[np.ndarray, Spans | None]]:
        """Each (text, character spans) as (ids, token spans). The text is tokenized in pieces cut at each span's
        ends, so a target's first token is what a model given the text before it would write next. A row where the
        whole text's tokenization would run a token across a target's start is counted (`split_tokens`), found on
        the 32 characters either side of each start (a tokenizer's merges reach no further)."""
        cuts = [[0, len(t)] if s is None else sorted({0, len(t), *(p for span in s for p in span)}) for t, s in lays]
        pieces = [t[a:b] for (t, _), c in zip(lays, cuts, strict=True) for a, b in zip(c, c[1:], strict=False)]
        near = []
        for text, spans in lays:
            for a, _ in spans or ():
                near += [text[max(0, a - 32):a], text[a:a + 32], text[max(0, a - 32):a + 32]]
        encoded = encode(self.tokenizer, pieces + near)
        checks = iter(encoded[len(pieces):])
        at = 0
        for (_, spans), c in zip(lays, cuts, strict=True):
            parts = encoded[at: at + len(c) - 1]
            at += len(c) - 1
            ids = np.asarray([i for p in parts for i in p], dtype=np.int64)
            if spans is None:
                yield ids, None
                continue
            merged = [list(next(checks)) + list(next(checks)) != list(next(checks)) for _ in spans]
            self.stats.split_tokens += any(merged)
            bound = dict(zip(c, np.cumsum([0] + [len(p) for p in parts]).tolist(), strict=True))
            yield ids, [(bound[a], bound[b]) for a, b in spans]

    def _strings(self, prompt: str, completion: str, train_on: str) -> tuple[np.ndarray, Spans | None]:
        """Prompt/completion strings as a model sees them: the tokenizer's BOS (where it adds one) and the prompt
        tokenized alone, then the completion and EOS (unless the completion ends with it)."""
        if self._lead is None:
            self._lead = leading_specials(self.tokenizer)
        first, second, joined = encode(self.tokenizer, [prompt, completion, prompt + completion])
        if list(first) + list(second) != list(joined):
            self.stats.boundary += 1
        eos = self.tokenizer.eos_token
        tail = [self.eos] if self.eos is not None and not (eos and completion.endswith(eos)) else []
        ids = np.asarray(self._lead + list(first) + list(second) + tail, dtype=np.int64)
        start = len(self._lead) + len(first)
        return ids, (None if train_on == "all" else [(start, len(ids))])


def documents(rows: Iterable[Mapping[str, Any]], renderer: ChatRenderer, start: int = 0) -> Iterator[Document]:
    """The Documents of `rows` (numbered from `start`), skipping those the renderer skips; InputError at the end
    if every row was skipped (no assistant turn anywhere, or every target truncated away)."""
    for index, row in enumerate(rows, start):
        doc = renderer.document(row, index)
        if doc is not None:
            yield doc
    if renderer.stats.documents == 0:
        raise InputError(f"data=chat: no row is left to train on: {renderer.stats.line()}")


__all__ = ["ChatRenderer", "ChatStats", "Document", "IGNORE", "KWARGS_COLUMN", "SHAPES", "TEMPLATE_COLUMNS",
           "TRAIN_ON", "detect_shape", "documents", "template_columns"]

"""Chat rows as training documents: TRL's two shapes, rendered with the model's own tokenizer, loss on the answers.

A row is a conversation (`messages`: a list of {role, content}, rendered with the tokenizer's chat template) or a
`prompt` / `completion` pair (strings, or message lists); `columns` maps other column names onto these. The loss
mask is found turn by turn, so a stock template without `{% generation %}` markers is masked right: assistant
turn k's targets are the tokens that rendering messages[:k+1] adds after messages[:k] with the generation prompt
(the header `<|im_start|>assistant\\n` is the prompt, the content and its end token `<|im_end|>` are targets;
template whitespace after the end token is not). Every render must start its successor, in text and in token ids;
a template that rewrites earlier turns (e.g. moves the system prompt into the last user turn) is refused by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from framework.data.packing import encode
from framework.errors import InputError

#: the shapes, by the columns that make them (TRL's names); `columns` maps a shape's names to the file's
SHAPES = {"messages": ("messages",), "prompt/completion": ("prompt", "completion")}
TRAIN_ON = ("assistant", "last", "all")
IGNORE = -100
#: ShareGPT's spelling of a message, read as TRL's
_SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system", "tool": "tool"}

Document = tuple[np.ndarray, "np.ndarray | None"]


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


@dataclasses.dataclass
class ChatStats:
    """What rendering did to the rows, for the run's log and record."""

    rows: int = 0
    documents: int = 0
    no_assistant: int = 0  # conversations with no assistant turn: skipped
    truncated: int = 0  # longer than seq_len: cut to it
    cut_out: int = 0  # truncated until no target was left: skipped
    split_tokens: int = 0  # a token merged across a turn boundary: the turns tokenized one by one
    tokens: int = 0
    targets: int = 0

    def line(self) -> str:
        """One log line; the counts a user would want to act on are named even when 0."""
        return (f"chat: {self.documents} of {self.rows} rows kept ({self.tokens} tokens, {self.targets} targets); "
                f"{self.no_assistant} skipped with no assistant turn, {self.truncated} truncated to seq_len "
                f"({self.cut_out} of them skipped: no target left), {self.split_tokens} tokenized turn by turn")


class ChatRenderer:
    """Renders one row of `shape` (`detect_shape`) into a Document (ids, labels with -100 where no loss is taken)
    with `tokenizer` (a transformers tokenizer). `train_on`: `assistant` (every assistant turn / the completion),
    `last` (the last assistant turn), `all` (every token). A row longer than `seq_len` is cut and counted, or
    refused with `truncate=False`. `chat_template` (a Jinja string) replaces the tokenizer's own."""

    def __init__(self, tokenizer: Any, shape: str, columns: Mapping[str, str], train_on: str = "assistant",
                 seq_len: int | None = None, truncate: bool = True, chat_template: str | None = None):
        if train_on not in TRAIN_ON:
            raise InputError(f"data.train_on={train_on!r}; valid: {', '.join(TRAIN_ON)}")
        if shape not in SHAPES:
            raise InputError(f"chat shape {shape!r}; valid: {', '.join(SHAPES)}")
        self.tokenizer, self.shape, self.columns, self.train_on = tokenizer, shape, dict(columns), train_on
        self.seq_len, self.truncate = seq_len, truncate
        self.template = chat_template or getattr(tokenizer, "chat_template", None)
        self.name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        self.eos = getattr(tokenizer, "eos_token_id", None)
        unk = getattr(tokenizer, "unk_token_id", None)
        self.ends = (set(getattr(tokenizer, "all_special_ids", ())) - {unk}) | ({self.eos} - {None})
        self.stats = ChatStats()

    def check_template(self, needed: bool | None = None) -> None:
        """Refuse conversations (`needed`; default: when the rows are `messages`) with no chat template to render
        them."""
        if (self.shape == "messages" if needed is None else needed) and not self.template:
            raise InputError(f"data=chat: the rows are conversations, but the tokenizer {self.name!r} has no chat "
                             "template; use a chat / instruct model's tokenizer, set data.chat_template= (a Jinja "
                             "template or a file holding one), or give the rows as prompt/completion strings")

    def document(self, row: Mapping[str, Any], index: int) -> Document | None:
        """Row `index` as a Document, or None when it is skipped (no assistant turn, or truncated to no target)."""
        missing = [c for c in self.columns.values() if c not in row]
        if missing:
            raise InputError(f"data=chat: row {index} has no {', '.join(map(repr, missing))} column; its columns: "
                             f"{', '.join(map(repr, row))}")
        self.stats.rows += 1
        spans = self._rendered(row, index)
        if spans is None:
            self.stats.no_assistant += 1
            return None
        ids, targets = spans
        labels = None
        if targets is not None:
            labels = np.full(len(ids), IGNORE, dtype=np.int64)
            for start, end in targets:
                labels[start:end] = ids[start:end]
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
        """A `prompt`/`completion` row's prompt ids (what a model is given, with the generation prompt) and its
        completion ids (what it should produce, through the end token): the probes generate from the first."""
        if self.shape != "prompt/completion":
            raise InputError(f"data=chat: prompt and completion ids need prompt/completion rows, these are "
                             f"{self.shape} (map columns with data.columns={{prompt: ..., completion: ...}})")
        ids, targets = self._rendered(row, index, train_on="assistant")
        (start, end), = targets
        return ids[:start], ids[start:end]

    # ---- rendering -------------------------------------------------------------------------------------------
    def _rendered(self, row: Mapping[str, Any], index: int,
                  train_on: str | None = None) -> tuple[np.ndarray, list[tuple[int, int]] | None] | None:
        """(ids, target spans; None = every token) of a row, None for a conversation with no assistant turn."""
        train_on = train_on or self.train_on
        if self.shape == "messages":
            messages = _messages(row[self.columns["messages"]], index, self.columns["messages"])
            turns = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
            if train_on == "all":
                return self._tokens([self._render(messages, index)])[0], None
            if not turns:
                return None
            return self._turns(messages, turns[-1:] if train_on == "last" else turns, index)
        prompt, completion = (_scalar(row[self.columns[n]]) for n in ("prompt", "completion"))
        if isinstance(prompt, str) and isinstance(completion, str):
            first, second = self._tokens([prompt, completion])
            tail = [self.eos] if self.eos is not None else []
            ids = np.asarray(list(first) + list(second) + tail, dtype=np.int64)
            return ids, (None if train_on == "all" else [(len(first), len(ids))])
        if isinstance(prompt, str) or isinstance(completion, str):
            raise InputError(f"data=chat: row {index}'s prompt and completion are a {type(prompt).__name__} and a "
                             f"{type(completion).__name__}; give both as strings or both as message lists")
        messages = _messages(prompt, index, self.columns["prompt"]) + \
            _messages(completion, index, self.columns["completion"])
        ids, spans = self._turns(messages, [len(prompt)], index, whole_tail=True)
        return ids, (None if train_on == "all" else spans)

    def _render(self, messages: list[dict[str, Any]], index: int, generation: bool = False) -> str:
        """The chat template's text for `messages` (with the generation prompt if asked)."""
        self.check_template(needed=True)
        continues = generation and bool(messages) and messages[-1]["role"] == "assistant"
        try:
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, chat_template=self.template, add_generation_prompt=generation and not
                continues, continue_final_message=continues)
        except Exception as err:
            if not _template_error(err):
                raise
            raise InputError(f"data=chat: the chat template of {self.name!r} refused row {index}'s first "
                             f"{len(messages)} messages: {err}") from None

    def _tokens(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids of each text, without the tokenizer's automatic special tokens (a template writes its own)."""
        return [np.asarray(ids, dtype=np.int64) for ids in encode(self.tokenizer, texts)]

    def _turns(self, messages: list[dict[str, Any]], turns: list[int], index: int,
               whole_tail: bool = False) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """Ids of the whole conversation and the target span of each turn in `turns`: from the end of the render of
        messages[:k] with the generation prompt to the end of messages[:k+1] (`whole_tail`: to the end)."""
        full = self._render(messages, index)
        texts, cuts = [full], []
        for k in turns:
            cuts += [self._render(messages[:k], index, generation=True),
                     full if whole_tail else self._render(messages[: k + 1], index)]
        before = ""
        for j, text in enumerate(cuts):  # each render starts the next, and the whole conversation
            for earlier, later in ((before, text), (text, full)):
                if not later.startswith(earlier):
                    self._unstable(turns[j // 2] + (j % 2), index, earlier, later)
            before = text
        ids = self._tokens(texts + cuts)
        whole, pieces = ids[0], ids[1:]
        if all(len(p) <= len(whole) and np.array_equal(whole[: len(p)], p) for p in pieces):
            bounds = [len(p) for p in pieces]
        else:  # a token spans a turn boundary: tokenize the pieces between boundaries one by one
            self.stats.split_tokens += 1
            edges = [0] + [len(t) for t in cuts] + [len(full)]
            parts = self._tokens([full[a:b] for a, b in zip(edges, edges[1:], strict=False)])
            whole = np.concatenate(parts) if parts else whole
            bounds = list(np.cumsum([len(p) for p in parts[:-1]]))
        spans = [(int(bounds[i]), self._end(whole, int(bounds[i]), int(bounds[i + 1])))
                 for i in range(0, len(bounds), 2)]
        return whole, spans

    def _end(self, ids: np.ndarray, start: int, end: int) -> int:
        """Where a turn's targets end: after its last special token (the end of turn); the template's whitespace
        after it is not for the model to produce. Without one, the whole turn."""
        for j in range(end - 1, start - 1, -1):
            if int(ids[j]) in self.ends:
                return j + 1
        return end

    def _unstable(self, k: int, index: int, before: str, text: str) -> None:
        """Refuse a template whose render of a conversation's start is not the start of a longer render."""
        at = next((i for i, (a, b) in enumerate(zip(before, text, strict=False)) if a != b), len(before))
        raise InputError(
            f"data=chat: the chat template of {self.name!r} is not prefix-stable: on row {index}, rendering its "
            f"first {k} messages and then more changes what was already rendered (at character {at}: "
            f"{before[at:at + 24]!r} became {text[at:at + 24]!r}), so the assistant's tokens cannot be found turn "
            "by turn and the loss mask is refused; set data.chat_template= to a template that renders earlier turns "
            "the same whatever follows, or data.train_on=all")


def _template_error(err: BaseException) -> bool:
    """True for jinja2's TemplateError (a template refusing a row), found by class without importing jinja2: only
    transformers' `apply_chat_template` needs it (transformers' `chat-template` extra)."""
    return any(c.__name__ == "TemplateError" and c.__module__.startswith("jinja2") for c in type(err).__mro__)


def _scalar(value: Any) -> Any:
    """A number read from a CSV column (datasets infers int / float) as its text; anything else as it is."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _messages(value: Any, index: int, column: str) -> list[dict[str, Any]]:
    """A row's message list as {role, content} dicts (ShareGPT's {from, value} with human/gpt roles is read too)."""
    if not isinstance(value, (list, tuple)):
        raise InputError(f"data=chat: row {index}'s {column!r} is a {type(value).__name__}, not a list of "
                         "{role, content} messages")
    out = []
    for message in value:
        if isinstance(message, Mapping) and "role" in message and "content" in message:
            out.append(dict(message))
        elif isinstance(message, Mapping) and "from" in message and "value" in message:
            role = _SHAREGPT_ROLES.get(str(message["from"]), str(message["from"]))
            out.append({"role": role, "content": message["value"]})
        else:
            got = sorted(message) if isinstance(message, Mapping) else type(message).__name__
            raise InputError(f"data=chat: row {index}'s {column!r} holds a message with {got}, not role and content "
                             "(or ShareGPT's from and value)")
    return out


def documents(rows: Iterable[Mapping[str, Any]], renderer: ChatRenderer, start: int = 0) -> Iterator[Document]:
    """The Documents of `rows` (numbered from `start`), skipping those the renderer skips; InputError at the end
    if every row was skipped (no assistant turn anywhere, or every target truncated away)."""
    for index, row in enumerate(rows, start):
        doc = renderer.document(row, index)
        if doc is not None:
            yield doc
    if renderer.stats.documents == 0:
        raise InputError(f"data=chat: no row is left to train on: {renderer.stats.line()}")


__all__ = ["ChatRenderer", "ChatStats", "Document", "IGNORE", "SHAPES", "TRAIN_ON", "detect_shape", "documents"]

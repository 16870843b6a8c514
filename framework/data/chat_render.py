"""One render of a conversation and the assistant's spans in it (`data=chat`'s loss mask, `framework.data.chat`).

Each conversation is rendered once, whole, as the model will see it: with its tools, documents and the template's
own arguments, through transformers' own renderer (the text is `apply_chat_template(..., tokenize=False)`'s). The
assistant's spans are found in that text:

- a template with `{% generation %}` markers: the markers decide (transformers' generation indices);
- otherwise, sentinels: the conversation is rendered a second time with each message's content between private-use
  sentinels; with the sentinels taken out that text must be the first one exactly (else the template is refused by
  name), so every message's content has a place. An assistant turn's targets start where the template's generation
  prompt ends (`<|im_start|>assistant\\n`: what a model is given before it writes) and end with the turn's
  end-of-turn token (found from the template itself: the token it writes after an assistant's words); the template's
  whitespace after that token is not a target. Reasoning, tool calls and anything else the template writes between
  the generation prompt and the end of the turn are the model's to write, so they are targets.

Both ways render each conversation a fixed number of times: building is linear in its turns.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from framework.errors import InputError

#: a message's content as rendered between sentinels: OPEN + index before, index + CLOSE after (private use planes)
OPEN, CLOSE, BASE = "\U000f0000", "\U000f0001", 0x100000
_SENTINEL = re.compile("\U000f0000[\U00100000-\U0010fffd]|[\U00100000-\U0010fffd]\U000f0001")
_MARKERS = re.compile(r"\{%-?\s*generation\s*-?%\}")
_PROBE_USER = "Qq"


def has_markers(template: str) -> bool:
    """True when the template marks the assistant's output with `{% generation %}` blocks."""
    return bool(_MARKERS.search(template))


@dataclasses.dataclass(frozen=True)
class Layout:
    """What a template writes around an assistant's turn, found once per template and arguments: the generation
    prompt (`opener`, with shorter cuts of it to try where a template renders earlier turns without part of it) and
    the end-of-turn texts (`stops`)."""

    opener: str
    cuts: tuple[str, ...]
    stops: tuple[str, ...]


class Renderer:
    """Renders conversations with `template` (Jinja) for `tokenizer` (its special tokens reach the template as
    `apply_chat_template` passes them) and finds the assistant's character spans. `name` names the template in
    refusals."""

    def __init__(self, tokenizer: Any, template: str, name: str):
        from jinja2 import TemplateError
        from transformers.utils.chat_template_utils import render_jinja_template

        self._render_jinja = render_jinja_template
        #: what a template's refusal of a conversation raises: its own `raise_exception`, or Python's on a value it
        #: does not take
        self.errors = (TemplateError, TypeError, ValueError, AttributeError, KeyError, IndexError)
        self.tokenizer, self.template, self.name = tokenizer, template, name
        self.markers = has_markers(template)
        self.special = dict(getattr(tokenizer, "special_tokens_map", {}) or {})
        self.controls = control_tokens(tokenizer)
        self._control = re.compile("|".join(map(re.escape, self.controls))) if self.controls else None
        self._layouts: dict[str, Layout] = {}

    # ---- rendering -------------------------------------------------------------------------------------------
    def render(self, messages: list[dict[str, Any]], tools: Any = None, documents: Any = None,
               kwargs: Mapping[str, Any] | None = None, generation: bool = False,
               spans: bool = False) -> tuple[str, list[tuple[int, int]]]:
        """The template's text for one conversation, and (`spans`) the `{% generation %}` blocks' character spans."""
        texts, indices = self._render_jinja(
            conversations=[messages], tools=tools, documents=documents, chat_template=self.template,
            return_assistant_tokens_mask=spans, add_generation_prompt=generation,
            **{**self.special, **dict(kwargs or {})})
        return texts[0], [tuple(s) for s in (indices[0] if indices else [])]

    # ---- the layout: the generation prompt and the end-of-turn tokens ------------------------------------------
    def layout(self, kwargs: Mapping[str, Any] | None = None) -> Layout:
        """The template's generation prompt and end-of-turn texts under `kwargs` (remembered per arguments)."""
        key = json.dumps(kwargs or {}, sort_keys=True, default=str)
        if key not in self._layouts:
            self._layouts[key] = self._probe(kwargs)
        return self._layouts[key]

    def _probe(self, kwargs: Mapping[str, Any] | None) -> Layout:
        user = [{"role": "user", "content": _PROBE_USER}]
        try:
            plain, _ = self.render(user, kwargs=kwargs)
            prompted, _ = self.render(user, kwargs=kwargs, generation=True)
        except self.errors:  # a template that needs more than one user turn: no generation prompt known
            plain = prompted = ""
        # the generation prompt: what rendering with it adds (a template may end a plain render with its EOS instead)
        common = next((i for i, (a, b) in enumerate(zip(plain, prompted, strict=False)) if a != b),
                      min(len(plain), len(prompted)))
        opener = prompted[common:]
        stops: list[str] = []
        probe = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": "Aa"},
                 {"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": "Bb"}]
        try:
            text, places = self.sentinel_render(probe, None, None, kwargs, range(4))
        except self.errors:  # the rows will meet the template's own refusal
            text, places = "", {}
        for k in (1, 3):
            if k in places:
                stop = self._first_control(text, places[k][1], len(text))
                if stop is not None:
                    stops.append(text[stop[0]:stop[1]])
        stops += self._tool_call_stop(opener, kwargs)
        eos = self.special.get("eos_token")
        if eos:
            stops.append(eos)
        cuts = tuple(c for c in _cuts(opener, self._control) if c not in plain)  # never what opens a user's turn
        return Layout(opener, cuts, tuple(dict.fromkeys(s for s in stops if s)))

    def _tool_call_stop(self, opener: str, kwargs: Mapping[str, Any] | None) -> list[str]:
        """The token that ends an assistant turn of tool calls (gpt-oss's `<|call|>`): the last control token
        before the tool result's turn opens (with the token that opens every turn, as the opener does)."""
        first = self._control.match(opener) if self._control is not None and opener else None
        if first is None:
            return []
        for arguments in ({"x": "1"}, '{"x": "1"}'):
            call = {"type": "function", "function": {"name": "f", "arguments": arguments}}
            probe = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "tool_calls": [call]},
                     {"role": "tool", "name": "f", "content": "Tt"}]
            try:
                text, places = self.sentinel_render(probe, None, None, kwargs, {0, 2})
            except self.errors:  # a template without tool calls, or wanting them otherwise
                continue
            if 0 not in places or 2 not in places or places[2][0] < 0:
                continue
            low, high = places[0][1], places[2][0]
            at = text.find(opener, low, high)
            header = text.rfind(first.group(), low, high)
            if at < 0 or header <= at:
                continue
            last = None
            for match in self._control.finditer(text, at + len(opener), header):
                last = match
            return [] if last is None else [last.group()]
        return []

    def _first_control(self, text: str, start: int, end: int) -> tuple[int, int] | None:
        match = self._control.search(text, start, end) if self._control else None
        return None if match is None else match.span()

    # ---- sentinels -----------------------------------------------------------------------------------------------
    def sentinel_render(self, messages: list[dict[str, Any]], tools: Any, documents: Any,
                        kwargs: Mapping[str, Any] | None, wrap: Any, strip: bool = False
                        ) -> tuple[str, dict[int, tuple[int, int]]]:
        """The render with the contents of the messages in `wrap` between sentinels, the sentinels taken out, and
        each wrapped message's content span in it ({message index: (start, end)}; a side the template dropped is
        -1)."""
        wrapped = [_wrap(m, k, strip) if k in wrap else m for k, m in enumerate(messages)]
        text, _ = self.render(wrapped, tools, documents, kwargs)
        places: dict[int, list[int]] = {}
        out, last, removed = [], 0, 0
        for match in _SENTINEL.finditer(text):
            a, b = match.span()
            out.append(text[last:a])
            token = match.group()
            opening = token[0] == OPEN
            k = ord(token[1] if opening else token[0]) - BASE
            places.setdefault(k, [-1, -1])[0 if opening else 1] = a - removed
            removed += b - a
            last = b
        out.append(text[last:])
        return "".join(out), {k: (v[0], v[1]) for k, v in places.items()}

    def spans(self, messages: list[dict[str, Any]], tools: Any, documents: Any, kwargs: Mapping[str, Any] | None,
              text: str, index: int) -> dict[int, tuple[int, int]]:
        """Each assistant message's target span in `text` (the conversation's render), {message index: span}."""
        wrap_all = range(len(messages))
        assistant = [k for k, m in enumerate(messages) if m.get("role") == "assistant"]
        places = None
        for wrap, strip in ((wrap_all, False), (assistant, False), (wrap_all, True), (assistant, True)):
            try:
                again, found = self.sentinel_render(messages, tools, documents, kwargs, set(wrap), strip)
            except self.errors:  # wrapping changed what the template accepts: try the next way
                continue
            if again == text:
                places = found
                break
        if places is None:
            raise InputError(
                f"data=chat: the chat template of {self.name!r} renders row {index} differently when its messages' "
                "words are marked, so the assistant's tokens cannot be found exactly and the loss mask is refused; "
                "set data.chat_template= to a template with {% generation %} markers around the assistant's output "
                "(transformers' assistant mask), or data.train_on=all")
        return self._assistant_spans(messages, tools, documents, kwargs, text, places, assistant, index)

    def _assistant_spans(self, messages: list[dict[str, Any]], tools: Any, documents: Any,
                         kwargs: Mapping[str, Any] | None, text: str, places: dict[int, tuple[int, int]],
                         assistant: list[int], index: int) -> dict[int, tuple[int, int]]:
        layout = self.layout(kwargs)
        ends = {k: e for k, (_, e) in places.items() if e >= 0}
        starts = {k: s for k, (s, _) in places.items() if s >= 0}
        spans: dict[int, tuple[int, int]] = {}
        opened: dict[int, int] = {}  # where each assistant turn's opener begins
        done = 0  # the end of the last target span
        for k in assistant:
            anchor = starts.get(k, ends.get(k))
            own = anchor is not None
            if not own:  # no words rendered (a tool call alone): up to the next message's words
                anchor = min((p for j, p in {**ends, **starts}.items() if j > k and p >= done), default=len(text))
            low = max([done] + [e for j, e in ends.items() if j < k and e <= anchor])
            begin = self._open(text, low, anchor, layout, own)
            if begin is None:  # the template opens this turn otherwise here (DeepSeek's after a tool's output)
                begin = self._prompted(messages[:k], tools, documents, kwargs, text, low, anchor)
            if begin is None:
                raise InputError(
                    f"data=chat: the chat template of {self.name!r}: row {index}'s assistant turn "
                    f"(messages[{k}]) does not follow the template's generation prompt {layout.opener!r}, so where "
                    "its tokens start is unknown and the loss mask is refused; set data.chat_template= to a template "
                    "with {% generation %} markers around the assistant's output, or data.train_on=all")
            opened[k], start = begin
            spans[k] = (start, -1)
            done = start
        for n, k in enumerate(assistant):
            start = spans[k][0]
            after = max(start, ends.get(k, start))
            bound = min([p for j, p in starts.items() if j > k and p >= after] +
                        [opened[j] for j in assistant[n + 1:] if opened[j] >= after] + [len(text)])
            stop = self._last_stop(text, after, bound, layout)
            if stop is None:
                if k not in ends:
                    raise InputError(
                        f"data=chat: the chat template of {self.name!r}: row {index}'s assistant turn "
                        f"(messages[{k}]) has no end-of-turn token ({', '.join(layout.stops) or 'none found'}), so "
                        "where its tokens end is unknown and the loss mask is refused; set data.chat_template= to a "
                        "template with {% generation %} markers around the assistant's output, or "
                        "data.train_on=all")
                stop = ends[k]
            spans[k] = (start, stop)
        return spans

    def _open(self, text: str, low: int, anchor: int, layout: Layout, own: bool = True) -> tuple[int, int] | None:
        """(where the opener begins, where the targets start) of an assistant turn between `low` and `anchor` (the
        turn's own words when `own`, else the next message's): the first place of the generation prompt (or its
        longest cut found). A template with no generation prompt (Mistral's `[INST]` ones): after the last control
        token before the turn's words, or the first one after the message before it."""
        for cut in layout.cuts:
            at = text.find(cut, low, anchor)
            if at >= 0:
                return at, at + len(cut)
        if layout.opener:
            return None
        matches = list(self._control.finditer(text, low, anchor)) if self._control is not None else []
        if not matches:
            return (anchor, anchor) if own else None
        end = (matches[-1] if own else matches[0]).end()
        return end, end

    def _prompted(self, before: list[dict[str, Any]], tools: Any, documents: Any, kwargs: Mapping[str, Any] | None,
                  text: str, low: int, anchor: int) -> tuple[int, int] | None:
        """Where a turn starts by rendering the conversation before it with the generation prompt (one more render,
        for a turn the template opens otherwise than its first one): the prompt must start the whole text."""
        try:
            prompt, _ = self.render(before, tools, documents, kwargs, generation=True)
        except self.errors:  # e.g. a template that wants a prompt to end on a user's turn
            return None
        if low <= len(prompt) <= anchor and text.startswith(prompt):
            return len(prompt), len(prompt)
        return None

    def _last_stop(self, text: str, start: int, bound: int, layout: Layout) -> int | None:
        """The end of the last end-of-turn token between `start` and `bound`; one that follows another across
        whitespace only is the template's own after the turn (Phi-3.5's EOS after the last turn), not the turn's."""
        if not layout.stops:
            return None
        found = [m.span() for m in re.finditer("|".join(map(re.escape, layout.stops)), text[start:bound])]
        if not found:
            return None
        k = len(found) - 1
        while k > 0 and not text[start + found[k - 1][1]: start + found[k][0]].strip():
            k -= 1
        return start + found[k][1]


def _cuts(opener: str, control: re.Pattern | None) -> tuple[str, ...]:
    """The opener and its shorter cuts (ending at a line break or a control token), longest first: a template may
    write earlier turns without the tail of its generation prompt (Qwen3's empty reasoning block)."""
    if not opener:
        return ()
    ends = {len(opener)} | {i + 1 for i, c in enumerate(opener) if c == "\n"}
    if control is not None:
        ends |= {m.end() for m in control.finditer(opener)}
    cuts = [opener[:e] for e in sorted(ends, reverse=True)]
    first = control.search(opener) if control is not None else None
    floor = first.end() if first is not None and first.start() == 0 else 1
    # a cut holds at least the opener's first control token (whether that alone opens other roles' turns too, as
    # `<|im_start|>` does, the caller checks against a user's turn)
    return tuple(c for c in cuts if len(c) >= floor)


def _wrap(message: dict[str, Any], k: int, strip: bool) -> dict[str, Any]:
    """`message` with its content between sentinels (the first and the last text part of a list of parts)."""
    content = message.get("content")
    before, after = OPEN + chr(BASE + k), chr(BASE + k) + CLOSE
    if isinstance(content, str):
        if not content.strip() if strip else not content:
            return message  # an empty content changes what a template tests (`if message.content`)
        return {**message, "content": before + (content.strip() if strip else content) + after}
    if isinstance(content, list):
        texts = [i for i, p in enumerate(content) if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
        if not texts:
            return message
        parts = [dict(p) if isinstance(p, Mapping) else p for p in content]
        first, last = texts[0], texts[-1]
        parts[first]["text"] = before + parts[first]["text"]
        parts[last]["text"] = parts[last]["text"] + after
        return {**message, "content": parts}
    return message


def control_tokens(tokenizer: Any) -> tuple[str, ...]:
    """The tokenizer's added and special tokens as text, longest first (a template's control tokens)."""
    names = set(getattr(tokenizer, "all_special_tokens", ()) or ())
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    names |= {str(getattr(t, "content", t)) for t in decoder.values()}
    return tuple(sorted((n for n in names if n), key=len, reverse=True))


__all__ = ["Layout", "Renderer", "control_tokens", "has_markers"]

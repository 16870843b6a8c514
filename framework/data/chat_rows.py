"""Reading a chat row's fields as a template takes them, and naming the row and field when one cannot be taken."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from framework.errors import InputError

#: what a message says: its content, or (an assistant's) tool calls or reasoning in their place
_SAYS = {"content", "tool_calls", "reasoning_content", "thinking", "reasoning"}
#: ShareGPT's spelling of a message, read as TRL's
_SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system", "tool": "tool"}


def names_in(calls: Any) -> list[str]:
    """The function names in a list of tools or tool calls (OpenAI's {type, function: {name}} or {name})."""
    names = []
    for call in calls or []:
        if isinstance(call, Mapping):
            inner = call.get("function") if isinstance(call.get("function"), Mapping) else call
            if isinstance(inner.get("name"), str) and inner["name"]:
                names.append(inner["name"])
    return names


def leading_specials(tokenizer: Any) -> list[int]:
    """The ids a tokenizer puts before a text on its own (Llama 3's BOS), found by tokenizing one word both ways."""
    plain = list(tokenizer("a", add_special_tokens=False)["input_ids"])
    full = list(tokenizer("a", add_special_tokens=True)["input_ids"])
    for k in range(len(full) - len(plain) + 1):
        if full[k: k + len(plain)] == plain:
            return full[:k]
    return []


def refusal(err: BaseException, messages: list[dict[str, Any]], index: int, name: str) -> str:
    """What a template's failure on row `index` was, naming the field that caused it where one can be told."""
    said = " ".join(str(err).split())[:240] or type(err).__name__
    for k, m in enumerate(messages):
        content = m.get("content")
        if isinstance(content, list) and not isinstance(err, _TemplateErrorTypes()):
            return (f"data=chat: row {index}: messages[{k}].content is a list of parts, and the chat template of "
                    f"{name!r} takes strings ({type(err).__name__}: {said}); join the parts' text into one string, "
                    "or set data.chat_template= to a template that reads parts")
    hint = ""
    if messages and messages[0].get("role") == "assistant":
        hint = "; messages[0] is an assistant turn, and this template wants the conversation to open otherwise"
    elif not _TemplateErrorTypes() or not isinstance(err, _TemplateErrorTypes()):
        hint = f" ({type(err).__name__})"
    return f"data=chat: row {index}: the chat template of {name!r} refused the conversation: {said}{hint}"


def _TemplateErrorTypes() -> tuple[type, ...]:  # noqa: N802 - a tuple of types, as isinstance takes it
    try:
        from jinja2 import TemplateError
    except ImportError:
        return ()
    return (TemplateError,)


def drop_none(value: Any) -> Any:
    """`value` without the None-valued keys `datasets` fills in where rows' dicts differ (nested too)."""
    if isinstance(value, Mapping):
        return {k: drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [drop_none(v) for v in value]
    return value


def scalar(value: Any) -> Any:
    """A number read from a CSV column (datasets infers int / float) as its text; anything else as it is."""
    return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def messages_of(value: Any, index: int, column: str, first: int = 0) -> list[dict[str, Any]]:
    """A row's message list as dicts (ShareGPT's {from, value} with human/gpt roles read too; None-valued keys, which
    `datasets` fills in, dropped), each checked for what a template needs: a role, and content that is a string, a
    list of parts or absent. `first` numbers the messages (a completion's follow its prompt's)."""
    if not isinstance(value, (list, tuple)):
        raise InputError(f"data=chat: row {index}'s {column!r} is a {type(value).__name__}, not a list of "
                         "{role, content} messages")
    if not value:
        raise InputError(f"data=chat: row {index}'s {column!r} is an empty list of messages")
    out = []
    for k, message in enumerate(value, first):
        where = f"row {index}: {column}[{k - first}]"
        if not isinstance(message, Mapping):
            raise InputError(f"data=chat: {where} is a {type(message).__name__}, not a message (a dict with role and "
                             "content)")
        if "from" in message and "value" in message and "role" not in message:
            message = {"role": _SHAREGPT_ROLES.get(str(message["from"]), str(message["from"])),
                       "content": message["value"]}
        message = {key: drop_none(v) for key, v in message.items() if v is not None}
        if not isinstance(message.get("role"), str) or not (set(message) & _SAYS):
            raise InputError(f"data=chat: {where} has no {'role' if 'role' not in message else 'content'} (its keys: "
                             f"{', '.join(map(repr, message)) or 'none'}); a message is {{role, content}} (or "
                             "ShareGPT's {from, value}; an assistant's tool_calls or reasoning may stand for content)")
        content = message.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise InputError(f"data=chat: {where}.content is a {type(content).__name__} ({content!r:.40}); a "
                             "message's content is a string (or a list of {type: text, text: ...} parts where the "
                             "template reads them)")
        out.append(message)
    return out


__all__ = ["drop_none", "leading_specials", "messages_of", "names_in", "refusal", "scalar"]

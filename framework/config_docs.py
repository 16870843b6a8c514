"""What a config key means, read from the docstrings: a small reader of Google-style `Args:` sections (also torch's
and Lightning's `name (type, optional): text`), and where each registered name's task guide is.

`meanings(target)` maps each parameter of a class (its class docstring, then `__init__`'s, then its bases') or a
function to the first sentence of its entry. `framework.ls KIND NAME` and the configuration reference
(docs/reference/config.md) print these; neither imports anything beyond the component itself.
"""

from __future__ import annotations

import fnmatch
import inspect
import re
from typing import Any

#: section headers that open a parameter list (Google style; numpy's underlined `Parameters` is not read)
ARGS_HEADERS = ("Args:", "Arguments:", "Parameters:", "Params:", "Keyword Args:", "Keyword Arguments:")
_ENTRY = re.compile(r"^(\*{0,2}\w+)\s*(\([^()]*(?:\([^()]*\)[^()]*)*\))?\s*:(?:\s+(.*))?$")
_SECTION = re.compile(r"^[A-Z][A-Za-z ]*:$")  # `Returns:`, `Raises:`, `Example:` ... end the Args section
_DEFAULT = re.compile(r"\s*[(\[]?\s*default(?:s)?\s*(?:is|:|=)\s*[^()]*(?:\([^()]*\)[^()]*)*[)\]]?\s*\.?\s*$", re.I)
_ROLE = re.compile(r":\w+:`~?([^`]+)`")  # :class:`x`, :func:`~a.b`
MAX_MEANING = 200
_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\betc)(?<!\bvs)\.(?=\s)")


def parse_args(doc: str | None) -> dict[str, str]:
    """Each entry of the `Args:` sections of `doc` (a docstring, already dedented or not), name → its one-line
    meaning (`one_line`). Entries are `name: text` or `name (type, optional): text`; deeper-indented lines continue
    an entry; a dedent or another section header ends the section."""
    found: dict[str, str] = {}
    lines = inspect.cleandoc(doc or "").splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() in ARGS_HEADERS:
            i = _read_section(lines, i + 1, _indent(lines[i]), found)
        else:
            i += 1
    return found


def _read_section(lines: list[str], i: int, header_indent: int, found: dict[str, str]) -> int:
    """Read the entries from line `i` on into `found`; returns the line after the section."""
    entry_indent, name, text = None, None, []
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            text.append("")
            i += 1
            continue
        indent = _indent(line)
        if indent <= header_indent or (entry_indent is not None and indent < entry_indent):
            break
        match = _ENTRY.match(line.strip())
        if entry_indent is None or (indent == entry_indent and match):
            if name is not None:
                found.setdefault(name, one_line(text))
            if not match:
                break
            entry_indent, name, text = indent, match.group(1).lstrip("*"), [match.group(3) or ""]
        elif _SECTION.match(line.strip()) and indent <= entry_indent:
            break
        else:
            text.append(line.strip())
        i += 1
    if name is not None:
        found.setdefault(name, one_line(text))
    return i


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def one_line(text: list[str]) -> str:
    """The first sentence of an entry (its first paragraph's lines joined; one longer than `MAX_MEANING` characters
    is cut at the end of the entry's first line), with RST markup made Markdown and torch's `(default: ...)` and
    Lightning's `Default: ...` dropped: the reference prints the config's own default beside it."""
    lines = [t.strip() for t in text]
    while lines and not lines[0]:
        lines.pop(0)
    paragraph = " ".join(lines[: lines.index("")] if "" in lines else lines)
    end = _SENTENCE_END.search(paragraph)
    sentence = paragraph[: end.start() + 1] if end else paragraph
    if len(sentence) > MAX_MEANING and lines:
        sentence = lines[0]
    sentence = _ROLE.sub(r"`\1`", sentence).replace("``", "`")
    sentence = _DEFAULT.sub("", sentence).strip()
    return sentence.rstrip(":,;").strip()


def meanings(target: Any) -> dict[str, str]:
    """Parameter name → one-line meaning for a class (its docstring, its `__init__`'s, then its bases' the same
    way; the first found wins) or any other callable (its own docstring, then the one it wraps)."""
    found: dict[str, str] = {}
    if inspect.isclass(target):
        for cls in inspect.getmro(target):
            if cls is object:
                continue
            for doc in (cls.__dict__.get("__doc__"), getattr(cls.__dict__.get("__init__"), "__doc__", None)):
                for key, value in parse_args(doc).items():
                    found[key] = found.get(key) or value
        return found
    seen = set()
    while target is not None and id(target) not in seen:
        seen.add(id(target))
        for key, value in parse_args(getattr(target, "__doc__", None)).items():
            found[key] = found.get(key) or value
        target = getattr(target, "__wrapped__", None) or getattr(target, "func", None)  # functools.wraps / partial
    return found


def dotted_path(target: Any) -> str:
    """`module.QualName` of a class or function (what hydra-zen writes as `_target_`)."""
    module = getattr(target, "__module__", None) or type(target).__module__
    return f"{module}.{getattr(target, '__qualname__', type(target).__qualname__)}"


#: kind → (shell wildcards separated by '|', the docs page under docs/): the task guide of each registered name; the
#: first match wins, a name no pattern matches has none (tests/test_config_reference.py checks each page names it)
GUIDES: dict[str, list[tuple[str, str]]] = {
    "model": [("hf_*", "hf_models.md"), ("timm|convnet", "images.md"), ("mlp", "data_agent.md"),
              ("moe_transformer", "growth.md")],
    "module": [("mdlm", "mdlm.md"), ("classifier", "images.md"), ("duo_attention|random_heads|rlkv", "rlkv.md"),
               ("causal_lm", "fine_tuning.md"), ("metric_eval", "gicdm.md")],
    "optimizer": [("olion|muon|lion|ortho_momentum", "olion.md")],
    "loss": [("*", "mdlm.md")],
    "metric": [("gicdm", "gicdm.md")],
    "callback": [("orthogonal_growth", "growth.md"), ("data_selection", "data_agent.md"), ("hub_push", "hub.md"),
                 ("mask_sweep", "mdlm.md")],
    "sampler": [("*", "data_agent.md")],
    "data": [("text|chat", "data.md"), ("images", "images.md"), ("hubness_sweep", "gicdm.md"),
             ("digits*|synth_classes", "data_agent.md"), ("byte_corpus", "data.md"), ("needle|kv_recall", "mdlm.md"),
             ("pointer_chase", "rlkv.md")],
    "peft": [("*", "fine_tuning.md")],
    "recipe": [("sft", "fine_tuning.md"), ("char_lm|olion_char_lm", "olion.md"), ("mdlm_*", "mdlm.md"),
               ("rlkv_probe|pointer_chase_lm", "rlkv.md"), ("data_agent_digits|selection_compare", "data_agent.md"),
               ("gicdm_eval", "gicdm.md"), ("moe_growth*", "growth.md")],
    "strategy": [("fsdp2", "olion.md")],
}


def guide(kind: str, name: str) -> str | None:
    """The docs page (under docs/, e.g. `olion.md`) that is the task guide for registered name `name`, or None."""
    for patterns, page in GUIDES.get(kind, []):
        if any(fnmatch.fnmatchcase(name, p) for p in patterns.split("|")):
            return page
    return None

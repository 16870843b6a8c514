"""data=chat's loss mask on the stock chat templates of the families users fine-tune (tests/support/chat_families.py):
multi-turn rows, tool calls with the row's `tools`, reasoning, and two assistant turns in a row.

For every family and conversation: the ids are the template's own render, unchanged; every assistant turn's words
and its end-of-turn token are targets, and nothing of the user's, system's or tool's turns is; each target span
starts where rendering the conversation up to that turn with the generation prompt ends (the turn-by-turn reading,
where the template renders that prefix unchanged); where TRL ships a training copy of the template with
`{% generation %}` markers that renders the same text, transformers' assistant mask on it agrees (less the opener
some copies mark and the whitespace after the end token, which we do not train on). A conversation the template
itself refuses is refused for that row, by name. `WHAT_IS_TRAINED` is the table docs/data.md quotes.
"""

from __future__ import annotations

import functools

import pytest
from support.chat_families import FAMILIES, available, family_tokenizer, template_text
from support.tiny_chat import target_runs

from framework.data.chat import ChatRenderer
from framework.errors import InputError

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city."}},
                   "required": ["city"]}}}]
CALL = {"id": "call00042", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
CONVERSATIONS = {
    "multi_turn": [
        {"role": "system", "content": "Answer in few words."},
        {"role": "user", "content": "What colour is the sky?"},
        {"role": "assistant", "content": "Blue by day."},
        {"role": "user", "content": "And grass, at noon?"},
        {"role": "assistant", "content": "Green, mostly."}],
    "tools": [
        {"role": "user", "content": "Is it warm in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "name": "get_weather", "tool_call_id": "call00042", "content": "Sunny and 24 degrees."},
        {"role": "assistant", "content": "Yes, sunny and warm."}],
    "reasoning": [
        {"role": "user", "content": "What is two plus two?"},
        {"role": "assistant", "reasoning_content": "Adding two twos gives four.", "content": "Four."},
        {"role": "user", "content": "And times three?"},
        {"role": "assistant", "reasoning_content": "Four times three is twelve.", "content": "Twelve."}],
    "two_in_a_row": [
        {"role": "user", "content": "Describe the sea."},
        {"role": "assistant", "content": "Grey in winter."},
        {"role": "assistant", "content": "Also grey at night."}],
}
FAMILY_NAMES = sorted(FAMILIES)

#: what is trained, per family, as measured below (and quoted in docs/data.md): for a multi-turn row with a system
#: prompt, a tool call with the row's tools, reasoning given as `reasoning_content`, two assistant turns in a row
WHAT_IS_TRAINED = {
    "chatml": ("trained", "refused: writes no tools", "not written", "trained"),
    "deepseek_r1_distill": ("trained", "refused: writes no tools", "not written", "trained"),
    "gemma2": ("the template refuses", "the template refuses", "not written", "the template refuses"),
    "gemma3": ("trained", "the template refuses", "not written", "the template refuses"),
    "gptoss": ("trained", "trained", "the last turn's", "trained"),
    "granite3": ("trained", "refused: writes no tool calls", "not written", "trained"),
    "llama3_1": ("trained", "trained", "not written", "trained"),
    "llama3_2": ("trained", "trained", "not written", "trained"),
    "llama3_3": ("trained", "trained", "not written", "trained"),
    "mistral_small": ("trained", "trained", "not written", "trained"),
    "mistral_v0_3": ("trained", "trained", "not written", "the template refuses"),
    "olmo2": ("trained", "refused: writes no tools", "not written", "trained"),
    "phi3_5": ("trained", "refused: writes no tools", "not written", "trained"),
    "phi4": ("trained", "refused: writes no tools", "not written", "trained"),
    "qwen2_5": ("trained", "trained", "not written", "trained"),
    "qwen3": ("trained", "trained", "the last turn's", "trained"),
    "qwq": ("trained", "trained", "not written", "trained"),
    "smollm3": ("trained", "refused: writes no tools", "not written", "trained"),
}


def run(family: str, conversation: list[dict], tools=None, train_on: str = "assistant"):
    tok = family_tokenizer(family)
    chat = ChatRenderer(tok, "messages", {"messages": "messages"}, train_on,
                        template_columns={"tools": "tools"} if tools else None)
    row = {"messages": conversation, **({"tools": tools} if tools else {})}
    return tok, chat, row


@functools.cache
def trained(family: str, kind: str) -> dict:
    """The measured facts of one family on one conversation (for the checks and the table; measured once per
    process)."""
    conversation = CONVERSATIONS[kind]
    tools = TOOLS if kind == "tools" else None
    tok, chat, row = run(family, conversation, tools)
    try:
        expected = tok.apply_chat_template(conversation, tools=tools, tokenize=False)
    except Exception as err:  # noqa: BLE001 - the template's own refusal
        with pytest.raises(InputError, match=r"row 3: the chat template of 'tiny-.*' refused the conversation"):
            chat.documents([row], 3)
        return {"refused": "the template refuses", "why": str(err)}
    try:
        doc = chat.documents([row], 3)[0]
    except InputError as err:  # ours, by name: the template drops what the row holds
        assert kind == "tools" and "does not write" in str(err), f"{family}/{kind}: {err}"
        what = "tools" if "the row's tools" in str(err) else "tool calls"
        return {"refused": f"refused: writes no {what}", "why": str(err)}
    assert doc is not None, f"{family}/{kind}: no target"
    ids, labels = doc
    assert tok.decode(ids) == expected  # one render, unchanged
    text, spans = chat._lay(row, 3)
    return {"text": text, "spans": spans, "runs": target_runs(tok, doc), "tokenizer": tok,
            "conversation": conversation, "tools": tools}


def measured(family: str) -> tuple[str, str, str, str]:
    """One row of the table: multi-turn, tool calls, reasoning (whose turns' reasoning is trained), two in a row."""
    out = []
    for kind in ("multi_turn", "tools", "reasoning", "two_in_a_row"):
        facts = trained(family, kind)
        if "refused" in facts:
            out.append(facts["refused"])
        elif kind != "reasoning":
            out.append("trained")
        else:
            joined = "\n".join(facts["runs"])
            kept = [m["reasoning_content"] in joined for m in CONVERSATIONS[kind] if m.get("reasoning_content")]
            out.append({(True, True): "every turn's", (False, True): "the last turn's",
                        (False, False): "not written"}.get(tuple(kept), str(kept)))
    return tuple(out)


def rendered_assistant_words(conversation, text):
    """The assistant contents (and reasoning) that the render holds, in order."""
    words = []
    for m in conversation:
        if m["role"] == "assistant":
            for key in ("reasoning_content", "content"):
                if m.get(key) and m[key] in text:
                    words.append(m[key])
    return words


@pytest.mark.parametrize("kind", sorted(CONVERSATIONS))
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_every_assistant_turn_and_its_end_token_are_targets_and_nothing_else(family, kind):
    if not available(family):
        pytest.skip(f"no copy of {family}'s template in tests/fixtures/chat_templates")
    facts = trained(family, kind)
    if "refused" in facts:
        return
    text, spans, runs = facts["text"], facts["spans"], facts["runs"]
    ends = FAMILIES[family][5] + (FAMILIES[family][3],)
    joined = "\n".join(runs)
    for words in rendered_assistant_words(facts["conversation"], text):
        assert words in joined, f"{family}/{kind}: {words!r} not trained: {runs}"
    others = [m["content"] for m in facts["conversation"] if m["role"] != "assistant" and m.get("content")]
    for words in others:
        assert words not in joined, f"{family}/{kind}: {words!r} (not the assistant's) is trained: {runs}"
    for r in runs:
        assert r.endswith(ends), f"{family}/{kind}: a target run does not end with an end-of-turn token: {r!r}"
    n_assistant = sum(m["role"] == "assistant" for m in facts["conversation"])
    assert len(spans) == n_assistant
    # the turn-by-turn reading, where the template renders the prefix unchanged: a span starts where the prompt ends
    tok, conversation = facts["tokenizer"], facts["conversation"]
    for k, (start, _) in zip([k for k, m in enumerate(conversation) if m["role"] == "assistant"], spans,
                             strict=True):
        try:
            prompt = tok.apply_chat_template(conversation[:k], tools=facts["tools"], tokenize=False,
                                             add_generation_prompt=True)
        except Exception:  # noqa: BLE001 - e.g. a template that wants the conversation to end on a user turn
            continue
        if text.startswith(prompt):
            assert start == len(prompt), f"{family}/{kind}: messages[{k}] starts at {start}, the prompt ends at " \
                                         f"{len(prompt)} ({text[start - 10:start + 10]!r})"


@pytest.mark.parametrize("kind", sorted(CONVERSATIONS))
@pytest.mark.parametrize("family", [f for f in FAMILY_NAMES if FAMILIES[f][1]])
def test_the_mask_agrees_with_transformers_on_trls_marked_copy_of_the_template(family, kind):
    from transformers.utils.chat_template_utils import render_jinja_template

    facts = trained(family, kind)
    if "refused" in facts:
        return
    tok = facts["tokenizer"]
    marked = template_text(FAMILIES[family][1])
    try:
        (text,), (blocks,) = render_jinja_template(
            conversations=[[{k: v for k, v in m.items() if v is not None} for m in facts["conversation"]]],
            tools=facts["tools"], chat_template=marked, return_assistant_tokens_mask=True,
            **tok.special_tokens_map)
    except Exception:  # noqa: BLE001 - TRL's copy refuses what the stock one renders: nothing to compare
        pytest.skip("TRL's marked copy refuses this conversation")
    if text != facts["text"]:
        pytest.skip("TRL's marked copy renders this conversation otherwise")
    opener = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True
                                     )[len(tok.apply_chat_template([{"role": "user", "content": "x"}],
                                                                   tokenize=False)):]
    eos = tok.eos_token
    theirs = []
    for a, b in blocks:
        if text[a:b].strip() == eos and b == len(text.rstrip()):
            continue  # a copy that marks the EOS its template writes after the last turn (Phi-3.5): not a turn
        at = text.find(opener, max(0, a - len(opener)), a + len(opener)) if opener else -1
        a = at + len(opener) if 0 <= at <= a < at + len(opener) or at == a else a
        theirs.append((a, len(text[:b].rstrip())))
    assert facts["spans"] == theirs


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_what_is_trained_per_family_is_the_table(family):
    assert measured(family) == WHAT_IS_TRAINED[family]


def test_docs_data_md_quotes_the_table():
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "data.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \| (.+?) \|$", doc, flags=re.M))
    quoted = {f: tuple(c.strip() for c in rows[f].split(" | ")) for f in rows if f in WHAT_IS_TRAINED}
    assert quoted == WHAT_IS_TRAINED

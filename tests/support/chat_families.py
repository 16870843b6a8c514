"""The chat templates of the families users fine-tune, as they ship them, on tiny offline tokenizers.

Each family's stock template is read from TRL's copies (the installed `trl` package's `chat_templates/`) or from
tests/fixtures/chat_templates/ (verbatim copies, sources in its README); the tokenizer is tests/support/tiny_chat's
byte-level BPE with the family's BOS, EOS and control tokens registered as its real tokenizer registers them."""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

from support.tiny_chat import CHATML, tiny_tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"
_LLAMA = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]
_CHATML = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
_QWEN = _CHATML + ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
_DEEPSEEK = ["<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
             "<｜tool▁call▁end｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>",
             "<｜tool▁output▁end｜>", "<｜tool▁sep｜>", "<think>", "</think>"]
_GEMMA = ["<start_of_turn>", "<end_of_turn>"]
_MISTRAL = ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]"]
_GPTOSS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]

#: family: (template: "trl:FILE" | "fixture:FILE" | "chatml", TRL's training copy or None, bos, eos, control tokens,
#: the tokens an assistant turn may end with)
FAMILIES: dict[str, tuple] = {
    "chatml": ("chatml", None, None, "<|im_end|>", _CHATML, ("<|im_end|>",)),
    "llama3_1": ("trl:llama3_1.jinja", None, "<|begin_of_text|>", "<|eot_id|>", _LLAMA, ("<|eot_id|>", "<|eom_id|>")),
    "llama3_2": ("trl:llama3_2.jinja", None, "<|begin_of_text|>", "<|eot_id|>", _LLAMA, ("<|eot_id|>", "<|eom_id|>")),
    "llama3_3": ("trl:llama3_1.jinja", None, "<|begin_of_text|>", "<|eot_id|>", _LLAMA,
                 ("<|eot_id|>", "<|eom_id|>")),
    "qwen2_5": ("trl:qwen2_5.jinja", "trl:qwen2_5_training.jinja", None, "<|im_end|>", _QWEN, ("<|im_end|>",)),
    "qwen3": ("trl:qwen3.jinja", None, None, "<|im_end|>", _QWEN, ("<|im_end|>",)),
    "qwq": ("fixture:qwq.jinja", None, None, "<|im_end|>", _QWEN, ("<|im_end|>",)),
    "deepseek_r1_distill": ("trl:deepseek_r1_distill.jinja", None, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                            _DEEPSEEK, ("<｜end▁of▁sentence｜>",)),
    "gemma2": ("trl:gemma.jinja", "trl:gemma_training.jinja", "<bos>", "<eos>", _GEMMA, ("<end_of_turn>",)),
    "gemma3": ("trl:gemma3.jinja", "trl:gemma3_training.jinja", "<bos>", "<eos>", _GEMMA, ("<end_of_turn>",)),
    "mistral_v0_3": ("fixture:mistral_v0_3.jinja", None, "<s>", "</s>", _MISTRAL, ("</s>",)),
    "mistral_small": ("fixture:mistral_small.jinja", None, "<s>", "</s>",
                      _MISTRAL + ["[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[ARGS]", "[CALL_ID]"], ("</s>",)),
    "phi3_5": ("trl:phi3_5.jinja", "trl:phi3_5_training.jinja", "<s>", "<|endoftext|>",
               ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"], ("<|end|>",)),
    "phi4": ("fixture:phi4.jinja", None, "<|endoftext|>", "<|im_end|>", ["<|im_start|>", "<|im_sep|>", "<|im_end|>"],
             ("<|im_end|>",)),
    "smollm3": ("fixture:smollm3.jinja", None, None, "<|im_end|>", _QWEN, ("<|im_end|>",)),
    "olmo2": ("fixture:olmo2.jinja", None, "<|endoftext|>", "<|endoftext|>", ["<|endoftext|>"], ("<|endoftext|>",)),
    "granite3": ("fixture:granite3.jinja", None, "<|end_of_text|>", "<|end_of_text|>",
                 ["<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>", "<|tool_call|>"], ("<|end_of_text|>",)),
    "gptoss": ("trl:gptoss.jinja", "trl:gptoss_training.jinja", "<|startoftext|>", "<|return|>", _GPTOSS,
               ("<|end|>", "<|return|>", "<|call|>")),
}


def template_text(spec: str) -> str:
    """A template by its spec: `trl:FILE` (TRL's copy), `fixture:FILE` (tests/fixtures/chat_templates/), `chatml`."""
    if spec == "chatml":
        return CHATML
    where, name = spec.split(":", 1)
    if where == "trl":
        return (resources.files("trl") / "chat_templates" / name).read_text(encoding="utf-8")
    return (FIXTURES / name).read_text(encoding="utf-8")


def available(family: str) -> bool:
    spec = FAMILIES[family][0]
    return not spec.startswith("fixture:") or (FIXTURES / spec.split(":", 1)[1]).is_file()


@functools.cache
def family_tokenizer(family: str):
    """The family's tiny tokenizer with its stock template."""
    spec, _, bos, eos, specials, _ = FAMILIES[family]
    tok = tiny_tokenizer(template_text(spec), bos, eos, specials=[s for s in specials if s not in (bos, eos)])
    tok.name_or_path = f"tiny-{family}"
    return tok

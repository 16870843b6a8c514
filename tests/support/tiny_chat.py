"""Tiny chat tokenizers and a word-level Llama built offline.

The chat tokenizers: a byte-level BPE (every text round-trips) with Llama-3's pre-tokenizing regex
and a few merges, wrapped in transformers' PreTrainedTokenizerFast, with the families' own special tokens and their
stock chat templates as Jinja strings (tests/data/test_chat.py, the README's "Your own data" test)."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>", "<|user|>", "<|assistant|>", "<|system|>", "</s>", "<s>"]
# stock templates, as the models ship them (Qwen2-Instruct, Meta-Llama-3-Instruct, zephyr-7b-beta)
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>"
          "system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' "
          "+ message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>"
          "assistant\n' }}{% endif %}")
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>"
          "' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if "
          "loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if "
          "add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
ZEPHYR = ("{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] "
          "+ eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + "
          "eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + "
          "eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif "
          "%}\n{% endfor %}")
# Mistral-Instruct-v0.3's way with a system prompt: it goes into the LAST user turn, so earlier renders change
MISTRAL = ("{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}{%- set "
           "loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}{{- bos_token }}"
           "{%- for message in loop_messages %}{%- if message['role'] == 'user' %}{%- if loop.last and "
           "system_message is defined %}{{- '[INST] ' + system_message + '\n\n' + message['content'] + '[/INST]' }}"
           "{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}{%- elif message['role'] == "
           "'assistant' %}{{- ' ' + message['content'] + eos_token}}{%- endif %}{%- endfor %}")
FAMILIES = {  # template, bos, eos, the end token each assistant turn's targets close with
    "chatml": (CHATML, None, "<|im_end|>"),
    "llama3": (LLAMA3, "<|begin_of_text|>", "<|eot_id|>"),
    "zephyr": (ZEPHYR, None, "</s>"),
}
CONVERSATION = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "What colour is the sky?"},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "And grass, at noon?"},
    {"role": "assistant", "content": "Green, mostly."},
]


def tiny_tokenizer(template: str | None, bos: str | None = None, eos: str = "</s>", split: str = LLAMA3_SPLIT,
                   specials: list[str] | None = None):
    """A byte-level BPE tokenizer with a few merges ("\\n\\n" among them) and the families' special tokens
    (`specials`: a family's own, instead of the ones here)."""
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = [("Ċ", "Ċ"), ("h", "e"), ("Ġ", "t"), ("r", "e"), ("o", "r"), ("e", "n"), ("Ġt", "he")]
    vocab = {c: i for i, c in enumerate(alphabet + ["".join(m) for m in merges])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos,
                                   additional_special_tokens=[s for s in (SPECIALS if specials is None else specials)
                                                              if s not in (bos, eos)])
    fast.chat_template = template
    return fast


WORDS = ["red", "green", "blue", "cat", "dog", "sun", "moon", "tree"]


def word_tokenizer():
    """A word-level tokenizer (one id per word; `<pad>` 0, `<eos>` 1, `<end>` 2) as transformers' fast tokenizer."""
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<end>", "<unk>", "list:", "first:", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                   additional_special_tokens=["<end>"])


def tiny_llama(folder: Path, seed: int = 0) -> Path:
    """A fresh 2-layer Llama (4 query / 2 KV heads) with the word tokenizer, `save_pretrained` into `folder`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = word_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, eos_token_id=1, bos_token_id=None)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def tiny_chat_model(folder: Path, tok, max_positions: int = 256, layers: int = 1, kv_heads: int = 1) -> Path:
    """A fresh Llama (`layers` layers, hidden 16, 2 query heads per KV head) over `tok`'s vocabulary, saved with `tok`
    into `folder` (a chat model by folder)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                         num_attention_heads=2 * kv_heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=max_positions,
                         eos_token_id=tok.eos_token_id, bos_token_id=None, pad_token_id=None)
    LlamaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def target_runs(tok, doc) -> list[str]:
    """The decoded runs of a Document's target tokens (each assistant turn's, in order); every label is its id."""
    ids, labels = doc
    runs, run = [], []
    for i, label in zip(ids.tolist(), labels.tolist(), strict=True):
        if label != -100:
            assert label == i
            run.append(i)
        elif run:
            runs, run = runs + [run], []
    return [tok.decode(r) for r in runs + ([run] if run else [])]


def write_jsonl(path: Path, rows: list) -> Path:
    """`rows` as JSON Lines at `path`."""
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


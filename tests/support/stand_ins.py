"""Tiny stand-ins served by the local Hub under the ids users really have, so a command is tested as printed:
`recipe=sft`'s defaults (HuggingFaceTB/SmolLM2-135M-Instruct, trl-lib/Capybara), the base model the your-model
guide trains (HuggingFaceTB/SmolLM2-135M), the MoE the growth guide grows
(ibm-granite/granite-3.1-1b-a400m-base) and the guides' lines. Each has its model's family, template and special
tokens, at a few thousand parameters."""

from __future__ import annotations

import tempfile
from pathlib import Path

from support.tiny_chat import CHATML, CONVERSATION, tiny_chat_model, tiny_tokenizer, write_jsonl

CHAT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # SmolLM2's chat template is ChatML
CHAT_DATA = "trl-lib/Capybara"  # TRL's SFT example data: a `messages` column, train and test splits
BASE_MODEL = "HuggingFaceTB/SmolLM2-135M"  # a small base model (a Llama; no chat template)
MOE_MODEL = "ibm-granite/granite-3.1-1b-a400m-base"  # a small base MoE (GraniteMoE: 32 experts, 8 per token)


def chat_rows(n: int, offset: int = 0) -> list[dict]:
    """`n` conversations in TRL's `messages` shape, one or two exchanges each."""
    rows = []
    for i in range(offset, offset + n):
        turns = CONVERSATION[1:3] if i % 3 else CONVERSATION
        rows.append({"source": "stand-in", "messages": [dict(t, content=f"{t['content']} ({i})") for t in turns]})
    return rows


def _push(api, repo_id: str, folder: Path, repo_type: str | None = None) -> str:
    """`folder` as a commit of `repo_id` (created if missing); returns the commit's sha."""
    api.create_repo(repo_id, repo_type=repo_type, exist_ok=True)
    return api.upload_folder(repo_id=repo_id, repo_type=repo_type, folder_path=str(folder)).oid


def serve_chat(api, max_positions: int = 8192) -> dict[str, str]:
    """Push the chat model and the chat dataset stand-ins (idempotent); returns their commit shas by id. The model
    is a Llama as SmolLM2 is (2 layers, 2 KV heads of 2 query heads each: a mixed KV cache has heads to compress),
    with SmolLM2's ChatML template and end of turn and its 8,192 positions."""
    commits = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tiny_chat_model(folder / "model", tiny_tokenizer(CHATML, eos="<|im_end|>"), max_positions=max_positions,
                        layers=2, kv_heads=2)
        commits[CHAT_MODEL] = _push(api, CHAT_MODEL, folder / "model")
        data = folder / "data" / "data"
        data.mkdir(parents=True)
        write_jsonl(data / "train-00000-of-00001.jsonl", chat_rows(48))
        write_jsonl(data / "test-00000-of-00001.jsonl", chat_rows(8, offset=1000))
        commits[CHAT_DATA] = _push(api, CHAT_DATA, folder / "data", repo_type="dataset")
    return commits


def serve_moe(api) -> str:
    """Push the base MoE stand-in: a GraniteMoE (2 layers, 4 experts, 2 per token, Granite's scaled residuals and
    logits) with a base model's tokenizer (no chat template); returns its commit sha."""
    import torch
    from transformers import GraniteMoeConfig, GraniteMoeForCausalLM

    tok = tiny_tokenizer(None, eos="<|end_of_text|>", specials=[])
    config = GraniteMoeConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                              max_position_embeddings=4096, embedding_multiplier=12.0, logits_scaling=6.0,
                              residual_multiplier=0.22, attention_multiplier=0.015625, tie_word_embeddings=True,
                              eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id, pad_token_id=None)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        GraniteMoeForCausalLM(config).save_pretrained(tmp)
        tok.save_pretrained(tmp)
        return _push(api, MOE_MODEL, Path(tmp))


def serve_base(api) -> str:
    """Push the base model stand-in: a Llama as SmolLM2-135M is (2 layers, 2 KV heads), with a base model's
    tokenizer (SmolLM2's `<|endoftext|>` as BOS and EOS, no chat template); returns its commit sha."""
    with tempfile.TemporaryDirectory() as tmp:
        tiny_chat_model(Path(tmp), tiny_tokenizer(None, bos="<|endoftext|>", eos="<|endoftext|>", specials=[]),
                        max_positions=8192, layers=2, kv_heads=2)
        return _push(api, BASE_MODEL, Path(tmp))

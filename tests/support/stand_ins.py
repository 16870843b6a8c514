"""Tiny stand-ins served by the local Hub under the ids users really have, so a command is tested as printed:
`recipe=sft`'s defaults (HuggingFaceTB/SmolLM2-135M-Instruct, trl-lib/Capybara) and the README's lines."""

from __future__ import annotations

import tempfile
from pathlib import Path

from support.tiny_chat import CHATML, CONVERSATION, tiny_chat_model, tiny_tokenizer, write_jsonl

CHAT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"  # SmolLM2's chat template is ChatML
CHAT_DATA = "trl-lib/Capybara"  # TRL's SFT example data: a `messages` column, train and test splits


def chat_rows(n: int, offset: int = 0) -> list[dict]:
    """`n` conversations in TRL's `messages` shape, one or two exchanges each."""
    rows = []
    for i in range(offset, offset + n):
        turns = CONVERSATION[1:3] if i % 3 else CONVERSATION
        rows.append({"source": "stand-in", "messages": [dict(t, content=f"{t['content']} ({i})") for t in turns]})
    return rows


def serve_chat(api, max_positions: int = 128) -> dict[str, str]:
    """Push the chat model and the chat dataset stand-ins (idempotent); returns their commit shas by id."""
    commits = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tiny_chat_model(folder / "model", tiny_tokenizer(CHATML, eos="<|im_end|>"), max_positions=max_positions)
        api.create_repo(CHAT_MODEL, exist_ok=True)
        commits[CHAT_MODEL] = api.upload_folder(repo_id=CHAT_MODEL, folder_path=str(folder / "model")).oid
        data = folder / "data" / "data"
        data.mkdir(parents=True)
        write_jsonl(data / "train-00000-of-00001.jsonl", chat_rows(48))
        write_jsonl(data / "test-00000-of-00001.jsonl", chat_rows(8, offset=1000))
        api.create_repo(CHAT_DATA, repo_type="dataset", exist_ok=True)
        commits[CHAT_DATA] = api.upload_folder(repo_id=CHAT_DATA, repo_type="dataset",
                                               folder_path=str(folder / "data")).oid
    return commits

"""data=chat: TRL's row shapes rendered with stock chat templates (no generation markers), the loss on the answers.

The tokenizers are built here, offline: a byte-level BPE (every text round-trips) with Llama-3's pre-tokenizing
regex and a few merges, wrapped in transformers' PreTrainedTokenizerFast, with the families' own special tokens and
their stock templates as Jinja strings.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.tiny_chat import (
    CHATML,
    CONVERSATION,
    FAMILIES,
    GPT2_SPLIT,
    LLAMA3,
    MISTRAL,
    target_runs,
    tiny_chat_model,
    tiny_tokenizer,
    write_jsonl,
)

from framework.data.chat import IGNORE, ChatRenderer, detect_shape, documents
from framework.errors import InputError


@pytest.fixture(scope="module")
def tokenizers():
    return {name: tiny_tokenizer(t, bos, eos) for name, (t, bos, eos) in FAMILIES.items()}


def renderer(tok, columns=None, **kw) -> ChatRenderer:
    shape, mapped = detect_shape(["messages"] if columns is None else columns)
    return ChatRenderer(tok, shape, mapped, **kw)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_stock_templates_train_on_each_assistant_turn_through_its_end_token(tokenizers, family):
    tok, end = tokenizers[family], FAMILIES[family][2]
    doc = renderer(tok).document({"messages": CONVERSATION}, 0)
    assert target_runs(tok, doc) == [f"Blue.{end}", f"Green, mostly.{end}"]
    assert tok.decode(doc[0]) == tok.apply_chat_template(CONVERSATION, tokenize=False)  # the whole render, unchanged
    last = renderer(tok, train_on="last").document({"messages": CONVERSATION}, 0)
    assert target_runs(tok, last) == [f"Green, mostly.{end}"] and np.array_equal(last[0], doc[0])
    every = renderer(tok, train_on="all").document({"messages": CONVERSATION}, 0)
    assert every[1] is None and np.array_equal(every[0], doc[0])


def test_a_template_that_rewrites_earlier_turns_is_masked_from_one_render():
    # Mistral-Instruct's older template moves the system prompt into the last user turn: not prefix-stable, and
    # rendered once it is masked all the same (the turn-by-turn reading refused it)
    tok = tiny_tokenizer(MISTRAL, "<s>", "</s>", specials=["[INST]", "[/INST]"])
    doc = renderer(tok).document({"messages": CONVERSATION[:4]}, 7)
    assert target_runs(tok, doc) == [" Blue.</s>"]
    assert tok.decode(doc[0]) == tok.apply_chat_template(CONVERSATION[:4], tokenize=False)
    assert renderer(tok, train_on="all").document({"messages": CONVERSATION}, 7)[1] is None


def test_a_token_merged_across_a_targets_start_is_tokenized_apart_there():
    # GPT-2's regex splits "\n\nBlue" as "\n" "\n" "Blue" but a prompt ending "\n\n" as one merged token
    tok = tiny_tokenizer(LLAMA3, "<|begin_of_text|>", "<|eot_id|>", split=GPT2_SPLIT)
    plain = tok("x\n\n", add_special_tokens=False)["input_ids"]
    assert plain[-1] == tok.convert_tokens_to_ids("ĊĊ")
    chat = renderer(tok)
    doc = chat.document({"messages": CONVERSATION}, 0)
    assert target_runs(tok, doc) == ["Blue.<|eot_id|>", "Green, mostly.<|eot_id|>"]
    assert chat.stats.split_tokens == 1 and tok.decode(doc[0]) == tok.apply_chat_template(CONVERSATION,
                                                                                           tokenize=False)
    first = int(np.flatnonzero(doc[1] != IGNORE)[0])
    assert doc[0][first - 1] == tok.convert_tokens_to_ids("ĊĊ")  # the prompt ends as it does when generating


def test_prompt_completion_strings_train_on_the_completion_and_eos(tokenizers):
    tok = tokenizers["chatml"]
    chat = renderer(tok, columns=["prompt", "completion", "id"])
    row = {"prompt": "2 + 2 =", "completion": " 4", "id": 3}
    ids, labels = chat.document(row, 0)
    assert target_runs(tok, (ids, labels)) == [" 4<|im_end|>"]
    prompt, completion = chat.prompt_completion(row, 0)
    assert tok.decode(prompt) == "2 + 2 =" and tok.decode(completion) == " 4<|im_end|>"
    assert np.array_equal(np.concatenate([prompt, completion]), ids)


def test_prompt_completion_message_lists_put_the_generation_prompt_in_the_prompt(tokenizers):
    tok = tokenizers["llama3"]
    with pytest.raises(InputError, match=r"columns 'question', 'answer', and neither shape fits \(messages needs "
                                         r"'messages'; prompt/completion needs 'prompt' and 'completion'\)"):
        detect_shape(["question", "answer"])
    shape, mapped = detect_shape(["question", "answer"], {"prompt": "question", "completion": "answer"})
    chat = ChatRenderer(tok, shape, mapped)
    row = {"question": CONVERSATION[:2], "answer": CONVERSATION[2:3]}
    prompt, completion = chat.prompt_completion(row, 0)
    assert tok.decode(prompt).endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert tok.decode(completion) == "Blue.<|eot_id|>"
    assert target_runs(tok, chat.document(row, 0)) == ["Blue.<|eot_id|>"]


def test_sharegpt_conversations_read_through_the_column_map(tokenizers):
    tok = tokenizers["zephyr"]
    shape, mapped = detect_shape(["conversations"], {"messages": "conversations"})
    row = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]}
    assert target_runs(tok, ChatRenderer(tok, shape, mapped).document(row, 0)) == ["Hello</s>"]
    with pytest.raises(InputError, match=r"data.columns names 'text'; the keys it maps are messages, prompt, "):
        detect_shape(["conversations"], {"text": "conversations"})


def test_a_conversation_with_no_assistant_turn_is_skipped_and_counted_and_none_left_is_refused(tokenizers):
    chat = renderer(tokenizers["chatml"])
    rows = [{"messages": CONVERSATION}, {"messages": CONVERSATION[:2]}, {"messages": CONVERSATION}]
    assert len(list(documents(rows, chat))) == 2
    assert (chat.stats.rows, chat.stats.documents, chat.stats.no_assistant) == (3, 2, 1)
    assert "1 skipped with no assistant turn" in chat.stats.line()
    with pytest.raises(InputError, match=r"no row is left to train on: chat: 0 of 2 rows kept .* 2 skipped with "
                                         r"no assistant turn"):
        list(documents([{"messages": CONVERSATION[:2]}] * 2, renderer(tokenizers["chatml"])))


def test_a_row_longer_than_seq_len_is_cut_and_counted_or_refused(tokenizers):
    tok = tokenizers["chatml"]
    whole = renderer(tok).document({"messages": CONVERSATION}, 0)
    n = len(whole[0])
    chat = renderer(tok, seq_len=n - 3)
    ids, labels = chat.document({"messages": CONVERSATION}, 0)
    assert len(ids) == n - 3 and np.array_equal(ids, whole[0][: n - 3]) and chat.stats.truncated == 1
    first_answer = int(np.flatnonzero(whole[1] != IGNORE)[0])
    assert chat.stats.cut_out == 0
    cut = renderer(tok, seq_len=first_answer)  # every target cut away: skipped, counted
    assert cut.document({"messages": CONVERSATION}, 0) is None and cut.stats.cut_out == 1
    with pytest.raises(InputError, match=rf"row 5 is {n} tokens, longer than data.seq_len={n - 1}; .*"
                                         r"data.truncate=true"):
        renderer(tok, seq_len=n - 1, truncate=False).document({"messages": CONVERSATION}, 5)


def test_conversations_with_a_tokenizer_without_chat_template_are_refused_in_one_line():
    tok = tiny_tokenizer(None)
    tok.name_or_path = "tiny-base"
    with pytest.raises(InputError, match=r"the tokenizer 'tiny-base' has no chat template; .*data.chat_template="):
        renderer(tok).document({"messages": CONVERSATION}, 0)
    assert renderer(tok, chat_template=CHATML).document({"messages": CONVERSATION}, 0) is not None
    strings = renderer(tok, columns=["prompt", "completion"]).document({"prompt": "a", "completion": "b"}, 0)
    assert target_runs(tok, strings) == ["b</s>"]  # strings need no template


def test_malformed_rows_name_the_row_and_what_it_holds(tokenizers):
    chat = renderer(tokenizers["chatml"])
    with pytest.raises(InputError, match=r"row 4's 'messages' is a str, not a list"):
        chat.document({"messages": "hi"}, 4)
    with pytest.raises(InputError, match=r"row 2: messages\[0\] has no content \(its keys: 'role', 'text'\)"):
        chat.document({"messages": [{"role": "user", "text": "hi"}]}, 2)
    with pytest.raises(InputError, match=r"data.train_on='first'; valid: assistant, last, all"):
        renderer(tokenizers["chatml"], train_on="first")


# ---- the chat DataModule ----------------------------------------------------------------------------------------
def _conversation(i: int) -> list[dict[str, str]]:
    turns = [{"role": "user", "content": f"Question {i}: how many {'cats ' * (i % 4)}?"},
             {"role": "assistant", "content": f"Answer {i}: {i % 7} {'there ' * (i % 5)}."}]
    return turns * (1 + i % 2) if i % 5 != 3 else turns[:1]  # every 5th conversation has no assistant turn


def _packed_documents(rows):
    """Each packed document's ids and labels, split where position_ids restart (a row's padding is one too)."""
    docs = []
    for i in range(len(rows)):
        row = rows[i]
        for tok, label, pos in zip(*(row[k].tolist() for k in ("input_ids", "labels", "position_ids")), strict=True):
            if pos == 0:
                docs.append(([], []))
            docs[-1][0].append(tok)
            docs[-1][1].append(label)
    return docs


def test_a_chat_file_packs_whole_conversations_whose_targets_are_the_assistant_turns(tmp_path, cache, tokenizers,
                                                                                      capsys):
    from framework.data.user_chat import ChatData, best_fit

    tok = tokenizers["chatml"]
    convs = [_conversation(i) for i in range(40)]
    dm = ChatData(str(write_jsonl(tmp_path / "chat.jsonl", [{"messages": c, "id": i} for i, c in enumerate(convs)])),
                  seq_len=256, batch_size=2, val_fraction=0.25)
    with pytest.raises(InputError, match=r"the model brings no tokenizer .*use a model that brings one: "
                                         r"hf_causal_lm or hf_masked_lm with model.name_or_path="):
        dm.vocab_size  # noqa: B018 - what the run asks of data (DataSpec) when a byte model gave it no tokenizer
    dm.use_tokenizer(tok)
    dm.setup()
    assert "data=chat train: 24 of 30 rows kept; 6 skipped with no assistant turn" in capsys.readouterr().out
    train = [c for i, c in enumerate(convs) if i % 4 and i % 5 != 3]  # val_fraction 0.25: every 4th, from the first
    docs = _packed_documents(dm.train_set)
    rendered = sorted(tok.apply_chat_template(c, tokenize=False) for c in train)
    whole = sorted(tok.decode(ids) for ids, _ in docs if tok.decode(ids).startswith("<|im_start|>"))
    assert whole == rendered  # every conversation whole in one row (never split across rows)
    got = sorted(tok.decode([i for i, lab in zip(ids, labels, strict=True) if lab != IGNORE]) for ids, labels in docs
                 if any(lab != IGNORE for lab in labels))
    assert got == sorted("".join(f"{m['content']}<|im_end|>" for m in c if m["role"] == "assistant") for c in train)
    record = dm.record()
    assert record["chat"]["no_assistant"] == 6 and record["train_on"] == "assistant"
    assert record["format"] == "chat (messages; json)" and record["tokens"] == record["chat"]["tokens"]
    lengths = [len(tok.apply_chat_template(c, tokenize=False)) for c in train]  # bytes = tokens here, near enough
    assert record["rows"] <= len(best_fit(lengths, 256)) + 1  # best-fit decreasing, not one conversation a row


def test_prompt_completion_columns_by_a_map_and_their_ids_for_the_probes(tmp_path, cache, tokenizers):
    import csv

    from framework.data.user_chat import ChatData

    path = tmp_path / "qa.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["question", "answer"])
        w.writerows([[f"What is {i} + {i}?", f" {2 * i} apples"] for i in range(11)] + [["What is 9 + 9?", 18]])
    with pytest.raises(InputError, match=r"the rows have columns 'question', 'answer', and neither shape fits"):
        ChatData(str(path))
    dm = ChatData(str(path), columns={"prompt": "question", "completion": "answer"}, seq_len=32, batch_size=2)
    dm.use_tokenizer(tokenizers["llama3"])
    pairs = list(dm.prompt_completions(limit=3))
    tok = tokenizers["llama3"]
    assert [(tok.decode(p), tok.decode(c)) for p, c in pairs] == [
        (f"What is {i} + {i}?", f" {2 * i} apples<|eot_id|>") for i in range(3)]
    dm.setup()  # ceil(12 * 0.05) = 1 row held out: row 0; the last row's answer is a number in the CSV
    answers = [f" {2 * i} apples" for i in range(1, 11)] + ["18"]
    assert dm.record()["chat"]["targets"] == sum(len(tok(a)["input_ids"]) + 1 for a in answers)


def test_conversations_and_a_tokenizer_without_template_are_refused_at_the_hand_off(tmp_path, cache):
    from framework.data.user_chat import ChatData

    dm = ChatData(str(write_jsonl(tmp_path / "chat.jsonl", [{"messages": _conversation(i)} for i in range(4)])))
    with pytest.raises(InputError, match=r"has no chat template"):
        dm.use_tokenizer(tiny_tokenizer(None))
    with pytest.raises(InputError, match=r"data.train_on='turns'; valid: assistant, last, all"):
        ChatData(str(tmp_path / "chat.jsonl"), train_on="turns")


def test_best_fit_fills_rows_no_worse_than_in_order():
    from framework.data.user_chat import best_fit

    rng = np.random.default_rng(0)
    lengths = [int(x) for x in rng.integers(10, 120, 500)]
    bins = best_fit(lengths, 128)
    assert sorted(i for b in bins for i in b) == list(range(500))
    assert all(sum(lengths[i] for i in b) <= 128 for b in bins)
    in_order, fill = 1, 0
    for n in lengths:
        in_order, fill = (in_order + 1, n) if fill + n > 128 else (in_order, fill + n)
    assert len(bins) < 0.8 * in_order and sum(lengths) / (128 * len(bins)) > 0.93  # 358 rows in order, 279


def test_chat_data_on_a_byte_model_is_one_error_line_exit_2_and_nothing_written(tmp_path, cli):
    path = write_jsonl(tmp_path / "chat.jsonl", [{"messages": _conversation(i)} for i in range(4)])
    run_dir = tmp_path / "run"
    proc = cli("recipe=char_lm", "data=chat", f"data.source={path}", f"data.cache_dir={tmp_path / 'cache'}",
               f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "brings no tokenizer" in lines[0] and "hf_causal_lm" in lines[0]
    assert not run_dir.exists()


def test_an_hf_model_trains_on_a_chat_file_through_the_cli_and_logs_the_counts(tmp_path, cli, tokenizers):
    tok = tokenizers["chatml"]
    model = tiny_chat_model(tmp_path / "tiny-chat-llama", tok)
    rows = [{"messages": _conversation(i)} for i in range(30)] + [{"messages": CONVERSATION * 8}]  # > seq_len
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    run_dir = tmp_path / "run"
    proc = cli("recipe=char_lm", "data=chat", f"data.source={path}", f"data.cache_dir={tmp_path / 'cache'}",
               "data.seq_len=256", "data.batch_size=2", "model=hf_causal_lm", f"model.name_or_path={model}",
               "trainer.max_steps=2", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = (run_dir / "train.log").read_text()
    assert "data=chat train: 23 of 29 rows kept; 6 skipped with no assistant turn; 1 truncated" in log
    proc = cli("recipe=char_lm", "data=chat", f"data.source={path}", f"data.cache_dir={tmp_path / 'cache'}",
               "data.seq_len=256", "data.truncate=false", "model=hf_causal_lm", f"model.name_or_path={model}",
               f"hydra.run.dir={tmp_path / 'refused'}")
    assert proc.returncode == 2 and "error: data=chat: row 30 is " in proc.stderr
    assert "longer than data.seq_len=256" in proc.stderr

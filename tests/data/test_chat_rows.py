"""data=chat on rows as users hold them (issue 50): a `tools` column, templates with `{% generation %}` markers, two
assistant turns in a row, prompt/completion strings with a BOS-adding tokenizer, malformed rows named by row and
field (the CLI in a fresh process), and the end-of-turn rule whatever the tokenizer calls special."""

from __future__ import annotations

import json

import pytest
from support.chat_families import family_tokenizer, template_text
from support.tiny_chat import CHATML, CONVERSATION, target_runs, tiny_chat_model, tiny_tokenizer, write_jsonl

from framework.data.chat import ChatRenderer, detect_shape
from framework.errors import InputError

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather now.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
TOOL_ROW = [{"role": "user", "content": "Warm in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "name": "get_weather", "content": "Sunny."},
            {"role": "assistant", "content": "Yes."}]


def chat(tok, columns=("messages",), **kw) -> ChatRenderer:
    shape, mapped = detect_shape(list(columns))
    return ChatRenderer(tok, shape, mapped, **kw)


def test_a_tools_column_in_a_file_reaches_the_template_as_apply_chat_template_passes_it(tmp_path, cache):
    from framework.data.user_chat import ChatData

    tok = family_tokenizer("qwen2_5")
    other = [{"type": "function", "function": {"name": "get_time", "description": "The time.", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string"}}}}}]
    # datasets fills the keys one row's tools lack with null where another's have them: dropped again here
    rows = [{"messages": TOOL_ROW, "tools": TOOLS if i % 2 else json.dumps(other + TOOLS)} for i in range(40)]
    data = ChatData(source=str(write_jsonl(tmp_path / "tools.jsonl", rows)), seq_len=2048, packing=False,
                    val_fraction=0.1)
    data.use_tokenizer(tok)
    data.prepare_data()
    data.setup()
    assert data.template_columns == {"tools": "tools"} and data.record()["template_columns"] == {"tools": "tools"}
    batch = data.train_set[0]
    text = tok.decode(batch["input_ids"][batch["attention_mask"].bool()].tolist())
    expected = {tok.apply_chat_template(TOOL_ROW, tools=t, tokenize=False) for t in (TOOLS, other + TOOLS)}
    assert text in expected and "get_weather" in text and "# Tools" in text


def test_a_template_that_writes_no_tools_is_refused_naming_the_row(tmp_path):
    tok = tiny_tokenizer(CHATML, None, "<|im_end|>")
    tok.name_or_path = "tiny-chatml"
    renderer = ChatRenderer(tok, "messages", {"messages": "messages"}, template_columns={"tools": "tools"})
    with pytest.raises(InputError, match=r"row 4: the chat template of 'tiny-chatml' does not write the row's tools "
                                         r"\(get_weather\).*data.chat_template="):
        renderer.documents([{"messages": TOOL_ROW, "tools": TOOLS}], 4)


def test_generation_markers_decide_the_mask_a_turn_they_leave_out_is_not_trained():
    marked = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
              "{% if m.get('train', true) %}{% generation %}{{ m['content'] + '<|im_end|>' }}{% endgeneration %}"
              "{% else %}{{ m['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}{% else %}{{ '<|im_start|>' + "
              "m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    tok = tiny_tokenizer(marked, None, "<|im_end|>")
    row = [{"role": "user", "content": "Sky?"}, {"role": "assistant", "content": "Bad answer.", "train": False},
           {"role": "user", "content": "Sky, really?"}, {"role": "assistant", "content": "Blue."}]
    ours = target_runs(tok, chat(tok).document({"messages": row}, 0))
    theirs = tok.apply_chat_template(row, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    mask = [i for i, m in zip(theirs["input_ids"], theirs["assistant_masks"], strict=True) if m]
    assert ours == ["Blue.<|im_end|>"] == [tok.decode(mask)]
    assert target_runs(tok, chat(tok, train_on="last").document({"messages": row}, 0)) == ["Blue.<|im_end|>"]


def test_two_assistant_turns_in_a_row_are_two_targets_and_last_is_only_the_second():
    tok = tiny_tokenizer(CHATML, None, "<|im_end|>")
    row = [{"role": "user", "content": "The sea?"}, {"role": "assistant", "content": "Grey in winter."},
           {"role": "assistant", "content": "Also grey at night."}]
    both = ["Grey in winter.<|im_end|>", "Also grey at night.<|im_end|>"]
    assert target_runs(tok, chat(tok).document({"messages": row}, 0)) == both
    assert target_runs(tok, chat(tok, train_on="last").document({"messages": row}, 0)) == both[1:]


def test_a_conversation_opening_with_the_assistant_trains_where_the_template_takes_it():
    tok = tiny_tokenizer(CHATML, None, "<|im_end|>")
    row = [{"role": "assistant", "content": "Hello, ask me."}, {"role": "user", "content": "Sky?"},
           {"role": "assistant", "content": "Blue."}]
    assert target_runs(tok, chat(tok).document({"messages": row}, 0)) == ["Hello, ask me.<|im_end|>", "Blue.<|im_end|>"]


def test_qwen3_trains_on_multi_turn_rows_with_the_reasoning_it_writes():
    tok = family_tokenizer("qwen3")
    row = [{"role": "user", "content": "2+2?"},
           {"role": "assistant", "content": "4.", "reasoning_content": "Two twos."},
           {"role": "user", "content": "Times 3?"},
           {"role": "assistant", "content": "12.", "reasoning_content": "Four threes."}]
    assert target_runs(tok, chat(tok).document({"messages": row}, 0)) == [
        "4.<|im_end|>", "<think>\nFour threes.\n</think>\n\n12.<|im_end|>"]
    kwargs = ChatRenderer(tok, "messages", {"messages": "messages"}, template_columns={"enable_thinking": "think"})
    one = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4."}]
    off, on = ({"messages": one, "think": think} for think in (False, True))
    assert target_runs(tok, kwargs.document(off, 0)) == ["4.<|im_end|>"]  # the prompt holds the empty block
    assert target_runs(tok, kwargs.document(on, 0)) == ["<think>\n\n</think>\n\n4.<|im_end|>"]


def test_the_newline_after_the_end_token_is_never_a_target_whatever_the_tokenizer_calls_special():
    plain = tiny_tokenizer(CHATML, None, "</s>", specials=[])
    plain.add_tokens(["<|im_start|>", "<|im_end|>"])  # added, not special (not in additional_special_tokens)
    named = tiny_tokenizer(CHATML, None, "</s>", specials=["<|im_start|>", "<|im_end|>"])
    for tok in (plain, named):
        assert target_runs(tok, chat(tok).document({"messages": CONVERSATION}, 0)) == ["Blue.<|im_end|>",
                                                                                 "Green, mostly.<|im_end|>"]


def test_prompt_completion_strings_get_the_tokenizers_bos_and_boundary_merges_are_counted():
    from tokenizers import processors

    tok = family_tokenizer("llama3_1")
    bos = tok.convert_tokens_to_ids("<|begin_of_text|>")
    tok = tiny_tokenizer(template_text("trl:llama3_1.jinja"), "<|begin_of_text|>", "<|eot_id|>",
                         specials=["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"])
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])
    assert tok("x")["input_ids"][0] == bos
    renderer = chat(tok, columns=["prompt", "completion"])
    ids, labels = renderer.document({"prompt": "2 + 2 =", "completion": " 4"}, 0)
    assert ids[0] == bos and target_runs(tok, (ids, labels)) == [" 4<|eot_id|>"]
    assert tok.decode(ids) == "<|begin_of_text|>2 + 2 = 4<|eot_id|>" and renderer.stats.boundary == 0
    renderer.document({"prompt": "Q: sky?\n", "completion": "\nBlue"}, 1)  # "\n\n" is one token when joined
    assert renderer.stats.boundary == 1 and "1 prompt/completion rows tokenized apart" in renderer.stats.line()
    prompt, completion = renderer.prompt_completion({"prompt": "2 + 2 =", "completion": " 4"}, 0)
    assert prompt[0] == bos and tok.decode(completion) == " 4<|eot_id|>"


@pytest.mark.parametrize("messages, said", [
    ([{"role": "user", "content": [{"type": "text", "text": "Sky?"}]}, {"role": "assistant", "content": "Blue."}],
     r"row 5: messages\[0\].content is a list of parts, and the chat template of 'tiny-chatml' takes strings"),
    ([{"role": "user", "content": 7}, {"role": "assistant", "content": "Blue."}],
     r"row 5: messages\[0\].content is a int \(7\)"),
    ([{"role": "user", "text": "Sky?"}, {"role": "assistant", "content": "Blue."}],
     r"row 5: messages\[0\] has no content \(its keys: 'role', 'text'\)"),
    ([{"content": "Sky?"}], r"row 5: messages\[0\] has no role"),
    ([], r"row 5's 'messages' is an empty list"),
])
def test_malformed_rows_are_refused_naming_the_row_and_the_field(messages, said):
    tok = tiny_tokenizer(CHATML, None, "<|im_end|>")
    tok.name_or_path = "tiny-chatml"
    with pytest.raises(InputError, match=said):
        chat(tok).documents([{"messages": messages}], 5)


def test_a_template_that_refuses_a_row_is_one_error_line_exit_2_and_nothing_written(tmp_path, cli):
    model = tiny_chat_model(tmp_path / "tiny-gemma-chat", family_tokenizer("gemma3"), max_positions=128)
    rows = [{"messages": [{"role": "user", "content": f"Q{i}"}, {"role": "assistant", "content": f"A{i}"}]}
            for i in range(8)]
    rows[5] = {"messages": [{"role": "assistant", "content": "A5"}, {"role": "user", "content": "Q5"}]}
    path = write_jsonl(tmp_path / "chat.jsonl", rows)
    run_dir = tmp_path / "run"
    proc = cli("recipe=char_lm", "data=chat", f"data.source={path}", f"data.cache_dir={tmp_path / 'cache'}",
               "data.seq_len=64", "data.val_fraction=0.2", "model=hf_causal_lm", f"model.name_or_path={model}",
               "trainer.max_steps=1", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "row 5: the chat template of" in lines[0], proc.stderr[-2000:]
    assert "Conversation roles must alternate" in lines[0] and "messages[0] is an assistant turn" in lines[0]
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "results.json").exists()


def test_content_given_as_parts_trains_where_the_template_reads_parts():
    tok = family_tokenizer("gemma3")
    row = [{"role": "user", "content": [{"type": "text", "text": "Sky?"}]},
           {"role": "assistant", "content": [{"type": "text", "text": "Blue."}]}]
    doc = chat(tok).document({"messages": row}, 0)
    assert target_runs(tok, doc) == ["Blue.<end_of_turn>"]
    assert tok.decode(doc[0]) == tok.apply_chat_template(row, tokenize=False)


def test_the_registered_chat_and_text_modules_load_batches_when_built_outside_a_run(tmp_path, cache):
    # the catalog registers them with seed=None for a run to fill; built on their own they take seed 0
    from framework.registry import DATA, load_catalog

    load_catalog()
    rows = [{"messages": [{"role": "user", "content": f"Q{i}?"}, {"role": "assistant", "content": f"A{i}."}]}
            for i in range(40)]
    chats = DATA.build("chat", source=str(write_jsonl(tmp_path / "chats.jsonl", rows)), seq_len=64, batch_size=4)
    chats.use_tokenizer(tiny_tokenizer(CHATML, None, "<|im_end|>"))
    (tmp_path / "notes.txt").write_text("one short document\n\nand another one\n" * 50, encoding="utf-8")
    (tmp_path / "more.txt").write_text("a second file of text\n" * 50, encoding="utf-8")
    text = DATA.build("text", source=str(tmp_path / "*.txt"), seq_len=32, batch_size=4)
    for data in (chats, text):
        data.prepare_data()
        data.setup()
        batch = next(iter(data.train_dataloader()))
        assert data.seed == 0 and batch["input_ids"].shape == (4, data.seq_len)

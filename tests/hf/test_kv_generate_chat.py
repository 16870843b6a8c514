"""`python -m framework.kv_generate MODEL --prompt TEXT --chat`: the prompt goes in as one user turn of the tokenizer's
chat template with the assistant's turn opened, and generate() starts from exactly that rendering's tokens; `--chat`
with `--ids`, or on a tokenizer without a template, is refused with one `error:` line and exit 2."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from support.tiny_chat import FAMILIES, tiny_chat_model, tiny_tokenizer  # noqa: E402

from framework.kv_generate import main, parse_args, run  # noqa: E402
from framework.probes.allocation import HeadAllocation  # noqa: E402

QUESTION = "What colour is the sky?"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny Llama-3-style chat model (its template opens with the BOS token), the same without a template, and a
    pattern for their one layer of one KV head."""
    root = tmp_path_factory.mktemp("kv_generate_chat")
    template, bos, eos = FAMILIES["llama3"]
    torch.manual_seed(0)
    chat = tiny_chat_model(root / "chat", tiny_tokenizer(template, bos=bos, eos=eos))
    base = tiny_chat_model(root / "base", tiny_tokenizer(None))
    HeadAllocation.from_gates(torch.tensor([[0.9]]), 1, 4, sparsity=0.0).save(root / "pattern")
    return chat, base, root / "pattern"


@pytest.fixture
def started_from(monkeypatch):
    """The input ids each `generate()` call got."""
    from transformers import GenerationMixin

    seen: list[list[int]] = []
    generate = GenerationMixin.generate

    def spy(self, inputs=None, *args, **kwargs):
        seen.append(inputs[0].tolist())
        return generate(self, inputs, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", spy)
    return seen


def test_chat_decodes_from_the_templates_rendering_of_one_user_turn(models, started_from, capsys):
    from transformers import AutoTokenizer

    chat, _, pattern = models
    argv = [str(chat), "--pattern", str(pattern), "--prompt", QUESTION, "-n", "4"]
    got = run(parse_args([*argv, "--chat"]))
    tok = AutoTokenizer.from_pretrained(chat)
    rendered = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"]
    assert started_from == [rendered] and got["prompt"] == rendered
    text = tok.decode(rendered)
    assert text.startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n" + QUESTION)
    assert text.endswith("<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert text.count("<|begin_of_text|>") == 1  # the template's BOS, none added on top
    plain = run(parse_args(argv))  # without --chat: the text as it is
    assert started_from[1] == plain["prompt"] == tok(QUESTION, add_special_tokens=False)["input_ids"]
    assert capsys.readouterr().out.count("tokens: [") == 2


def _refused(argv: list[str], capsys) -> str:
    code = main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and err[0].startswith("error:"), (code, err)
    return err[0]


def test_chat_with_ids_or_without_a_template_is_refused(models, started_from, capsys):
    chat, base, pattern = models
    err = _refused([str(chat), "--pattern", str(pattern), "--ids", "5 6 7", "--chat"], capsys)
    assert err == ("error: --chat applies the chat template to --prompt TEXT, but the prompt came as --ids '5 6 7', "
                   "already tokens: give the text as --prompt, or drop --chat")
    err = _refused([str(base), "--pattern", str(pattern), "--prompt", QUESTION, "--chat"], capsys)
    assert err == (f"error: --chat: the tokenizer of {base} has no chat template (a base model's, not a chat / "
                   "instruct model's): drop --chat to send the prompt as plain text, or use a chat model")
    assert started_from == []  # nothing was decoded

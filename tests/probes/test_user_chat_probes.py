"""RLKV's and DuoAttention's probes on the user's `data=chat` prompt/completion rows: prompts of varying length come
left-padded with their mask, the completions are the answers, and the reward is the generated completion matching
them through the end token. A word-level tokenizer and a tiny Llama are built here and saved to a folder, as a user's
model would be; the files are written in the test; nothing is downloaded."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from support.tiny_chat import WORDS, tiny_llama, word_tokenizer

pytest.importorskip("transformers")

def first_word_rows(n: int, seed: int = 0) -> list[dict[str, str]]:
    """`list: w1 .. wk first:` -> ` w1`, k from 2 to 10: the answer is far back in a prompt of varying length."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, 10))]
        rows.append({"prompt": "list: " + " ".join(words) + " first:", "completion": " " + words[0]})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_prompt_batches_are_left_padded_and_each_row_decodes_as_it_would_alone(tmp_path):
    """data=chat's prompt batches: each prompt right-aligned after padding (mask False there), each answer the
    completion's ids through EOS then padding. Decoding the padded batch, with the full cache, a mixed cache and the
    soft-gated model, gives every row the tokens it gets alone; the reward of answers equal to those is 1."""
    from framework.data.user_chat import ChatData
    from framework.models.hf import HFCausalLM
    from framework.probes.allocation import select_full_heads
    from framework.probes.base import accuracy_at
    from framework.serving.decoding import decode, decode_uncached

    tok = word_tokenizer()
    rows = first_word_rows(24)
    data = ChatData(str(write_jsonl(tmp_path / "qa.jsonl", rows)), seq_len=32, batch_size=4, cache_dir=str(tmp_path))
    data.use_tokenizer(tok)
    data.use_prompts()
    data.setup()
    assert data.prompt_counts["train"]["rows"] == 22 and data.prompt_counts["end_ids"] == [tok.eos_token_id]
    assert data.max_new_tokens == 2 and data.record()["prompts"]["val"]["rows"] == 2
    batch = next(iter(data.val_dataloader()))  # rows 0 and 20 (held out: every 20th from the first)
    for r, i in enumerate(batch["index"].tolist()):
        real = batch["prompt"][r][batch["prompt_mask"][r]]
        assert tok.decode(real) == rows[[0, 20][i]]["prompt"]
        assert bool(batch["prompt_mask"][r, -1]) and not bool(batch["prompt_mask"][r, : -len(real)].any())
        assert batch["answer"][r].tolist() == tok(rows[[0, 20][i]]["completion"])["input_ids"] + [tok.eos_token_id]

    torch.manual_seed(0)
    model = HFCausalLM(config={"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                               "max_position_embeddings": 64}, vocab_size=len(tok)).eval()
    batch = next(iter(data.train_dataloader()))
    prompt, mask = batch["prompt"], batch["prompt_mask"]
    assert len({int(m.sum()) for m in mask}) > 1  # prompts of different lengths in one batch
    gates = torch.tensor([[0.2, 0.9], [0.6, 0.0]])
    full_heads, window = select_full_heads(gates, 0.5), (1, 2)
    runs = {"full": lambda p, m: decode(model, p, 6, None, window, prompt_mask=m),
            "mixed": lambda p, m: decode(model, p, 6, full_heads, window, prompt_mask=m),
            "soft": lambda p, m: decode_uncached(model, p, 6, gates=gates, window=window, prompt_mask=m)}
    with torch.no_grad():  # the soft-gated forward (rollouts, their log-probs): each row's sink is its first token
        padded = model(prompt, key_padding_mask=mask, gates=gates, window=window)
        for r in range(len(prompt)):
            alone = model(prompt[r][mask[r]][None], gates=gates, window=window)[0]
            assert (padded[r][mask[r]] - alone).abs().max() <= 1e-5 * alone.abs().max()
    for name, run in runs.items():
        together = run(prompt, mask)
        alone = torch.cat([run(prompt[r][mask[r]][None], None) for r in range(len(prompt))])
        assert torch.equal(together, alone), name
        if name != "soft":
            hard = None if name == "full" else full_heads
            assert accuracy_at(model, prompt, alone, hard, window, None, None, prompt_mask=mask).tolist() == [1.0] * 4


def _chat_data(tmp_path: Path, rows: list[dict], **kw):
    from framework.data.user_chat import ChatData

    data = ChatData(str(write_jsonl(tmp_path / "qa.jsonl", rows)), seq_len=32, batch_size=4, cache_dir=str(tmp_path),
                    **kw)
    data.use_tokenizer(word_tokenizer())
    return data


def _fit(probe, data, tmp_path: Path, steps: int = 2):
    import lightning as L

    trainer = L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=1,
                        num_sanity_val_steps=0, default_root_dir=str(tmp_path))
    trainer.fit(probe, datamodule=data)
    return trainer


def test_duo_attention_distils_at_each_completions_tokens_through_its_end_and_moves_the_gates(tmp_path):
    """The probe asks for prompt batches itself (a chat DataModule given to a plain Lightning Trainer); the hidden
    states it distils are those that predict each completion's tokens and its EOS, not the padding after it."""
    from framework.models.hf import HFCausalLM
    from framework.probes.duo_attention import DuoAttentionProbe

    data = _chat_data(tmp_path, first_word_rows(24))
    model = HFCausalLM(str(tiny_llama(tmp_path / "llama")))
    probe = DuoAttentionProbe(model, optimizer=lambda ps: torch.optim.Adam([p for _, p in ps], lr=0.05),
                              save_allocation=False)
    _fit(probe, data, tmp_path)
    assert data.serves_prompts() and probe.eos_id == 1 and probe.max_new_tokens == 2 and probe.prompt_length is None
    batch = next(iter(data.train_dataloader()))
    inputs, padding, where = probe.teacher_forced(batch)
    width = batch["prompt"].shape[1]
    assert torch.equal(padding[:, :width], batch["prompt_mask"]) and bool(padding[:, width:].all())
    assert where.sum(1).tolist() == [2] * 4 and bool(where[:, width - 1 : width + 1].all())  # the word, then EOS
    assert not torch.equal(probe.gates, torch.ones(2, 2))


# make test-slow (~15 s of a busy suite): make test runs the probe's CLI in bf16 (test_fault_injection), a chat file
# through the CLI (data/test_chat.py) and the prompt batches the probe takes from chat rows (above), in process
@pytest.mark.slow
def test_rlkv_probes_a_model_on_a_chat_file_through_the_cli(cli, tmp_path):
    """`recipe=rlkv_probe data=chat data.source=<file> model=hf_causal_lm model.name_or_path=<folder>`: the rows
    come as prompts (logged), the probe trains its gates a few steps on them and writes its allocation; the run's
    record names the rows kept."""
    from framework.probes.allocation import HeadAllocation

    run = tmp_path / "run"
    proc = cli(*probe_args(tmp_path, "rlkv"), f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "data=chat as prompts: 38 training and 2 validation rows (0 skipped" in (run / "train.log").read_text()
    results = json.loads((run / "results.json").read_text())
    assert results["global_step"] == 2 and 0.0 <= results["metrics"]["val/acc_full"] <= 1.0
    assert results["data"]["prompts"]["train"]["rows"] == 38
    alloc = HeadAllocation.load(run)
    assert alloc.shape == (2, 2) and alloc.method == "rlkv"


def probe_args(tmp_path: Path, module: str) -> list[str]:
    """A probe's command line on a file of 40 rows and a tiny Llama folder (both written here), 2 steps."""
    model = tiny_llama(tmp_path / "llama")
    source = write_jsonl(tmp_path / "qa.jsonl", first_word_rows(40))
    return ["recipe=rlkv_probe", f"module={module}", "data=chat", f"data.source={source}", "data.seq_len=32",
            "data.batch_size=4", "model=hf_causal_lm", f"model.name_or_path={model}", "trainer.max_steps=2",
            "trainer.val_check_interval=2", "trainer.limit_val_batches=1"]


@pytest.mark.slow
def test_duo_attention_probes_a_model_on_a_chat_file_through_the_cli(cli, tmp_path):
    from framework.probes.allocation import HeadAllocation

    run = tmp_path / "run"
    proc = cli(*probe_args(tmp_path, "duo_attention"), f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((run / "results.json").read_text())["global_step"] == 2
    assert HeadAllocation.load(run).method == "duo_attention"


def test_completions_that_end_with_another_token_than_the_eos_are_refused_naming_it(tmp_path):
    """Message-list completions close with the template's end of turn (`<end>` here); where the tokenizer's EOS is
    another token the probe would not stop where the answer does: refused, naming the id to set."""
    from framework.errors import InputError
    from framework.models.hf import HFCausalLM
    from framework.probes.rlkv import RLKVProbe

    template = ("{% for m in messages %}{{ m['content'] + ' first:' if m['role'] == 'user' else m['content'] + "
                "' <end>' }}{% endfor %}")
    rows = [{"prompt": [{"role": "user", "content": r["prompt"][: -len(" first:")]}],
             "completion": [{"role": "assistant", "content": r["completion"]}]} for r in first_word_rows(12)]
    data = _chat_data(tmp_path, rows, chat_template=template)
    probe = RLKVProbe(HFCausalLM(str(tiny_llama(tmp_path / "llama"))), eos_id=1, save_allocation=False)
    with pytest.raises(InputError, match=r"the completions end with id\(s\) 2; set module.eos_id=2"):
        _fit(probe, data, tmp_path)
    assert data.prompt_counts["end_ids"] == [2]
    _fit(RLKVProbe(HFCausalLM(str(tmp_path / "llama")), eos_id=2, group_size=2, save_allocation=False), data,
         tmp_path, steps=1)


def test_a_conversation_is_probed_on_its_last_assistant_turn_cut_from_its_one_render(tmp_path):
    """A `messages` row (TRL's shape, as most chat datasets are) gives the probes the conversation before its last
    assistant turn as the prompt, ending in the template's generation prompt: transformers' own render of those
    messages with `add_generation_prompt=True`; and that turn through its end of turn as the completion."""
    from support.tiny_chat import CHATML, CONVERSATION, tiny_tokenizer

    from framework.data.user_chat import ChatData

    tok = tiny_tokenizer(CHATML, eos="<|im_end|>")
    rows = [{"messages": CONVERSATION if i % 2 else CONVERSATION[:3]} for i in range(40)]
    data = ChatData(str(write_jsonl(tmp_path / "chats.jsonl", rows)), seq_len=128, batch_size=4,
                    cache_dir=str(tmp_path))
    data.use_tokenizer(tok)
    data.use_prompts()
    data.setup()
    assert data.prompt_counts["train"]["rows"] == 38 and data.prompt_counts["end_ids"] == [tok.eos_token_id]
    for i, (prompt, completion) in enumerate(data.prompt_completions(limit=2)):  # one exchange, then two
        messages = rows[i]["messages"]
        expected = tok.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=False)
        assert prompt.tolist() == tok(expected, add_special_tokens=False)["input_ids"]
        assert tok.decode(completion) == messages[-1]["content"] + "<|im_end|>"


@pytest.mark.slow
def test_rlkv_on_a_model_fine_tuned_on_the_chat_file_matches_held_out_completions(cli, tmp_path):
    """The whole path a user takes (slow, ~20 s): fine-tune a tiny Llama on the prompt/completion file with OLion,
    then probe it with RLKV on the same file: with the full cache the held-out completions (the first word of a
    prompt of 2 to 10 words, left-padded among others) are generated exactly; the rollouts' reward is high enough
    that RLKV's L1 pressure is on, and with half the KV heads compressed the probed allocation keeps more
    completions than the untrained gates' (0.25 -> 1.0 when measured)."""
    model = tiny_llama(tmp_path / "llama")
    source = write_jsonl(tmp_path / "qa.jsonl", first_word_rows(400, seed=1))
    tuned = tmp_path / "tuned"
    proc = cli("recipe=char_lm", "data=chat", f"data.source={source}", "data.seq_len=32", "data.batch_size=16",
               "data.packing=false", "model=hf_causal_lm", f"model.name_or_path={model}", "optimizer=olion",
               "optimizer.lr=1e-2", "trainer.max_steps=300", "trainer.val_check_interval=300",
               f"hydra.run.dir={tuned}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "probe"
    proc = cli("recipe=rlkv_probe", "data=chat", f"data.source={source}", "data.seq_len=32", "data.batch_size=8",
               "model=hf_causal_lm", f"model.name_or_path={model}", f"init_from={tuned}", "trainer.max_steps=20",
               "trainer.val_check_interval=20", "trainer.limit_val_batches=3", f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((run / "results.json").read_text())
    metrics, initial = results["metrics"], results["initial_metrics"]
    assert metrics["val/acc_full"] >= 0.9 and metrics["train/reward"] > 0.5, metrics
    assert metrics["train/penalty_weight"] > 0 and metrics["val/gate_mean"] < 1.0
    assert metrics["val/acc_s0.5"] > initial["val/acc_s0.5_init"] + 0.3, (metrics, initial)


@pytest.mark.slow  # a CLI probe run (~15 s); tests/hf/test_peft_serving.py checks gates and the mixed cache in process
def test_rlkv_probes_a_lora_fine_tuned_model_given_by_its_adapter_and_leaves_the_adapter_as_saved(cli, tmp_path):
    """`init_from=<a PEFT adapter folder>` on its base (a folder PEFT's `save_pretrained` wrote): the probe runs on
    the adapted model (the log says so), writes its allocation, and the checkpoint holds the adapter's weights exactly
    as saved: only the gates train."""
    from safetensors.torch import load_file

    from framework.models.hf import HFCausalLM
    from framework.models.peft_adapters import LoRA, attach
    from framework.probes.allocation import HeadAllocation

    args = probe_args(tmp_path, "rlkv")
    base = next(a.split("=", 1)[1] for a in args if a.startswith("model.name_or_path="))
    model = HFCausalLM(name_or_path=base)
    wrapper = attach(model, LoRA(r=4, alpha=8.0, dropout=0.0))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    wrapper.save_pretrained(str(tmp_path / "adapter"))
    saved = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    run = tmp_path / "run"
    proc = cli(*args, f"init_from={tmp_path / 'adapter'}", f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"peft: continuing the adapter {tmp_path / 'adapter'} with its own values (r=4" in (run / "train.log"
                                                                                               ).read_text()
    assert HeadAllocation.load(run).shape == (2, 2)
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    lora = {k: v for k, v in state.items() if "lora_" in k}
    assert len(lora) == len(saved) > 0
    for key, value in saved.items():  # PEFT's file drops the adapter name: `...lora_A.weight`
        (match,) = [v for k, v in lora.items() if k.endswith(key.replace("base_model.model.", "").replace(
            ".weight", ".default.weight"))]
        assert torch.equal(match, value), key

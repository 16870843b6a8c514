"""The dict batch of user text (input_ids, labels, position_ids or attention_mask, index) under the causal LM and the
MDLM modules: packed documents attend only within themselves (the framework's TransformerLM and transformers models,
sdpa and eager), losses are token-weighted, and the Data Agent / InfoBatch select among a language model's rows."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from hf_models import MASKED_FAMILIES

from framework.models.transformer import TransformerLM
from framework.modules.causal_lm import CausalLM, token_stats
from framework.modules.mdlm import MDLMModule, user_prompts, user_rows
from framework.samplers.reward import sample_pieces, uncertainty

LENGTHS = (5, 7, 4)  # three documents packed into one row of 16
VOCAB = 64
LLAMA = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


def _documents(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB - 1, (n,), generator=g) for n in LENGTHS]


def packed(docs: list[torch.Tensor], pad: int = 0) -> dict[str, torch.Tensor]:
    """One packed row as the contract has it: positions restart per document, each document's first label -100, and
    `pad` padding tokens at the tail as their own all -100 "document"."""
    ids = torch.cat([*docs, torch.zeros(pad, dtype=torch.long)])
    labels = torch.cat([torch.cat([torch.tensor([-100]), d[1:]]) for d in docs] + [torch.full((pad,), -100)])
    positions = torch.cat([torch.arange(len(d)) for d in [*docs, torch.zeros(pad)] if len(d)])
    return {"input_ids": ids[None], "labels": labels[None], "position_ids": positions[None],
            "index": torch.tensor([0])}


def padded(docs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same documents one per row, right-padded with id 0, with `attention_mask`."""
    width = max(len(d) for d in docs)
    ids = torch.zeros(len(docs), width, dtype=torch.long)
    mask = torch.zeros(len(docs), width, dtype=torch.long)
    for i, d in enumerate(docs):
        ids[i, : len(d)], mask[i, : len(d)] = d, 1
    return {"input_ids": ids, "labels": ids.masked_fill(mask == 0, -100), "attention_mask": mask,
            "index": torch.arange(len(docs))}


def assert_packed_is_alone(model: torch.nn.Module, docs: list[torch.Tensor]) -> None:
    """Each document's logits in the packed row equal its logits alone (within float tolerance)."""
    model.eval()
    batch = packed(docs)
    with torch.no_grad():
        together = model(batch["input_ids"], position_ids=batch["position_ids"])[0]
        at = 0
        for d in docs:
            torch.testing.assert_close(together[at : at + len(d)], model(d[None])[0], rtol=1e-4, atol=1e-5)
            at += len(d)


@pytest.mark.parametrize("causal", [True, False])
def test_transformer_lm_packed_documents_equal_each_document_alone(causal):
    torch.manual_seed(0)
    assert_packed_is_alone(TransformerLM(VOCAB, dim=32, depth=2, heads=4, causal=causal), _documents())


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_hf_models_packed_documents_equal_each_document_alone(attn):
    """A llama (causal: transformers reads the documents from position_ids), the same llama run bidirectionally
    (causal=False: our block-diagonal mask, logits shifted within each document) and a BERT and a RoBERTa (masked LMs:
    our mask; RoBERTa's positions start past its padding id)."""
    from framework.models.hf import HFCausalLM, HFMaskedLM

    docs = _documents(1)
    torch.manual_seed(0)
    assert_packed_is_alone(HFCausalLM(config=LLAMA, vocab_size=VOCAB, attn_implementation=attn), docs)
    assert_packed_is_alone(HFCausalLM(config=LLAMA, vocab_size=VOCAB, attn_implementation=attn, causal=False), docs)
    bert = {**MASKED_FAMILIES["bert"], "max_position_embeddings": 64}
    assert_packed_is_alone(HFMaskedLM(config=bert, vocab_size=VOCAB, attn_implementation=attn), docs)
    roberta = {**bert, "model_type": "roberta", "pad_token_id": 1, "max_position_embeddings": 70}
    assert_packed_is_alone(HFMaskedLM(config=roberta, vocab_size=VOCAB, attn_implementation=attn), docs)


def test_padding_is_hidden_under_eager_attention_of_a_bidirectional_hf_model():
    """Eager attention adds a 4-D mask to its scores: a boolean one would hide nothing (it was, for causal=False)."""
    from framework.models.hf import HFCausalLM

    torch.manual_seed(0)
    model = HFCausalLM(config=LLAMA, vocab_size=VOCAB, attn_implementation="eager", causal=False).eval()
    doc = _documents()[1]
    ids, keys = torch.cat([doc, torch.zeros(3, dtype=torch.long)])[None], torch.ones(1, len(doc) + 3)
    keys[:, len(doc):] = 0
    with torch.no_grad():
        torch.testing.assert_close(model(ids, keys)[0, : len(doc)], model(doc[None])[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("hf", [False, True])
def test_a_documents_loss_has_no_gradient_from_another_document(hf):
    """Document 0's next-token loss, backpropagated, leaves exactly zero gradient on the other documents' input
    embeddings (block-causal attention: nothing crosses a boundary)."""
    torch.manual_seed(0)
    if hf:
        from framework.models.hf import HFCausalLM

        model = HFCausalLM(config=LLAMA, vocab_size=VOCAB, attn_implementation="sdpa")
        embed = model.hf.get_input_embeddings()
    else:
        model = TransformerLM(VOCAB, dim=32, depth=2, heads=4)
        embed = model.embed
    captured = []

    def keep(module, inputs, out):
        out.retain_grad()
        captured.append(out)

    handle = embed.register_forward_hook(keep)
    batch = packed(_documents())
    logits = model(batch["input_ids"], position_ids=batch["position_ids"])
    handle.remove()
    first = LENGTHS[0]
    F.cross_entropy(logits[0, : first - 1], batch["input_ids"][0, 1:first]).backward()
    grad = captured[0].grad[0]
    assert grad[:first].abs().sum() > 0
    assert torch.equal(grad[first:], torch.zeros_like(grad[first:]))


def test_causal_lm_packed_row_scores_what_the_padded_rows_score():
    """The same three documents packed in one row (position_ids) and one per padded row (attention_mask): equal
    token-weighted loss, and per-row losses that are each row's mean over its supervised tokens."""
    torch.manual_seed(0)
    lm = CausalLM(TransformerLM(VOCAB, dim=32, depth=2, heads=4)).eval()
    docs = _documents()
    with torch.no_grad():
        one, rows = lm.loss(packed(docs, pad=3)), lm.loss(padded(docs))
        per_row = lm.per_sample_loss(padded(docs))
        alone = [lm.per_sample_loss(d[None])[0] for d in docs]
    torch.testing.assert_close(one, rows, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(per_row, torch.stack(alone), rtol=1e-5, atol=1e-6)
    counts = torch.tensor([n - 1 for n in LENGTHS], dtype=torch.float)
    torch.testing.assert_close(rows, (per_row * counts).sum() / counts.sum(), rtol=1e-5, atol=1e-6)  # token-weighted


def test_a_row_with_no_supervised_token_has_loss_zero_and_weighs_nothing():
    torch.manual_seed(0)
    lm = CausalLM(TransformerLM(VOCAB, dim=32, depth=2, heads=4)).eval()
    batch = padded(_documents())
    batch["labels"][1] = -100
    with torch.no_grad():
        losses = lm.per_sample_loss(batch)
        assert losses[1] == 0 and bool((losses[[0, 2]] > 0).all())
        counts = torch.tensor([LENGTHS[0] - 1, LENGTHS[2] - 1], dtype=torch.float)
        torch.testing.assert_close(lm.loss(batch), (losses[[0, 2]] * counts).sum() / counts.sum())


def test_validation_loss_is_token_weighted_over_batches():
    torch.manual_seed(0)
    lm = CausalLM(TransformerLM(VOCAB, dim=32, depth=2, heads=4)).eval()
    docs = _documents()
    batches = [padded(docs[:1]), padded(docs[1:])]
    with torch.no_grad():
        for i, batch in enumerate(batches):
            lm.validation_step(batch, i)
        total = sum(lm.per_sample_loss(padded([d]))[0] * (len(d) - 1) for d in docs)
    torch.testing.assert_close(lm.val_nll.compute(), total / sum(n - 1 for n in LENGTHS), rtol=1e-5, atol=1e-6)


def test_token_stats_give_each_rows_mean_label_smoothed_ce_and_uncertainty():
    g = torch.Generator().manual_seed(0)
    logits, targets = torch.randn(3, 6, VOCAB, generator=g), torch.randint(0, VOCAB, (3, 6), generator=g)
    targets[0, :2] = targets[2] = -100
    losses, unsure = sample_pieces({"token_stats": token_stats(logits, targets, chunk=VOCAB * 4)}, 0.1)
    for row in range(2):
        keep = targets[row] != -100
        ce = F.cross_entropy(logits[row][keep], targets[row][keep], reduction="none", label_smoothing=0.1)
        torch.testing.assert_close(losses[row], ce.mean())
        torch.testing.assert_close(unsure[row], uncertainty(logits[row][keep]).mean())
    assert losses[2] == 0 and unsure[2] == 0


def test_mdlm_reads_user_rows_masking_real_tokens_only():
    """Packed rows: the padding tail (its labels all -100) is neither attended, masked nor scored; the first token of
    each document is real; the extra loss's prompt is each row's leading -100 run, its targets what follows."""
    docs = _documents()
    batch = packed(docs, pad=3)
    tokens, real, prompt, positions = user_rows(batch)
    assert real[0].tolist() == [True] * sum(LENGTHS) + [False] * 3
    starts = torch.cumsum(torch.tensor((0, *LENGTHS[:-1])), 0).tolist()
    assert torch.nonzero(prompt[0]).flatten().tolist() == starts
    seen = []

    class Recorder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = TransformerLM(VOCAB + 1, dim=32, depth=1, heads=4, causal=False)

        def forward(self, ids, key_padding_mask=None, position_ids=None):
            seen.append((ids, key_padding_mask, position_ids))
            return self.net(ids, key_padding_mask=key_padding_mask, position_ids=position_ids)

    module = MDLMModule(Recorder(), vocab_size=VOCAB)
    loss = module.training_step(batch, 0)
    loss.backward()
    ids, keys, pos = seen[0]
    assert torch.equal(ids[0, -3:], torch.zeros(3, dtype=torch.long))  # the padding is never masked
    assert torch.equal(keys, real) and torch.equal(pos, batch["position_ids"])
    prompt, target, lengths, scored = user_prompts(batch, 3, pad_id=0)
    assert lengths.tolist() == [1] and torch.equal(target[0], docs[0][1:4]) and bool(scored.all())


def test_mdlm_mask_agnostic_trains_an_hf_masked_lm_on_user_rows():
    from framework.losses.mask_agnostic import MaskAgnosticLoss
    from framework.models.hf import HFMaskedLM

    torch.manual_seed(0)
    model = HFMaskedLM(config={**MASKED_FAMILIES["bert"], "max_position_embeddings": 64}, vocab_size=VOCAB)
    mask_id = VOCAB - 1
    for batch in (packed(_documents(), pad=2), padded(_documents())):
        module = MDLMModule(model, mask_id=mask_id, target_len=4,
                            extra_loss=MaskAgnosticLoss(mask_id=mask_id, pad_id=0, k1=1, k_max=4))
        loss = module.training_step(batch, 0)
        loss.backward()
        assert torch.isfinite(loss) and model.hf.get_input_embeddings().weight.grad.abs().sum() > 0
        model.zero_grad()


def test_a_causal_lm_hands_a_selection_policy_each_rows_pooled_hidden_state_and_token_stats(monkeypatch):
    """With a policy that reads features and logits, a training step returns each row's final hidden state (the LM
    head's input: the model's own `features`) averaged over its supervised positions, and its `token_stats`."""
    from framework.models.hf import HFCausalLM
    from framework.samplers.agent import DataAgentPolicy

    torch.manual_seed(0)
    model = HFCausalLM(config=LLAMA, vocab_size=VOCAB)
    lm = CausalLM(model)
    monkeypatch.setattr(CausalLM, "_selection_needs", lambda self: set(DataAgentPolicy.needs))
    batch = padded(_documents())
    out = lm.training_step(batch, 0)
    with torch.no_grad():
        hidden = model.features(batch["input_ids"], batch["attention_mask"])
        logits, targets = lm.predictions(batch)
    for row, n in enumerate(LENGTHS):  # supervised: positions 0 .. n-2 predict tokens 1 .. n-1
        torch.testing.assert_close(out["features"][row], hidden[row, : n - 1].mean(0), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out["token_stats"], token_stats(logits, targets))
    torch.testing.assert_close(out["token_stats"][:, 0], out["per_sample_loss"].detach(), rtol=1e-5, atol=1e-6)


def _text_file(folder) -> str:
    """A JSON-lines file of 24 short documents."""
    g = torch.Generator().manual_seed(0)
    words = "the quick brown fox jumps over a lazy dog while packed rows keep documents apart".split()
    lines = []
    for _ in range(24):
        picks = torch.randint(0, len(words), (int(torch.randint(3, 30, (1,), generator=g)),), generator=g)
        lines.append(json.dumps({"text": " ".join(words[i] for i in picks)}))
    path = folder / "docs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("sampler", ["data_agent", "infobatch"])
def test_selection_prunes_among_the_users_text_rows(cli, tmp_path, sampler):
    """`data=text` (dict batches of packed rows) under a selection policy, through the real CLI: three epochs, and the
    later ones train on fewer rows (per-row losses weighed, the agent acting on each row's state)."""
    proc = cli("recipe=char_lm", "data=text", f"data.source={_text_file(tmp_path)}", f"sampler={sampler}",
               "trainer.max_steps=-1", "trainer.max_epochs=3", "data.batch_size=8", "data.seq_len=64", "model.dim=32",
               "model.depth=1", "trainer.limit_val_batches=1", "trainer.val_check_interval=null",
               f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "results.json").read_text())["metrics"]
    assert metrics["selection/pruned"] > 0 and metrics["selection/cost"] < 1


def test_mdlm_mask_agnostic_on_the_users_text_with_an_hf_masked_lm(cli, tmp_path):
    """`module=mdlm loss=mask_agnostic` trains a transformers masked LM (its tokenizer's [MASK]) on `data=text`."""
    from hf_models import save_model

    folder = save_model("bert", tmp_path / "bert")
    proc = cli("recipe=mdlm_text", "model=hf_masked_lm", f"model.name_or_path={folder}", "data=text",
               f"data.source={_text_file(tmp_path)}", "loss=mask_agnostic", "trainer.max_steps=2", "data.batch_size=4",
               "data.seq_len=32", "trainer.limit_val_batches=1", "trainer.val_check_interval=2",
               f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "results.json").read_text())["metrics"]
    assert metrics["train/extra_loss"] > 0 and metrics["train/ce_k2"] > 0 and 0 < metrics["val/nelbo"] < 1e3


def test_data_agent_selects_among_a_language_models_rows(cli, tmp_path):
    """`sampler=data_agent` on the byte LM's tensor batches (it was a TypeError asking for logits) trains through the
    real CLI: the agent acts on each row's pooled hidden state and its token-level reward pieces."""
    proc = cli("recipe=char_lm", "sampler=data_agent", "trainer.max_steps=3", "data.batch_size=4",
               "data.seq_len=32", "model.dim=32", "model.depth=1", "trainer.limit_val_batches=1",
               "trainer.val_check_interval=3", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "results.json").read_text())["metrics"]
    assert 0 < metrics["selection/action_mean"] < 1 and metrics["selection/samples_seen"] == 12

"""The chunked next-token loss (`framework.modules.head_loss`): the same losses and gradients as the whole logits', no
(seq, vocab) tensor kept for the backward pass, and the whole logits where a family changes its head's output."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from framework.modules import head_loss
from framework.modules.causal_lm import CausalLM

pytest.importorskip("transformers")

VOCAB = 300
LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": VOCAB, "tie_word_embeddings": True}


def packed_batch(rows: int = 2, length: int = 48) -> dict[str, torch.Tensor]:
    """Packed rows of two documents each, the first 9 tokens of each row unsupervised (a prompt)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (rows, length), generator=g)
    labels = ids.clone()
    labels[:, :9] = -100
    positions = torch.cat([torch.arange(length // 3), torch.arange(length - length // 3)]).repeat(rows, 1)
    return {"input_ids": ids, "labels": labels, "position_ids": positions}


def loss_and_grads(model: nn.Module, module: CausalLM, batch) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    loss = module.loss(batch)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def models():
    from framework.models.hf import HFCausalLM
    from framework.models.transformer import TransformerLM

    torch.manual_seed(0)
    yield "hf_causal_lm", HFCausalLM(config=LLAMA)
    torch.manual_seed(0)
    yield "transformer_lm", TransformerLM(vocab_size=VOCAB, dim=32, depth=2, heads=4, max_seq_len=64)


@pytest.mark.parametrize("name", ["hf_causal_lm", "transformer_lm"])
def test_the_chunked_loss_and_its_gradients_are_the_whole_logits_ones(name, monkeypatch):
    """Slices of 7 rows (so several per batch): loss and every gradient as with the whole logits, within float
    rounding; the chunked path is the one taken, and the prompt masking (`prompt_length`) holds in both."""
    model = dict(models())[name]
    batch = packed_batch()
    monkeypatch.setattr(head_loss, "CHUNK_ELEMENTS", 7 * VOCAB)
    calls = []
    real = head_loss._slice_losses
    monkeypatch.setattr(head_loss, "_slice_losses", lambda *a: calls.append(a[1].shape[0]) or real(*a))
    for prompt_length in (0, 12):
        chunked = CausalLM(model, prompt_length=prompt_length)
        whole = CausalLM(model, prompt_length=prompt_length, chunked_loss=False)
        calls.clear()
        loss, grads = loss_and_grads(model, chunked, batch)
        assert chunked._head_takes is True
        supervised = 2 * (47 - max(8, prompt_length - 1))
        # built at the supervised positions only, 7 rows at a time, each slice again in the backward pass
        assert sum(calls) == 2 * supervised and max(calls) == 7, calls
        expected, expected_grads = loss_and_grads(model, whole, batch)
        torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
        assert len(grads) == len(expected_grads) == len(list(model.parameters()))
        for got, want in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(chunked.per_sample_loss(batch), whole.per_sample_loss(batch), rtol=1e-5,
                                   atol=1e-6)


def test_no_logits_of_the_whole_batch_are_kept_for_the_backward_pass():
    """The tensors autograd keeps for the backward pass: with the whole logits, one holds every position's vocabulary;
    chunked, none holds more than a slice (CHUNK_ELEMENTS) beyond the model's own activations."""
    from framework.models.hf import HFCausalLM

    vocab = 4096  # logits well above the model's own activations, as at a real vocabulary
    model = HFCausalLM(config={**LLAMA, "vocab_size": vocab})
    batch = packed_batch(rows=2, length=64)
    whole_size = 2 * 63 * vocab

    def largest_saved(module: CausalLM) -> int:
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            module.loss(batch).backward()
        return max(sizes)

    assert largest_saved(CausalLM(model, chunked_loss=False)) >= whole_size
    old = head_loss.CHUNK_ELEMENTS
    head_loss.CHUNK_ELEMENTS = 8 * vocab
    try:
        assert largest_saved(CausalLM(model)) <= whole_size / 8
    finally:
        head_loss.CHUNK_ELEMENTS = old


def test_a_family_that_changes_its_heads_logits_gets_the_whole_logits():
    """Gemma 2 soft-caps its logits after the head: its output is not the head's, so the loss falls back to the
    whole logits (the soft-capped ones the model means), and it is the same loss as chunked_loss=False."""
    from framework.models.hf import HFCausalLM

    torch.manual_seed(0)
    config = {"model_type": "gemma2", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 64, "vocab_size": VOCAB,
              "final_logit_softcapping": 1.0}
    model = HFCausalLM(config=config)
    batch = {"input_ids": packed_batch()["input_ids"]}
    chunked = CausalLM(model)
    loss = chunked.loss(batch)
    assert chunked._head_takes is False
    torch.testing.assert_close(loss, CausalLM(model, chunked_loss=False).loss(batch))
    assert loss < 1.0 + torch.log(torch.tensor(float(VOCAB)))  # soft-capped at 1: CE within log V +- 1
    assert "forward" not in model.hf.get_output_embeddings().__dict__  # the head is itself again


def test_a_features_only_policy_reads_the_hidden_states_from_the_chunked_path(monkeypatch):
    """A selection policy that reads `features` but not the logits keeps the chunked loss; its features are each
    row's final hidden state averaged over the supervised positions, as the model's own `features` gives."""
    model = dict(models())["hf_causal_lm"]
    lm = CausalLM(model)
    monkeypatch.setattr(CausalLM, "_selection_needs", lambda self: {"features", "loss"})
    ids = packed_batch()["input_ids"]
    mask = torch.ones_like(ids)
    mask[1, 30:] = 0  # the second row is 30 tokens, padded
    batch = {"input_ids": ids, "attention_mask": mask}
    out = lm.training_step(batch, 0)
    assert lm._head_takes is True and "token_stats" not in out
    with torch.no_grad():
        hidden = model.features(ids, mask)
    for row, n in enumerate((48, 30)):  # positions 0 .. n-2 predict the tokens 1 .. n-1
        torch.testing.assert_close(out["features"][row], hidden[row, : n - 1].mean(0), rtol=1e-4, atol=1e-5)


def test_an_instance_level_forward_on_the_head_comes_back():
    """A head whose forward was replaced on the instance (accelerate's hooks do this) gets that forward back."""
    head = nn.Linear(4, 6)
    own = head.forward
    head.forward = lambda x: own(x) * 2
    marker = head.forward
    with head_loss.HeadSkipped(head) as skipped:
        out = head(torch.ones(3, 4))
    assert skipped.took(out) and out.shape == (3, 6) and out.untyped_storage().nbytes() <= 4
    assert head.forward is marker

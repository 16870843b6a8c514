"""peft=lora on PEFT: what trains, what the optimizers do with LoRA's factors, merged weights, gradient checkpointing.

In-process and tiny (a 2-layer Llama, the framework's TransformerLM); the CLI, the Hub round trip and resume are in
tests/hf/test_sft_cli.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from framework.models.peft_adapters import (
    LoRA,
    QLoRA,
    attach,
    is_peft_state,
    linear_layers,
    merged_state,
    peft_model,
    trainable_line,
)
from framework.models.transformer import TransformerLM
from framework.registry import OPTIMIZERS, PEFT

peft = pytest.importorskip("peft")


def tiny_llama(seed: int = 0):
    from framework.models.hf import HFCausalLM

    torch.manual_seed(seed)
    return HFCausalLM(config={"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                              "max_position_embeddings": 64}, vocab_size=50)


def ids(seed: int = 1, shape=(2, 12), vocab: int = 50) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def test_lora_on_a_transformers_model_trains_only_adapters_on_every_linear_layer_but_the_head():
    model = tiny_llama()
    before = model(ids()).detach()
    attach(model, PEFT.build("lora"))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    adapted = {n.split(".lora_")[0] for n in trainable}
    layers = {n.removesuffix(".base_layer") for n in linear_layers(model.hf) if n.endswith(".base_layer")}
    # every projection of both layers (q, k, v, o, gate, up, down), never the output head
    assert adapted == {f"hf.{n}" for n in layers} and len(adapted) == 2 * 7
    assert not any("lm_head" in n for n in adapted)
    # B starts at zero: the adapted model computes what the base did
    torch.testing.assert_close(model(ids()), before, rtol=0, atol=1e-6)
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in model.parameters())
    assert trainable_line(model) == f"trainable {n_train:,} of {n_all:,} parameters ({100 * n_train / n_all:.3g}%)"
    assert peft_model(model).peft_config["default"].r == 16


def test_lora_on_the_frameworks_own_model_spells_all_linear_without_its_head():
    model = TransformerLM(vocab_size=40, dim=32, depth=2, heads=4, max_seq_len=32)
    attach(model, LoRA(r=4, alpha=8))
    adapted = {n.split(".lora_")[0] for n, p in model.named_parameters() if p.requires_grad}
    assert adapted == {f"blocks.{i}.{leaf}" for i in range(2) for leaf in ("attn.q", "attn.kv", "attn.proj", "ffn.fc",
                                                                           "ffn.proj")}
    assert not model.head.weight.requires_grad


def test_target_modules_that_match_nothing_name_the_models_linear_layers():
    with pytest.raises(ValueError, match=r"peft.target_modules=\['q_proj'\] matches no layer of TransformerLM; its "
                                         r"linear layers are named: fc, head, kv, proj, q"):
        attach(TransformerLM(vocab_size=40, dim=32, depth=1, heads=4, max_seq_len=32),
               LoRA(target_modules=["q_proj"]))


@pytest.mark.parametrize("bad", [{"r": 0}, {"alpha": 0}, {"dropout": 1.0}, {"target_modules": []}])
def test_bad_lora_values_are_refused_by_name(bad):
    key = next(iter(bad))
    with pytest.raises(ValueError, match=rf"peft.{key}="):
        LoRA(**bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_qlora_is_refused_without_cuda_with_the_reason():
    with pytest.raises(ValueError, match=r"peft=qlora .*bitsandbytes.* CUDA GPU.*use peft=lora"):
        QLoRA()


@pytest.mark.parametrize("variant", [{}, {"use_rslora": True}, {"use_dora": True}])
def test_merged_state_is_what_peft_merges(variant):
    """A checkpoint's adapters folded by tensor arithmetic alone equal PEFT's own merge_and_unload."""
    model = tiny_llama()
    attach(model, LoRA(r=4, alpha=12, dropout=0.0, **variant))
    with torch.no_grad():  # trained-looking adapters (B is zero at init, and DoRA's magnitudes its norms)
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))))
    state = model.state_dict()
    assert is_peft_state(state)
    ours = merged_state(state, model.peft_spec.record())
    peft_model(model).merge_and_unload()
    theirs = model.state_dict()
    assert ours.keys() == theirs.keys()
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-6)


def test_olion_orthogonalises_both_lora_factors_and_sends_doras_magnitudes_to_adamw():
    model = tiny_llama()
    attach(model, LoRA(r=4, use_dora=True))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = OPTIMIZERS.build("olion", named, lr=1e-3)
    routed = dict(zip((n for n, _ in named), opt.param_groups[0]["orthogonal"], strict=True))
    assert all(routed[n] for n in routed if ".lora_A." in n or ".lora_B." in n)
    assert not any(routed[n] for n in routed if "lora_magnitude_vector" in n)


@pytest.mark.parametrize("name", ["olion", "muon", "adamw", "lion"])
def test_every_optimizer_trains_the_adapters_and_leaves_the_base_untouched(name):
    model = tiny_llama()
    attach(model, LoRA(r=4, dropout=0.0))
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = OPTIMIZERS.build(name, named, lr=1e-2)
    x = ids()
    first = None
    for _ in range(4):
        loss = nn.functional.cross_entropy(model(x)[:, :-1].reshape(-1, 50), x[:, 1:].reshape(-1))
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    final = nn.functional.cross_entropy(model(x)[:, :-1].reshape(-1, 50), x[:, 1:].reshape(-1)).item()
    assert final < first  # the adapters learn
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    assert all(p.abs().sum() > 0 for n, p in named if ".lora_B." in n)  # B left zero


def _saved_bytes(model: nn.Module, x: torch.Tensor) -> tuple[int, dict[str, torch.Tensor]]:
    """Bytes autograd keeps for the backward pass of one forward, and the gradients it then computes."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    model.zero_grad()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).float().logsumexp(-1).mean()
    loss.backward()
    return total, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("which", ["hf", "ours"])
def test_gradient_checkpointing_keeps_the_gradients_and_saves_activation_memory(which):
    def build(on: bool) -> nn.Module:
        torch.manual_seed(0)
        if which == "ours":
            return TransformerLM(vocab_size=50, dim=32, depth=4, heads=4, max_seq_len=64,
                                 gradient_checkpointing=on).train()
        from framework.models.hf import HFCausalLM

        return HFCausalLM(config={"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                                  "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                                  "max_position_embeddings": 64}, vocab_size=50, gradient_checkpointing=on).train()

    x = ids(shape=(2, 48))
    plain, grads = _saved_bytes(build(False), x)
    checkpointed, grads_ckpt = _saved_bytes(build(True), x)
    assert grads.keys() == grads_ckpt.keys()
    for key in grads:
        torch.testing.assert_close(grads_ckpt[key], grads[key], rtol=1e-4, atol=1e-6)
    assert checkpointed < 0.6 * plain, (checkpointed, plain)


def test_gradient_checkpointing_composes_with_lora_on_a_frozen_embedding():
    """Non-reentrant checkpointing needs no input that requires grad: the adapters still get their gradients."""
    from framework.models.hf import HFCausalLM

    model = HFCausalLM(config={"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                               "max_position_embeddings": 64}, vocab_size=50, gradient_checkpointing=True).train()
    assert model.hf.is_activation_checkpointing and model.hf.config.use_cache is False
    attach(model, LoRA(r=4, dropout=0.0))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 0.1)
    model(ids()).float().logsumexp(-1).mean().backward()
    grads = [p.grad for n, p in model.named_parameters() if ".lora_A." in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)

"""LoRA adapters: equal to the base at init, only A/B train, merging is exact, and MDLMModule's LoRA fine-tune."""

import copy

import lightning as L
import pytest
import torch

from framework.data.needle import NeedleData
from framework.models.lora import LoRALinear, apply_lora, lora_parameters, merge_lora, merge_lora_state
from framework.models.transformer import TransformerLM
from framework.modules.mdlm import MDLMModule

torch.set_num_threads(1)


def _model(seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(vocab_size=20, dim=32, depth=2, heads=2, causal=False)


def _tokens() -> torch.Tensor:
    return torch.randint(0, 20, (3, 12), generator=torch.Generator().manual_seed(1))


def _randomise_b(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.lora_B.normal_(0, 0.05)


def test_lora_wrapped_model_equals_the_base_model_at_init():
    base = _model()
    wrapped = apply_lora(copy.deepcopy(base), rank=4, alpha=8)
    x = _tokens()
    assert torch.equal(wrapped(x), base(x))
    # every attention and MLP linear is wrapped (2 blocks x q, kv, proj, fc, proj); the LM head is not
    assert sum(isinstance(m, LoRALinear) for m in wrapped.modules()) == 10
    assert not isinstance(wrapped.head, LoRALinear)


def test_only_the_lora_a_and_b_matrices_require_grad():
    model = apply_lora(_model(), rank=4)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(n.endswith(("lora_A", "lora_B")) for n in trainable)
    assert len(trainable) == len(lora_parameters(model)) == 20
    model(_tokens()).sum().backward()
    assert all(p.grad is None for n, p in model.named_parameters() if not p.requires_grad)


def test_merge_gives_the_same_outputs_as_the_wrapped_model_and_plain_keys():
    model = apply_lora(_model(), rank=4, alpha=8)
    _randomise_b(model)
    x = _tokens()
    wrapped_out = model(x).detach()
    assert not torch.allclose(wrapped_out, _model()(x))  # the adapters do change the function
    state = {k: v.clone() for k, v in model.state_dict().items()}
    merged = merge_lora(model)
    assert not any(isinstance(m, LoRALinear) for m in merged.modules())
    torch.testing.assert_close(merged(x), wrapped_out, rtol=1e-5, atol=1e-5)
    # a LoRA checkpoint folds into a plain model's state dict the same way
    plain = _model(seed=5)
    plain.load_state_dict(merge_lora_state(state), strict=True)
    torch.testing.assert_close(plain(x), wrapped_out, rtol=1e-5, atol=1e-5)


def test_targets_choose_layers_by_name_and_a_target_matching_nothing_is_refused():
    model = apply_lora(_model(), rank=2, targets=("q", "blocks.1.ffn.*"))
    wrapped = sorted(n for n, m in model.named_modules() if isinstance(m, LoRALinear))
    assert wrapped == ["blocks.0.attn.q", "blocks.1.attn.q", "blocks.1.ffn.fc", "blocks.1.ffn.proj"]
    with pytest.raises(ValueError, match=r"match no nn.Linear layer.*blocks.0.attn.q"):
        apply_lora(_model(), targets=("query",))
    with pytest.raises(ValueError, match="rank=0"):
        LoRALinear(torch.nn.Linear(4, 4), rank=0)


def test_mdlm_module_lora_fine_tune_changes_only_the_adapters_of_the_loaded_weights():
    data = NeedleData(n_train=32, n_val=8, batch_size=8, seed=0)
    module = MDLMModule(TransformerLM(data.vocab_size, dim=32, depth=1, heads=2, causal=False),
                        vocab_size=data.vocab_size, mask_id=data.mask_id, ema_decay=0.5, lora_rank=2)
    pretrained = TransformerLM(data.vocab_size, dim=32, depth=1, heads=2, causal=False).state_dict()
    module.model.load_state_dict(pretrained)  # what train.py's init_from does, after the module is built
    trainer = L.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        limit_val_batches=0, use_distributed_sampler=False, enable_model_summary=False)
    trainer.fit(module, datamodule=data)
    after = module.model.state_dict()
    frozen = {k: v for k, v in after.items() if "lora_" not in k}
    assert frozen.keys() == pretrained.keys()
    assert all(torch.equal(frozen[k], pretrained[k]) for k in pretrained)  # the base weights never moved
    adapters = [m for m in module.model.modules() if isinstance(m, LoRALinear)]
    assert len(adapters) == 5 and all(m.lora_B.abs().sum() > 0 for m in adapters)
    ema = module.ema.state_dict()  # EMA starts from the loaded weights (not the pre-init_from ones), LoRA-shaped
    assert ema.keys() == after.keys() and all(torch.equal(ema[k], pretrained[k]) for k in pretrained)
    optimizer_params = {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]}
    assert optimizer_params == {id(p) for p in lora_parameters(module.model)}

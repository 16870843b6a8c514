"""The MDLM's LoRA fine-tune is PEFT's (`module.lora_rank`), and checkpoints of the framework's own earlier LoRA still
fold into plain weights (`merge_lora_state`)."""

import lightning as L
import pytest
import torch

from framework.data.needle import NeedleData
from framework.models.lora import merge_lora_state
from framework.models.peft_adapters import merged_state, peft_spec
from framework.models.transformer import TransformerLM
from framework.modules.mdlm import MDLMModule

pytest.importorskip("peft")
torch.set_num_threads(1)


def _model(seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(vocab_size=20, dim=32, depth=2, heads=2, causal=False)


def test_a_checkpoint_of_the_earlier_lora_folds_into_the_plain_model():
    """The layout the framework's own LoRALinear saved: X.weight frozen, X.lora_A (r, in), X.lora_B (out, r) and
    X.lora_scale; folded, the plain model computes W + scale·B·A."""
    model = _model()
    x = torch.randint(0, 20, (3, 12), generator=torch.Generator().manual_seed(1))
    state = dict(model.state_dict())
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randn(4, 32, generator=gen), torch.randn(32, 4, generator=gen)
    state.update({"blocks.0.attn.q.lora_A": a, "blocks.0.attn.q.lora_B": b, "blocks.0.attn.q.lora_scale":
                  torch.tensor(0.5)})
    plain = _model(seed=5)
    plain.load_state_dict(merge_lora_state(state), strict=True)
    with torch.no_grad():
        model.blocks[0].attn.q.weight.add_(0.5 * b @ a)
    torch.testing.assert_close(plain(x), model(x), rtol=1e-5, atol=1e-5)


def test_mdlm_module_lora_fine_tune_is_peft_on_the_loaded_weights_and_changes_only_the_adapters():
    data = NeedleData(n_train=32, n_val=8, batch_size=8, seed=0)
    module = MDLMModule(TransformerLM(data.vocab_size, dim=32, depth=1, heads=2, causal=False),
                        vocab_size=data.vocab_size, mask_id=data.mask_id, ema_decay=0.5, lora_rank=2)
    pretrained = TransformerLM(data.vocab_size, dim=32, depth=1, heads=2, causal=False).state_dict()
    module.model.load_state_dict(pretrained)  # what train.py's init_from does, after the module is built
    trainer = L.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        limit_val_batches=0, use_distributed_sampler=False, enable_model_summary=False)
    trainer.fit(module, datamodule=data)
    spec = peft_spec(module.model)
    assert spec is not None and (spec.r, spec.alpha, spec.dropout) == (2, 16.0, 0.0)
    assert spec.target_modules == ["q", "kv", "proj", "fc"]
    after = module.model.state_dict()
    adapters = {k for k in after if ".lora_" in k}
    assert len(adapters) == 2 * 5  # A and B of q, kv, proj and the MLP's fc and proj
    frozen = {k.replace(".base_layer.", "."): v for k, v in after.items() if k not in adapters}
    assert frozen.keys() == pretrained.keys()
    assert all(torch.equal(frozen[k], pretrained[k]) for k in pretrained)  # the base weights never moved
    assert all(after[k].abs().sum() > 0 for k in adapters if ".lora_B." in k)
    ema = module.ema.state_dict()  # EMA starts from the loaded weights (not the pre-init_from ones), LoRA-shaped
    assert ema.keys() == after.keys()
    assert all(torch.equal(ema[k], v) for k, v in after.items() if k not in adapters and ".lora_" not in k)
    optimizer_params = {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]}
    assert optimizer_params == {id(p) for n, p in module.model.named_parameters() if ".lora_" in n}
    merged = merged_state(after, spec.record())  # what a run dir's readers load: the plain model
    plain = TransformerLM(data.vocab_size, dim=32, depth=1, heads=2, causal=False)
    plain.load_state_dict(merged, strict=True)
    x = torch.randint(0, data.vocab_size, (2, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(plain(x), module.model(x), rtol=1e-5, atol=1e-5)

"""Orthogonal growth of transformers MoE models in their own layouts (issue 37): Mixtral (router `gate`, fused
experts), OLMoE, Qwen2-MoE (a shared expert, dense layers from `decoder_sparse_step`) and Qwen3-MoE (`mlp_only_layers`),
grown in depth and width; the config and keys follow, `generate()` works, the paper's function-preserving settings
preserve, `from_pretrained` opens the saved model unchanged, and a run grown by the callback resumes bitwise. Issue 43:
DeepSeek-V3 (group-limited routing, dense first layers), gpt-oss and GraniteMoE(-Shared, -Hybrid) (`router`) keep the
logits too, and what growth cannot keep is refused by name."""

from __future__ import annotations

import copy
import json

import lightning as L
import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from framework.callbacks.growth import OrthogonalGrowth  # noqa: E402
from framework.data.text import ByteCorpus  # noqa: E402
from framework.grow import grow  # noqa: E402
from framework.grow.cli import main as grow_main  # noqa: E402
from framework.grow.hf import moe_blocks  # noqa: E402
from framework.hub import load_weights_into  # noqa: E402
from framework.models.hf import HFCausalLM  # noqa: E402
from framework.modules.causal_lm import CausalLM  # noqa: E402
from framework.resume import checked_resume  # noqa: E402

SIZE = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256)
FAMILIES = {
    "mixtral": dict(num_local_experts=4, num_experts_per_tok=2),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                      shared_expert_intermediate_size=32, decoder_sparse_step=2),  # layer 1 sparse, 0 and 2 dense
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, mlp_only_layers=[0]),
}
EXPERTS = {"mixtral": "num_local_experts"}


def config(family: str) -> dict:
    return {"model_type": family, **SIZE, **FAMILIES[family]}


def tiny(family: str, seed: int = 0):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **SIZE, **FAMILIES[family])).eval()


def dense_layers(model) -> list[int]:
    return [i for i, layer in enumerate(model.model.layers) if not moe_blocks(layer)]


IDS = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("family", FAMILIES)
def test_grown_config_keys_and_layer_indices_are_those_of_a_model_built_from_the_grown_config(family, tmp_path):
    model = tiny(family)
    before = dense_layers(model)
    growth = grow(model, depth_factor=2, width_factor=2, seed=3)
    cfg = model.config
    assert growth.sources == [0, 0, 1, 1, 2, 2] and cfg.num_hidden_layers == 6
    assert getattr(cfg, EXPERTS.get(family, "num_experts")) == 8 and cfg.num_experts_per_tok == 4
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == list(range(6))
    assert dense_layers(model) == [j for j, s in enumerate(growth.sources) if s in before]
    if hasattr(cfg, "mlp_only_layers"):
        assert cfg.mlp_only_layers == dense_layers(model) and cfg.decoder_sparse_step == 1
    for block in moe_blocks(model):
        assert (block.gate.num_experts, block.gate.top_k, block.experts.num_experts) == (8, 4, 8)
    assert (model.num_experts, model.num_experts_per_tok) == (8, 4)  # the aux loss reads these
    fresh = AutoModelForCausalLM.from_config(type(cfg).from_dict(cfg.to_dict()))  # the config as saved, reread
    assert {k: v.shape for k, v in fresh.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}
    with torch.no_grad():  # the router loss runs with the grown counts
        out = model(IDS, labels=IDS, output_router_logits=True)
    assert torch.isfinite(out.loss) and out.router_logits[0].shape[-1] == 8
    cached = model.generate(IDS[:, :5], max_new_tokens=7, do_sample=False)  # one KV-cache layer per grown layer
    uncached = model.generate(IDS[:, :5], max_new_tokens=7, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_papers_function_preserving_settings_preserve_the_logits(family):
    model = tiny(family)
    with torch.no_grad():
        ref = model(IDS).logits
        for method in ("interposition", "stack"):
            deep = copy.deepcopy(model)
            grow(deep, depth_factor=2, depth_method=method, zero_init_copies=True)
            assert torch.equal(deep(IDS).logits, ref), method  # zeroed residual outputs: each copy the identity
        wide = copy.deepcopy(model)
        grow(wide, width_factor=2, noise_alpha=0.0)
        assert ((wide(IDS).logits - ref).norm() / ref.norm()).item() < 1e-6  # softmax over 2E rounds differently
        half = copy.deepcopy(model)
        grow(half, width_factor=2, noise_alpha=0.0, top_k_factor=1)  # top-k not doubled: a different function
        assert ((half(IDS).logits - ref).norm() / ref.norm()).item() > 1e-3
        plain = copy.deepcopy(model)
        grow(plain, depth_factor=2)  # the paper's default plain copies change the function
        assert not torch.allclose(plain(IDS).logits, ref)


def test_expert_copies_carry_noise_at_the_papers_scale_and_the_originals_stay_bitwise():
    model = tiny("mixtral")
    old = {k: v.clone() for k, v in model.state_dict().items()}
    grow(model, width_factor=2, noise_alpha=0.01, seed=0)
    for i, block in enumerate(moe_blocks(model)):
        for name in ("gate_up_proj", "down_proj"):
            new, src = getattr(block.experts, name), old[f"model.layers.{i}.mlp.experts.{name}"]
            assert torch.equal(new[:4], src)
            for e in range(4):
                ratio = ((new[4 + e] - src[e]).std() / src[e].std()).item()
                assert abs(ratio - 0.01) < 0.01 * 0.1, (name, e, ratio)  # σ of that expert's matrix, α = 0.01
        router, src = block.gate.weight, old[f"model.layers.{i}.mlp.gate.weight"]
        assert torch.equal(router[:4], src) and not torch.equal(router[4:], src)


def test_stack_with_the_first_and_last_layers_kept_once_renumbers_and_lists_dense_layers():
    model = tiny("qwen2_moe")  # dense 0 and 2, sparse 1
    growth = grow(model, depth_factor=2, depth_method="stack", ignore_first=1, ignore_last=1)
    assert growth.sources == [0, 1, 1, 2]  # (n − b) + (n − a) layers
    assert model.config.mlp_only_layers == [0, 3] and dense_layers(model) == [0, 3]
    assert [layer.self_attn.layer_idx for layer in model.model.layers] == [0, 1, 2, 3]
    assert model.config.layer_types == ["full_attention"] * 4


@pytest.mark.parametrize("family", FAMILIES)
def test_the_saved_grown_model_opens_in_transformers_with_bitwise_equal_logits(family, tmp_path):
    ours = HFCausalLM(config=config(family)).eval()
    grow(ours, depth_factor=2, width_factor=2, zero_init_copies=True, seed=1)
    ours.save_pretrained(tmp_path)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(theirs(IDS).logits, ours(IDS))
    rebuilt = HFCausalLM(**ours.init_config)  # the recorded config describes the grown model
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in ours.state_dict().items()}


def _fit(module, callbacks, root, steps, ckpt_path=None):
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=root / "ckpt", filename="step{step}", save_top_k=-1,
                                               auto_insert_metric_name=False, every_n_train_steps=1)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False, callbacks=[*callbacks, ckpt],
                        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                        num_sanity_val_steps=0, use_distributed_sampler=False, default_root_dir=root)
    trainer.fit(module, datamodule=ByteCorpus(max_bytes=20000, seq_len=16, batch_size=4, seed=0), ckpt_path=ckpt_path)
    return trainer


def _lm(family: str) -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(HFCausalLM(config=config(family)), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_run_grown_by_the_callback_resumes_from_a_post_growth_checkpoint_bitwise(family, tmp_path):
    event = dict(at_step=2, depth_factor=2, width_factor=2, optimizer_state="duplicate", plot=False)
    full = _lm(family)
    trainer = _fit(full, [OrthogonalGrowth(**event)], tmp_path / "full", steps=5)
    grown = {id(p) for p in full.model.parameters()}
    assert {id(p) for g in trainer.optimizers[0].param_groups for p in g["params"]} == grown  # rebuilt over them
    assert full.model.hf.config.num_hidden_layers == 6 and len(moe_blocks(full.model)) == 2 * len(
        [s for s in (0, 1, 2) if s not in dense_layers(tiny(family))])
    resumed = _lm(family)  # a fresh, ungrown module: the checkpoint's growth is replayed before the weights load
    step, _ = checked_resume(str(tmp_path / "full" / "ckpt" / "step3.ckpt"), resumed, tmp_path)  # framework.train's
    assert step == 3 and resumed.model.hf.config.num_hidden_layers == 3  # check: on a meta copy, the module untouched
    _fit(resumed, [OrthogonalGrowth(**event)], tmp_path / "resumed", steps=5,
         ckpt_path=tmp_path / "full" / "ckpt" / "step3.ckpt")
    a, b = full.state_dict(), resumed.state_dict()
    assert a.keys() == b.keys() and [k for k in a if not torch.equal(a[k], b[k])] == []
    record = json.loads((tmp_path / "full" / "growth.json").read_text())[0]["measured"]
    assert (record["layers_before"], record["layers_after"], record["num_experts"], record["top_k"]) == (3, 6, 8, 4)


def test_the_grow_command_writes_transformers_layout_that_init_from_and_from_pretrained_read(tmp_path, capsys):
    source = HFCausalLM(config=config("olmoe")).eval()
    source.save_pretrained(tmp_path / "olmoe")
    out = tmp_path / "grown"
    assert grow_main([str(tmp_path / "olmoe"), "--depth", "2", "--width", "2", "--seed", "5", "--out", str(out)]) == 0
    expected = HFCausalLM(name_or_path=str(tmp_path / "olmoe")).eval()
    grow(expected, depth_factor=2, width_factor=2, seed=5)
    theirs = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        assert torch.equal(theirs(IDS).logits, expected(IDS))
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["num_experts"], cfg["num_experts_per_tok"]) == (6, 8, 4)
    record = json.loads((out / "growth.json").read_text())
    assert record["params_after"]["total"] > record["params_before"]["total"]
    assert len(record["norm_profile_after"]) == 6
    continued = load_weights_into(HFCausalLM(name_or_path=str(out)), out)  # init_from=DIR: the run-dir layout
    with torch.no_grad():
        assert torch.equal(continued.eval()(IDS), expected(IDS))


@pytest.mark.parametrize(("args", "match"), [
    (["--depth", "2", "--width", "2"], "llama') is a dense model: orthogonal growth grows mixture-of-experts"),
    (["--width", "0"], "width_factor=0 must be an integer >= 1"),
    (["--depth", "2", "--ignore-first", "2", "--ignore-last", "1"], "leaves no middle layer of the 3 to copy"),
])
def test_bad_growth_input_is_one_error_line_and_nothing_is_written(args, match, tmp_path, capsys):
    family = "llama" if "dense" in match else "mixtral"
    cfg = {"model_type": "llama", **SIZE} if family == "llama" else config(family)
    HFCausalLM(config=cfg).save_pretrained(tmp_path / "src")
    capsys.readouterr()
    assert grow_main([str(tmp_path / "src"), *args, "--out", str(tmp_path / "out")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_the_grow_command_never_writes_into_a_folder_that_holds_files(tmp_path, capsys):
    HFCausalLM(config=config("mixtral")).save_pretrained(tmp_path / "src")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert grow_main([str(tmp_path / "src"), "--width", "2", "--out", str(tmp_path / "out")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "is not empty" in lines[0], lines
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["notes.txt"]


def test_a_grown_model_loaded_by_name_is_rebuilt_from_its_recorded_config_with_its_own_vocabulary(tmp_path):
    cfg = {k: v for k, v in config("olmoe").items() if k != "vocab_size"}  # OLMoE's default vocabulary
    AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg)).save_pretrained(tmp_path / "src")
    model = HFCausalLM(name_or_path=str(tmp_path / "src"), vocab_size=300)  # the data needs fewer ids
    grow(model, depth_factor=2, width_factor=2)
    rebuilt = HFCausalLM(**model.init_config)
    assert rebuilt.hf.config.vocab_size == AutoConfig.for_model("olmoe").vocab_size
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}
    assert model.init_config["tokenizer"] == str(tmp_path / "src") and model.init_config["name_or_path"] is None


# Issue 43: every MoE family transformers 5 ships in these layouts, 2 layers of hidden 32, built offline. DeepSeek-V3:
# MLA attention, a dense first layer, group-limited sigmoid routing with a score-correction bias and shared experts;
# gpt-oss: a `router` with a bias, (E, in, out) experts with biases, sinks, eager attention; GraniteMoE: a `router`
# in `block_sparse_moe` (GraniteMoeShared: a `shared_mlp` beside it; GraniteMoeHybrid: a Mamba-2 layer 0). The first
# four keep their own layouts (qwen2_moe: layer 0 dense).
TWO = dict(SIZE, num_hidden_layers=2)
MLA = dict(num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)
EVERY = {**FAMILIES,
         "deepseek_v3": dict(MLA, n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
                             moe_intermediate_size=16, first_k_dense_replace=1),
         "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2),
         "granitemoe": dict(num_local_experts=4, num_experts_per_tok=2),
         "granitemoeshared": dict(num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=32),
         "granitemoehybrid": dict(num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=32,
                                  layer_types=["mamba", "attention"], mamba_n_heads=4, mamba_d_head=16,
                                  mamba_d_state=16, mamba_n_groups=1, mamba_chunk_size=16)}


def small(family: str, **overrides):
    """A 2-layer model of `family` in transformers' default attention; routers' correction biases made non-zero."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **{**TWO, **EVERY[family], **overrides}))
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape) * 0.1)
    return model.eval()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("family", EVERY)
def test_width_at_alpha_zero_and_zero_init_depth_keep_the_logits_of_every_moe_family(family):
    model = small(family)
    with torch.no_grad():
        ref = model(IDS).logits
        wide = copy.deepcopy(model)
        grow(wide, width_factor=2, noise_alpha=0.0)
        assert rel(wide(IDS).logits, ref) < 1e-5, family  # copies share their original's weight: rounding only
        deep = copy.deepcopy(model)
        grow(deep, depth_factor=2, zero_init_copies=True)
        assert rel(deep(IDS).logits, ref) < 1e-5, family  # every residual output of each copy zeroed


@pytest.mark.parametrize("norm", [True, False])
def test_deepseek_v3_group_limited_routing_is_carried_and_the_grown_model_reopens_in_transformers(norm, tmp_path):
    model = small("deepseek_v3", norm_topk_prob=norm)
    biases = [block.gate.e_score_correction_bias.clone() for block in moe_blocks(model)]
    noisy = copy.deepcopy(model)
    grow(noisy, width_factor=2, noise_alpha=0.01)
    for block, bias in zip(moe_blocks(noisy), biases, strict=True):  # indexed by expert, not trained: copied exactly
        assert torch.equal(block.gate.e_score_correction_bias, bias.repeat(2))
    with torch.no_grad():
        ref = model(IDS).logits
        grow(model, depth_factor=2, width_factor=2, noise_alpha=0.0, zero_init_copies=True)
        out = model(IDS).logits
    assert rel(out, ref) < 1e-5
    cfg = model.config  # copy j of expert i at i + j·E: the copies form 2 groups of their own, 2 groups are picked
    assert (cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group) == (8, 4, 4, 2)
    assert (cfg.num_hidden_layers, cfg.first_k_dense_replace) == (4, 2) and dense_layers(model) == [0, 1]
    assert cfg.routed_scaling_factor == (2.5 if norm else 1.25)  # unnormalised: both copies weigh the full score
    for block in moe_blocks(model):
        gate = block.gate
        assert (gate.num_experts, gate.top_k, gate.num_group, gate.topk_group, block.experts.num_experts) == (
            8, 4, 4, 2, 8)
        assert gate.routed_scaling_factor == cfg.routed_scaling_factor
    model.save_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(AutoModelForCausalLM.from_pretrained(tmp_path).eval()(IDS).logits, out)


def test_deepseek_v3_dense_first_layers_stay_first_when_interposed_and_stacking_them_apart_is_refused():
    model = small("deepseek_v3")  # first_k_dense_replace=1: layer 0 dense
    deep = copy.deepcopy(model)
    grow(deep, depth_factor=2)
    assert deep.config.first_k_dense_replace == 2 and dense_layers(deep) == [0, 1]
    fresh = AutoModelForCausalLM.from_config(type(deep.config).from_dict(deep.config.to_dict()))
    assert {k: v.shape for k, v in fresh.state_dict().items()} == {k: v.shape for k, v in deep.state_dict().items()}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"deepseek_v3: its dense layers are the first first_k_dense_replace=1.*"
                                         r"stack with ignore_first >= 1"):
        grow(model, depth_factor=2, depth_method="stack")  # layers 0 1 0 1: a dense layer after an MoE one
    assert model.config.num_hidden_layers == 2 and len(model.model.layers) == 2  # refused before any change
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    grow(model, depth_factor=2, depth_method="stack", ignore_first=1)  # 0 1 1: the dense layer once, first
    assert model.config.first_k_dense_replace == 1 and dense_layers(model) == [0]


def test_width_growth_that_would_change_the_routing_is_refused_by_name_before_anything_changes(monkeypatch):
    import framework.grow.hf as hf_growth

    model = small("deepseek_v3")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    monkeypatch.setattr(hf_growth, "GROUP_KEYS", ())  # the groups not carried: copies land in unpicked groups
    with pytest.raises(ValueError, match=r"deepseek_v3 \(DeepseekV3TopkRouter\): width growth would change its "
                                         r"routing"):
        grow(model, depth_factor=2, width_factor=2, noise_alpha=0.0)
    assert model.config.num_hidden_layers == 2 and model.config.n_routed_experts == 4
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("family", ["gpt_oss", "granitemoe", "granitemoeshared", "granitemoehybrid"])
def test_routers_named_router_grow_and_the_grown_model_reopens_in_transformers(family, tmp_path):
    model = small(family)
    with torch.no_grad():
        ref = model(IDS).logits
        grow(model, depth_factor=2, width_factor=2, noise_alpha=0.0, zero_init_copies=True)
        out = model(IDS).logits
    assert rel(out, ref) < 1e-5
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_local_experts, cfg.num_experts_per_tok) == (4, 8, 4)
    for block in moe_blocks(model):
        assert (block.router.num_experts, block.router.top_k, block.experts.num_experts) == (8, 4, 8)
    if family == "gpt_oss":  # (E, in, out) experts with biases; the router's bias repeated with its rows
        experts, router = moe_blocks(model)[0].experts, moe_blocks(model)[0].router
        assert experts.gate_up_proj.shape[0] == experts.down_proj_bias.shape[0] == router.bias.shape[0] == 8
        assert torch.equal(router.bias[:4], router.bias[4:])
        assert cfg.layer_types == ["sliding_attention"] * 2 + ["full_attention"] * 2
    model.save_pretrained(tmp_path)
    with torch.no_grad():
        assert torch.equal(AutoModelForCausalLM.from_pretrained(tmp_path).eval()(IDS).logits, out)


def test_a_family_whose_routing_or_residual_outputs_growth_cannot_keep_is_refused_by_name(tmp_path):
    torch.manual_seed(0)  # PhiMoE routes by sparsemixer: a copy and its original are never both chosen
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("phimoe", **TWO, num_local_experts=4,
                                                                  num_experts_per_tok=2)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"phimoe \(PhimoeTopKRouter\): width growth would change its routing"):
        grow(model, width_factor=2)
    with pytest.raises(ValueError, match=r"zero_init_copies: the residual outputs of phimoe are not known to be named"):
        grow(model, depth_factor=2, zero_init_copies=True)  # not proven by a test: never zeroed by guesswork
    assert model.config.num_hidden_layers == 2 and model.config.num_local_experts == 4
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with torch.no_grad():
        ref = model(IDS).logits
        grow(model, depth_factor=2, zero_init_copies=True, zero_patterns=["self_attn.o_proj", "mlp.experts.down_proj"])
        assert rel(model(IDS).logits, ref) < 1e-5  # its residual outputs named by the caller

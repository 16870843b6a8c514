"""Orthogonal growth of transformers MoE models in their own layouts (issue 37): Mixtral (router `gate`, fused
experts), OLMoE, Qwen2-MoE (a shared expert, dense layers from `decoder_sparse_step`) and Qwen3-MoE (`mlp_only_layers`),
grown in depth and width; the config and keys follow, `generate()` works, the paper's function-preserving settings
preserve, `from_pretrained` opens the saved model unchanged, and a run grown by the callback resumes bitwise."""

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

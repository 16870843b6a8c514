"""OLion's routing by whole name words and a convnet's stem and classifier, the AdamW branch's own lr, and what the
update's scale guarantees per entry (issue 34, point 6)."""

from __future__ import annotations

import copy
import math
import re

import pytest
import timm
import torch
from torch import nn

from framework.models.transformer import TransformerLM
from framework.optim import MuonAdamW, OLion, is_hidden_matrix
from framework.optim.hybrid import DEFAULT_ADAMW_LR, NOT_A_LAYER_WORDS, name_words
from framework.optim.olion_groups import adamw_lr

torch.set_num_threads(1)


def adamw_matrices(opt: OLion) -> list[str]:
    """Names of the ≥2-D parameters OLion sends to its AdamW branch, in order."""
    return [n for g in opt.param_groups for n, p, o in zip(g["param_names"], g["params"], g["orthogonal"], strict=True)
            if not o and p.ndim >= 2]


@pytest.mark.parametrize(
    ("name", "hidden"),
    [
        ("blocks.0.member_proj.weight", True),  # "emb" inside a word: a hidden layer
        ("assembly.weight", True),
        ("h.0.mlp.fc.weight", True),  # a hidden `fc` stays hidden
        ("model.tok_embeddings.weight", False),
        ("decoder.embed_positions.weight", False),
        ("tok_emb.weight", False),
        ("layers.0.attn.relative_position_bias_table", False),
        ("conv_stem.weight", False),
        ("encoder.LayerNorm.weight", False),  # case change splits words
        ("blocks.0.input_layernorm.weight", False),
        ("reg_token", False),
        ("transformer.wte.weight", False),
        ("lm_head.weight", False),
        ("cls_head.weight", True),  # a head is a whole part: `head`, `lm_head`, `classifier`, `output`
    ],
)
def test_names_are_matched_by_whole_words_and_parts_not_substrings(name, hidden):
    assert is_hidden_matrix(name, torch.empty(8, 8)) is hidden


def test_name_words_split_at_underscores_digits_and_case_changes():
    assert name_words("norm1") == ["norm"] and name_words("ln_f") == ["ln", "f"]
    assert name_words("LayerNorm") == ["layer", "norm"] and name_words("member_proj") == ["member", "proj"]


TIMM_MODELS = ["resnet18", "efficientnet_b0", "convnext_atto", "vit_tiny_patch16_224"]


@pytest.mark.parametrize("arch", TIMM_MODELS)
def test_timm_models_send_timms_own_first_conv_and_classifier_to_adamw(arch):
    """timm names each model's stem (`first_conv`) and classifier in its pretrained_cfg: OLion finds those, and sends
    no other layer weight to AdamW (the rest it sends there are embeddings and tokens)."""
    model = timm.create_model(arch, pretrained=False, num_classes=10)
    cfg = model.pretrained_cfg
    edges = {f"{cfg['first_conv']}.weight", f"{cfg['classifier']}.weight"}
    adamw = adamw_matrices(OLion(model.named_parameters()))
    assert edges <= set(adamw)
    others = [n for n in adamw if n not in edges]
    assert all(any(w in NOT_A_LAYER_WORDS for part in n.split(".") for w in name_words(part)) for n in others), others
    n_matrices = sum(p.ndim >= 2 for p in model.parameters())
    assert n_matrices - len(adamw) >= 10  # the hidden layers stay orthogonalised


def test_resnet18_routes_exactly_its_stem_and_fc_to_adamw_and_a_custom_predicate_replaces_the_rule():
    model = timm.create_model("resnet18", pretrained=False)
    assert adamw_matrices(OLion(model.named_parameters())) == ["conv1.weight", "fc.weight"]
    assert adamw_matrices(OLion(model.named_parameters(), predicate=is_hidden_matrix)) == []  # names alone
    muon = MuonAdamW(model.named_parameters())  # Muon takes 2-D only: every conv goes to AdamW there anyway
    assert [n for g in muon.param_groups if g["use_muon"] for n in g["param_names"]] == []


@pytest.mark.parametrize("arch", ["resnet18", "convnext_atto"])
def test_a_feature_extractor_keeps_its_last_hidden_layer_orthogonal(arch):
    model = timm.create_model(arch, pretrained=False, num_classes=0)  # no classifier
    adamw = adamw_matrices(OLion(model.named_parameters()))
    assert adamw == [f"{model.pretrained_cfg['first_conv']}.weight"]  # convnext: the last Linear is a hidden MLP


def test_a_frozen_stem_or_a_part_of_the_network_keeps_its_first_conv_orthogonal():
    model = timm.create_model("resnet18", pretrained=False)
    trainable = [(n, p) for n, p in model.named_parameters() if not n.startswith(("conv1.", "bn1."))]
    assert adamw_matrices(OLion(trainable)) == ["fc.weight"]  # layer1.0.conv1 reads 64 channels: not a stem
    assert adamw_matrices(OLion(model.layer4.named_parameters())) == []
    single = nn.Conv2d(32, 64, 3)
    assert OLion(single.named_parameters()).param_groups[0]["orthogonal"] == [True, False]


@pytest.mark.parametrize("tie", [False, True])
def test_the_projects_transformer_sends_only_its_embedding_and_head_to_adamw(tie):
    model = TransformerLM(vocab_size=64, dim=32, depth=2, heads=4, tie_embeddings=tie)
    opt = OLion(model.named_parameters())
    assert adamw_matrices(opt) == (["embed.weight"] if tie else ["embed.weight", "head.weight"])
    assert sum(sum(g["orthogonal"]) for g in opt.param_groups) == 10  # q, kv, proj, fc, proj per block


def test_the_convnet_rule_spans_the_groups_given_at_construction_and_later_groups_route_by_name():
    model = timm.create_model("resnet18", pretrained=False)
    named = list(model.named_parameters())
    opt = OLion([{"params": named[:-2]}, {"params": named[-2:], "lr": 1e-3}])
    assert adamw_matrices(opt) == ["conv1.weight", "fc.weight"]
    late = copy.deepcopy(model)
    opt.add_param_group({"params": list(late.named_parameters(prefix="twin"))})
    assert opt.param_groups[-1]["orthogonal"][0] is True  # twin.conv1.weight: names only after construction


def branch_params(dtype=torch.float64) -> tuple[nn.Parameter, nn.Parameter]:
    gen = torch.Generator().manual_seed(3)
    hidden = nn.Parameter(torch.randn(12, 8, generator=gen, dtype=dtype))
    emb = nn.Parameter(torch.randn(10, 8, generator=gen, dtype=dtype))
    return hidden, emb


def steps_with_fixed_grads(opt: torch.optim.Optimizer, params: list[nn.Parameter], steps: int, seed: int = 4) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen, dtype=p.dtype)
        opt.step()


@pytest.mark.parametrize("olion_lr", [0.005, 0.02])
def test_the_adamw_branch_runs_at_adamws_own_lr_whatever_olions_lr(olion_lr):
    hidden, emb = branch_params()
    twin = nn.Parameter(emb.detach().clone())
    opt = OLion([("h.weight", hidden), ("wte.weight", emb)], lr=olion_lr, ns_dtype=torch.float64)
    ref = torch.optim.AdamW([twin], lr=DEFAULT_ADAMW_LR, betas=(0.9, 0.95), eps=1e-10, weight_decay=0.1)
    assert opt.param_groups[0]["adamw_lr"] == DEFAULT_ADAMW_LR == 1e-3
    steps_with_fixed_grads(opt, [hidden, emb], 3)
    steps_with_fixed_grads(ref, [hidden.detach().clone().requires_grad_(), twin], 3)  # the same grad stream
    assert torch.allclose(emb, twin, rtol=1e-12, atol=1e-15)


def test_adamw_lr_none_ties_the_adamw_branch_to_olions_lr_as_before():
    hidden, emb = branch_params()
    twin = nn.Parameter(emb.detach().clone())
    opt = OLion([("h.weight", hidden), ("wte.weight", emb)], lr=0.02, adamw_lr=None, ns_dtype=torch.float64)
    ref = torch.optim.AdamW([twin], lr=0.02, betas=(0.9, 0.95), eps=1e-10, weight_decay=0.1)
    steps_with_fixed_grads(opt, [hidden, emb], 3)
    steps_with_fixed_grads(ref, [hidden.detach().clone().requires_grad_(), twin], 3)
    assert torch.allclose(emb, twin, rtol=1e-12, atol=1e-15) and adamw_lr(opt.param_groups[0]) == 0.02


def test_a_state_dict_saved_with_the_old_tied_default_resumes_tied_bitwise():
    """An optimizer built with today's default loads yesterday's `adamw_lr=None` and keeps running it."""
    hidden, emb = branch_params(torch.float32)
    old = OLion([("h.weight", hidden), ("wte.weight", emb)], lr=0.02, adamw_lr=None)
    steps_with_fixed_grads(old, [hidden, emb], 2)
    hidden2, emb2 = (nn.Parameter(p.detach().clone()) for p in (hidden, emb))
    new = OLion([("h.weight", hidden2), ("wte.weight", emb2)], lr=0.02)  # the new default: fixed
    new.load_state_dict(copy.deepcopy(old.state_dict()))
    assert new.param_groups[0]["adamw_lr"] is None
    steps_with_fixed_grads(old, [hidden, emb], 2, seed=9)
    steps_with_fixed_grads(new, [hidden2, emb2], 2, seed=9)
    assert torch.equal(emb, emb2) and torch.equal(hidden, hidden2)


def test_an_old_layout_group_of_adamw_params_saved_with_the_tied_default_resumes_tied():
    """A group that held AdamW-branch params only, in the earlier layout (internal groups, bool `use_olion`)."""
    named = [("ln.weight", nn.Parameter(torch.ones(4))), ("ln.bias", nn.Parameter(torch.zeros(4)))]
    saved = {"state": {}, "param_groups": [{
        "params": [0, 1], "param_names": ["ln.weight", "ln.bias"], "lr": 0.01, "betas": (0.9, 0.95), "eps": 1e-10,
        "weight_decay": 0.0, "use_olion": False, "adamw_lr": None, "adamw_betas": (0.9, 0.95), "adamw_eps": 1e-10,
        "adamw_weight_decay": None, "ns_steps": 5, "ns_dtype": None, "use_scale": True, "rms_scale": True,
        "nesterov": True, "pre_update_momentum": False, "sign": True, "ns_batch": None}]}  # fmt: skip
    opt = OLion(named, lr=0.01)
    assert adamw_lr(opt.param_groups[0]) == DEFAULT_ADAMW_LR
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["adamw_lr"] is None and adamw_lr(opt.param_groups[0]) == 0.01  # as it ran


@pytest.mark.parametrize("tied", [False, True])
def test_resuming_at_another_olion_lr_moves_the_adamw_branch_only_when_tied(tied):
    """`rebase_lr` (a run resumed with a new `optimizer.lr`) scales OLion's lr; a fixed AdamW-branch lr stays."""
    from framework.modules.base import rebase_lr

    opt = OLion([("h.weight", branch_params()[0]), ("wte.weight", branch_params()[1])], lr=0.02,
                adamw_lr=None if tied else DEFAULT_ADAMW_LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5)
    (group,) = opt.param_groups
    before = adamw_lr(group)
    assert rebase_lr(opt, [sched], [0.04]) == [(0.02, 0.04)]
    assert group["lr"] == pytest.approx(0.02) and sched.base_lrs == [0.04]  # 0.04 · the schedule's 0.5
    assert adamw_lr(group) == pytest.approx(2 * before if tied else before, rel=1e-12)


def test_muons_adamw_branch_has_the_same_fixed_default_and_none_ties_it():
    model = nn.ModuleDict({"wte": nn.Embedding(8, 4), "fc": nn.Linear(4, 4)})
    lrs = lambda opt: sorted(g["lr"] for g in opt.param_groups if not g["use_muon"])  # noqa: E731
    assert lrs(MuonAdamW(model.named_parameters(), lr=0.02)) == [DEFAULT_ADAMW_LR, DEFAULT_ADAMW_LR]
    assert lrs(MuonAdamW(model.named_parameters(), lr=0.02, adamw_lr=None)) == [0.02, 0.02]


def one_step_update(grad: torch.Tensor, lr: float = 1e-3) -> torch.Tensor:
    """The update −ΔW of one default OLion step (no decay) on a matrix whose gradient is `grad`."""
    w = nn.Parameter(torch.zeros_like(grad))
    w.grad = grad.clone()
    OLion([("w", w)], lr=lr, weight_decay=0.0, ns_dtype=torch.float32).step()
    return -w.detach()


@pytest.mark.parametrize(("dead_rows", "dead_cols"), [(0, 0), (0, 16), (8, 0), (8, 16)])
@pytest.mark.parametrize("shape", [(32, 64), (64, 32)])
def test_the_update_rms_is_0_2_lr_and_each_live_entry_moves_by_0_2_lr_sqrt_of_size_over_nonzeros(
    shape, dead_rows, dead_cols
):
    lr = 1e-3
    grad = torch.randn(*shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    grad[:dead_rows] = 0.0  # dead units
    grad[:, :dead_cols] = 0.0  # dead inputs
    upd = one_step_update(grad, lr)
    live = grad != 0
    nnz = int(live.sum())
    assert torch.equal(upd != 0, live)  # zero rows and columns of the gradient stay still
    per_entry = 0.2 * lr * math.sqrt(grad.numel() / nnz)
    assert torch.allclose(upd[live].abs(), torch.full((nnz,), per_entry, dtype=upd.dtype), rtol=1e-9, atol=0)
    assert math.isclose(upd.pow(2).mean().sqrt().item(), 0.2 * lr, rel_tol=1e-9)  # RMS over every entry
    if (dead_rows, dead_cols) == (0, 16) and shape == (32, 64):  # a quarter of the inputs dead
        assert per_entry / lr == pytest.approx(0.2 * math.sqrt(4 / 3)) and round(per_entry / lr, 3) == 0.231


@pytest.mark.slow  # a fresh process (19 s here); make test checks the same routing in process (above)
def test_the_cli_routes_a_convnets_stem_and_head_to_adamw_at_its_own_lr(cli, tmp_path):
    """What the run's optimizer did, read back from its checkpoint: the branch of each parameter and the AdamW lr."""
    proc = cli("recipe=data_agent_digits", "size=smoke", "model=convnet", "optimizer=olion", "sampler=full",
               "trainer.max_steps=2", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    (group,) = saved["optimizer_states"][0]["param_groups"]
    branches = dict(zip(group["param_names"], group["orthogonal"], strict=True))
    assert [n for n, o in branches.items() if o] == ["features.3.weight", "features.7.weight", "pre_logits.2.weight"]
    assert not branches["features.0.weight"] and not branches["head.weight"]  # the stem and the classifier
    assert group["adamw_lr"] == DEFAULT_ADAMW_LR and group["adamw_lr_base"] == 0.05  # OLion's lr: the recipe's


@pytest.mark.slow  # a fresh process; make test ties the branch in process (test_adamw_lr_none_ties_...)
def test_the_cli_ties_the_adamw_branch_with_adamw_lr_null(cli):
    proc = cli("recipe=olion_char_lm", "optimizer.adamw_lr=null", "--cfg", "job", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    optimizer = re.search(r"^optimizer:\n((?:  .*\n)+)", proc.stdout, re.M).group(1)  # its indented block
    assert "OLion" in optimizer and "  adamw_lr: null\n" in optimizer

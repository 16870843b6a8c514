"""Each Hugging Face family (tiny configs built with `from_config`, a BPE tokenizer trained here; nothing downloaded)
trains under the framework's causal_lm module with adamw, olion and muon, resumes bitwise after SIGKILL through the
real CLI, and round-trips through the local Hub by name in transformers' own layout."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch
from hf_models import CAUSAL_FAMILIES, MASKED_FAMILIES, save_model

pytest.importorskip("transformers")

from framework.models.hf import HFCausalLM, HFMaskedLM  # noqa: E402
from framework.modules.causal_lm import CausalLM  # noqa: E402
from framework.registry import OPTIMIZERS  # noqa: E402

FAMILIES = [*CAUSAL_FAMILIES, *MASKED_FAMILIES]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """family -> a folder `save_pretrained` wrote (model and tokenizer)."""
    root = tmp_path_factory.mktemp("hf_models")
    return {family: save_model(family, root / family) for family in FAMILIES}


def _tokens(folder, rows: int = 8, length: int = 33) -> torch.Tensor:
    from framework.data.text import corpus_bytes
    from framework.models.hf import load_tokenizer

    ids = load_tokenizer(str(folder))(corpus_bytes("pydoc")[:30_000].decode(), add_special_tokens=False)["input_ids"]
    return torch.tensor(ids[: rows * length]).view(rows, length)


def _build(family: str, folder) -> torch.nn.Module:
    return (HFMaskedLM if family in MASKED_FAMILIES else HFCausalLM)(name_or_path=str(folder))


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_trains_with_adamw_olion_and_muon(folders, family):
    """A few steps of next-token CE (a masked LM: CE at each position of its own input, enough to move every part):
    each optimizer lowers the loss on a fixed batch and moves the hidden matrices, MoE experts included."""
    batch = _tokens(folders[family])
    for name, lr in (("adamw", 3e-3), ("olion", 3e-3), ("muon", 3e-2)):
        torch.manual_seed(0)
        model = _build(family, folders[family])
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        before = {n: p.detach().clone() for n, p in params}
        opt = OPTIMIZERS.build(name, params, lr=lr)
        losses = []
        for _ in range(4):
            opt.zero_grad()
            logits = model(batch[:, :-1])
            target = batch[:, 1:] if family in CAUSAL_FAMILIES else batch[:, :-1]
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[-1] < losses[0], (name, losses)
        moved = [n for n, p in params if not torch.equal(before[n], p.detach())]
        hidden = [n for n, p in params if p.ndim >= 2 and "embed" not in n and "pooler" not in n]
        assert set(hidden) <= set(moved), (name, sorted(set(hidden) - set(moved)))
        experts = [n for n, p in params if p.ndim == 3]
        assert bool(experts) == (family in ("mixtral", "olmoe")), experts


def test_moe_experts_are_orthogonalised_per_expert_by_both_optimizers(folders):
    """OLion and Muon treat transformers 5's fused (E, out, in) expert tensors as E matrices: each expert's update
    is that optimizer's update of the expert alone (Muon: torch.optim.Muon's on each expert, within a few ulps)."""
    model = _build("mixtral", folders["mixtral"])
    stack = model.hf.model.layers[0].mlp.experts.gate_up_proj
    assert stack.ndim == 3
    torch.manual_seed(1)
    stack.grad = torch.randn_like(stack)
    for p in model.parameters():
        if p is not stack:
            p.requires_grad_(False)
    start = stack.detach().clone()
    opt = OPTIMIZERS.build("muon", [(n, p) for n, p in model.named_parameters() if p.requires_grad], lr=0.02,
                           weight_decay=0.0)
    opt.step()
    for e in range(stack.shape[0]):
        ref = torch.nn.Parameter(start[e].clone())
        ref.grad = stack.grad[e].clone()
        torch.optim.Muon([ref], lr=0.02, weight_decay=0.0, adjust_lr_fn="match_rms_adamw").step()
        torch.testing.assert_close(stack.detach()[e], ref.detach(), rtol=0, atol=4 * torch.finfo(torch.float32).eps)
    with torch.no_grad():
        stack.copy_(start)
    opt = OPTIMIZERS.build("olion", [("model.layers.0.mlp.experts.gate_up_proj", stack)], lr=0.01, weight_decay=0.0,
                           ns_dtype="float32")
    opt.step()
    step = (start - stack.detach()) / 0.01
    for e in range(stack.shape[0]):  # each expert: entries ±0.2·sqrt(out·in/nnz), RMS exactly 0.2
        rms = step[e].pow(2).mean().sqrt().item()
        assert abs(rms - 0.2) < 1e-5, (e, rms)
    flat = OPTIMIZERS.build("olion", [("flat", torch.nn.Parameter(start.clone()))], lr=0.01)
    assert flat.param_groups[0]["expert_stack"] == [False]  # a 3-D tensor not under `experts`: a conv kernel


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_round_trips_through_the_local_hub_by_name(folders, family, hub, tmp_path):
    """Trained a step under the causal_lm module, pushed in transformers' layout, opened by transformers' own
    AutoModel class (logits bitwise equal) and by the framework's `from_pretrained` and `init_from` (same weights)."""
    import transformers

    from framework.hub import from_pretrained, load_weights_into, push_to_hub

    model = _build(family, folders[family])
    module = CausalLM(model)
    batch = _tokens(folders[family], rows=4)
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batch, batch_size=4))
    repo = f"local-user/tiny-{family.replace('_', '-')}"
    push_to_hub(module, repo)
    files = set(hub.api.list_repo_files(repo))
    assert {"config.json", "model.safetensors", "tokenizer.json", "framework.json", "README.md"} <= files, files
    ours = json.loads(open(hub.api.hf_hub_download(repo, "framework.json")).read())
    assert ours["name"] == ("hf_masked_lm" if family in MASKED_FAMILIES else "hf_causal_lm")

    auto = transformers.AutoModelForMaskedLM if family in MASKED_FAMILIES else transformers.AutoModelForCausalLM
    theirs = auto.from_pretrained(repo).eval()
    model.eval()
    with torch.no_grad():
        ours_logits = model(batch[:, :16])
        assert torch.equal(theirs(input_ids=batch[:, :16]).logits, ours_logits)
        assert torch.equal(from_pretrained(repo)(batch[:, :16]), ours_logits)
    fresh = _build(family, folders[family])
    load_weights_into(fresh, repo)  # init_from=REPO
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values(),
                                                 strict=True))


@pytest.mark.parametrize("family", list(CAUSAL_FAMILIES))
def test_a_causal_family_runs_bidirectionally_with_causal_false(family):
    """`causal=False` (an MDLM backbone): a change to the last token reaches the first positions' logits; with the
    default causal mask it does not. Logits are shifted one place right (Dream's convention)."""
    values = {**CAUSAL_FAMILIES[family], "vocab_size": 300}
    ids = torch.randint(0, 300, (2, 8), generator=torch.Generator().manual_seed(0))
    later = ids.clone()
    later[:, -1] = (ids[:, -1] + 1) % 300
    for causal in (True, False):
        torch.manual_seed(0)
        model = HFCausalLM(config=values, causal=causal).eval()
        with torch.no_grad():
            a, b = model(ids), model(later)
        assert torch.allclose(a[:, :2], b[:, :2]) == causal, (family, causal)
        if not causal:
            torch.manual_seed(0)
            plain = HFCausalLM(config=values).eval()
            full = torch.ones(2, 1, 8, 8, dtype=torch.bool)
            with torch.no_grad():
                unshifted = plain.hf(input_ids=ids, attention_mask=full).logits
            assert torch.equal(a[:, 1:], unshifted[:, :-1]) and torch.equal(a[:, 0], unshifted[:, 0])

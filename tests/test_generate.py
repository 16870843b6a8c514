"""`python -m framework.generate` on a real (tiny) `mdlm_text` run: text, infilling, LoRA runs, clear refusals."""

import json

import pytest
import torch
from helpers import run_cli
from support.local_hub import LocalHub, patch_client

from framework.generate import encode, generate_text, generate_tokens, load_generator, main
from framework.hub import push_to_hub

TINY = ["threads=1", "trainer.max_steps=4", "trainer.val_check_interval=2", "trainer.limit_val_batches=2",
        "trainer.enable_progress_bar=false", "data.max_bytes=60000", "model.dim=32", "model.depth=1",
        "model.heads=2", "data.seq_len=32", "data.batch_size=8", "model.max_seq_len=96"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 4-step `mdlm_text` run (EMA on, as the recipe sets it)."""
    where = tmp_path_factory.mktemp("mdlm_text")
    proc = run_cli("recipe=mdlm_text", *TINY, f"hydra.run.dir={where}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return where


def test_an_mdlm_run_records_its_appended_mask_id_next_to_the_model(run_dir):
    spec = json.loads((run_dir / "model_config.json").read_text())
    assert spec["mask_id"] == 256 and spec["config"]["vocab_size"] == 257 and spec["config"]["causal"] is False


@pytest.mark.slow  # a fresh process (~7 s); make test runs the same `main` in process (below)
def test_cli_prints_the_prompt_followed_by_generated_text(run_dir):
    proc = run_cli(str(run_dir), "--prompt", "Hello", "--length", "16", "--steps", "8", module="framework.generate",
                   timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.removesuffix("\n")
    assert out.startswith("Hello") and len(out) > len("Hello")


def test_generation_appends_exactly_length_bytes_and_leaves_no_mask(run_dir):
    model, mask_id = load_generator(str(run_dir))
    for block_length, temperature in ((None, 0.0), (4, 0.0), (8, 1.0)):
        tokens = generate_tokens(model, "Hi", 16, 8, block_length, temperature, mask_id=mask_id, seed=3)
        assert tokens.shape == (18,) and bytes(tokens[:2].tolist()) == b"Hi"
        assert (tokens < 256).all()  # bytes only: [MASK] is never committed
    sampled = [generate_text(model, "Hi", 16, 8, temperature=1.0, mask_id=mask_id, seed=3) for _ in range(2)]
    assert sampled[0] == sampled[1]  # same seed, same text


def test_infill_keeps_every_given_byte_and_fills_every_gap(run_dir, capsys):
    model, mask_id = load_generator(str(run_dir))
    prompt = "ab___cd[MASK]e"
    assert encode(prompt, mask_id, infill=True) == [97, 98, 256, 256, 256, 99, 100, 256, 101]
    tokens = generate_tokens(model, prompt, 0, 8, mask_id=mask_id, infill=True)
    assert bytes(tokens[[0, 1, 5, 6, 8]].tolist()) == b"abcde"
    assert (tokens < 256).all() and tokens.shape == (9,)
    assert main([str(run_dir), "--infill", "--prompt", "def ____(self):", "--steps", "8"]) == 0
    out = capsys.readouterr().out.removesuffix("\n")
    assert out.startswith("def ") and out.endswith("(self):")


def test_device_auto_and_cpu_give_the_same_text_where_auto_is_the_cpu(run_dir, capsys):
    """`--device` (default auto: the GPU where torch sees one) moves the model; the draws come from a CPU generator."""
    args = [str(run_dir), "--prompt", "Hi", "--length", "8", "--steps", "8", "--temperature", "1.0", "--seed", "3"]
    texts = []
    for device in ("auto", "cpu"):
        assert main([*args, "--device", device]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0].startswith("Hi") and len(texts[0].encode()) >= 2
    if not torch.cuda.is_available():
        assert texts[0] == texts[1]


def test_ema_weights_are_loaded_on_request(run_dir):
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    model, _ = load_generator(str(run_dir / "checkpoints" / "last.ckpt"), ema=True)
    assert torch.equal(model.embed.weight, ckpt["ema.embed.weight"])
    assert not torch.equal(model.embed.weight, ckpt["model.embed.weight"])  # 4 steps moved the raw weights


def _fake_run(where, **config):
    where.mkdir()
    spec = {"name": "transformer_lm", "config": {"vocab_size": 257, "dim": 16, "depth": 1, "heads": 2, **config}}
    (where / "model_config.json").write_text(json.dumps(spec))
    return str(where)


@pytest.mark.parametrize("case", ["missing_path", "not_a_repo_id", "causal", "not_bytes", "too_long", "no_gap",
                                  "no_such_device"])
def test_bad_input_exits_2_with_one_clear_error(run_dir, tmp_path, capsys, case):
    args, expected = {
        "missing_path": ([str(tmp_path / "no" / "such_run"), "--prompt", "x"], "unknown source"),
        "not_a_repo_id": (["just-a-name", "--prompt", "x"], "unknown source 'just-a-name'"),
        "causal": ([_fake_run(tmp_path / "ar", causal=True), "--prompt", "x"], "is causal (causal=True)"),
        "not_bytes": ([_fake_run(tmp_path / "needle", vocab_size=18, causal=False), "--prompt", "x"],
                      "vocab_size=18"),
        "too_long": ([str(run_dir), "--prompt", "x" * 90, "--length", "16"], "more than the model's max_seq_len=96"),
        "no_gap": ([str(run_dir), "--prompt", "no gaps here", "--infill"], "found no gap"),
        "no_such_device": ([str(run_dir), "--prompt", "x", "--device", f"cuda:{torch.cuda.device_count()}"],
                           f"this machine has {torch.cuda.device_count()} CUDA device(s)"),
    }[case]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err


def test_lora_fine_tune_from_init_from_trains_adapters_only_and_generates(run_dir, tmp_path):
    proc = run_cli("recipe=mdlm_text", *TINY, "trainer.max_steps=2", "module.lora_rank=2", f"init_from={run_dir}",
                   "validate_before_fit=false", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    base = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    tuned = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    # PEFT's layers: each adapted layer's frozen weight under `base_layer`, its adapters beside it
    plain = {k.replace(".base_layer.", "."): k for k in tuned if k.startswith("model.") and ".lora_" not in k}
    assert sorted(plain) == sorted(k for k in base if k.startswith("model."))
    assert all(torch.equal(tuned[k], base[p]) for p, k in plain.items())  # frozen: the pretrained weights untouched
    assert any(tuned[k].abs().sum() > 0 for k in tuned if ".lora_B." in k)
    model, mask_id = load_generator(str(tmp_path))  # the adapters are merged into a plain model on load
    assert not torch.equal(model.blocks[0].attn.q.weight, base["model.blocks.0.attn.q.weight"])
    assert generate_text(model, "Hi", 8, 8, mask_id=mask_id).startswith("Hi")


def test_a_pushed_run_generates_from_its_hub_repo_id_and_a_missing_repo_is_an_unknown_source(run_dir, tmp_path,
                                                                                              capsys):
    with LocalHub(tmp_path / "repos") as hub, patch_client(hub.url, tmp_path / "cache"):
        push_to_hub(run_dir, "local-user/mdlm-text")
        assert main(["local-user/mdlm-text", "--prompt", "Hi", "--length", "8", "--steps", "8"]) == 0
        local = main([str(run_dir), "--prompt", "Hi", "--length", "8", "--steps", "8"])
        out = capsys.readouterr().out.splitlines()
        assert local == 0 and out[0] == out[1] and out[0].startswith("Hi")  # same weights, same mask id: same text
        assert main(["local-user/no-such-model", "--prompt", "Hi"]) == 2
        assert "unknown source 'local-user/no-such-model'" in capsys.readouterr().err

"""`python -m framework.kv_generate` refuses bad input with one `error:` line and exit 2, naming the value: an
allocation of another shape than the model's layers × KV heads, a sparsity outside [0, 1], a window not shorter than
the context, a prompt + new tokens past max_position_embeddings, a model outside transformers' attention interface.
It counts the full cache's keys and values each at their own head dim (an MLA model's differ), and transformers' own
cache beside it. (The README's serving section runs it for real.)"""

from __future__ import annotations

import pytest
import torch
from hf_models import save_model

pytest.importorskip("transformers")

from framework.kv_generate import main  # noqa: E402
from framework.probes.allocation import HeadAllocation  # noqa: E402


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("kv_generate")
    folder = save_model("llama", root / "llama")
    HeadAllocation.from_gates(torch.tensor([[0.9, 0.1], [0.2, 0.8]]), 1, 4, sparsity=0.5).save(root / "fits")
    HeadAllocation.from_gates(torch.rand(3, 2), 1, 4).save(root / "three_layers")
    return folder, root


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    """A tiny DeepSeek-V3 (MLA): keys qk_nope 8 + qk_rope 8 = 16 wide, values 4; 4 heads, each its own KV head."""
    root = tmp_path_factory.mktemp("kv_generate_mla")
    folder = save_model("llama", root / "deepseek", with_tokenizer=False, vocab_size=64, model_type="deepseek_v3",
                        num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8,
                        qk_rope_head_dim=8, v_head_dim=4, head_dim=8, n_routed_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=16, first_k_dense_replace=1, n_group=1, topk_group=1)
    HeadAllocation.from_gates(torch.rand(2, 4), 1, 4).save(root / "pattern")
    return folder, root / "pattern"


def _dynamic_cache_nbytes(folder, tokens: list[int]) -> int:
    """Bytes transformers' own DynamicCache holds after a forward of `tokens`."""
    from transformers import AutoModelForCausalLM, DynamicCache

    from framework.models.hf import cache_argument

    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    cache = DynamicCache(config=hf.config)
    with torch.no_grad():
        hf(input_ids=torch.tensor([tokens]), use_cache=True, **{cache_argument(hf): cache})
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)


def _refused(argv: list[str], capsys) -> str:
    code = main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and err[0].startswith("error:"), (code, err)
    return err[0]


def test_it_decodes_and_reports_the_bytes_held(llama, capsys):
    folder, root = llama
    assert main([str(folder), "--pattern", str(root / "fits"), "--ids", "5 6 7 8 9 10 11 12", "-n", "6"]) == 0
    out = capsys.readouterr().out
    assert "2 of 4 KV heads full at s=0.5, window (1, 4), float32 on " in out and out.startswith("tokens: [")


@pytest.fixture(scope="module")
def mistral_window(llama, tmp_path_factory):
    """A tiny Mistral with a sliding window of 4 positions (every layer), the Llama's pattern files beside it."""
    return save_model("mistral", tmp_path_factory.mktemp("kv_generate_window") / "m", sliding_window=4), llama[1]


@pytest.mark.parametrize("model", ["llama", "mistral_window"])
def test_at_s0_the_cache_held_is_the_full_cache_and_transformers_own(model, request, capsys):
    """At s = 0 the mixed cache holds what transformers' own cache holds (a sliding layer: the window - 1)."""
    from framework.kv_generate import parse_args, run

    folder, root = request.getfixturevalue(model)
    ids = [5, 6, 7, 8, 9, 10, 11, 12]
    got = run(parse_args([str(folder), "--pattern", str(root / "fits"), "--sparsity", "0", "--ids",
                          " ".join(map(str, ids)), "-n", "6"]))
    assert got["bytes"] == got["full_bytes"] == got["own_bytes"] == _dynamic_cache_nbytes(folder, ids + got[
        "tokens"][:-1])
    out = capsys.readouterr().out
    assert "(1.000 of it)" in out and "transformers' own cache" not in out


def test_an_mla_model_counts_keys_and_values_at_their_own_head_dims(deepseek, capsys):
    """DeepSeek-V3's keys are 16 wide, its values 4: the full cache is positions × layers × heads × (16 + 4) floats
    (it counted 16 + 16: 0.625 at s = 0). transformers' own cache holds the compressed latents (kv_lora_rank 16 +
    qk_rope 8 a layer and position), which the CLI reports beside it."""
    from framework.kv_generate import parse_args, run

    folder, pattern = deepseek
    ids = [5, 6, 7, 8, 9, 10, 11, 12]
    argv = [str(folder), "--pattern", str(pattern), "--ids", " ".join(map(str, ids)), "-n", "6"]
    got = run(parse_args([*argv, "--sparsity", "0"]))
    positions = len(ids) + 6 - 1
    assert got["bytes"] == got["full_bytes"] == positions * 2 * 4 * (16 + 4) * 4
    assert got["own_bytes"] == positions * 2 * (16 + 8) * 4 == _dynamic_cache_nbytes(folder, ids + got["tokens"][:-1])
    out = capsys.readouterr().out
    assert "(1.000 of it)" in out and f"transformers' own cache holds {got['own_bytes']:,} bytes" in out
    half = run(parse_args([*argv, "--sparsity", "0.5"]))  # 4 of 8 heads keep the sink + recent = 5 of 13 positions
    assert half["full_bytes"] == got["full_bytes"] and half["bytes"] == (4 * positions + 4 * 5) * (16 + 4) * 4


def test_device_and_dtype_choose_where_and_in_what_the_cache_is_held(llama, capsys):
    """`--device auto` is the GPU where torch sees one, else the CPU; `--dtype bfloat16` holds half the bytes."""
    from framework.kv_generate import parse_args, run

    folder, root = llama
    argv = [str(folder), "--pattern", str(root / "fits"), "--ids", "5 6 7 8 9 10 11 12", "-n", "6"]
    auto = run(parse_args(argv))
    assert auto["device"] == ("cuda:0" if torch.cuda.is_available() else "cpu")
    fp32, bf16 = (run(parse_args([*argv, "--device", "cpu", "--dtype", d])) for d in ("float32", "bfloat16"))
    assert fp32["device"] == "cpu" and bf16["bytes"] * 2 == fp32["bytes"] and bf16["full_bytes"] * 2 == fp32[
        "full_bytes"]
    assert "bfloat16 on cpu" in capsys.readouterr().out


def test_bad_input_is_one_error_line_exit_2(llama, capsys, tmp_path):
    folder, root = llama
    ids = ["--ids", "5 6 7 8 9 10 11 12", "-n", "6"]
    err = _refused([str(folder), "--pattern", str(root / "three_layers"), *ids], capsys)
    assert "layers × kv_heads = (3, 2), the model has (2, 2)" in err
    err = _refused([str(folder), "--pattern", str(root / "fits"), "--sparsity", "1.5", *ids], capsys)
    assert "sparsity=1.5 must lie in [0, 1]" in err
    err = _refused([str(folder), "--pattern", str(root / "fits"), "--window", "4", "16", *ids], capsys)
    assert "window sink=4 + recent=16 = 20 is not shorter than the context of 14 tokens" in err
    long = ["--ids", " ".join(["5"] * 250), "-n", "7"]  # the tiny llama has max_position_embeddings=256
    err = _refused([str(folder), "--pattern", str(root / "fits"), *long], capsys)
    assert err == ("error: the prompt's 250 tokens + 7 new tokens = 257 positions, more than the model config's "
                   "max_position_embeddings=256: shorten the prompt or -n")
    err = _refused([str(folder), "--pattern", str(root / "fits"), "--device", "gpu0", *ids], capsys)
    assert err == "error: --device 'gpu0' is not a device name; valid: auto, cpu, cuda, cuda:N, mps"
    missing = f"cuda:{torch.cuda.device_count()}"  # one past the last GPU: none on a CPU machine
    err = _refused([str(folder), "--pattern", str(root / "fits"), "--device", missing, *ids], capsys)
    assert f"--device '{missing}': this machine has {torch.cuda.device_count()} CUDA device(s)" in err
    neo = tmp_path / "neo"
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("gpt_neo", hidden_size=32, num_layers=2, num_heads=4, vocab_size=64,
                                  attention_types=[[["global"], 2]], max_position_embeddings=64)
    AutoModelForCausalLM.from_config(config, attn_implementation="eager").save_pretrained(neo)
    err = _refused([str(neo), "--pattern", str(root / "fits"), *ids], capsys)
    assert "GPTNeoForCausalLM does not route its attention through transformers' AttentionInterface" in err

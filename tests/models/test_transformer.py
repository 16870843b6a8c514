import pytest
import torch

from framework.models.transformer import TransformerLM


def tiny(**kw):
    torch.manual_seed(0)
    return TransformerLM(vocab_size=50, dim=32, depth=2, heads=4, **kw)


def test_causal_model_output_at_t_ignores_tokens_after_t():
    model = tiny(kv_heads=2).eval()
    x = torch.randint(0, 50, (2, 12))
    y = x.clone()
    y[:, 7:] = (y[:, 7:] + 1) % 50
    a, b = model(x), model(y)
    assert torch.allclose(a[:, :7], b[:, :7], atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_bidirectional_model_sees_the_future():
    model = tiny(causal=False).eval()
    x = torch.randint(0, 50, (1, 10))
    y = x.clone()
    y[0, 9] = (y[0, 9] + 1) % 50
    assert not torch.allclose(model(x)[:, 0], model(y)[:, 0])


def test_padding_is_never_attended():
    model = tiny(causal=False).eval()
    x = torch.randint(0, 50, (1, 10))
    keep = torch.ones(1, 10, dtype=torch.bool)
    keep[0, 6:] = False
    y = x.clone()
    y[0, 6:] = 0  # different padding content must not change the real positions
    assert torch.allclose(model(x, keep)[:, :6], model(y, keep)[:, :6], atol=1e-6)


def test_init_config_records_plain_constructor_values_and_rebuilds_the_same_shapes():
    model = tiny(kv_heads=2, tie_embeddings=True)
    assert model.init_config == {
        "vocab_size": 50, "dim": 32, "depth": 2, "heads": 4, "kv_heads": 2, "mlp_ratio": 4.0,
        "max_seq_len": 1024, "causal": True, "dropout": 0.0, "tie_embeddings": True, "init": "gpt2",
        "gradient_checkpointing": False,
    }
    clone = TransformerLM(**model.init_config)
    assert {k: v.shape for k, v in clone.state_dict().items()} == {k: v.shape for k, v in model.state_dict().items()}
    assert model.head.weight is model.embed.weight


def test_grouped_query_attention_has_fewer_key_value_parameters():
    assert tiny(kv_heads=1).blocks[0].attn.kv.weight.shape == (2 * 8, 32)
    assert tiny().blocks[0].attn.kv.weight.shape == (2 * 32, 32)


@pytest.mark.parametrize(("kw", "match"), [({"heads": 3}, "divisible by heads=3"), ({"kv_heads": 3}, "kv_heads=3")])
def test_bad_shapes_name_the_bad_value(kw, match):
    with pytest.raises(ValueError, match=match):
        TransformerLM(vocab_size=10, dim=32, depth=1, **{"heads": 4, **kw})


def test_too_long_input_is_refused_with_the_limit():
    with pytest.raises(ValueError, match="max_seq_len=8"):
        TransformerLM(vocab_size=10, dim=16, depth=1, heads=2, max_seq_len=8)(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize("causal", [True, False])
def test_the_init_choice_sets_the_documented_standard_deviations(causal):
    depth, dim = 3, 256
    torch.manual_seed(0)
    gpt2 = TransformerLM(vocab_size=512, dim=dim, depth=depth, heads=4, causal=causal, init="gpt2")
    torch.manual_seed(0)
    torch_init = TransformerLM(vocab_size=512, dim=dim, depth=depth, heads=4, causal=causal, init="torch")

    def close(p, std):
        return abs(p.detach().std().item() / std - 1) < 0.03

    for name, p in gpt2.named_parameters():
        if "norm" in name:
            continue
        std = 0.02 / (2 * depth) ** 0.5 if name.endswith("proj.weight") else 0.02
        assert close(p, std), (name, p.std().item(), std)
    layers = dict(torch_init.named_modules())
    for name, p in torch_init.named_parameters():
        if "norm" in name:
            continue
        layer = layers[name.rsplit(".", 1)[0]]
        # PyTorch's defaults: Linear ~ U(±1/√fan_in) (std 1/√(3·fan_in)), Embedding ~ N(0, 1)
        std = 1.0 if isinstance(layer, torch.nn.Embedding) else (3 * layer.in_features) ** -0.5
        assert close(p, std), (name, p.std().item(), std)
    for model in (gpt2, torch_init):  # LayerNorms start as the identity under both
        norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
        assert all(torch.equal(m.weight, torch.ones_like(m.weight)) and not m.bias.any() for m in norms)
    assert gpt2.init_config["init"] == "gpt2" and torch_init.init_config["init"] == "torch"


def test_an_unknown_init_is_refused_naming_the_valid_schemes():
    with pytest.raises(ValueError, match=r"init='xavier' is not an initialisation scheme; valid: gpt2, torch"):
        tiny(init="xavier")


def test_a_saved_model_loads_the_same_whatever_init_the_new_one_draws():
    saved = tiny(init="gpt2")
    for init in ("gpt2", "torch"):
        torch.manual_seed(1)
        fresh = tiny(init=init)
        fresh.load_state_dict(saved.state_dict())
        x = torch.randint(0, 50, (2, 7))
        assert torch.equal(fresh(x), saved(x))

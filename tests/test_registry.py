import pytest
from hydra_zen import ZenStore, instantiate

from framework.registry import GROUPS, KINDS, Registry, UnknownNameError


class Widget:
    """A test component."""

    def __init__(self, size: int, color: str = "red"):
        self.size, self.color = size, color


def make_registry(partial: bool = False) -> tuple[Registry, ZenStore]:
    store = ZenStore(name="test", deferred_hydra_store=True)
    return Registry("widget", partial=partial, store=store), store


def test_register_get_build_with_defaults_and_overrides():
    reg, _ = make_registry()
    reg.register(Widget, name="widget_a", size=3)
    assert reg.get("widget_a") is Widget
    w = reg.build("widget_a", color="blue")
    assert (w.size, w.color) == (3, "blue")


class BigWidget(Widget):
    pass


def test_register_works_as_a_decorator_and_derives_a_snake_case_name():
    reg, _ = make_registry()
    assert reg.register(size=1)(BigWidget) is BigWidget
    assert reg.names() == ["big_widget"]
    assert reg.build("big_widget").size == 1


def test_aliases_resolve_to_the_canonical_entry():
    reg, _ = make_registry()
    reg.register(Widget, name="widget", aliases=("gadget",), size=2)
    assert reg.get("gadget") is Widget
    assert reg.resolve("gadget") == "widget"
    assert reg.names() == ["widget"] and reg.names(aliases=True) == ["gadget", "widget"]
    assert "gadget" in reg


def test_duplicate_names_and_aliases_are_refused():
    reg, _ = make_registry()
    reg.register(Widget, name="widget", aliases=("gadget",), size=2)
    with pytest.raises(ValueError, match="already registered"):
        reg.register(Widget, name="widget", size=1)
    with pytest.raises(ValueError, match="already registered"):
        reg.register(Widget, name="other", aliases=("gadget",), size=1)


@pytest.mark.parametrize("bad", ["Widget", "my-widget", "2widget", "a b"])
def test_names_must_be_lower_snake_case(bad):
    reg, _ = make_registry()
    with pytest.raises(ValueError, match="lower_snake_case"):
        reg.register(Widget, name=bad, size=1)


def test_names_filter_with_shell_wildcards():
    reg, _ = make_registry()
    for n in ("mdlm_small", "mdlm_base", "olion"):
        reg.register(Widget, name=n, size=1)
    assert reg.names("mdlm_*") == ["mdlm_base", "mdlm_small"]
    assert reg.names("*lion") == ["olion"]
    assert reg.names("nothing*") == []


def test_unknown_name_says_kind_name_closest_match_and_valid_names():
    reg, _ = make_registry()
    for n in ("olion", "adamw", "sgd"):
        reg.register(Widget, name=n, size=1)
    with pytest.raises(UnknownNameError) as info:
        reg.get("olio")
    msg = str(info.value)
    assert "Unknown widget 'olio'" in msg
    assert "Did you mean 'olion'?" in msg
    assert "adamw, olion, sgd" in msg
    assert info.value.matches == ["olion"]


def test_unknown_name_without_close_match_has_no_suggestion():
    reg, _ = make_registry()
    reg.register(Widget, name="olion", size=1)
    msg = str(pytest.raises(UnknownNameError, reg.get, "zzz").value)
    assert "Did you mean" not in msg and "olion" in msg


def test_registering_mirrors_a_full_signature_config_into_the_hydra_group():
    reg, store = make_registry()
    reg.register(Widget, name="widget", aliases=("gadget",), size=4)
    names = {(e["group"], e["name"]) for e in store}
    assert names == {("widget", "widget"), ("widget", "gadget")}
    cfg = store["widget", "widget"]
    obj = instantiate(cfg)
    assert isinstance(obj, Widget) and obj.size == 4 and obj.color == "red"
    assert "color" in cfg.__dataclass_fields__  # populate_full_signature: every argument overridable


def test_partial_registry_leaves_required_arguments_for_build_time():
    reg, store = make_registry(partial=True)
    reg.register(Widget, name="widget", color="green")
    factory = instantiate(store["widget", "widget"])
    assert "size" not in store["widget", "widget"].__dataclass_fields__
    assert factory(size=7).size == 7 and factory(size=7).color == "green"


def test_every_kind_has_one_registry_with_a_hydra_group():
    assert set(KINDS) == {
        "model", "module", "optimizer", "scheduler", "loss", "metric", "callback", "sampler", "data", "peft",
        "recipe", "strategy",
    }
    assert KINDS["callback"].group == "callbacks"
    assert set(GROUPS) == {r.group for r in KINDS.values()} - {"trainer.strategy"}  # a Trainer value, not a group


def test_ls_lists_the_fsdp2_strategy_lightning_takes_by_name(capsys):
    """(`python -m framework.ls` in a fresh process: tests/test_conf.py and tests/test_errors.py)"""
    from lightning.pytorch.strategies import StrategyRegistry

    from framework.ls import main

    assert main(["strategy"]) == 0
    assert capsys.readouterr().out.strip() == "strategy: fsdp2"
    import framework.strategies  # noqa: F401 - registers it with Lightning too

    assert "fsdp2" in StrategyRegistry.available_strategies()

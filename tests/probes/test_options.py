"""The probes' shared options are written once (HeadProbe) and still reach every probe, its config and the CLI."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest
from hydra_zen import builds, instantiate

from framework.cli import BadSettingError, check_settings
from framework.models.transformer import TransformerLM
from framework.probes.base import HeadProbe, RandomHeads
from framework.probes.duo_attention import DuoAttentionProbe
from framework.probes.rlkv import RLKVProbe

PROBES = (RLKVProbe, DuoAttentionProbe, RandomHeads)
SHARED = [p for name, p in inspect.signature(HeadProbe.__init__).parameters.items()
          if name not in ("self", "model", "optimizer", "scheduler")]


@pytest.mark.parametrize("cls", PROBES)
def test_every_probe_config_has_every_shared_option_with_its_default_and_type(cls):
    fields = {f.name: f for f in dataclasses.fields(builds(cls, populate_full_signature=True, zen_partial=True))}
    base = {f.name: f for f in dataclasses.fields(builds(HeadProbe, populate_full_signature=True, zen_partial=True))}
    for p in SHARED:
        assert p.name in fields, p.name
        assert (fields[p.name].type, fields[p.name].default) == (base[p.name].type, base[p.name].default), p.name


@pytest.mark.parametrize("cls", PROBES)
def test_a_shared_option_set_in_the_config_reaches_the_probe(cls):
    cfg = builds(cls, populate_full_signature=True, zen_partial=True, sink=2, recent=3, sparsity=0.25)
    probe = instantiate(cfg)(TransformerLM(vocab_size=12, dim=16, depth=1, heads=2))
    assert probe.window == (2, 3) and probe.sparsity == 0.25


def test_a_misspelt_shared_option_is_refused_by_the_probe_and_the_cli_with_did_you_mean():
    with pytest.raises(TypeError, match="sinkk"):
        RLKVProbe(TransformerLM(vocab_size=12, dim=16, depth=1, heads=2), sinkk=2)
    with pytest.raises(BadSettingError, match=re.escape("Unknown setting 'module.sinkk'. Did you mean 'module.sink'")):
        check_settings(["recipe=rlkv_probe", "module.sinkk=2"])
    with pytest.raises(BadSettingError, match=re.escape("Bad value for module.pretrain_steps: 'many'.")):
        check_settings(["recipe=rlkv_probe", "module.pretrain_steps=many"])
    check_settings(["recipe=rlkv_probe", "module.sink=2", "module.pretrain_lr=0.01", "module.group_size=8"])

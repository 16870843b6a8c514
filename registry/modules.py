"""LightningModules (partial: completed with the model, optimizer and scheduler)."""

from framework.modules.causal_lm import CausalLM
from framework.registry import MODULES

MODULES.register(CausalLM, name="causal_lm")

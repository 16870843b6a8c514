"""LightningModules (partial: completed with the model, optimizer and scheduler)."""

from framework.modules.causal_lm import CausalLM
from framework.registry import MODULES

MODULES.register(CausalLM, name="causal_lm")

from framework.modules.mdlm import MDLMModule  # noqa: E402

MODULES.register(MDLMModule, name="mdlm", sampling_eps=1e-3, ema_decay=0.0)

from framework.modules.classifier import Classifier  # noqa: E402

MODULES.register(Classifier, name="classifier", label_smoothing=0.0)

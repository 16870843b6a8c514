"""LightningModules (partial: completed with the model, optimizer and scheduler)."""

from framework.modules.causal_lm import CausalLM
from framework.registry import MODULES

MODULES.register(CausalLM, name="causal_lm")

from framework.modules.mdlm import MDLMModule  # noqa: E402

MODULES.register(MDLMModule, name="mdlm", sampling_eps=1e-3, ema_decay=0.0)

from framework.modules.classifier import Classifier  # noqa: E402

MODULES.register(Classifier, name="classifier", label_smoothing=0.0)

from framework.probes.base import RandomHeads  # noqa: E402
from framework.probes.duo_attention import DuoAttentionProbe  # noqa: E402
from framework.probes.rlkv import RLKVProbe  # noqa: E402

MODULES.register(RLKVProbe, name="rlkv", group_size=4, penalty=0.5, tau=0.5, sink=1, recent=4)
MODULES.register(DuoAttentionProbe, name="duo_attention", reg_weight=0.05, sink=1, recent=4)
MODULES.register(RandomHeads, name="random_heads", aliases=("random",), sink=1, recent=4)

from framework.modules.metric_eval import MetricEval  # noqa: E402

MODULES.register(
    MetricEval, name="metric_eval", k=5, corrections=["none", "icdm", "gicdm_reconstructed"],
    description="Trains nothing; evaluates P/R/D/C raw and with each correction listed on each validation "
                "configuration (the comparison gicdm_eval exists for).",
)

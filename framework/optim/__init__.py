"""Optimizers: OLion (orthogonal Lion) with an internal AdamW, its baselines, the shared routing and NS5."""

from framework.optim.hybrid import is_hidden_matrix
from framework.optim.muon import MuonAdamW
from framework.optim.newton_schulz import newton_schulz5
from framework.optim.olion import OLion

__all__ = ["MuonAdamW", "OLion", "is_hidden_matrix", "newton_schulz5"]

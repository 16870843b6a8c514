"""LightningModules: MDLM, causal LM, classifier and metric evaluation, each built from registered parts."""

from framework.recipe import recipe

# An evaluation, not training: the data module's validation set is the hubness sweep (docs/gicdm.md: Gaussians
# d = 2…2048 × 3 seeds, OOD fraction at d = 256, digits ± 1024 noise dims), the module evaluates P/R/D/C raw,
# ICDM-corrected and with our GICDM reconstruction (`gicdm_reconstructed`, which over-corrects: docs/gicdm.md) on
# each, and the final validation after the (empty) fit writes gicdm_eval.md / .json and gicdm_hubness.png /
# gicdm_scenarios.png into the run dir. `module.corrections=[none]` gives the raw metrics alone.
recipe(
    "gicdm_eval",
    description="Hubness sweep: raw vs ICDM vs our GICDM reconstruction, P/R/D/C on Gaussians, OOD, digits+noise.",
    defaults={"data": "hubness_sweep", "module": "metric_eval", "model": None, "optimizer": None, "scheduler": None},
    validate_before_fit=False,
    trainer={"max_steps": 1, "val_check_interval": 1_000_000, "check_val_every_n_epoch": None,
             "log_every_n_steps": 1},
)

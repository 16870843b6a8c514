from framework.recipes.data_agent_digits import CLASSIFY, SMOKE

from framework.recipe import recipe

# The comparison workload: 10 classes × 2 clusters in 64-d with 20% training label noise (spec 2.4), where
# selection policies can differ. Sweep the policies side by side (Hydra multirun):
#   python -m framework.train -m recipe=selection_compare sampler=full,random,infobatch,data_agent
recipe(
    "selection_compare",
    description="One workload for comparing data-selection policies (sweep sampler=full,random,infobatch,...).",
    defaults={"data": "synth_classes", "model": "mlp", "module": "classifier", "optimizer": "sgd",
              "scheduler": "warmup_cosine", "sampler": "full"},
    smoke=[*SMOKE, "data.n_samples=800", "data.batch_size=32"],
    data={"n_samples": 10_000, "batch_size": 128},
    **{**CLASSIFY, "trainer": {**CLASSIFY["trainer"], "max_epochs": 20, "check_val_every_n_epoch": 5}},
)

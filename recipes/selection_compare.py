from framework.recipe import recipe

# The comparison workload: data_agent_digits' training on 10 classes × 2 clusters in 64-d with 20% training label
# noise, where selection policies can differ. Sweep the policies side by side (Hydra multirun):
#   python -m framework.train -m recipe=selection_compare sampler=full,random,infobatch,data_agent,data_agent_staleness
#   (add data_agent_amortised: the agent acting and learning once per epoch, at random pruning's cost)
recipe(
    "selection_compare",
    description="One workload for comparing data-selection policies (sweep sampler=full,random,infobatch,...).",
    base="data_agent_digits",
    defaults={"data": "synth_classes", "sampler": "full"},
    data={"n_samples": 10_000, "batch_size": 128},
    trainer={"max_epochs": 20, "check_val_every_n_epoch": 5},
)

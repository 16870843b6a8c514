from framework.recipe import recipe

# An MLP (64→256→256→10) whose 256-d penultimate feature is the agent's state; SGD-Nesterov with a
# cosine schedule whose length comes from the selection plan; ρ = 0.5 for ⌊0.875·E⌋ epochs, then full data.
# `sampler=full|random|infobatch|eps_greedy|ucb` swaps the policy, `sampler=data_agent_staleness` runs the agent
# with the staleness bonus that stops its selection freezing (docs/data_agent.md), `sampler=data_agent_amortised`
# the agent acting and learning once per epoch instead of every step; results.json reports
# `selection/cost`.
recipe(
    "data_agent_digits",
    description="Data Agent (PPO data selection, ρ=0.5) training an MLP on sklearn digits; cost vs full data.",
    defaults={"data": "digits", "model": "mlp", "module": "classifier", "optimizer": "sgd",
              "scheduler": "warmup_cosine", "sampler": "data_agent"},
    optimizer={"lr": 0.05, "weight_decay": 5e-4, "nesterov": True},
    scheduler={"warmup_steps": 20, "min_lr_ratio": 0.0},
    trainer={"max_epochs": 40, "max_steps": -1, "check_val_every_n_epoch": 10, "log_every_n_steps": 5},
    test=True,
)

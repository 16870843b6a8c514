from framework.recipe import recipe

recipe(
    "olion_char_lm",
    description="The char_lm workload trained with OLion (orthogonalised Lion); sweep optimizer=olion,muon,adamw,lion.",
    base="char_lm",
    defaults={"optimizer": "olion"},
)

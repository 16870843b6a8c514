"""Recipes: registered compositions of catalog names and values (installed as `framework.recipes`).

Each file is data, names and values only: a recipe built on another names it as `base=` (a Hydra defaults entry,
never an import), and sizes other than the CPU default live in conf/size/ and conf/preset/RECIPE/."""

from framework.recipes import (  # noqa: F401 - each module registers its recipe on import, in this order
    char_lm,
    data_agent_digits,
    gicdm_eval,
    mdlm_kv_recall,
    mdlm_mask_agnostic,
    mdlm_text,
    moe_growth,
    olion_char_lm,
    pointer_chase_lm,
    rlkv_probe,
    selection_compare,
    sft,
)

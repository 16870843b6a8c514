"""Recipes: registered compositions of catalog names and values (installed as `framework.recipes`).

Each file is data, names and values only: a recipe built on another names it as `base=` (a Hydra defaults entry,
never an import), and sizes other than the CPU default live in conf/size/ and conf/preset/RECIPE/."""

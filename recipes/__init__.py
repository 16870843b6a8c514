"""Recipes: registered compositions of catalog names and values (installed as `framework.recipes`)."""

"""Package layout only; everything else lives in pyproject.toml.

`registry/` and `recipes/` sit at the top of the repository so the architecture is visible, but they install
inside the framework namespace (`framework.catalog`, `framework.recipes`) so the unrelated PyPI packages
named `registry` and `recipes` can neither shadow them nor be shadowed by them.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["framework", "framework.*"]), "framework.catalog", "framework.recipes"],
    package_dir={"framework.catalog": "registry", "framework.recipes": "recipes"},
)

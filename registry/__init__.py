"""The catalog: every registered name, one module per kind (installed as `framework.catalog`).

Importing it registers every entry. `framework.registry.load_catalog` finds it through the `framework.catalog`
entry point in pyproject.toml, so the machinery in `framework/` never names it.
"""

from framework.catalog import (  # noqa: F401 - each module registers its entries on import, in this order
    adapters,
    callbacks,
    data,
    losses,
    metrics,
    models,
    modules,
    optimizers,
    samplers,
    strategies,
)

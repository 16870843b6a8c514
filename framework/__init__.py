"""framework: a PyTorch Lightning training framework where new methods are registered, composable parts.

Importing `framework` is cheap and has no side effects: components live in subpackages
(`framework.optim`, `framework.models`, ...) and the catalog of names in `framework.catalog`.
"""

__version__ = "0.1.0"

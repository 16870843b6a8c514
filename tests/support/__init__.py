"""Test-support code, kept out of the installed package: fault injection (`support.faults`), the warm CLI runner
(`support.warm_cli`), and `support.local_hub`, which re-exports the local Hub server (`framework.local_hub`).

pytest puts `tests/` on `sys.path` (`pythonpath` in pyproject.toml), so tests import these as `support.*`.
"""

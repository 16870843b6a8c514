"""Test-support code, kept out of the installed package: a local Hugging Face Hub-compatible server
(`support.local_hub`, also runnable as `python tools/local_hub.py`) and fault injection (`support.faults`).

pytest puts `tests/` on `sys.path` (`pythonpath` in pyproject.toml), so tests import these as `support.*`.
"""

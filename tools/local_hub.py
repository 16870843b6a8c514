"""Run a local Hugging Face Hub-compatible server: `python tools/local_hub.py --root DIR --port 8765`.

Then `export HF_ENDPOINT=http://127.0.0.1:8765` and use `huggingface_hub` as usual, fully offline.
The server is test-support code, `tests/support/local_hub.py` in a checkout; it is not in the installed package.
"""

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
TESTS = str(REPO_ROOT / "tests")  # holds the `support` package (the server needs nothing from `framework`)
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

from support.local_hub import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())

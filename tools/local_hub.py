"""Run a local Hugging Face Hub-compatible server: `python tools/local_hub.py --root DIR --port 8765`.

Then `export HF_ENDPOINT=http://127.0.0.1:8765` and use `huggingface_hub` as usual, fully offline.
"""

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from framework.testing.local_hub import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())

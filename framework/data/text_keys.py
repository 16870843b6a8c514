"""What `data=text` (and the chat and image data built on it) key their splits and caches on: which documents are
held out for validation, and a tokenizer's identity."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any


def held_out(i: int, fraction: float) -> bool:
    """Document i is a validation document: every (1/fraction)-th from the first (ceil(n · fraction) of n)."""
    return math.ceil(round((i + 1) * fraction, 9)) > math.ceil(round(i * fraction, 9))


def tokenizer_identity(tokenizer: Any) -> dict[str, Any]:
    """A tokenizer's name and a hash of its whole definition (a fast tokenizer's JSON without its call-time
    padding / truncation settings, else its vocabulary), its EOS; bytes for byte data."""
    if tokenizer is None:
        return {"name_or_path": "bytes"}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        definition = {k: v for k, v in json.loads(backend.to_str()).items() if k not in ("padding", "truncation")}
    else:
        definition = sorted(tokenizer.get_vocab().items())
    digest = hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()[:16]
    return {"name_or_path": str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__),
            "definition": digest, "eos": tokenizer.eos_token_id, "size": len(tokenizer)}

"""A callback for tests that records every training batch a run takes, so two runs can be compared bitwise.

`PYTHONPATH=tests python -m framework.train ... +callbacks.batches._target_=support.batch_log.BatchLog
+callbacks.batches.path=/some/file.jsonl`: each rank appends one JSON line per step to `path` (`.rank{r}` before the
suffix on ranks > 0): the global step, the epoch, a hash of every tensor in the batch, the rows' `index` and, with
`tokens=true`, the rows' tokens other than `pad_id` (byte data: the text's bytes) to reconstruct what was read.
`corpus` writes the files of numbered documents the streaming tests read.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import lightning as L


class BatchLog(L.Callback):
    def __init__(self, path: str, tokens: bool = False, pad_id: int = 0):
        self.path, self.tokens, self.pad_id = Path(path), tokens, pad_id

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        path = self.path if trainer.global_rank == 0 else self.path.with_suffix(f".rank{trainer.global_rank}.jsonl")
        digest = hashlib.sha256()
        for key in sorted(batch):
            digest.update(key.encode() + batch[key].detach().cpu().contiguous().numpy().tobytes())
        line: dict[str, Any] = {"step": trainer.global_step, "epoch": trainer.current_epoch,
                                "hash": digest.hexdigest(), "index": batch["index"].tolist()}
        if self.tokens:
            ids = batch["input_ids"].cpu()
            line["rows"] = [row[row != self.pad_id].tolist() for row in ids]  # byte data: no text byte is 0
        with path.open("a") as f:
            f.write(json.dumps(line) + "\n")


WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


def corpus(folder: Path, sizes: dict[str, int], seed: int = 0) -> Path:
    """JSON-lines files of numbered documents ('name/i: words#', each unique, no byte 0), `sizes` = rows per file."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for name, n in sizes.items():
        with open(folder / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for i in range(n):
                words = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 12)))
                f.write(json.dumps({"text": f"{name}/{i}: {words}#"}) + "\n")
    return folder

"""Read what an offline W&B run recorded (its `run-*.wandb` file) without the W&B service or a network: the file is a
LevelDB-style log (32 KiB blocks of records, each a 7-byte header: CRC32, length, type) of `Record` protobufs."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    """Every `wandb_internal_pb2.Record` in the offline run file `path`, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, out, parts = 7, [], b""  # the file header: ':W&B', a 2-byte magic, a version byte
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the rest of a block too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0:
            break
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        parts = chunk if kind in (FULL, FIRST) else parts + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            out.append(record)
    return out


def history(run_dir: Path) -> list[dict[str, Any]]:
    """The metric rows (`wandb.log` calls) of the offline run in `run_dir`, each `{key: value}`."""
    (path,) = run_dir.glob("run-*.wandb")
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def config(run_dir: Path) -> dict[str, Any]:
    """The run's config (what `wandb.config.update` received), merged over every config record."""
    (path,) = run_dir.glob("run-*.wandb")
    values: dict[str, Any] = {}
    for record in records(path):
        if record.WhichOneof("record_type") in ("config", "run"):
            items = record.config.update if record.WhichOneof("record_type") == "config" else record.run.config.update
            values.update({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items})
    return values

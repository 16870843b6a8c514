"""The head allocation: per-KV-head gate scores plus the streaming window, a small shareable artefact.

Heads whose gate is among the top `1 - s` keep the full KV cache; the rest keep `sink + recent` entries. The
allocation is JSON (`head_allocation.json`, never a pickle) plus a readable `gates.tsv`, and goes to and from
the Hugging Face Hub on its own or next to the model it was probed on:

    alloc = HeadAllocation.load("outputs/rlkv/run")          # or .from_pretrained("me/chase-rlkv")
    tokens = decode(model, prompt, 9, full_heads=alloc.full_heads(0.5), window=alloc.window)

    python -m framework.probes.allocation push RUN_DIR REPO_ID [--revision R]
    python -m framework.probes.allocation show REPO_ID_OR_PATH
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from framework.errors import run_cli

FILE_NAME, TSV_NAME = "head_allocation.json", "gates.tsv"
FORMAT_VERSION = 1
#: DuoAttention's and RLKV's own layout, written beside ours in this subfolder (so a model repo's config.json is
#: never touched): a layers × KV heads matrix of gates, tab-separated, one layer per line, and DuoAttention's
#: `config.json` with `sink_size` / `recent_size`. DuoAttention reads `full_attention_heads.tsv`, RLKV
#: `adapter_weights.tsv` (the same matrix); both clip the values to [0, 1].
PATTERN_DIR, DUO_TSV, RLKV_TSV, PATTERN_CONFIG = "attn_pattern", "full_attention_heads.tsv", "adapter_weights.tsv", \
    "config.json"


def full_head_count(n_heads: int, sparsity: float) -> int:
    """How many of `n_heads` keep the full cache at `sparsity` (the fraction compressed): round((1 - s) · n)."""
    if not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"sparsity={sparsity} must lie in [0, 1] (the fraction of KV heads compressed)")
    return int(math.floor((1.0 - sparsity) * n_heads + 0.5))


def gate_shape(model: Any) -> tuple[int, int]:
    """(layers, kv_heads) of a causal LM that takes per-KV-head gates and a mixed cache: the framework's own (its
    `blocks`) or one that states its `gate_shape` (`hf_causal_lm`); ValueError naming the model otherwise."""
    blocks = getattr(model, "blocks", None)
    if blocks is not None and all(hasattr(b, "attn") for b in blocks):
        if not all(b.attn.causal for b in blocks):
            raise ValueError(f"{type(model).__name__} has causal=False: gates and KV caches need a causal LM")
        return len(blocks), int(blocks[0].attn.kv_heads)
    try:
        shape = model.gate_shape
    except AttributeError:
        raise ValueError(f"{type(model).__name__} takes no attention gates: head allocations and probes apply to "
                         "causal language models with per-KV-head attention (TransformerLM, MoETransformerLM, "
                         "hf_causal_lm)") from None
    return tuple(int(x) for x in shape)


def select_full_heads(gates: Tensor, sparsity: float, seed: int = 0) -> Tensor:
    """Bool mask like `gates`: the top round((1 - s) · n) gates keep the full cache (DuoAttention's quantile rule,
    with exact counts); ties are broken by noise of 1e-6 drawn from `seed`, so equal gates split at random."""
    flat = gates.detach().float().flatten().cpu()
    keep = full_head_count(flat.numel(), sparsity)
    g = torch.Generator().manual_seed(seed)
    noise = torch.rand(flat.shape, generator=g, device=g.device) * 1e-6
    mask = torch.zeros(flat.shape, dtype=torch.bool)
    mask[torch.argsort(flat + noise, descending=True)[:keep]] = True
    return mask.view(gates.shape)


def _read_matrix(path: Path) -> list[list[float]]:
    """A tab- (or space-) separated matrix of floats, one row per line (blank lines and `#` comments skipped)."""
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            rows.append([float(x) for x in line.split()])
        except ValueError:
            raise ValueError(f"{path}, line {n}: {line[:60]!r} is not a row of numbers (a layers × KV heads matrix "
                             "of gates, tab-separated)") from None
    if not rows or len({len(r) for r in rows}) != 1:
        raise ValueError(f"{path}: rows of {sorted({len(r) for r in rows})} values; a layers × KV heads matrix has "
                         "one row per layer, all of the same length")
    return rows


@dataclass
class HeadAllocation:
    """Gate scores (depth × kv_heads, higher = needs the full cache), the window and a default sparsity."""

    gates: list[list[float]]
    sink: int
    recent: int
    sparsity: float = 0.5
    method: str = ""
    model: dict[str, Any] = field(default_factory=dict)  # the model it was probed on: registry name + config
    metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rows = [len(r) for r in self.gates]
        if not rows or min(rows) < 1 or len(set(rows)) != 1:
            raise ValueError(f"gates must be a non-empty depth × kv_heads table, got row lengths {rows}")
        if self.sink < 0 or self.recent < 1:
            raise ValueError(f"window sink={self.sink}, recent={self.recent}: need sink >= 0 and recent >= 1")
        full_head_count(1, self.sparsity)  # validates the range

    @classmethod
    def from_gates(cls, gates: Tensor, sink: int, recent: int, **kw: Any) -> HeadAllocation:
        return cls([[float(x) for x in row] for row in gates.detach().float().cpu()], int(sink), int(recent), **kw)

    @property
    def window(self) -> tuple[int, int]:
        return self.sink, self.recent

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.gates), len(self.gates[0])

    def tensor(self) -> Tensor:
        return torch.tensor(self.gates, dtype=torch.float32)

    def full_heads(self, sparsity: float | None = None, seed: int = 0) -> Tensor:
        """(depth, kv_heads) bool: True where the head keeps its full cache at `sparsity` (default: `self.sparsity`)."""
        return select_full_heads(self.tensor(), self.sparsity if sparsity is None else sparsity, seed)

    def check_model(self, model: Any) -> None:
        """ValueError unless `model` (a causal TransformerLM or hf_causal_lm) has layers × kv_heads equal to this
        allocation's shape."""
        shape = gate_shape(model)
        if shape != self.shape:
            raise ValueError(f"this allocation is for layers × kv_heads = {self.shape}, the model has {shape}")

    # -- files ----------------------------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps({"format_version": FORMAT_VERSION, **asdict(self)}, indent=2) + "\n"

    def to_tsv(self) -> str:
        """One line per (layer, kv_head): `layer  head  gate`, with a header (readable; the matrix DuoAttention and
        RLKV read is `to_pattern`)."""
        lines = ["layer\thead\tgate"]
        lines += [f"{i}\t{j}\t{g:.6f}" for i, row in enumerate(self.gates) for j, g in enumerate(row)]
        return "\n".join(lines) + "\n"

    def to_pattern(self) -> str:
        """The gates as DuoAttention's and RLKV's matrix: one layer per line, its KV heads' gates tab-separated
        (numpy's `savetxt(..., delimiter="\\t")` format, 18 significant digits)."""
        return "".join("\t".join(f"{g:.18e}" for g in row) + "\n" for row in self.gates)

    def save(self, folder: str | Path) -> Path:
        """Write `head_allocation.json` and `gates.tsv` into `folder`, and DuoAttention's / RLKV's layout into
        `folder/attn_pattern/` (`full_attention_heads.tsv`, `adapter_weights.tsv`, `config.json`); returns the JSON
        path."""
        folder = Path(folder)
        (folder / PATTERN_DIR).mkdir(parents=True, exist_ok=True)
        (folder / TSV_NAME).write_text(self.to_tsv())
        for name in (DUO_TSV, RLKV_TSV):
            (folder / PATTERN_DIR / name).write_text(self.to_pattern())
        config = {"sink_size": self.sink, "recent_size": self.recent, "sparsity": self.sparsity,
                  "method": self.method or "gates", "written_by": "framework"}
        (folder / PATTERN_DIR / PATTERN_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        path = folder / FILE_NAME
        path.write_text(self.to_json())
        return path

    @classmethod
    def from_pattern(cls, folder: str | Path, sink: int | None = None, recent: int | None = None,
                     sparsity: float = 0.5) -> HeadAllocation:
        """Read a DuoAttention or RLKV pattern folder: `adapter_weights.tsv` (RLKV) or `full_attention_heads.tsv`
        (DuoAttention), a layers × KV heads tab-separated matrix whose values are clipped to [0, 1] as both
        projects do; the window from its `config.json` (`sink_size`, `recent_size`) unless `sink` / `recent` are
        given (RLKV's runs pass them on the command line). ValueError naming the file on a malformed one."""
        folder = Path(folder)
        name = next((n for n in (RLKV_TSV, DUO_TSV) if (folder / n).is_file()), None)
        if name is None:
            raise FileNotFoundError(f"no {RLKV_TSV} or {DUO_TSV} in {folder}: pass a DuoAttention or RLKV pattern "
                                    "folder")
        gates = _read_matrix(folder / name)
        config_path = folder / PATTERN_CONFIG
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        sink = config.get("sink_size") if sink is None else sink
        recent = config.get("recent_size") if recent is None else recent
        if sink is None or recent is None:
            raise ValueError(f"{folder} has no {PATTERN_CONFIG} with sink_size and recent_size: pass the window "
                             "(sink, recent) it was trained with")
        method = "rlkv" if name == RLKV_TSV else "duo_attention"
        return cls([[min(1.0, max(0.0, g)) for g in row] for row in gates], int(sink), int(recent),
                   sparsity=float(sparsity), method=str(config.get("method", method)))

    @classmethod
    def from_json(cls, text: str, where: str = "head_allocation.json") -> HeadAllocation:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where} is not valid JSON: {err}") from err
        if not isinstance(data, dict):
            raise ValueError(f"{where} must hold a JSON object, got {type(data).__name__}")
        version = data.pop("format_version", None)
        if version != FORMAT_VERSION:
            raise ValueError(f"{where} has format_version={version!r}; this framework reads {FORMAT_VERSION}")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where} has unknown keys {unknown}; valid: {sorted(known)}")
        return cls(**data)

    @classmethod
    def load(cls, path: str | Path) -> HeadAllocation:
        """From a `head_allocation.json` file or a folder (a run dir) holding one, or a DuoAttention / RLKV pattern
        folder (`from_pattern`)."""
        path = Path(path)
        if path.is_dir() and not (path / FILE_NAME).is_file() and any(
                (path / n).is_file() for n in (DUO_TSV, RLKV_TSV)):
            return cls.from_pattern(path)
        if path.is_dir():
            path = path / FILE_NAME
        if not path.is_file():
            raise FileNotFoundError(f"no {FILE_NAME} at {path}: pass a probe run dir or the JSON file")
        return cls.from_json(path.read_text(), str(path))

    # -- the Hub --------------------------------------------------------------------------------------------
    def push_to_hub(self, repo_id: str, revision: str | None = None, private: bool = False,
                    commit_message: str | None = None) -> str:
        """Add `head_allocation.json`, `gates.tsv`, the `attn_pattern/` folder (and a model card if the repo has
        none) in ONE commit.

        Other files are left alone, so the allocation can sit next to the model it was probed on. Returns the
        commit id.
        """
        from huggingface_hub import CommitOperationAdd, HfApi

        from framework.hub import check_repo_id

        check_repo_id(repo_id)
        api = HfApi(library_name="framework")
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision and revision != "main":
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="framework-alloc-") as tmp:
            self.save(tmp)
            names = [FILE_NAME, TSV_NAME, *(f"{PATTERN_DIR}/{n}" for n in (DUO_TSV, RLKV_TSV, PATTERN_CONFIG))]
            if "README.md" not in api.list_repo_files(repo_id, revision=revision):
                (Path(tmp) / "README.md").write_text(self.card(repo_id))
                names.append("README.md")
            ops = [CommitOperationAdd(path_in_repo=n, path_or_fileobj=str(Path(tmp) / n)) for n in names]
            info = api.create_commit(repo_id, ops, revision=revision,
                                     commit_message=commit_message or f"head allocation ({self.method or 'gates'})")
        return info.oid

    @classmethod
    def from_pretrained(cls, repo_id_or_path: str, revision: str | None = None) -> HeadAllocation:
        """From a local run dir / JSON file, or a Hub repo holding `head_allocation.json` (JSON only, no pickle)."""
        if Path(repo_id_or_path).exists():
            return cls.load(repo_id_or_path)
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(repo_id_or_path, FILE_NAME, revision=revision, library_name="framework")
        return cls.from_json(Path(path).read_text(), f"{repo_id_or_path}/{FILE_NAME}")

    def card(self, repo_id: str) -> str:
        depth, heads = self.shape
        rows = "\n".join(f"| {k} | {v:.4g} |" for k, v in sorted(self.metrics.items())) or "| (none) | |"
        return (
            f"---\nlibrary_name: framework\ntags: [framework, kv-cache, head-allocation, {self.method or 'gates'}]\n"
            f"---\n\n# {repo_id}\n\nA per-KV-head cache allocation ({depth} layers × {heads} KV heads) found by "
            f"`{self.method or 'a probe'}`: heads with the top gates keep the full KV cache, the others keep "
            f"{self.sink} sink + {self.recent} recent tokens.\n\n```python\nfrom framework.probes.allocation import "
            f"HeadAllocation\nfrom framework.serving.decoding import decode\n\nalloc = HeadAllocation.from_pretrained("
            f"{repo_id!r})\ntokens = decode(model, prompt, n, full_heads=alloc.full_heads({self.sparsity}), "
            f"window=alloc.window)\n```\n\n| metric | value |\n|---|---|\n{rows}\n"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """`push RUN_DIR_OR_JSON REPO_ID [--revision R] [--private]` or `show REPO_ID_OR_PATH [--revision R]`."""
    parser = argparse.ArgumentParser(prog="python -m framework.probes.allocation",
                                     description="Push or show a head allocation (head_allocation.json).")
    sub = parser.add_subparsers(dest="command", required=True)
    push = sub.add_parser("push", help="push a run dir's head_allocation.json to a Hub repo")
    push.add_argument("source")
    push.add_argument("repo_id")
    push.add_argument("--revision")
    push.add_argument("--private", action="store_true")
    show = sub.add_parser("show", help="print an allocation from a path or a Hub repo")
    show.add_argument("source")
    show.add_argument("--revision")
    args = parser.parse_args(argv)
    return run_cli(lambda: _push(args) if args.command == "push" else _show(args))


def _push(args: argparse.Namespace) -> None:
    commit = HeadAllocation.load(args.source).push_to_hub(args.repo_id, args.revision, args.private)
    print(f"pushed {FILE_NAME} to {args.repo_id} at commit {commit}")


def _show(args: argparse.Namespace) -> None:
    alloc = HeadAllocation.from_pretrained(args.source, args.revision)
    print(f"{alloc.method or 'allocation'}: sink={alloc.sink} recent={alloc.recent} sparsity={alloc.sparsity}")
    print(alloc.to_tsv(), end="")


if __name__ == "__main__":
    raise SystemExit(main())

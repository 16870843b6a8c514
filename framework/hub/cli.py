"""`python -m framework.hub push RUN_DIR REPO_ID` / `python -m framework.hub pull REPO_ID [--revision R]`."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

from framework.errors import run_cli
from framework.hub.common import CARD_NAME
from framework.hub.formats import TRANSFORMERS, model_spec
from framework.hub.load import download, load_model
from framework.hub.push import push_to_hub, record_push


# ---- CLI ----------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """`python -m framework.hub push RUN_DIR REPO_ID` / `pull REPO_ID`; exit codes from `framework.errors` (1 when the
    Hub fails, 2 on bad input)."""
    parser = argparse.ArgumentParser(prog="python -m framework.hub", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    push = sub.add_parser("push", help="publish a finished run dir as one commit")
    push.add_argument("run_dir", type=Path, help="Hydra run dir of `python -m framework.train`")
    push.add_argument("repo_id", help="'namespace/name'")
    push.add_argument("--revision", help="branch to commit to (created if missing; default main)")
    push.add_argument("--private", action="store_true", help="create the repo as private")
    pull = sub.add_parser("pull", help="download a pushed model, check it loads, print where it is")
    pull.add_argument("repo_id")
    pull.add_argument("--revision", help="branch, tag or commit id (default main)")
    args = parser.parse_args(argv)
    return run_cli(lambda: _push(args) if args.command == "push" else _pull(args))


def _push(args: argparse.Namespace) -> None:
    pushed = push_to_hub(args.run_dir, args.repo_id, args.revision, args.private)
    record_push(args.run_dir, pushed)
    print(f"pushed {args.run_dir} to {pushed.repo_id}@{pushed.revision}: commit {pushed.commit}")
    print(pushed.url)


def _pull(args: argparse.Namespace) -> None:
    from huggingface_hub.errors import EntryNotFoundError

    model, config, commit, weights = load_model(args.repo_id, args.revision)
    with contextlib.suppress(EntryNotFoundError):  # the card is for people; the model does not need it
        download(args.repo_id, CARD_NAME, commit or args.revision)
    print(f"downloaded {args.repo_id}@{commit or args.revision or 'main'} to {Path(weights).parent}")
    print(summary(model, config))


#: what a transformers config.json says of a model's shape, in the pull summary (the keys it has)
SHAPE_KEYS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "num_local_experts", "num_experts")


def summary(model: Any, config: dict[str, Any]) -> str:
    """One line: the model's name, class and parameter count, and the values it was built with (a transformers
    model: the shape its config.json gives; a timm model built with none: timm's defaults)."""
    spec = model_spec(config)
    values = dict(spec.values)
    if spec.format == TRANSFORMERS:
        values = {key: config[key] for key in SHAPE_KEYS if config.get(key) is not None}
    head = f"{spec.name} ({type(model).__name__}, {sum(p.numel() for p in model.parameters()):,} parameters)"
    if not values:
        return f"{head}, built with the defaults of {spec.name}"
    return f"{head}: " + ", ".join(f"{k}={v}" for k, v in values.items())

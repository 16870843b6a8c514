"""`python -m framework.grow SOURCE --depth 2 --width 2 --out DIR`: grow a trained checkpoint offline.

SOURCE is a `framework.train` run dir, a Lightning `.ckpt` inside one, an earlier `--out` dir, a Hub repo id, or a
folder in transformers' layout (`save_pretrained`'s). DIR receives `model.safetensors` + `config.json` (the Hub
layout, with the grown constructor values) and `model_config.json` + `checkpoints/last.ckpt` (the run-dir
layout), so it can be pushed with `python -m framework.hub push DIR REPO`, loaded back with `from_pretrained(REPO)`,
used as `init_from=DIR`, or grown again. `growth.json` records what was done (parameter counts, norm profiles
before and after). A transformers MoE (Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3, gpt-oss, GraniteMoE, ...:
docs/growth.md's table) grows in its own layout and DIR is transformers' (`save_pretrained`:
`AutoModelForCausalLM.from_pretrained(DIR)` opens it, its tokenizer beside it), with `framework.json` and the run-dir
layout added; a family whose function growth cannot keep is one `error:` line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from framework.errors import InputError, run_cli
from framework.grow.hf import transformers_model
from framework.grow.ops import DEPTH_METHODS, count_params, grow, layer_list, norm_profile
from framework.rundir import GROWTH_KEY, LAST_CHECKPOINT, SPEC_NAME, Build, RunDir, resolve_source


def load_growable(source: str, revision: str | None = None, build: Build | None = None
                  ) -> tuple[nn.Module, dict[str, Any]]:
    """The model in `source` (run dir, .ckpt, grown dir or Hub repo id) and its spec {"name", "config"}.

    A checkpoint saved by OrthogonalGrowth knows its own (pre- or post-growth) architecture; `build(name, config)`
    builds the named model (default: the registered one)."""
    from framework.hub import load_model, registered_model, validate_config

    resolved = resolve_source(source)
    folder = Path(resolved.value)
    if resolved.is_local and folder.is_dir() and not (folder / SPEC_NAME).is_file() and _is_transformers(folder):
        from framework.models.hf import HFCausalLM

        model = HFCausalLM(name_or_path=str(folder))
        return model, {"name": "hf_causal_lm", "config": dict(model.init_config)}
    if resolved.is_local:
        run = RunDir(resolved.value)
        if not run.checkpoint.is_file():
            raise FileNotFoundError(f"{source!r} has no checkpoint ({run.checkpoint} does not exist)")
        spec = validate_config(run.model_config())
        return run.load(build or registered_model), spec
    loaded = load_model(resolved.value, revision, build=build)
    if transformers_model(loaded.model) is not None:  # transformers' layout: its config has no framework name
        from framework.hub.formats import model_spec

        return loaded.model, {"name": model_spec(loaded.config).name, "config": dict(loaded.model.init_config)}
    return loaded.model, {"name": loaded.config["name"], "config": dict(loaded.config["config"])}


def _is_transformers(folder: Path) -> bool:
    """Whether `folder` holds a config.json in transformers' layout (the Hub loader's own test of the format)."""
    from framework.hub.formats import TRANSFORMERS, config_format

    try:
        return config_format(json.loads((folder / "config.json").read_text(encoding="utf-8"))) == TRANSFORMERS
    except (OSError, ValueError):
        return False


def save_grown(model: nn.Module, spec: dict[str, Any], out: Path, record: dict[str, Any]) -> Path:
    """Write `model` to `out` in both the Hub layout and the run-dir layout (see the module docstring)."""
    from safetensors.torch import save_model

    from framework import __version__
    from framework.hub import validate_config
    from framework.hub.formats import FRAMEWORK_CONFIG_NAME

    config = validate_config({"name": spec["name"], "config": dict(model.init_config),
                              "framework_version": __version__})
    out.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "save_pretrained"):  # a transformers model: its own layout, and ours beside it
        model.save_pretrained(out)
        (out / FRAMEWORK_CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    else:
        save_model(model, str(out / "model.safetensors"), metadata={"format": "pt"})
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / SPEC_NAME).write_text(json.dumps({"name": spec["name"], "config": config["config"]}, indent=2) + "\n")
    (out / LAST_CHECKPOINT).parent.mkdir(exist_ok=True)
    state = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, GROWTH_KEY: {"config": config["config"]}}, out / LAST_CHECKPOINT)
    (out / "growth.json").write_text(json.dumps(record, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    """Grow SOURCE and write DIR; exit codes from `framework.errors` (2 on bad input, 1 when the Hub fails)."""
    parser = argparse.ArgumentParser(prog="python -m framework.grow", description=__doc__.split("\n")[0])
    parser.add_argument("source", help="run dir, .ckpt, grown dir or Hub repo id")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--depth", type=int, default=1, help="depth factor k (layers ×k; default 1)")
    parser.add_argument("--width", type=int, default=1, help="expert factor m (experts and top-k ×m; default 1)")
    parser.add_argument("--method", default="interposition", choices=DEPTH_METHODS)
    parser.add_argument("--ignore-first", type=int, default=0, help="first source layers not duplicated")
    parser.add_argument("--ignore-last", type=int, default=0, help="last source layers not duplicated")
    parser.add_argument("--zero-init", action="store_true", help="zero the copies' output projections")
    parser.add_argument("--alpha", type=float, default=0.01, help="expert-copy noise std / tensor std")
    parser.add_argument("--seed", type=int, default=0, help="noise seed")
    parser.add_argument("--revision", help="Hub revision of SOURCE")
    args = parser.parse_args(argv)
    return run_cli(lambda: _grow(args))


def _grow(args: argparse.Namespace) -> None:
    """Load, grow, save and report what `main` parsed."""
    if args.out.exists() and any(args.out.iterdir()):
        raise InputError(f"--out {args.out} is not empty: give a new folder (nothing there is overwritten)")
    model, spec = load_growable(args.source, args.revision)
    before, profile_before = count_params(model), _profile(model)
    grow(model, depth_factor=args.depth, depth_method=args.method, ignore_first=args.ignore_first,
         ignore_last=args.ignore_last, zero_init_copies=args.zero_init, width_factor=args.width,
         noise_alpha=args.alpha, seed=args.seed)
    after = count_params(model)
    record = {"source": args.source, "depth_factor": args.depth, "depth_method": args.method,
              "ignore_first": args.ignore_first, "ignore_last": args.ignore_last, "zero_init_copies": args.zero_init,
              "width_factor": args.width, "noise_alpha": args.alpha, "seed": args.seed, "params_before": before,
              "params_after": after, "norm_profile_before": profile_before, "norm_profile_after": _profile(model)}
    save_grown(model, spec, args.out, record)
    print(f"grew {spec['name']} from {args.source}: {before['total']:,} → {after['total']:,} parameters"
          f" ({before['active']:,} → {after['active']:,} active); written to {args.out}")


def _profile(model: nn.Module) -> list[float] | None:
    try:
        return norm_profile(layer_list(model))
    except ValueError:
        return None

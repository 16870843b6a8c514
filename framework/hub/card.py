"""The model card (`README.md`) of a push: metadata, how to load the model (framework, timm, or plain
huggingface_hub + safetensors, by the config's format), the final metrics, the training data, the training curves,
the command."""

from __future__ import annotations

import json
import math
from typing import Any

from framework.hub.adapters import ADAPTER, adapter_base, adapter_usage
from framework.hub.common import CONFIG_NAME, PLOT_NAME, WEIGHTS_NAME
from framework.hub.formats import PLAIN, TIMM


def model_card(bundle: Any, repo_id: str, revision: str | None, has_plot: bool) -> str:
    """The README.md of a push of `bundle` (a push `_Bundle`: model, config, format, metrics, ...) to `repo_id`."""
    from huggingface_hub import EvalResult, ModelCardData

    cfg, fmt = bundle.config, bundle.format
    name = cfg.get("architecture") or cfg["name"]
    finite = {k: v for k, v in sorted(bundle.metrics.items()) if math.isfinite(v)}
    record = getattr(bundle, "data", None) or {}
    hub_dataset = [record["dataset"]] if record.get("sha") else []  # a Hub dataset: the card links it by id
    dataset = (hub_dataset or bundle.datasets or ["unknown"])[0]
    evals = [EvalResult(task_type=bundle.task or "other", dataset_type=dataset, dataset_name=dataset,
                        metric_type=k, metric_name=k, metric_value=v) for k, v in finite.items()]
    extra = ("timm", "image-classification") if fmt == TIMM else ()
    tags = [t for t in ("framework", "pytorch-lightning", "safetensors", *extra, name, cfg.get("recipe")) if t]
    base = {"base_model": adapter_base(bundle.model)[0]} if fmt == ADAPTER else {}
    data = ModelCardData(library_name={TIMM: "timm", ADAPTER: "peft"}.get(fmt, "framework"), tags=tags, **base,
                         datasets=hub_dataset or bundle.datasets or None, metrics=list(finite) or None,
                         model_name=repo_id, eval_results=evals or None)
    params = sum(p.numel() for p in bundle.model.parameters())
    rows = "\n".join(f"| {k} | {v:.6g} |" for k, v in sorted(bundle.metrics.items())) or "| (none logged) | |"
    step = f" after step {bundle.global_step}" if bundle.global_step is not None else ""
    recipe = f" with recipe `{cfg['recipe']}`" if cfg.get("recipe") else ""
    card = [
        f"---\n{data.to_yaml()}\n---\n\n# {repo_id}\n\nA `{name}` model ({params:,} parameters) trained by framework"
        f" {cfg['framework_version']}{recipe}.\n\n## Usage\n\n{usage(fmt, name, repo_id, revision, bundle.model)}\n"
        f"## Metrics\n\nFinal values{step}.\n\n| metric | value |\n|---|---|\n{rows}\n",
    ]
    if record:
        card.append(data_section(record))
    if has_plot:
        card.append(f"\n## Training curves\n\n![training curves]({PLOT_NAME})\n")
    if cfg.get("command"):
        card.append(f"\n## Training command\n\n```bash\n{cfg['command']}\n```\n")
    shown = cfg.get("model_args", {}) if fmt == TIMM else cfg["config"]
    card.append(f"\n## Model config\n\n```json\n{json.dumps(shown, indent=2)}\n```\n")
    return "".join(card)


#: the record's keys the card's data table shows first, with their row names (the rest follow as they are)
DATA_ROWS = {"format": "format", "column": "column", "tokenizer": "tokenizer", "seq_len": "sequence length",
             "packing": "packing", "documents": "documents", "tokens": "tokens", "rows": "rows",
             "packing_efficiency": "packing efficiency", "validation": "validation",
             "val_documents": "validation documents", "val_tokens": "validation tokens"}


def data_section(record: dict[str, Any]) -> str:
    """The card's "Training data" section: the dataset (Hub id, revision and commit, or file names and the
    fingerprint), then its format, token count, packing efficiency and the rest of the data's record."""
    if record.get("sha"):
        where = f"`{record['dataset']}` at revision `{record.get('revision') or 'main'}` (commit `{record['sha']}`)"
    else:
        files = ", ".join(f"`{f}`" for f in record.get("files") or [])
        where = f"`{record.get('dataset')}`" + (f": {files}" if files else "")
        where += f" ({record['bytes']:,} bytes)" if isinstance(record.get("bytes"), int) else ""
    rows = [f"| dataset | {where} |"]
    if record.get("fingerprint"):
        rows.append(f"| fingerprint | `{record['fingerprint']}` |")
    shown = {"dataset", "revision", "sha", "files", "bytes", "fingerprint"}
    for key in [*DATA_ROWS, *sorted(k for k in record if k not in DATA_ROWS)]:
        value = record.get(key)
        if key in shown or value is None:
            continue
        if isinstance(value, (dict, list)):
            value = f"`{json.dumps(value)}`"
        elif isinstance(value, int) and not isinstance(value, bool):
            value = f"{value:,}"
        rows.append(f"| {DATA_ROWS.get(key, key)} | {value} |")
    return "\n## Training data\n\n| | |\n|---|---|\n" + "\n".join(rows) + "\n"


def usage(fmt: str, name: str, repo_id: str, revision: str | None, model: Any = None) -> str:
    """The card's "Usage" section: the first ```python block is the snippet that loads the model."""
    rev = f", revision={revision!r}" if revision and revision != "main" else ""
    if fmt == ADAPTER:
        return adapter_usage(*adapter_base(model), repo_id, revision)
    if fmt == TIMM:
        hub_id = f"hf-hub:{repo_id}" + (f"@{revision}" if rev else "")
        return (f"```python\nimport timm\n\nmodel = timm.create_model({hub_id!r}, pretrained=True).eval()\n```\n\n"
                f"or `framework.hub.from_pretrained({repo_id!r}{rev})`, or `python -m framework.hub pull {repo_id}`.\n")
    if fmt == PLAIN:
        return (
            f"`config.json` holds the constructor arguments of `{name}` (its saved hyperparameters); with your class"
            f" `{name}` in scope:\n\n```python\nimport json\n\nfrom huggingface_hub import hf_hub_download\n"
            f"from safetensors.torch import load_model\n\n"
            f"config = json.load(open(hf_hub_download({repo_id!r}, {CONFIG_NAME!r}{rev})))\n"
            f"model = {name}(**config[\"config\"])\n"
            f"load_model(model, hf_hub_download({repo_id!r}, {WEIGHTS_NAME!r}{rev}))\n"
            f"model.eval()\n```\n\nor `framework.hub.from_pretrained({repo_id!r}{rev}, model_cls={name})`.\n")
    return (f"```python\nfrom framework.hub import from_pretrained\n\nmodel = from_pretrained({repo_id!r}{rev})"
            f"  # eval mode: rebuilt by registry name, safetensors weights\n```\n\n"
            f"or `python -m framework.hub pull {repo_id}`.\n")


__all__ = ["data_section", "model_card", "usage"]

"""Loading what a Hugging Face model needs, by Hub id, folder or config: transformers (imported here, lazily), the
config (with errors that name the bad id, folder or model type), a fresh config for a new model, the tokenizer."""

from __future__ import annotations

import difflib
import functools
import json
from pathlib import Path
from typing import Any

#: files a folder or repo of a transformers tokenizer holds (any one of them)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "tokenizer.model", "vocab.json")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as err:  # pragma: no cover - the dev extra installs it
        raise ImportError("Hugging Face models need `transformers`: pip install 'framework[hf]'") from err
    transformers.utils.logging.set_verbosity_error()  # tiny test configs trip vocabulary-range warnings
    transformers.utils.logging.disable_progress_bar()  # per-file bars on every load and save
    return transformers


def _plain(value: Any) -> Any:
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def load_hf_config(name_or_path: str, revision: str | None = None) -> Any:
    """The transformers config of a Hub id or a local folder; ValueError naming what is wrong (an unknown id, a
    folder without config.json, a model type transformers does not know, a config asking for remote code)."""
    transformers = _transformers()
    where = f"model.name_or_path={name_or_path}"
    path = Path(name_or_path).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ValueError(f"{where}: the folder has no config.json; a transformers model folder holds the "
                             "config.json and model.safetensors that save_pretrained writes")
    elif name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1:
        raise ValueError(f"{where}: no such folder, and not a Hub id ('namespace/name')")
    try:
        config = transformers.AutoConfig.from_pretrained(name_or_path, revision=revision, trust_remote_code=False)
    except ValueError as err:
        raise ValueError(f"{where}: {_first_line(err)} (transformers {transformers.__version__} knows: "
                         f"{_known_types_hint(name_or_path, revision)})") from None
    except (OSError, KeyError) as err:
        from huggingface_hub import constants

        raise ValueError(f"{where}: not a local folder, and the Hub at {constants.ENDPOINT} has no model repo "
                         f"{name_or_path!r} ({type(err).__name__}: {_first_line(err)})") from None
    if getattr(config, "auto_map", None):
        raise ValueError(f"{where}: the config asks for remote code (auto_map); the framework never runs remote "
                         "code: register an Adapter for the family (docs/hf_models.md)")
    return config


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _known_types_hint(name_or_path: str, revision: str | None) -> str:
    """The model types closest to the one a config names (for an unknown architecture)."""
    transformers = _transformers()
    known = sorted(transformers.CONFIG_MAPPING.keys())
    try:
        path = Path(name_or_path)
        if path.is_dir():
            text = (path / "config.json").read_text()
        else:
            from huggingface_hub import hf_hub_download

            text = Path(hf_hub_download(name_or_path, "config.json", revision=revision)).read_text()
        asked = str(json.loads(text).get("model_type"))
    except (OSError, ValueError, AttributeError):  # unreadable: no hint (the Hub's errors are OSErrors)
        asked = ""
    close = difflib.get_close_matches(asked, known, n=3, cutoff=0.6)
    return (f"did you mean {' or '.join(map(repr, close))}? " if close else "") + f"{len(known)} model types"


def fresh_hf_config(config: dict[str, Any], vocab_size: int | None) -> Any:
    """A transformers config from `{"model_type": ..., **values}`; the data's `vocab_size` unless the config sets
    one. ValueError for a missing or unknown model_type (with close matches)."""
    transformers = _transformers()
    values = _plain(config)
    model_type = values.pop("model_type", None)
    known = sorted(transformers.CONFIG_MAPPING.keys())
    if model_type not in transformers.CONFIG_MAPPING:
        close = difflib.get_close_matches(str(model_type), known, n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
        raise ValueError(f"model.config.model_type={model_type!r} is not a model type transformers "
                         f"{transformers.__version__} knows: {hint}e.g. llama, qwen2, qwen3, mistral, mixtral, olmoe, "
                         f"bert ({len(known)} in all)")
    if vocab_size is not None:
        values.setdefault("vocab_size", int(vocab_size))
    return transformers.AutoConfig.for_model(model_type, **values)


@functools.lru_cache(maxsize=8)
def load_tokenizer(name_or_path: str, revision: str | None = None) -> Any | None:
    """The tokenizer saved with a model (a Hub id or a folder), or None where there is none. The model's config is
    read first, so an unknown id or a bad folder is reported as `load_hf_config` reports it."""
    transformers = _transformers()
    load_hf_config(name_or_path, revision)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not any((path / f).is_file() for f in TOKENIZER_FILES):
            return None
    else:
        from huggingface_hub import HfApi

        try:
            files = set(HfApi().list_repo_files(name_or_path, revision=revision))
        except Exception as err:  # noqa: BLE001 - whatever the Hub says, in the user's words
            raise ValueError(f"model.name_or_path={name_or_path}: cannot list the repo's files to find its tokenizer"
                             f" ({type(err).__name__}: {_first_line(err)})") from None
        if not files.intersection(TOKENIZER_FILES):
            return None
    return transformers.AutoTokenizer.from_pretrained(name_or_path, revision=revision, trust_remote_code=False)

"""Loading what a Hugging Face model needs, by Hub id, folder or config: transformers (imported here, lazily), the
config (with errors that name the bad id, folder or model type), the weights (checked: what the checkpoint lacks,
holds beyond the model or holds in another shape is named), a fresh config for a new model, the tokenizer."""

from __future__ import annotations

import difflib
import json
import logging
import warnings
from pathlib import Path
from typing import Any

from framework.errors import InputError

log = logging.getLogger(__name__)

#: files a folder or repo of a transformers tokenizer holds (any one of them)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "tokenizer.model", "vocab.json")
#: the weights `save_pretrained` writes: one file, or shards listed in the index
WEIGHTS, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"
#: the special-token ids a config may hold (an int, or a list of ints for eos)
TOKEN_ID_KEYS = tuple(f"{name}_token_id" for name in ("pad", "bos", "eos", "sep", "cls", "mask", "unk"))
#: the data's ids (`special_ids`, by the data's attribute name) a fresh config on the data's vocabulary takes
DATA_TOKEN_IDS = {"pad_id": "pad_token_id", "bos_id": "bos_token_id", "eos_id": "eos_token_id",
                  "mask_id": "mask_token_id"}
SHOWN = 3  # tensor names an error shows per kind, then a count


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


def load_pretrained(auto: Any, name_or_path: str, revision: str | None = None, strict: bool = True,
                    **kwargs: Any) -> Any:
    """`auto.from_pretrained` of a Hub id or folder (safetensors only, no remote code), saying what it loaded: weights
    the checkpoint lacks (left at random init), holds beyond the model or holds in another shape are an InputError (a
    ValueError) naming a few and the count, or with `strict=False` a warning; a damaged weights file is an InputError
    naming it. Tied weights and non-persistent buffers are not missing (transformers' own loading report)."""
    from safetensors import SafetensorError

    where = f"model.name_or_path={name_or_path}"
    check_weight_files(name_or_path)
    try:
        model, info = auto.from_pretrained(name_or_path, revision=revision, use_safetensors=True,
                                           trust_remote_code=False, output_loading_info=True,
                                           ignore_mismatched_sizes=True, **kwargs)  # mismatches: reported below
    except SafetensorError as err:
        for file in _cached_weight_files(name_or_path, revision):
            _check_header(file, where)
        raise InputError(f"{where}: a weights file of the checkpoint is damaged ({_first_line(err)}); fetch it "
                         "again") from None
    problems = weight_problems(info)
    if not problems:
        log.info("%s: all %d weights loaded from its checkpoint", where, len(model.state_dict()))
        return model
    message = f"{where}: the checkpoint does not fit the model: {'; '.join(problems)}"
    if strict:
        raise InputError(f"{message}. Is it another architecture or config? model.strict=false loads it anyway "
                         "(what is missing or of another shape then trains from random init)")
    warnings.warn(f"{message} (model.strict=false: loaded anyway)", UserWarning, stacklevel=2)
    return model


def weight_problems(info: dict[str, Any]) -> list[str]:
    """transformers' loading info (`output_loading_info=True`) in words: one part per kind of problem, [] if none."""
    missing, unexpected = sorted(info.get("missing_keys", ())), sorted(info.get("unexpected_keys", ()))
    mismatched = [f"{key} (checkpoint {tuple(theirs)}, model {tuple(ours)})"
                  for key, theirs, ours in sorted(info.get("mismatched_keys", ()))]
    parts = [(missing, "missing (left at random init)"), (unexpected, "unexpected (in the checkpoint, not the model)"),
             (mismatched, "of another shape (left at random init)")]
    return [f"{len(names)} {what}: {_few(names)}" for names, what in parts if names]


def _few(names: list[str]) -> str:
    more = f", and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def check_weight_files(name_or_path: str) -> None:
    """A local folder's safetensors weights are there and whole: each file's header reads and covers its data (a
    truncated or damaged file, a shard the index names but the folder lacks, or no safetensors at all: an InputError
    naming the file). Reads headers only, so the CLI's preflight runs it; a Hub id is checked as it downloads."""
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        return
    where = f"model.name_or_path={name_or_path}"
    index = path / WEIGHTS_INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, AttributeError) as err:
            raise InputError(f"{where}: {index} is damaged ({type(err).__name__}: {_first_line(err)})") from None
        files = [path / shard for shard in shards]
    elif (path / WEIGHTS).is_file():
        files = [path / WEIGHTS]
    else:
        raise InputError(f"{where}: the folder has no {WEIGHTS} (nor {WEIGHTS_INDEX}); the framework reads "
                         "safetensors only (a pytorch_model.bin is never unpickled): save_pretrained writes it")
    for file in files:
        if not file.is_file():
            raise InputError(f"{where}: {file} is missing ({index} lists it)")
        _check_header(file, where)


def _check_header(file: Path, where: str) -> None:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="pt"):
            pass
    except SafetensorError as err:
        raise InputError(f"{where}: {file} is damaged, not a whole safetensors file ({_first_line(err)}): a "
                         "download or copy cut short? write or fetch it again") from None


def _cached_weight_files(name_or_path: str, revision: str | None) -> list[Path]:
    """The weights files of a Hub repo that are in the local cache (what a failed load read)."""
    from huggingface_hub import try_to_load_from_cache

    if Path(name_or_path).expanduser().is_dir():
        return []
    index = try_to_load_from_cache(name_or_path, WEIGHTS_INDEX, revision=revision)
    names = [WEIGHTS]
    if isinstance(index, str):
        try:
            names = sorted(set(json.loads(Path(index).read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError):
            return [Path(index)]
    found = [try_to_load_from_cache(name_or_path, name, revision=revision) for name in names]
    return [Path(file) for file in found if isinstance(file, str)]


def fresh_hf_config(config: dict[str, Any], vocab_size: int | None, special_ids: dict[str, int] | None = None) -> Any:
    """A transformers config from `{"model_type": ..., **values}`; the data's `vocab_size` unless the config sets
    one. ValueError for a missing or unknown model_type (with close matches).

    What the family's defaults assume of a full-size model is fitted to this one, each change stated in a log line:
    on the data's vocabulary (`vocab_size` given, the config setting none) with the data's `special_ids` known
    (`{"eos_id": 3, ...}`, the data's attribute names; {} where it states none), its pad/bos/eos/mask ids are the
    data's and the family's others are cleared (the family's eos may be the data's separator); else its
    special-token ids (`*_token_id`) outside the vocabulary are cleared. Ids the user set win (outside the
    vocabulary: a ValueError naming the key). A head_dim the family fixes regardless of the hidden size (qwen3: 128,
    gemma: 256) becomes hidden_size // num_attention_heads unless the config gives one (indivisible: a ValueError)."""
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
    datas = special_ids is not None and vocab_size is not None and "vocab_size" not in values
    if vocab_size is not None:
        values.setdefault("vocab_size", int(vocab_size))
    hf_config = transformers.AutoConfig.for_model(model_type, **values)
    ids = _data_token_ids(hf_config, values, special_ids or {}) if datas else _fit_token_ids(hf_config, values)
    changes = {**ids, **_fit_head_dim(hf_config, values)}
    return transformers.AutoConfig.for_model(model_type, **values, **changes) if changes else hf_config


def _attr(config: Any, key: str) -> Any:
    try:
        return getattr(config, key, None)
    except (AttributeError, TypeError, ValueError, KeyError):  # a per-layer attribute of a heterogeneous config
        return None


def _fit_token_ids(hf_config: Any, values: dict[str, Any]) -> dict[str, Any]:
    """The family's special-token ids outside the vocabulary, cleared (a list keeps the ids inside)."""
    vocab = _attr(hf_config, "vocab_size")
    if not isinstance(vocab, int):
        return {}
    inside = range(vocab)
    changes: dict[str, Any] = {}
    for key in TOKEN_ID_KEYS:
        value = values[key] if key in values else _attr(hf_config, key)
        ids = list(value) if isinstance(value, (list, tuple)) else [value]
        if all(not isinstance(i, int) or i in inside for i in ids):
            continue
        if key in values:
            raise ValueError(f"model.config.{key}={value} is outside the vocabulary (vocab_size={vocab}: ids "
                             f"0..{vocab - 1}); give ids below {vocab}, or leave {key} out")
        kept = [i for i in ids if isinstance(i, int) and i in inside] if isinstance(value, (list, tuple)) else []
        changes[key] = kept or None
    if changes:
        was = ", ".join(f"{k}={_attr(hf_config, k)}" for k in changes)
        log.info("model.config: the %s defaults %s are outside the vocabulary (vocab_size=%d): now %s (set them in "
                 "model.config to choose)", hf_config.model_type, was, vocab,
                 ", ".join(f"{k}={v}" for k, v in changes.items()))
    return changes


def _data_token_ids(hf_config: Any, values: dict[str, Any], special_ids: dict[str, int]) -> dict[str, Any]:
    """The data's pad/bos/eos/mask ids, and None for each other special-token id the family sets (those the user set
    kept, checked against the vocabulary), stated in one log line."""
    stated = {DATA_TOKEN_IDS[name]: int(i) for name, i in special_ids.items() if name in DATA_TOKEN_IDS}
    changes = {key: stated.get(key) for key in TOKEN_ID_KEYS
               if key not in values and (key in stated or _attr(hf_config, key) is not None)}
    _fit_token_ids(hf_config, {**values, **changes})  # raises for an id outside the vocabulary; changes none
    was = ", ".join(f"{k}={_attr(hf_config, k)}" for k in changes if _attr(hf_config, k) != changes[k])
    if changes:
        log.info("model.config: special-token ids from the data (vocab_size=%s): %s%s (set them in model.config to "
                 "choose)", _attr(hf_config, "vocab_size"), ", ".join(f"{k}={v}" for k, v in changes.items()),
                 f"; the {hf_config.model_type} defaults were {was}" if was else "")
    return changes


def _fit_head_dim(hf_config: Any, values: dict[str, Any]) -> dict[str, Any]:
    """head_dim = hidden_size // num_attention_heads where the family fixes its own (never for MLA families, whose
    head sizes are their own fields, nor where the config gives one)."""
    hidden, heads = _attr(hf_config, "hidden_size"), _attr(hf_config, "num_attention_heads")
    head_dim = _attr(hf_config, "head_dim")
    if "head_dim" in values or _attr(hf_config, "kv_lora_rank") is not None or not isinstance(head_dim, int) or \
            not isinstance(hidden, int) or not isinstance(heads, int) or heads < 1:
        return {}
    if hidden % heads:
        raise ValueError(f"model.config: hidden_size={hidden} is not divisible by num_attention_heads={heads}; give "
                         "model.config.head_dim, or a hidden size divisible by the heads")
    if head_dim == hidden // heads or not isinstance(_default_head_dim(type(hf_config)), int):
        return {}
    log.info("model.config: head_dim=%d (hidden_size %d // num_attention_heads %d), not the %s default %d (give "
             "model.config.head_dim to choose)", hidden // heads, hidden, heads, hf_config.model_type, head_dim)
    return {"head_dim": hidden // heads}


def _default_head_dim(cls: type) -> Any:
    """The head_dim a config class sets by default (an int where the family fixes one; None where it derives it)."""
    import dataclasses
    import inspect

    if dataclasses.is_dataclass(cls):
        field = {f.name: f for f in dataclasses.fields(cls)}.get("head_dim")
        return None if field is None else field.default
    param = inspect.signature(cls.__init__).parameters.get("head_dim")
    return None if param is None else param.default


def load_tokenizer(name_or_path: str, revision: str | None = None) -> Any | None:
    """The tokenizer saved with a model (a Hub id or a folder), or None where there is none. The model's config is
    read first, so an unknown id or a bad folder is reported as `load_hf_config` reports it. Each call gives a new
    tokenizer of what the folder or the revision holds now (never one shared, mutable object: a caller may add
    tokens; a repo pushed again reads new)."""
    transformers = _transformers()
    load_hf_config(name_or_path, revision)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not any((path / f).is_file() for f in TOKENIZER_FILES):
            return None
    else:
        from huggingface_hub import HfApi

        try:  # the commit the revision names now: every file below is read from that one commit
            info = HfApi().model_info(name_or_path, revision=revision, files_metadata=False)
        except Exception as err:  # noqa: BLE001 - whatever the Hub says, in the user's words
            raise ValueError(f"model.name_or_path={name_or_path}: cannot list the repo's files to find its tokenizer"
                             f" ({type(err).__name__}: {_first_line(err)})") from None
        if not {s.rfilename for s in info.siblings or ()}.intersection(TOKENIZER_FILES):
            return None
        revision = info.sha or revision
    return transformers.AutoTokenizer.from_pretrained(name_or_path, revision=revision, trust_remote_code=False)

"""The sentence-transformers files of a model directory, folded into typed values once.

``modules.json`` lists what runs after the transformer, in order: ``Pooling`` (``1_Pooling/config.json``),
``Dense`` layers (``N_Dense/config.json`` + weights), ``Normalize``, and pplx-embed's
``st_quantize.FlexibleQuantizer`` (int8 = ``round(127 * tanh(x))``, the model's own output format).
``sentence_bert_config.json`` gives ``max_seq_length``; ``config_sentence_transformers.json`` the
prompts and the similarity function. Anything petal cannot reproduce exactly is refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from petal.engine.config import DENSE_ACTIVATIONS, SIMILARITIES, DenseConfig, PromptConfig
from petal.engine.weight_files import PICKLE_WEIGHT_NAMES, safetensors_files

# sentence-transformers' Pooling flags -> petal's modes; the other flags are refused by name.
POOLING_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_lasttoken": "last"}
UNSUPPORTED_POOLING_FLAGS = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                             "pooling_mode_weightedmean_tokens")
DOCUMENT_PROMPT_NAMES = ("document", "passage", "corpus")  # sentence-transformers' encode_document order


class StFilesError(ValueError):
    """A sentence-transformers file that is unreadable or asks for something petal does not do."""


@dataclass(frozen=True)
class StFiles:
    """What the sentence-transformers files say (``None``: they do not say)."""

    has_modules: bool = False
    pooling: str | None = None
    include_prompt: bool = True
    dense: tuple[DenseConfig, ...] = ()
    normalize: bool | None = None  # None without modules.json
    int8_scheme: str | None = None  # "tanh" when the last module is pplx-embed's FlexibleQuantizer
    max_seq_length: int | None = None
    prompts: PromptConfig = field(default_factory=PromptConfig)
    similarity: str | None = None
    pickle_dense: tuple[Path, ...] = ()  # Dense weights stored only as pickle


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise StFilesError(f"cannot read {path}: {exc}") from exc


def read_st_files(model_dir: Path) -> StFiles:
    """Parse ``modules.json`` and its module folders, ``sentence_bert_config.json`` and
    ``config_sentence_transformers.json`` (each optional)."""
    values: dict[str, Any] = {}
    modules_file = model_dir / "modules.json"
    if modules_file.is_file():
        values.update(_modules(model_dir, read_json(modules_file)))
    st_config = model_dir / "sentence_bert_config.json"
    if st_config.is_file():
        length = read_json(st_config).get("max_seq_length")
        values["max_seq_length"] = int(length) if length else None
    values.update(_prompts_and_similarity(model_dir))
    return StFiles(**values)


def _modules(model_dir: Path, modules: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"has_modules": True, "normalize": False}
    dense: list[DenseConfig] = []
    pickle_dense: list[Path] = []
    seen: list[str] = []
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        folder = model_dir / str(module.get("path", ""))
        where = f"{model_dir / 'modules.json'}: module {module.get('type')!r}"
        if seen and seen[-1] == "FlexibleQuantizer":
            raise StFilesError(f"{where} follows the quantizer; petal supports a quantizer only as the last module")
        if kind in ("Dense", "Normalize", "FlexibleQuantizer") and "Pooling" not in seen:
            raise StFilesError(f"{where} comes before Pooling; petal runs these on pooled vectors only")
        if kind == "Transformer":
            if folder != model_dir and (folder / "config.json").is_file():
                raise StFilesError(f"{where} keeps the transformer in {folder}; pass --model {folder}")
        elif kind == "Pooling":
            out["pooling"], out["include_prompt"] = _pooling(folder)
        elif kind == "Dense":
            if out["normalize"]:
                raise StFilesError(f"{where} comes after Normalize; petal normalises last")
            config, pickled = _dense(folder)
            dense.append(config)
            if pickled:
                pickle_dense.append(config.weight_file)
        elif kind == "Normalize":
            out["normalize"] = True
        elif kind == "FlexibleQuantizer":
            out["int8_scheme"] = "tanh"
        else:
            raise StFilesError(f"{where} is not supported (petal runs Transformer, Pooling, Dense, Normalize "
                               "and pplx-embed's FlexibleQuantizer)")
        seen.append(kind)
    out["dense"] = tuple(dense)
    out["pickle_dense"] = tuple(pickle_dense)
    return out


def _pooling(folder: Path) -> tuple[str, bool]:
    config = read_json(folder / "config.json")
    modes = [mode for key, mode in POOLING_FLAGS.items() if config.get(key)]
    others = [key for key in UNSUPPORTED_POOLING_FLAGS if config.get(key)]
    if others or len(modes) != 1:
        asked = [k for k in POOLING_FLAGS if config.get(k)] + others
        raise StFilesError(f"{folder / 'config.json'} asks for pooling {asked or 'none'}; petal supports exactly one "
                           "of pooling_mode_cls_token, pooling_mode_mean_tokens, pooling_mode_lasttoken")
    return modes[0], bool(config.get("include_prompt", True))


def _dense(folder: Path) -> tuple[DenseConfig, bool]:
    config = read_json(folder / "config.json")
    name = config.get("activation_function") or "torch.nn.modules.linear.Identity"
    if name not in DENSE_ACTIVATIONS:
        raise StFilesError(f"{folder / 'config.json'}: activation {name!r} is not supported "
                           f"(known: {', '.join(sorted(DENSE_ACTIVATIONS))})")
    files = safetensors_files(folder)
    pickles = [folder / n for n in PICKLE_WEIGHT_NAMES if (folder / n).is_file()]
    if not files and not pickles:
        raise StFilesError(f"{folder} has no Dense weights (model.safetensors)")
    weight_file = files[0] if files else pickles[0]
    try:
        dense = DenseConfig(in_features=int(config["in_features"]), out_features=int(config["out_features"]),
                            bias=bool(config.get("bias", True)), activation=DENSE_ACTIVATIONS[name],
                            weight_file=weight_file)
    except (KeyError, TypeError, ValueError) as exc:
        raise StFilesError(f"{folder / 'config.json'}: {exc!r}") from exc
    return dense, not files


def _prompts_and_similarity(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config_sentence_transformers.json"
    if not path.is_file():
        return {}
    config = read_json(path)
    prompts = {str(k): str(v) for k, v in (config.get("prompts") or {}).items()}
    default = prompts.get(config.get("default_prompt_name") or "", "")
    query = prompts.get("query", default)
    document = next((prompts[name] for name in DOCUMENT_PROMPT_NAMES if name in prompts), default)
    similarity = config.get("similarity_fn_name")
    if similarity is not None and similarity not in SIMILARITIES:
        raise StFilesError(f"{path}: similarity_fn_name {similarity!r} is not one of {', '.join(SIMILARITIES)}")
    return {"prompts": PromptConfig(query=query, document=document), "similarity": similarity}

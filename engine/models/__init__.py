"""Model registry: Hugging Face ``architectures`` / ``model_type`` names -> model families.

Torch-free: a model directory is judged through its ``Family`` (``families.py``); the ``nn.Module`` class is
imported only to build a model (``model_class_for``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from petal.engine.models.families import BERT, QWEN3, ROBERTA, XLM_ROBERTA, Family, same_architecture

if TYPE_CHECKING:
    from petal.engine.models.base import EncoderModel

# Hugging Face architecture or model_type -> model family. Add one line per architecture file.
MODEL_REGISTRY: dict[str, Family] = {
    "BertModel": BERT,
    "bert": BERT,
    "Qwen3Model": QWEN3,
    "Qwen3ForCausalLM": QWEN3,
    "qwen3": QWEN3,
    "PPLXQwen3Model": QWEN3,  # pplx-embed-v1: Qwen3 weights, bidirectional attention
    "bidirectional_pplx_qwen3": QWEN3,
    "XLMRobertaModel": XLM_ROBERTA,
    "xlm-roberta": XLM_ROBERTA,
    # NOTE: RoBERTa (all-roberta-large-v1, all-distilroberta-v1) is XLM-RoBERTa's layout: the same weight names,
    # positions from pad_token_id + 1 and one token type; transformers' XLM-R modeling is a copy of RoBERTa's
    "RobertaModel": ROBERTA,
    "roberta": ROBERTA,
}


def supported_architectures() -> list[str]:
    return sorted(MODEL_REGISTRY)


def family_for(hf_config: dict[str, Any]) -> Family:
    """The model family for a Hugging Face config, by ``architectures`` first, then ``model_type`` (no torch)."""
    architectures, model_type = hf_config.get("architectures") or [], hf_config.get("model_type") or ""
    if not isinstance(architectures, list) or not all(isinstance(name, str) for name in architectures):
        raise ValueError(f"architectures {architectures!r} is not a list of names")
    if not isinstance(model_type, str):
        raise ValueError(f"model_type {model_type!r} is not a name")
    names = [*architectures, model_type]
    for name in names:
        if name in MODEL_REGISTRY:
            _refuse_custom_code(hf_config, architectures, model_type)
            _refuse_conflict(architectures, model_type)
            return MODEL_REGISTRY[name]
    found = ", ".join(repr(n) for n in names if n) or "nothing"
    raise ValueError(
        f"unsupported model architecture ({found} in config.json); supported: {', '.join(supported_architectures())}"
    )


def _same_model(a: Family, b: Family) -> bool:
    """Whether two families compute the same (RoBERTa and XLM-RoBERTa: one layout, two names)."""
    return same_architecture(a.architecture, b.architecture) or same_architecture(b.architecture, a.architecture)


def _refuse_conflict(architectures: list[str], model_type: str) -> None:
    """An architecture of one family beside a ``model_type`` of another (``["BertModel"]`` with ``"roberta"``) is
    refused (``ValueError`` naming both): transformers' ``AutoModel`` builds the ``model_type``'s class, whatever
    ``architectures`` says, so petal could follow neither name silently."""
    # NOTE: before, the first name petal knew won: BERT's math (positions from 0) where AutoModel ran RoBERTa's
    by_type = MODEL_REGISTRY.get(model_type)
    if by_type is None:
        return
    for name in architectures:
        family = MODEL_REGISTRY.get(name)
        if family is not None and not _same_model(family, by_type):
            raise ValueError(f"architectures names {name!r} ({family.architecture}) but model_type is {model_type!r} "
                             f"({by_type.architecture}); transformers' AutoModel builds the model_type's model, so "
                             "petal will not guess which one this checkpoint is: make the two agree")


def _refuse_custom_code(hf_config: dict[str, Any], architectures: list[str], model_type: str) -> None:
    """A config.json whose ``auto_map`` names its own model code (``trust_remote_code``, which petal never runs) for
    a class petal does not know is refused (``ValueError``): its ``model_type`` (jina-embeddings-v2 says ``bert``)
    and even its ``architectures`` name what the code extends, not the computation it does (ALiBi in place of
    position embeddings), so building the registered family would embed with other math, silently. The class
    ``AutoModel`` names (else, with no such key, one of ``architectures``) must be one petal reproduces
    (pplx-embed's ``PPLXQwen3Model``)."""
    auto_map = hf_config.get("auto_map")
    code = {str(key): value for key, value in auto_map.items() if str(key).startswith("AutoModel")} \
        if isinstance(auto_map, dict) else {}
    if not code:
        return
    if "AutoModel" in code:
        model_class = code["AutoModel"]
        if isinstance(model_class, str) and model_class.rsplit(".", 1)[-1] in MODEL_REGISTRY:
            return
    elif any(name in MODEL_REGISTRY for name in architectures):
        return
    shown = ", ".join(f"{key}: {value!r}" for key, value in list(code.items())[:3])
    raise ValueError(
        f"auto_map names custom model code ({shown}; architectures {architectures!r}, model_type {model_type!r}), "
        "which petal does not run (no trust_remote_code) and cannot reproduce: the names say what the code extends, "
        f"not what it computes. Supported architectures: {', '.join(supported_architectures())}")


def model_class_for(hf_config: dict[str, Any]) -> type[EncoderModel]:
    """The ``nn.Module`` class of ``family_for(hf_config)`` (imports torch: only where a model is built)."""
    return family_for(hf_config).model_class()

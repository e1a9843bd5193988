"""What each model family's ``config.json`` says, read without torch: the loader judges a model directory
(its shape, attention mask, pooling) before anything imports torch, so a run refused by the model's config
(``--dim`` too wide, ``--max-length`` over the model's limit, an unsupported architecture) starts no torch.

One ``Family`` per architecture file (``bert.py``, ``xlm_roberta.py``, ``qwen3.py``); its ``nn.Module`` class
is imported by name only when a model is built (``Family.model_class``), and refers back to its ``Family``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from petal.engine.config import ModelConfig, PoolingMode
from petal.engine.layers.activation_names import check_activation
from petal.engine.st_files import config_bool, config_float, config_int, config_str, json_kind

if TYPE_CHECKING:
    from petal.engine.models.base import EncoderModel


@dataclass(frozen=True)
class Family:
    """An architecture as the loader reads it: the config folding, what the config says of the attention mask
    (``None``: it does not say), the masks its checkpoints use, the pooling of a bare directory without
    sentence-transformers files, and where its ``nn.Module`` class is (imported only to build a model)."""

    architecture: str  # ModelConfig.architecture: the registry name a built model is found by
    config_from_hf: Callable[[dict[str, Any]], ModelConfig]
    causal_from_hf: Callable[[dict[str, Any]], bool | None]
    attention_masks: tuple[str, ...]
    default_pooling: PoolingMode | None
    model_module: str  # the architecture file, e.g. "petal.engine.models.bert"
    model_class_name: str  # its nn.Module class, e.g. "BertModel"

    def model_class(self) -> type[EncoderModel]:
        """The ``nn.Module`` class (imports torch)."""
        model_class: type[EncoderModel] = getattr(importlib.import_module(self.model_module), self.model_class_name)
        return model_class


# --- BERT (bert.py): MiniLM, BGE, E5, GTE, ...

def bert_config(hf: dict[str, Any], architecture: str = "bert") -> ModelConfig:
    """Fold a Hugging Face BERT-style ``config.json`` into a ``ModelConfig`` (``ValueError`` naming a bad key)."""
    _refuse_decoder(hf)
    position_type = config_str(hf, "position_embedding_type", "absolute")
    if position_type != "absolute":
        raise ValueError(f"position_embedding_type {position_type!r} is not supported (only 'absolute')")
    num_heads = config_int(hf, "num_attention_heads")
    hidden = config_int(hf, "hidden_size")
    if hidden % num_heads:
        raise ValueError(f"hidden_size {hidden} is not a multiple of num_attention_heads {num_heads}")
    hidden_act = check_activation(config_str(hf, "hidden_act", "gelu"))  # NOTE: refused here, naming config.json
    return ModelConfig(
        architecture=architecture,
        vocab_size=config_int(hf, "vocab_size"),
        hidden_size=hidden,
        num_layers=config_int(hf, "num_hidden_layers"),
        num_heads=num_heads,
        num_kv_heads=num_heads,
        head_dim=hidden // num_heads,
        intermediate_size=config_int(hf, "intermediate_size"),
        max_position_embeddings=config_int(hf, "max_position_embeddings"),
        norm_eps=config_float(hf, "layer_norm_eps", 1e-12),
        hidden_act=hidden_act,
        causal=False,
        type_vocab_size=config_int(hf, "type_vocab_size", 2, minimum=0),
        position_offset=0,
    )


def _refuse_decoder(hf: dict[str, Any]) -> None:
    """``is_decoder`` true: transformers builds BERT's (and RoBERTa's, XLM-R's) self-attention causal
    (``BertAttention(is_causal=config.is_decoder)``), each token seeing only those before it; petal's encoders are
    bidirectional, so it is refused (``ValueError`` naming the key). ``add_cross_attention`` needs it (transformers
    refuses it without) and changes nothing without encoder states, which sentence-transformers never passes."""
    # NOTE: before, the key was ignored: a causal checkpoint embedded bidirectionally, other vectors at exit 0
    if config_bool(hf, "is_decoder", False):
        raise ValueError("is_decoder is true: transformers runs this model with causal attention (each token sees "
                         "only the tokens before it); petal runs BERT-family models bidirectionally only")


def encoder_causal(hf: dict[str, Any]) -> bool | None:
    return False  # an encoder: every token sees every other token of its sequence


BERT = Family("bert", bert_config, encoder_causal, ("bidirectional",), "mean", "petal.engine.models.bert",
              "BertModel")


# --- XLM-RoBERTa (xlm_roberta.py): BGE-M3 dense, multilingual-e5

def xlm_roberta_config(hf: dict[str, Any], architecture: str = "xlm-roberta") -> ModelConfig:
    """BERT's config; positions numbered from ``pad_token_id + 1`` as Hugging Face's RoBERTa does."""
    cfg = bert_config(hf, architecture=architecture)
    return replace(cfg, position_offset=config_int(hf, "pad_token_id", 1, minimum=0) + 1)


def roberta_config(hf: dict[str, Any]) -> ModelConfig:
    """XLM-RoBERTa's config under RoBERTa's name: the same layout (transformers' XLM-R is a copy of RoBERTa)."""
    return xlm_roberta_config(hf, architecture="roberta")


XLM_ROBERTA = Family("xlm-roberta", xlm_roberta_config, encoder_causal, ("bidirectional",), "mean",
                     "petal.engine.models.xlm_roberta", "XLMRobertaModel")
# RoBERTa (all-roberta-large-v1, all-distilroberta-v1): XLM-RoBERTa's model, recorded as what it is
ROBERTA = Family("roberta", roberta_config, encoder_causal, ("bidirectional",), "mean",
                 "petal.engine.models.xlm_roberta", "RobertaModel")
# the architecture name a petal before ROBERTA wrote into manifests for these models: an index that recorded it
# holds the same vectors (``same_architecture``)
RECORDED_BEFORE = {"roberta": "xlm-roberta"}
# the architectures on BERT's layers (the engine's BERT-family kernels apply to each)
BERT_LAYOUT = ("bert", "xlm-roberta", "roberta")


def same_architecture(recorded: object, current: str) -> bool:
    """Whether an index that recorded architecture ``recorded`` was embedded by the architecture ``current`` names
    (equal, or the name an earlier petal recorded for it: a RoBERTa index of before ``ROBERTA`` says xlm-roberta)."""
    return recorded == current or recorded == RECORDED_BEFORE.get(current)


# --- Qwen3 (qwen3.py): pplx-embed-v1 (bidirectional + mean), Qwen3-Embedding (causal + last token)

PPLX_MODEL_TYPE = "bidirectional_pplx_qwen3"  # pplx-embed-v1's config.json (remote code, Qwen3 weights)


def qwen3_causal(hf: dict[str, Any]) -> bool | None:
    """What the checkpoint says about its attention: ``True`` causal, ``False`` bidirectional, ``None`` nothing.

    Evidence, in order: ``use_bidirectional_attention`` / ``is_causal`` in config.json (pplx-embed,
    TEI's flag); ``model_type`` ``bidirectional_pplx_qwen3``; ``architectures`` naming a causal LM
    (``Qwen3ForCausalLM``: Qwen3-Embedding is saved that way and Hugging Face runs it causal).
    """
    if isinstance(hf.get("use_bidirectional_attention"), bool):
        return not hf["use_bidirectional_attention"]
    if isinstance(hf.get("is_causal"), bool):
        return bool(hf["is_causal"])
    if hf.get("model_type") == PPLX_MODEL_TYPE:
        return False
    if any(str(name).endswith("ForCausalLM") for name in hf.get("architectures") or []):
        return True
    return None


def qwen3_rope_theta(hf: dict[str, Any]) -> float:
    """RoPE base from ``rope_theta`` (transformers 4) or ``rope_parameters`` (transformers 5); plain RoPE only."""
    extras = {}
    for key in ("rope_parameters", "rope_scaling"):
        extras[key] = hf.get(key) or {}
        if not isinstance(extras[key], dict):
            raise ValueError(f"{key} {extras[key]!r} is {json_kind(extras[key])}, not an object")
        kind = extras[key].get("rope_type", extras[key].get("type", "default"))
        if kind != "default":
            raise ValueError(f"RoPE type {kind!r} ({extras[key]}) is not supported (only default RoPE)")
    params = extras["rope_parameters"]
    if params.get("rope_theta") is not None:
        return config_float(params, "rope_theta", 1_000_000.0, positive=True)
    return config_float(hf, "rope_theta", 1_000_000.0, positive=True)


def qwen3_config(hf: dict[str, Any]) -> ModelConfig:
    """Fold a Hugging Face Qwen3 ``config.json`` into a ``ModelConfig`` (``ValueError`` naming a bad key)."""
    num_heads = config_int(hf, "num_attention_heads")
    hidden = config_int(hf, "hidden_size")
    if config_bool(hf, "use_sliding_window", False):
        raise ValueError("use_sliding_window is true; sliding-window attention is not supported")
    hidden_act = config_str(hf, "hidden_act", "silu")
    if hidden_act != "silu":  # NOTE: refused here, naming config.json, not when the model is built
        raise ValueError(f"Qwen3 hidden_act {hidden_act!r} is not supported (only silu)")
    if hidden % num_heads and hf.get("head_dim") is None:
        raise ValueError(f"hidden_size {hidden} is not a multiple of num_attention_heads {num_heads} "
                         "and there is no head_dim")
    causal = qwen3_causal(hf)
    return ModelConfig(
        architecture="qwen3",
        vocab_size=config_int(hf, "vocab_size"),
        hidden_size=hidden,
        num_layers=config_int(hf, "num_hidden_layers"),
        num_heads=num_heads,
        num_kv_heads=config_int(hf, "num_key_value_heads", num_heads),
        head_dim=config_int(hf, "head_dim", hidden // num_heads),
        intermediate_size=config_int(hf, "intermediate_size"),
        max_position_embeddings=config_int(hf, "max_position_embeddings"),
        norm_eps=config_float(hf, "rms_norm_eps", 1e-6),
        hidden_act=hidden_act,
        # NOTE: unknown attention defaults to causal here (Hugging Face's behaviour); engine/loader.py refuses
        # to run a Qwen3 checkpoint whose attention nobody stated (see ``qwen3_causal``).
        causal=True if causal is None else causal,
        rope_theta=qwen3_rope_theta(hf),
        extra=(("attention_bias", config_bool(hf, "attention_bias", False)),),
    )


# default pooling None: mean (pplx-embed) or last (Qwen3-Embedding), never assumed
QWEN3 = Family("qwen3", qwen3_config, qwen3_causal, ("causal", "bidirectional"), None, "petal.engine.models.qwen3",
               "Qwen3Model")

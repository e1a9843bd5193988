"""Tiny random checkpoints of every supported family, saved the way their real counterparts are.

- ``qwen3-embedding``: ``Qwen3ForCausalLM`` weights, ``1_Pooling`` last token + ``Normalize``, query
  prompt ``Instruct: ...\\nQuery:``, a tokenizer whose post-processor appends ``<|endoftext|>`` (the
  current Qwen3-Embedding revision) or not (the first one);
- ``pplx-embed``: config.json of model_type ``bidirectional_pplx_qwen3`` with
  ``use_bidirectional_attention``, mean pooling and ``st_quantize.FlexibleQuantizer``;
- ``qwen3-bare``: a ``Qwen3Model`` directory with no sentence-transformers files;
- ``xlm-roberta``: CLS pooling + ``Normalize`` (BGE-M3 style); ``bert``: mean + ``Normalize``.

Weights are random with perturbed norms and biases, so a wrong mapping shows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

WORDS = re.findall(r"[a-z]+", """
how do glaciers move glaciers flow by internal deformation of the ice and by sliding over a film of meltwater
at their base bread dough rises because yeast ferments sugars and releases carbon dioxide vector search finds
the nearest neighbours of a query embedding among millions of documents le glacier avance lentement vers la
vallée gpus saturate on tokens not sequences instruct given web search retrieve relevant passages that answer
""".lower())
SPECIALS = ["<unk>", "<|endoftext|>", "<|im_end|>", "<s>", "</s>", "<pad>"]
QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
TEXTS = [
    "How do glaciers move?",
    "Glaciers flow by internal deformation of the ice and by sliding over a film of meltwater at their base.",
    "Bread dough rises because yeast ferments sugars and releases carbon dioxide.",
    "a",
    "Vector search finds the nearest neighbours of a query embedding among millions of documents. " * 6,
    "GPUs saturate on tokens, not sequences.",
]


def vocab() -> dict[str, int]:
    out = {tok: i for i, tok in enumerate(SPECIALS)}
    for word in sorted(set(WORDS)):
        out.setdefault(word, len(out))
    return out


def write_word_tokenizer(path: Path, append: str | None, bos: str | None = None) -> int:
    """A lower-casing word-level ``tokenizer.json`` (+ tokenizer_config.json); returns the vocab size.

    ``append``: special token the post-processor puts at the end; ``bos``: one it puts in front.
    """
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    ids = vocab()
    tok = Tokenizer(models.WordLevel(ids, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIALS)
    if append or bos:
        single = " ".join(x for x in (bos, "$A", append) if x)
        tok.post_processor = processors.TemplateProcessing(
            single=single, special_tokens=[(t, ids[t]) for t in (bos, append) if t])
    tok.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512, "unk_token": "<unk>",
              "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return len(ids)


def _perturb(model: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name.lower() or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
    return model.eval()


def write_st(path: Path, pooling: str | None, normalize: bool, *, quantizer: bool = False,
             prompts: dict[str, str] | None = None, max_seq_length: int = 128) -> None:
    """sentence-transformers files (``pooling`` None: no modules.json at all)."""
    if pooling is None:
        return
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (path / "2_Normalize").mkdir(exist_ok=True)
    if quantizer:
        modules.append({"idx": 2, "name": "2", "path": "", "type": "st_quantize.FlexibleQuantizer",
                        "kwargs": ["quantization"]})
    (path / "modules.json").write_text(json.dumps(modules))
    flags = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "last": "pooling_mode_lasttoken"}
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 0, **dict.fromkeys(flags.values(), False), flags[pooling]: True,
         "include_prompt": True}))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    if prompts is not None:
        (path / "config_sentence_transformers.json").write_text(json.dumps(
            {"prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"}))


def make_model(family: str, path: Path, *, eos_in_tokenizer: bool = True, seed: int = 0) -> torch.nn.Module:
    """Save a tiny ``family`` checkpoint in ``path``; returns the Hugging Face trunk (eval mode) it holds."""
    import transformers

    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if family in ("qwen3-embedding", "pplx-embed", "qwen3-bare"):
        size = write_word_tokenizer(path, "<|endoftext|>" if eos_in_tokenizer else None)
        config = transformers.Qwen3Config(
            vocab_size=size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, intermediate_size=128, max_position_embeddings=256, rope_theta=5000.0, rms_norm_eps=1e-6,
            eos_token_id=vocab()["<|endoftext|>"], pad_token_id=vocab()["<|endoftext|>"])
        if family == "qwen3-embedding":
            causal_lm = transformers.Qwen3ForCausalLM(config)
            _perturb(causal_lm).save_pretrained(path, safe_serialization=True)
            trunk = causal_lm.model
            write_st(path, "last", True, prompts={"query": QUERY_PROMPT, "document": ""})
        else:
            trunk = _perturb(transformers.Qwen3Model(config))
            trunk.save_pretrained(path, safe_serialization=True)
        if family == "pplx-embed":
            hf = json.loads((path / "config.json").read_text())
            hf.update(model_type="bidirectional_pplx_qwen3", architectures=["PPLXQwen3Model"],
                      use_bidirectional_attention=True, use_cache=False,
                      auto_map={"AutoConfig": "configuration.PPLXQwen3Config", "AutoModel": "modeling.PPLXQwen3Model"})
            (path / "config.json").write_text(json.dumps(hf))
            write_st(path, "mean", False, quantizer=True)
        return trunk.eval()
    if family == "xlm-roberta":
        size = write_word_tokenizer(path, "</s>", bos="<s>")
        config = transformers.XLMRobertaConfig(
            vocab_size=size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=130, type_vocab_size=1, pad_token_id=vocab()["<pad>"], bos_token_id=3,
            eos_token_id=4, layer_norm_eps=1e-5)
        trunk = _perturb(transformers.XLMRobertaModel(config, add_pooling_layer=False))
        trunk.save_pretrained(path, safe_serialization=True)
        write_st(path, "cls", True)
        return trunk
    if family == "bert":
        size = write_word_tokenizer(path, "</s>", bos="<s>")
        config = transformers.BertConfig(vocab_size=size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=128, max_position_embeddings=160)
        trunk = _perturb(transformers.BertModel(config, add_pooling_layer=False))
        trunk.save_pretrained(path, safe_serialization=True)
        write_st(path, "mean", True)
        return trunk
    raise ValueError(f"unknown family {family!r}")

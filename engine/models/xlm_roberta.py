"""XLM-RoBERTa encoders (BGE-M3 dense, multilingual-e5): BERT layers, RoBERTa position ids.

Hugging Face numbers positions from ``padding_idx + 1`` (``create_position_ids_from_input_ids``);
packed sequences have no padding, so position ``i`` of a sequence is ``padding_idx + 1 + i``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from petal.engine.config import ModelConfig
from petal.engine.models.bert import BertModel, bert_config
from petal.engine.st_files import config_int


def xlm_roberta_config(hf: dict[str, Any]) -> ModelConfig:
    cfg = bert_config(hf, architecture="xlm-roberta")
    return replace(cfg, position_offset=config_int(hf, "pad_token_id", 1, minimum=0) + 1)


class XLMRobertaModel(BertModel):
    weight_prefixes: tuple[str, ...] = ("", "roberta.", "model.")

    @staticmethod
    def config_from_hf(hf: dict[str, Any]) -> ModelConfig:
        return xlm_roberta_config(hf)

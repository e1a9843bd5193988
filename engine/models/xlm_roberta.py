"""XLM-RoBERTa encoders (BGE-M3 dense, multilingual-e5): BERT layers, RoBERTa position ids.

Hugging Face numbers positions from ``padding_idx + 1`` (``create_position_ids_from_input_ids``);
packed sequences have no padding, so position ``i`` of a sequence is ``padding_idx + 1 + i``
(``families.xlm_roberta_config`` sets ``position_offset``).
"""

from __future__ import annotations

from typing import ClassVar

from petal.engine.models.bert import BertModel
from petal.engine.models.families import XLM_ROBERTA, Family


class XLMRobertaModel(BertModel):
    family: ClassVar[Family] = XLM_ROBERTA
    weight_prefixes: tuple[str, ...] = ("", "roberta.", "model.")

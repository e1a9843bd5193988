"""XLM-RoBERTa and RoBERTa encoders (BGE-M3 dense, multilingual-e5, all-roberta-large-v1): BERT layers, RoBERTa
position ids.

Hugging Face numbers positions from ``padding_idx + 1`` (``create_position_ids_from_input_ids``), counting
only the tokens that are not the padding token: packed sequences have no padding, so position ``i`` of a
sequence is ``padding_idx + 1 + i`` (``families.xlm_roberta_config`` sets ``position_offset``), unless the
text itself holds the padding token (the text ``<pad>``): that token takes position ``padding_idx`` and the
tokens after it count on from the one before it.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from petal.engine.models.bert import BertEmbeddings, BertModel
from petal.engine.models.families import ROBERTA, XLM_ROBERTA, Family


class XLMRobertaEmbeddings(BertEmbeddings):
    def position_ids(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``padding_idx`` + the count of non-padding tokens of the sequence up to this one (``padding_idx`` for a
        padding token), as Hugging Face's ``create_position_ids_from_input_ids``; no host sync (CUDA graphs)."""
        padding_idx = self.position_offset - 1
        counted = (input_ids != padding_idx).to(positions.dtype)  # [T] 1 for a token that advances the count
        running = torch.cumsum(counted, 0, dtype=positions.dtype)  # [T] over the whole packed batch
        starts = torch.arange(positions.shape[0], dtype=positions.dtype, device=positions.device) - positions
        before = running.index_select(0, starts) - counted.index_select(0, starts)  # [T] counted before its sequence
        return (running - before) * counted + padding_idx


class XLMRobertaModel(BertModel):
    family: ClassVar[Family] = XLM_ROBERTA
    weight_prefixes: tuple[str, ...] = ("", "roberta.", "model.")
    embeddings_class: ClassVar[type[BertEmbeddings]] = XLMRobertaEmbeddings


class RobertaModel(XLMRobertaModel):
    """RoBERTa (``model_type: roberta``): XLM-RoBERTa's model, recorded under its own name."""

    family: ClassVar[Family] = ROBERTA

"""Per-step metadata every layer reads: sequence offsets, pooling indices, the attention backend.

Built on the host once per step from a ``PackedBatch``. Under CUDA graphs the tensors here are the
graph's static buffers (refilled in place before each replay) and ``num_seqs`` is the graph's
sequence capacity: unused slots are zero-length sequences, unused tokens belong to the dummy
sequence ``num_seqs`` (never pooled into a real row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from engine.layers.attention import AttentionBackend


@dataclass
class ForwardContext:
    cu_seqlens: torch.Tensor  # [num_seqs + 1] int32, on the model's device
    cu_seqlens_cpu: np.ndarray  # [num_seqs + 1] int32, host copy (SDPA loop, FlashInfer plan)
    max_seqlen: int  # longest sequence, or an upper bound of it under CUDA graphs
    num_seqs: int  # sequences (or sequence slots under CUDA graphs)
    token_seq_ids: torch.Tensor  # [num_tokens] int64, sequence of each token; padding -> num_seqs
    inv_seqlens: torch.Tensor  # [num_seqs] float32, 1 / length (0 for empty slots)
    first_token_idx: torch.Tensor  # [num_seqs] int64 (CLS pooling)
    last_token_idx: torch.Tensor  # [num_seqs] int64 (last-token pooling)
    attention: AttentionBackend


@dataclass(frozen=True)
class HostMetadata:
    """The host-side arrays a context is filled from (numpy, exact sizes for one padded step)."""

    cu_seqlens: np.ndarray  # [num_seqs + 1] int32
    token_seq_ids: np.ndarray  # [num_tokens] int64
    inv_seqlens: np.ndarray  # [num_seqs] float32
    first_token_idx: np.ndarray  # [num_seqs] int64
    last_token_idx: np.ndarray  # [num_seqs] int64


def host_metadata(cu_seqlens: np.ndarray, num_tokens: int, num_seqs: int) -> HostMetadata:
    """Metadata for ``cu_seqlens`` padded to ``num_tokens`` tokens and ``num_seqs`` sequence slots.

    Real sequences keep their offsets; padded slots are zero-length at the end of the real tokens;
    tokens past the real ones are assigned to the dummy sequence ``num_seqs``.
    """
    real_seqs = len(cu_seqlens) - 1
    real_tokens = int(cu_seqlens[-1])
    assert real_seqs <= num_seqs and real_tokens <= num_tokens, (real_seqs, num_seqs, real_tokens, num_tokens)
    cu = np.full(num_seqs + 1, real_tokens, dtype=np.int32)
    cu[: real_seqs + 1] = cu_seqlens
    seqlens = np.diff(cu).astype(np.int64)  # [num_seqs], zeros for padded slots
    token_seq_ids = np.full(num_tokens, num_seqs, dtype=np.int64)
    token_seq_ids[:real_tokens] = np.repeat(np.arange(real_seqs, dtype=np.int64), seqlens[:real_seqs])
    inv = np.zeros(num_seqs, dtype=np.float32)
    inv[:real_seqs] = 1.0 / seqlens[:real_seqs]
    first = np.zeros(num_seqs, dtype=np.int64)
    last = np.zeros(num_seqs, dtype=np.int64)
    first[:real_seqs] = cu_seqlens[:-1]
    last[:real_seqs] = cu_seqlens[1:] - 1
    return HostMetadata(cu, token_seq_ids, inv, first, last)

"""Per-step metadata every layer reads: sequence offsets, pooling indices, the attention backend.

Built once per step (``engine/inputs.py``). Under CUDA graphs the tensors here are a bucket's
static buffers, refilled in place before each replay, and ``num_seqs`` is the bucket's sequence
capacity: unused slots are zero-length sequences, and tokens past the real ones belong to the
dummy sequence ``num_seqs``, which is never pooled into a real row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from petal.engine.layers.attention import AttentionBackend


@dataclass
class ForwardContext:
    cu_seqlens: torch.Tensor  # [num_seqs + 1] int32, on the model's device
    cu_seqlens_cpu: torch.Tensor  # [num_seqs + 1] int32 host copy (pinned on CUDA): SDPA loop, FlashInfer plan
    max_seqlen: int  # longest sequence, or an upper bound of it under CUDA graphs
    num_seqs: int  # sequences (or sequence slots under CUDA graphs)
    token_seq_ids: torch.Tensor  # [num_tokens] int32, sequence of each token; padding -> num_seqs
    inv_seqlens: torch.Tensor  # [num_seqs] float32, 1 / length (0 for empty slots)
    first_token_idx: torch.Tensor  # [num_seqs] int32 (CLS pooling)
    last_token_idx: torch.Tensor  # [num_seqs] int32 (last-token pooling)
    attention: AttentionBackend
    padded: bool = False  # shapes are a graph bucket's (padded), not the batch's exact ones
    input_ids: torch.Tensor | None = None  # [num_tokens] int32
    positions: torch.Tensor | None = None  # [num_tokens] int32, restart at 0 per sequence
    # the small-batch path (engine/small_batch.py decides per bucket):
    fused_attention: bool = False  # attention in one Triton kernel (engine/layers/small_attention.py), no plan()
    fused_mlp: bool = False  # Qwen3 gate/up GEMM with SwiGLU fused (engine/layers/fused_mlp.py)
    tma_mlp: bool = False  # ... the large buckets' TMA kernel of it (engine/layers/tma_mlp.py)
    skinny_layers: bool = False  # Qwen3 layers as weight-streaming kernels (engine/layers/skinny_linear.py)
    pdl: bool = False  # ... launched as programmatic dependent launches
    attention_in_o: bool = False  # ... with the attention inside the O projection's kernel (buckets with its tiles)
    # every step on CUDA: the residual add in the O and down GEMMs (cuBLAS beta 1), and (BERT family) the
    # up projection's bias and GELU in its cuBLASLt epilogue
    gemm_epilogues: bool = False
    gelu_epilogue: bool = False

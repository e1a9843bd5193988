"""Pooling packed token states into one vector per sequence, CUDA-graph safe (no host syncs)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from petal.engine.context import ForwardContext


def pool(hidden: torch.Tensor, ctx: ForwardContext, mode: str) -> torch.Tensor:
    """``hidden [num_tokens, hidden]`` -> ``[num_seqs, hidden]`` float32.

    mean: segment sum in fp32 (``index_add_``) times 1/length; cls: first token; last: last token.
    """
    if mode == "mean":
        sums = torch.zeros(ctx.num_seqs + 1, hidden.shape[1], dtype=torch.float32, device=hidden.device)
        sums.index_add_(0, ctx.token_seq_ids, hidden.float())
        return sums[: ctx.num_seqs] * ctx.inv_seqlens[:, None]
    if mode == "cls":
        return hidden.index_select(0, ctx.first_token_idx).float()
    if mode == "last":
        return hidden.index_select(0, ctx.last_token_idx).float()
    raise ValueError(f"unknown pooling mode {mode!r}")


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit L2 norm (zero rows stay zero)."""
    return F.normalize(x, p=2.0, dim=-1, eps=1e-12)

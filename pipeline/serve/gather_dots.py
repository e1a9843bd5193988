"""Scores of gathered rows without gathering them (Triton, CUDA): ``dots[i, m] = vectors[rows[i, m]] . q[i]``
in float32, for the probed lists of ``serve/gpu_ivf.py``.

Each live row is read once, straight from the GPU copy; a row id below 0 (padding) reads nothing and
scores 0. The torch path it replaces (``vectors[rows]`` into a new tensor, then a batched product) reads
every slot's row, writes it and reads it again, and rounds its float16 products to float16 (hence that
path's second, float32 pass over the top candidates). Math here is float32 on the stored values.
"""

from __future__ import annotations

import functools
from typing import Any

BLOCK_ROWS = 64  # rows per program
BLOCK_DIM = 128  # vector elements per step of a program's loop


@functools.cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def gather_dots_kernel(vectors_ptr, rows_ptr, q_ptr, out_ptr, num_rows, DIM: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
        query = tl.program_id(0)
        block = tl.program_id(1)
        offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
        in_range = offs_m < num_rows
        base = query.to(tl.int64) * num_rows
        rows = tl.load(rows_ptr + base + offs_m, mask=in_range, other=-1)
        live = rows >= 0
        acc = tl.zeros([BLOCK_M], dtype=tl.float32)
        for d0 in range(0, DIM, BLOCK_D):
            offs_d = d0 + tl.arange(0, BLOCK_D)
            in_dim = offs_d < DIM
            x = tl.load(vectors_ptr + rows[:, None] * DIM + offs_d[None, :], mask=live[:, None] & in_dim[None, :],
                        other=0.0).to(tl.float32)
            qv = tl.load(q_ptr + query.to(tl.int64) * DIM + offs_d, mask=in_dim, other=0.0)
            acc += tl.sum(x * qv[None, :], axis=1)
        tl.store(out_ptr + base + offs_m, acc, mask=in_range)

    return gather_dots_kernel


def gather_dots(vectors: Any, rows: Any, q: Any) -> Any:
    """``vectors [N, d]`` (float16 or float32, contiguous), ``rows [n, M]`` int64 row ids (-1: none), ``q [n, d]``
    float32 -> ``[n, M]`` float32: each row's dot product with its query's vector (0 for -1)."""
    import torch
    import triton

    n, num_rows = rows.shape
    out = torch.empty((n, num_rows), dtype=torch.float32, device=rows.device)
    if n == 0 or num_rows == 0:
        return out
    grid = (n, triton.cdiv(num_rows, BLOCK_ROWS))
    _kernel()[grid](vectors, rows.contiguous(), q.contiguous(), out, num_rows, DIM=vectors.shape[1],
                    BLOCK_M=BLOCK_ROWS, BLOCK_D=BLOCK_DIM)
    return out


def prepare(dim: int, device: str) -> None:
    """Compile the kernel now for stored vectors of ``dim`` values (float16 and float32; a row count of 1, a multiple
    of 16 and any other: Triton's integer specialisations) on ``device``.

    A server (``petal serve --search-device cuda``) calls it before it freezes what lives as long as the process: the
    Triton modules, driver utilities and launchers a first compile imports (114 modules for a server of an index of
    vectors, which has no model to import Triton first) are frozen with the rest, and the GPU copy's warm-up finds the
    kernel compiled, instead of leaving them for every full collection to walk."""
    import torch

    q = torch.zeros((1, dim), dtype=torch.float32, device=device)
    for dtype in (torch.float16, torch.float32):
        vectors = torch.zeros((1, dim), dtype=dtype, device=device)
        for num_rows in (1, 16, 17):
            gather_dots(vectors, torch.zeros((1, num_rows), dtype=torch.int64, device=device), q)
    torch.cuda.synchronize(device)

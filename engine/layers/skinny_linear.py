"""GEMMs of a few dozen rows that stream the weights: Qwen3's layer as four of them around attention.

At 16-32 token rows a layer's GEMMs read 30 MB of weights (pplx-embed-0.6b) and do almost no
arithmetic, so what counts is how soon each kernel starts streaming. Two kernels:

- ``linear_add(x, w, residual, norm_weight=g)`` = ``h = residual + x @ w.T``: the residual add in the
  epilogue, which also writes ``hg = h * g`` and each column tile's sums of ``h**2`` for the norm that
  follows; K is split over several
  programs so a 1024-wide output still fills the GPU (the last program of a tile sums the partials in
  a fixed order: results do not depend on timing).
- ``norm_linear(NormInput(hg, sumsq), eps, w)`` = ``rmsnorm(h) * g @ w.T`` computed as
  ``(hg @ w.T) / rms(h)`` with ``rms`` from the sums of squares ``linear_add`` wrote per column tile: the
  norm folded into the GEMM, with ``swiglu=True`` the gate/up projection with SwiGLU in the epilogue
  (``w = [gate | up]``).

so a Qwen3 layer is ``qkv = norm_linear`` -> attention -> ``h, hg = linear_add`` -> ``act = norm_linear``
(SwiGLU) -> ``h, hg = linear_add``: five kernels, no separate norm or residual kernel. Numerics: the
unfused path rounds ``h / rms(h)`` and then ``* g`` to 16 bits before the GEMM; here ``h * g`` is
rounded once and 1/rms scales the fp32 product.

With ``pdl=True`` (sm90+) each kernel is launched as a programmatic dependent launch: it starts
during the previous kernel, prefetches its own weights into L2, and waits only before it reads
activations, so the launch and the first weight reads of each kernel hide behind the one before.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

MAX_ROWS = 32  # one program covers every row up to this (weights are read once)


@dataclass(frozen=True)
class SkinnyTiles:
    """Tile sizes of the two kernels (measured on the H200, pplx-embed-0.6b shape: bench/l1_probe.py skinny)."""

    block_n: int = 32  # output columns a program of ``norm_linear`` computes
    block_k: int = 128
    add_block_n: int = 32  # output columns a program of ``linear_add`` computes
    add_block_k: int = 128
    split_k: int = 4  # programs sharing one ``linear_add`` tile's K (fewer where K has fewer blocks)
    num_warps: int = 4
    num_stages: int = 4


DEFAULT_TILES = SkinnyTiles()


def fits(hidden_size: int, q_size: int, intermediate_size: int, tiles: SkinnyTiles = DEFAULT_TILES) -> bool:
    """Whether the tiles divide a Qwen3 layer's sizes (hidden, num_heads * head_dim, intermediate)."""
    norm_ok = hidden_size % tiles.block_k == 0 and intermediate_size % tiles.block_n == 0 \
        and q_size % tiles.block_n == 0
    parts = hidden_size // tiles.add_block_n  # sums of squares per column tile, summed by norm_linear
    add_ok = hidden_size % tiles.add_block_n == 0 and parts & (parts - 1) == 0 and all(
        k % tiles.add_block_k == 0 for k in (q_size, intermediate_size))
    return norm_ok and add_ok


def _split_k(k: int, tiles: SkinnyTiles) -> int:
    split = tiles.split_k
    while split > 1 and k % (split * tiles.add_block_k):
        split //= 2
    return split


@functools.cache
def _kernels():  # type: ignore[no-untyped-def]  # Triton kernels are untyped
    from petal.engine.layers import triton_skinny

    return triton_skinny


def _prefetch_block(num_rows: int, num_cols: int) -> int:
    lines = num_rows * max(1, num_cols // 64)
    return 1 << (lines - 1).bit_length()


def _block_m(num_tokens: int) -> int:
    return 16 if num_tokens <= 16 else 32


@dataclass(frozen=True)
class NormInput:
    """What ``norm_linear`` reads for ``rmsnorm(h) * g``: ``hg = h * g`` ``[T, K]`` (16-bit) and
    ``sumsq [P, T]`` float32, partial sums of ``h**2`` over ``P`` column blocks (``P`` a power of two)."""

    hg: torch.Tensor
    sumsq: torch.Tensor


def norm_input(h: torch.Tensor, g: torch.Tensor) -> NormInput:
    """The first ``norm_linear``'s input, from ``h [T, K]`` and the norm weight ``g [K]`` (later ones come
    from ``linear_add(..., norm_weight=g)``)."""
    return NormInput(h * g, h.float().pow(2).sum(-1)[None, :])


def norm_linear(x: NormInput, eps: float, weight: torch.Tensor, *, swiglu: bool = False, pdl: bool = False,
                tiles: SkinnyTiles = DEFAULT_TILES) -> torch.Tensor:
    """``rmsnorm(h) * g @ weight.T`` (``x`` holds ``h * g`` and the sums of ``h**2``); with ``swiglu``
    ``silu(. @ gate.T) * (. @ up.T)``.

    ``x.hg [T, K]`` (``T <= MAX_ROWS``), ``weight [N, K]`` (``[2 * I, K]`` = gate | up with ``swiglu``):
    16-bit, CUDA, contiguous rows. Returns ``[T, N]`` (``[T, I]``) in ``x.hg``'s dtype.
    """
    hg, sumsq = x.hg, x.sumsq
    num_tokens, k = hg.shape
    n = weight.shape[0] // 2 if swiglu else weight.shape[0]
    num_parts = sumsq.shape[0]
    assert num_tokens <= MAX_ROWS and hg.stride(1) == 1 and weight.is_contiguous() and weight.shape[1] == k
    assert sumsq.shape == (num_parts, num_tokens) and sumsq.dtype == torch.float32 and sumsq.stride(1) == 1
    assert num_parts & (num_parts - 1) == 0 and n % tiles.block_n == 0 and k % tiles.block_k == 0, (n, k, tiles)
    out = torch.empty(num_tokens, n, dtype=hg.dtype, device=hg.device)
    if num_tokens:
        _kernels().norm_linear_kernel[(n // tiles.block_n, 1)](
            sumsq, hg, weight, out, num_tokens, sumsq.stride(0), hg.stride(0), out.stride(0), eps, N=n, K=k,
            BLOCK_M=_block_m(num_tokens), BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, SWIGLU=swiglu, PDL=pdl,
            PREFETCH_BLOCK=_prefetch_block(tiles.block_n, k), NUM_PARTS=num_parts, num_warps=tiles.num_warps,
            num_stages=tiles.num_stages, launch_pdl=pdl)
    return out


@functools.cache
def _workspace(device: torch.device, numel: int, num_tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    # NOTE: one fp32 partial-sum workspace and one set of tile counters per device and size, shared by
    # every call: calls on a device run one after another (one engine stream; with PDL a kernel waits for
    # the previous one before it touches either). Counters start at 0 and every call leaves them at 0.
    return (torch.empty(numel, dtype=torch.float32, device=device),
            torch.zeros(num_tiles, dtype=torch.int32, device=device))


def linear_add(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, *, out: torch.Tensor | None = None,
               norm_weight: torch.Tensor | None = None, pdl: bool = False,
               tiles: SkinnyTiles = DEFAULT_TILES) -> tuple[torch.Tensor, NormInput | None]:
    """``residual + x @ weight.T``: ``x [T, K]`` (``T <= MAX_ROWS``), ``weight [N, K]``, ``residual [T, N]``.

    16-bit, CUDA, contiguous rows; ``out`` may be ``residual`` itself (each output tile reads only its
    own residual tile). Returns ``(out, the next norm_linear's input)`` (the second ``None`` without
    ``norm_weight``): the sum, and ``out * norm_weight`` with the sums of ``out**2`` per column tile.
    """
    num_tokens, k = x.shape
    n = weight.shape[0]
    assert num_tokens <= MAX_ROWS and x.stride(1) == 1 and weight.is_contiguous() and weight.shape[1] == k
    assert residual.shape == (num_tokens, n) and residual.stride(1) == 1
    assert n % tiles.add_block_n == 0 and k % tiles.add_block_k == 0, (n, k, tiles)
    if out is None:
        out = torch.empty_like(residual)
    scaled = None if norm_weight is None else torch.empty_like(out)
    num_tiles = n // tiles.add_block_n
    sumsq = None if norm_weight is None else torch.empty(num_tiles, num_tokens, dtype=torch.float32, device=x.device)
    if num_tokens:
        block_m = _block_m(num_tokens)
        split = _split_k(k, tiles)
        ws, counts = _workspace(x.device, num_tiles * split * block_m * tiles.add_block_n, num_tiles)
        g = weight if norm_weight is None else norm_weight  # NOTE: not read unless SCALED
        sc = out if scaled is None else scaled
        ss = ws if sumsq is None else sumsq
        _kernels().linear_add_kernel[(num_tiles, split, 1)](
            x, weight, residual, out, g, sc, ss, ws, counts, num_tokens, x.stride(0), residual.stride(0), out.stride(0),
            sc.stride(0), num_tokens if sumsq is None else sumsq.stride(0),
            N=n, K=k, BLOCK_M=block_m, BLOCK_N=tiles.add_block_n, BLOCK_K=tiles.add_block_k, SPLIT_K=split,
            PDL=pdl, PREFETCH_BLOCK=_prefetch_block(tiles.add_block_n, k // split), SCALED=scaled is not None,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages, launch_pdl=pdl)
    return out, None if scaled is None or sumsq is None else NormInput(scaled, sumsq)

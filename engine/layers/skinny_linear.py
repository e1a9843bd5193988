"""GEMMs of up to 128 rows that stream the weights: Qwen3's layer as four of them around attention.

At 16-128 token rows a layer's GEMMs read 30 MB of weights (pplx-embed-0.6b) and do little
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

For the 16-slot bucket ``attention_add`` runs the attention (the one-key-block path of
``engine/layers/small_attention.py``) inside the O projection: each program attends for its own heads
and multiplies the result straight into its slice of the GEMM, so a Qwen3 layer is four kernels.

Tiles are chosen per bucket and per kernel (``BUCKET_TILES``); a row block of ``block_m`` rows is a
grid dimension, so a bucket of more rows than ``block_m`` reads each weight tile once per row block
(the later reads mostly from L2).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from petal.engine.layers.small_attention import LOG2_E, WHOLE_MAX_TOKENS, SmallAttention, attend


@dataclass(frozen=True)
class GemmTiles:
    """One kernel's tiles: ``block_m`` rows x ``block_n`` output columns a program, ``block_k`` deep steps;
    ``split_k`` programs share one output tile's K (``linear_add`` only; halved while K has fewer blocks)."""

    block_m: int = 16
    block_n: int = 32
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4


@dataclass(frozen=True)
class LayerTiles:
    """The tiles of a Qwen3 layer's four skinny kernels for one bucket."""

    qkv: GemmTiles  # norm_linear, [T, hidden] @ [hidden, (hq + 2 hk) d]
    o: GemmTiles  # linear_add, [T, hq d] @ [hq d, hidden]
    gate_up: GemmTiles  # norm_linear with SwiGLU, [T, hidden] @ [hidden, 2 I]
    down: GemmTiles  # linear_add, [T, I] @ [I, hidden]
    # attention_add (attention inside the O projection; block_m = the bucket, split_k divides the heads);
    # None: the bucket runs the attention kernel and linear_add apart
    attention_o: GemmTiles | None = None


def _tiles(block_m: int, norm_n: int = 32, add_n: int = 32, split_k: int = 4) -> LayerTiles:
    norm, add = GemmTiles(block_m, norm_n), GemmTiles(block_m, add_n, split_k=split_k)
    return LayerTiles(qkv=norm, o=add, gate_up=norm, down=add)


# Per bucket (token slots), measured on the H200 with the pplx-embed-0.6b shape (bench/l1_probe.py
# skinny_sweep: each kernel over its tile candidates, 28 distinct weights in a graph).
BUCKET_TILES: dict[int, LayerTiles] = {
    16: replace(_tiles(16), attention_o=GemmTiles(16, 32, split_k=8)),
    # NOTE: 32 and 64 rows run the attention apart: inside the O projection it cost 2.2 / 9.8 us a layer more
    # (bench/attention_o_probe.py ceiling), 16 rows gain 1.5 us
    # NOTE: 256-deep K steps where they paid (bench/l1_probe.py deep_k): half the dependent iterations of
    # the K loop and twice the bytes in flight a program; the chain 29.8 -> 28.1 (32 rows), 31.6 -> 30.0
    # (64), 35.2 -> 33.8 (128) us a layer. Not at 16 rows: the best of each kernel chained slower there.
    # NOTE: 64-row norm_linear tiles (wgmma) beat 32 at 32 rows
    32: LayerTiles(qkv=GemmTiles(64, 32, 256, num_stages=3), o=GemmTiles(32, 16, 256, split_k=2),
                   gate_up=GemmTiles(64, 32), down=GemmTiles(32, 32, split_k=4)),
    64: LayerTiles(qkv=GemmTiles(64, 32, 256, num_stages=3), o=GemmTiles(64, 16, 256, split_k=2, num_stages=3),
                   gate_up=GemmTiles(64, 32), down=GemmTiles(64, 32, split_k=4)),
    128: LayerTiles(qkv=GemmTiles(64, 64), o=GemmTiles(64, 32, split_k=2), gate_up=GemmTiles(64, 64),
                    down=GemmTiles(64, 32, 256, split_k=2, num_stages=3)),
}
MAX_ROWS = max(BUCKET_TILES)  # the largest bucket with measured tiles


SHALLOW_K = 128  # a K step every layer size the skinny path admits is a multiple of (the tuned ones are 128-256)


@dataclass(frozen=True)
class LayerSizes:
    """The widths of a Qwen3 layer the skinny kernels' tiles must divide."""

    hidden_size: int
    q_size: int  # num_heads * head_dim: the O projection's K
    intermediate_size: int


def _k_step(tiles: GemmTiles, k: int) -> GemmTiles:
    """``tiles``, or the same with 128-deep K steps (and 4 stages) when its K step does not divide ``k``."""
    return tiles if k % tiles.block_k == 0 else replace(tiles, block_k=SHALLOW_K, num_stages=4)


def layer_tiles(num_tokens: int, sizes: LayerSizes | None = None) -> LayerTiles:
    """The tiles of the smallest bucket in ``BUCKET_TILES`` that holds ``num_tokens`` rows; with ``sizes``,
    fitted to them: a kernel whose K its tuned K step does not divide takes ``SHALLOW_K``-deep steps.

    NOTE: the deeper steps were tuned on pplx-embed-0.6b's widths (1024 / 2048 / 3072); a model whose widths
    are multiples of 128 but not of 256 keeps the skinny path with the shallower steps."""
    for bucket in sorted(BUCKET_TILES):
        if num_tokens <= bucket:
            tiles = BUCKET_TILES[bucket]
            if sizes is None:
                return tiles
            return replace(tiles, qkv=_k_step(tiles.qkv, sizes.hidden_size), o=_k_step(tiles.o, sizes.q_size),
                           gate_up=_k_step(tiles.gate_up, sizes.hidden_size),
                           down=_k_step(tiles.down, sizes.intermediate_size))
    raise ValueError(f"{num_tokens} rows: the skinny kernels have tiles up to {max(BUCKET_TILES)} rows")


def fits(hidden_size: int, q_size: int, intermediate_size: int, tiles: LayerTiles | None = None) -> bool:
    """Whether the tiles (of every bucket by default, fitted to these sizes by ``layer_tiles``) divide a Qwen3
    layer's sizes (hidden, num_heads * head_dim, intermediate)."""
    if tiles is None:
        sizes = LayerSizes(hidden_size, q_size, intermediate_size)
        return all(fits(hidden_size, q_size, intermediate_size, layer_tiles(bucket, sizes)) for bucket in BUCKET_TILES)
    norm_ok = all(hidden_size % t.block_k == 0 for t in (tiles.qkv, tiles.gate_up)) \
        and q_size % tiles.qkv.block_n == 0 and intermediate_size % tiles.gate_up.block_n == 0
    add_ok = True
    for t, k in ((tiles.o, q_size), (tiles.down, intermediate_size)):
        parts = hidden_size // t.block_n  # sums of squares per column tile, summed by norm_linear
        add_ok = add_ok and hidden_size % t.block_n == 0 and parts & (parts - 1) == 0 and k % t.block_k == 0
    return norm_ok and add_ok


def attention_fits(hidden_size: int, tiles: GemmTiles) -> bool:
    """Whether ``attention_add`` with ``tiles`` fits a layer: the column tiles divide the hidden size (in a
    power of two of them, for the next norm's partial sums). Its split over heads adapts (``_head_split``)."""
    parts = hidden_size // tiles.block_n
    return hidden_size % tiles.block_n == 0 and parts & (parts - 1) == 0


def _head_split(num_heads: int, tiles: GemmTiles) -> int:
    split = tiles.split_k
    while split > 1 and num_heads % split:
        split //= 2
    return split


def _split_k(k: int, tiles: GemmTiles) -> int:
    split = tiles.split_k
    while split > 1 and k % (split * tiles.block_k):
        split //= 2
    return split


@functools.cache
def _kernels():  # type: ignore[no-untyped-def]  # Triton kernels are untyped
    from petal.engine.layers import triton_skinny

    return triton_skinny


def _prefetch_block(num_rows: int, num_cols: int) -> int:
    lines = num_rows * max(1, num_cols // 64)
    return 1 << (lines - 1).bit_length()


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
                tiles: GemmTiles | None = None) -> torch.Tensor:
    """``rmsnorm(h) * g @ weight.T`` (``x`` holds ``h * g`` and the sums of ``h**2``); with ``swiglu``
    ``silu(. @ gate.T) * (. @ up.T)``.

    ``x.hg [T, K]`` (``T <= MAX_ROWS``), ``weight [N, K]`` (``[2 * I, K]`` = gate | up with ``swiglu``):
    16-bit, CUDA, contiguous rows. Returns ``[T, N]`` (``[T, I]``) in ``x.hg``'s dtype. ``tiles``: by
    default the bucket's (``layer_tiles(T)``) QKV or gate/up tiles.
    """
    hg, sumsq = x.hg, x.sumsq
    num_tokens, k = hg.shape
    n = weight.shape[0] // 2 if swiglu else weight.shape[0]
    num_parts = sumsq.shape[0]
    assert num_tokens <= MAX_ROWS and hg.stride(1) == 1 and weight.is_contiguous() and weight.shape[1] == k
    assert sumsq.shape == (num_parts, num_tokens) and sumsq.dtype == torch.float32 and sumsq.stride(1) == 1
    if tiles is None:
        tiles = _k_step(layer_tiles(num_tokens).gate_up if swiglu else layer_tiles(num_tokens).qkv, k)
    assert num_parts & (num_parts - 1) == 0 and n % tiles.block_n == 0 and k % tiles.block_k == 0, (n, k, tiles)
    out = torch.empty(num_tokens, n, dtype=hg.dtype, device=hg.device)
    if num_tokens:
        grid = (n // tiles.block_n, -(-num_tokens // tiles.block_m))
        _kernels().norm_linear_kernel[grid](
            sumsq, hg, weight, out, num_tokens, sumsq.stride(0), hg.stride(0), out.stride(0), eps, N=n, K=k,
            BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, SWIGLU=swiglu, PDL=pdl,
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


@dataclass(frozen=True)
class _AddOutputs:
    """What an add kernel writes: the sum, and with a norm weight the next ``norm_linear``'s input."""

    out: torch.Tensor
    scaled: torch.Tensor | None
    sumsq: torch.Tensor | None

    @classmethod
    def make(cls, residual: torch.Tensor, out: torch.Tensor | None, norm_weight: torch.Tensor | None,
             col_tiles: int) -> _AddOutputs:
        out = torch.empty_like(residual) if out is None else out
        if norm_weight is None:
            return cls(out, None, None)
        sumsq = torch.empty(col_tiles, residual.shape[0], dtype=torch.float32, device=residual.device)
        return cls(out, torch.empty_like(out), sumsq)

    def args(self, weight: torch.Tensor, norm_weight: torch.Tensor | None, num_tiles: int, numel: int
             ) -> tuple[torch.Tensor, ...]:
        """``g, scaled, sumsq, workspace, counters`` as the kernels take them (unused ones point elsewhere)."""
        ws, counts = _workspace(self.out.device, numel, num_tiles)
        g = weight if norm_weight is None else norm_weight  # NOTE: not read unless SCALED
        return (g, self.out if self.scaled is None else self.scaled, ws if self.sumsq is None else self.sumsq,
                ws, counts)

    def strides(self) -> tuple[int, int]:
        scaled = self.out if self.scaled is None else self.scaled
        return scaled.stride(0), self.out.shape[0] if self.sumsq is None else self.sumsq.stride(0)

    def result(self) -> tuple[torch.Tensor, NormInput | None]:
        return self.out, None if self.scaled is None or self.sumsq is None else NormInput(self.scaled, self.sumsq)


def linear_add(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, *, out: torch.Tensor | None = None,
               norm_weight: torch.Tensor | None = None, pdl: bool = False,
               tiles: GemmTiles | None = None) -> tuple[torch.Tensor, NormInput | None]:
    """``residual + x @ weight.T``: ``x [T, K]`` (``T <= MAX_ROWS``), ``weight [N, K]``, ``residual [T, N]``.

    16-bit, CUDA, contiguous rows; ``out`` may be ``residual`` itself (each output tile reads only its
    own residual tile). Returns ``(out, the next norm_linear's input)`` (the second ``None`` without
    ``norm_weight``): the sum, and ``out * norm_weight`` with the sums of ``out**2`` per column tile.
    ``tiles``: by default the bucket's (``layer_tiles(T)``) O-projection tiles.
    """
    num_tokens, k = x.shape
    n = weight.shape[0]
    assert num_tokens <= MAX_ROWS and x.stride(1) == 1 and weight.is_contiguous() and weight.shape[1] == k
    assert residual.shape == (num_tokens, n) and residual.stride(1) == 1
    if tiles is None:
        tiles = _k_step(layer_tiles(num_tokens).o, k)
    assert n % tiles.block_n == 0 and k % tiles.block_k == 0, (n, k, tiles)
    col_tiles = n // tiles.block_n
    outputs = _AddOutputs.make(residual, out, norm_weight, col_tiles)
    if num_tokens:
        row_blocks = -(-num_tokens // tiles.block_m)
        split = _split_k(k, tiles)
        num_tiles = col_tiles * row_blocks
        g, sc, ss, ws, counts = outputs.args(weight, norm_weight, num_tiles,
                                             num_tiles * split * tiles.block_m * tiles.block_n)
        _kernels().linear_add_kernel[(col_tiles, split, row_blocks)](
            x, weight, residual, outputs.out, g, sc, ss, ws, counts, num_tokens, x.stride(0), residual.stride(0),
            outputs.out.stride(0), *outputs.strides(), N=n, K=k, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
            BLOCK_K=tiles.block_k, SPLIT_K=split, PDL=pdl, PREFETCH_BLOCK=_prefetch_block(tiles.block_n, k // split),
            SCALED=outputs.scaled is not None, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
            launch_pdl=pdl)
    return outputs.result()


def attention_add(qkv: torch.Tensor, attention: SmallAttention, weight: torch.Tensor, residual: torch.Tensor, *,
                  out: torch.Tensor | None = None, norm_weight: torch.Tensor | None = None, pdl: bool = False,
                  tiles: GemmTiles) -> tuple[torch.Tensor, NormInput | None]:
    """``residual + small_attention(qkv) @ weight.T`` in one kernel, for a step of at most ``tiles.block_m``
    (<= ``WHOLE_MAX_TOKENS``) token slots.

    ``qkv [T, (Hq + 2 Hk) D]`` as ``small_attention`` takes it, ``attention`` its other inputs, ``weight
    [N, Hq D]`` (the O projection), ``residual [T, N]``: 16-bit, CUDA, contiguous rows. Returns what
    ``linear_add`` returns; ``out`` may be ``residual``. The attention output is never written out.
    """
    num_tokens = qkv.shape[0]
    n, k = weight.shape
    a = attention
    assert num_tokens <= tiles.block_m <= WHOLE_MAX_TOKENS and qkv.stride(1) == 1 and weight.is_contiguous()
    assert k == a.num_heads * a.head_dim and residual.shape == (num_tokens, n) and residual.stride(1) == 1
    assert attention_fits(n, tiles), (n, tiles)
    col_tiles = n // tiles.block_n
    split = _head_split(a.num_heads, tiles)
    outputs = _AddOutputs.make(residual, out, norm_weight, col_tiles)
    if num_tokens:
        g, sc, ss, ws, counts = outputs.args(weight, norm_weight, col_tiles,
                                             col_tiles * split * tiles.block_m * tiles.block_n)
        positions, table, qk_weights = a.kernel_inputs()
        _kernels().attention_add_kernel[(col_tiles, split)](
            qkv, qkv.stride(0), a.token_seq_ids, positions, table, qk_weights, a.eps, a.scale * LOG2_E,
            weight, residual, outputs.out, g, sc, ss, ws, counts, num_tokens, residual.stride(0),
            outputs.out.stride(0), *outputs.strides(), N=n, Q_HEADS=a.num_heads,
            K_HEADS=a.num_kv_heads, HALF=a.head_dim // 2, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n,
            SPLIT_K=split, CAUSAL=a.causal, NORM_ROPE=a.qk_norm_weights is not None, PDL=pdl,
            PREFETCH_BLOCK=_prefetch_block(tiles.block_n, k // split), SCALED=outputs.scaled is not None,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages, launch_pdl=pdl)
    return outputs.result()


@dataclass(frozen=True)
class SkinnyLayerWeights:
    """A Qwen3 layer's weights as the skinny kernels read them (Hugging Face names in the comments)."""

    input_norm: torch.Tensor  # [hidden] input_layernorm.weight
    qkv: torch.Tensor  # [(Hq + 2 Hk) D, hidden] self_attn.qkv_proj.weight (q | k | v)
    o: torch.Tensor  # [hidden, Hq D] self_attn.o_proj.weight
    post_norm: torch.Tensor  # [hidden] post_attention_layernorm.weight
    gate_up: torch.Tensor  # [2 I, hidden] mlp.gate_up_proj.weight (gate | up)
    down: torch.Tensor  # [hidden, I] mlp.down_proj.weight
    qk_norm: torch.Tensor  # [2, D] self_attn.q_norm.weight and k_norm.weight
    eps: float  # the RMSNorms'


@dataclass(frozen=True)
class SkinnyOptions:
    """How a bucket's skinny layers launch (``engine/small_batch.py`` decides)."""

    pdl: bool = False  # programmatic dependent launches (sm90+)
    attention_in_o: bool = False  # the attention inside the O projection, where the bucket's tiles have it


def skinny_layer(h: torch.Tensor, x: NormInput, layer: SkinnyLayerWeights, after: SkinnyLayerWeights | None,
                 attention: SmallAttention, tiles: LayerTiles, options: SkinnyOptions) -> NormInput | None:
    """One Qwen3 layer on the residual stream ``h [T, hidden]``, in place, as the skinny kernels:
    ``qkv = norm_linear`` -> attention -> ``linear_add`` (O) -> ``norm_linear`` (gate/up, SwiGLU) ->
    ``linear_add`` (down); with ``options.attention_in_o`` and ``tiles.attention_o`` the attention and O are
    one ``attention_add``.

    ``x`` is ``norm_input(h, layer.input_norm)`` (or what the layer before returned); returns the next
    layer's (``None`` when there is no layer ``after`` this one, whose norm weight the last kernel applies).
    ``attention``: the step's inputs besides ``qkv`` (its q/k norm weights are this layer's).
    """
    pdl = options.pdl
    attention = replace(attention, qk_norm_weights=layer.qk_norm)
    num_tokens = h.shape[0]
    qkv = norm_linear(x, layer.eps, layer.qkv, pdl=pdl, tiles=tiles.qkv)
    fused = tiles.attention_o
    if options.attention_in_o and fused is not None and num_tokens <= fused.block_m:
        _, mid = attention_add(qkv, attention, layer.o, h, out=h, norm_weight=layer.post_norm, pdl=pdl, tiles=fused)
    else:
        attended = attend(qkv, attention, pdl=pdl).view(num_tokens, layer.o.shape[1])
        _, mid = linear_add(attended, layer.o, h, out=h, norm_weight=layer.post_norm, pdl=pdl, tiles=tiles.o)
    assert mid is not None
    act = norm_linear(mid, layer.eps, layer.gate_up, swiglu=True, pdl=pdl, tiles=tiles.gate_up)
    return linear_add(act, layer.down, h, out=h, norm_weight=None if after is None else after.input_norm, pdl=pdl,
                      tiles=tiles.down)[1]

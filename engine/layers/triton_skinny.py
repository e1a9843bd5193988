"""Triton kernels of ``engine/layers/skinny_linear.py`` (imported only where Triton is).

Kept at module level, apart from the wrappers, because Triton resolves the helpers a kernel calls
through the kernel's module globals.

Both kernels take ``PDL`` (programmatic dependent launch, sm90+): launched with ``launch_pdl=True``
a kernel's programs start while the previous kernel still runs, ask L2 for their own weight slice
(which no earlier kernel writes), then wait (``gdc_wait``) for the previous kernel's results before
they read any activation. Only after that wait do they let the next kernel launch, so at most one
kernel ahead is prefetching.
"""

import triton
import triton.language as tl

from petal.engine.layers.triton_attention import _whole_head

LINE_ELEMENTS = 64  # 16-bit elements in a 128-byte cache line


@triton.jit
def _prefetch_l2(w_ptr, row0, num_rows: tl.constexpr, col0, num_cols: tl.constexpr, stride_row,
                 BLOCK: tl.constexpr):
    # one L2 prefetch per 128-byte line of w[row0 : row0 + num_rows, col0 : col0 + num_cols] (16-bit)
    lines_per_row: tl.constexpr = num_cols // 64
    idx = tl.arange(0, BLOCK)
    idx = tl.where(idx < num_rows * lines_per_row, idx, 0)  # NOTE: spare lanes repeat line 0 (harmless)
    r = idx // lines_per_row
    c = (idx % lines_per_row) * 64
    ptrs = w_ptr + (row0 + r).to(tl.int64) * stride_row + col0 + c
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def norm_linear_kernel(ss_ptr, hg_ptr, w_ptr, out_ptr, num_tokens, stride_ss, stride_hg, stride_out, eps,
                       N: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, SWIGLU: tl.constexpr, PDL: tl.constexpr,
                       PREFETCH_BLOCK: tl.constexpr, NUM_PARTS: tl.constexpr):
    """``out = (hg @ w.T) / rms(h)`` with ``hg = h * g`` (``SWIGLU``: ``silu(gate) * up`` of the two halves);
    ``ss [NUM_PARTS, T]``: partial sums of ``h**2`` (over column blocks) that add up to each row's.

    NOTE: the norm weight comes in already multiplied into ``hg`` and the sum of squares already summed
    over column blocks (both by the kernel that wrote ``h``); the 1/rms is a per-row scale of the product.
    So ``hg`` goes straight from memory to the tensor cores: any elementwise work on the GEMM's input in
    the K loop keeps Triton from pipelining its loads (measured: 8.4 against 5.6 us, gate/up at 16 rows),
    and a load of whole rows of ``h`` for the norm cost ~1.5 us more.
    """
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    col0 = pid_n * BLOCK_N
    if PDL:
        _prefetch_l2(w_ptr, col0, BLOCK_N, 0, K, K, PREFETCH_BLOCK)
        if SWIGLU:
            _prefetch_l2(w_ptr, N + col0, BLOCK_N, 0, K, K, PREFETCH_BLOCK)
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    ty = out_ptr.dtype.element_ty
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = col0 + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_mask = rows[:, None] < num_tokens
    parts = tl.arange(0, NUM_PARTS)
    ss = tl.load(ss_ptr + parts[:, None] * stride_ss + rows[None, :], mask=rows[None, :] < num_tokens, other=0.0)
    hg_ptrs = hg_ptr + rows.to(tl.int64)[:, None] * stride_hg + ks[None, :]
    w_ptrs = w_ptr + cols.to(tl.int64)[:, None] * K + ks[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        hg = tl.load(hg_ptrs + k0, mask=row_mask, other=0.0)
        acc = tl.dot(hg, tl.trans(tl.load(w_ptrs + k0)), acc)
        if SWIGLU:
            acc_up = tl.dot(hg, tl.trans(tl.load(w_ptrs + N * K + k0)), acc_up)
    sumsq = tl.sum(ss, axis=0)  # in part order: deterministic
    inv_rms = 1.0 / tl.sqrt(sumsq / K + eps)
    out = (acc * inv_rms[:, None]).to(ty)
    if SWIGLU:  # rounded as the unfused GEMM's output would be, then SwiGLU in fp32
        gate = out.to(tl.float32)
        up = (acc_up * inv_rms[:, None]).to(ty).to(tl.float32)
        out = (gate / (1.0 + tl.exp(-gate)) * up).to(ty)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_out + cols[None, :], out, mask=row_mask)


@triton.jit
def linear_add_kernel(x_ptr, w_ptr, res_ptr, out_ptr, g_ptr, scaled_ptr, ss_ptr, ws_ptr, count_ptr, num_tokens,
                      stride_x, stride_res, stride_out, stride_scaled, stride_ss, N: tl.constexpr, K: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                      PDL: tl.constexpr, PREFETCH_BLOCK: tl.constexpr, SCALED: tl.constexpr):
    """``out = residual + x @ w.T`` with K split over ``SPLIT_K`` programs; the last one of a tile adds up.
    With ``SCALED`` it also writes ``scaled = out * g`` and ``ss[tile, row]`` = the sum of ``out**2`` over the
    tile's columns (the next norm_linear's inputs).

    Each program writes its fp32 partial tile to ``ws`` and bumps the tile's counter; the program that
    sees the count reach ``SPLIT_K - 1`` sums the partials in split order (deterministic), rounds the
    product to 16 bits as the unfused GEMM would, adds the residual, stores, and resets the counter
    to 0 for the next call (or graph replay).
    """
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    k_per_split: tl.constexpr = K // SPLIT_K
    col0 = pid_n * BLOCK_N
    k_start = pid_k * k_per_split
    if PDL:
        _prefetch_l2(w_ptr, col0, BLOCK_N, k_start, k_per_split, K, PREFETCH_BLOCK)
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    m_idx = tl.arange(0, BLOCK_M)
    n_idx = tl.arange(0, BLOCK_N)
    rows = pid_m * BLOCK_M + m_idx
    cols = col0 + n_idx
    ks = tl.arange(0, BLOCK_K)
    row_mask = rows[:, None] < num_tokens
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_x + k_start + ks[None, :]
    w_ptrs = w_ptr + cols.to(tl.int64)[:, None] * K + k_start + ks[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, k_per_split, BLOCK_K):
        x = tl.load(x_ptrs + k0, mask=row_mask, other=0.0)
        acc = tl.dot(x, tl.trans(tl.load(w_ptrs + k0)), acc)
    _add_partial(acc, res_ptr, out_ptr, g_ptr, scaled_ptr, ss_ptr, ws_ptr, count_ptr, num_tokens, stride_res,
                 stride_out, stride_scaled, stride_ss, pid_n, pid_k, pid_m, N, BLOCK_M, BLOCK_N, SPLIT_K, SCALED)


@triton.jit
def attention_add_kernel(qkv_ptr, stride_t, seq_ptr, pos_ptr, table_ptr, qk_w_ptr, eps, qk_scale, w_ptr, res_ptr,
                         out_ptr, g_ptr, scaled_ptr, ss_ptr, ws_ptr, count_ptr, num_tokens, stride_res, stride_out,
                         stride_scaled, stride_ss, N: tl.constexpr, Q_HEADS: tl.constexpr, K_HEADS: tl.constexpr,
                         HALF: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr,
                         CAUSAL: tl.constexpr, NORM_ROPE: tl.constexpr, PDL: tl.constexpr,
                         PREFETCH_BLOCK: tl.constexpr, SCALED: tl.constexpr):
    """``out = residual + attention(qkv) @ w.T`` for a step of at most ``BLOCK_M`` tokens: the small
    attention's one-key-block path (``_whole_head``) and the O projection in one kernel.

    K (the attention output's width, ``Q_HEADS`` heads) is split over ``SPLIT_K`` programs per output tile;
    each program computes the attention of its own heads for every token (each head's output is one
    ``head_dim``-deep step of the GEMM, rounded to 16 bits as the separate kernel would store it) and never
    writes it out; then the split-K sum, residual add and next-norm inputs of ``linear_add_kernel``.
    NOTE: a head's attention is recomputed by each of the ``N // BLOCK_N`` column tiles: a few kFLOP each.
    """
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    head_dim: tl.constexpr = 2 * HALF
    K: tl.constexpr = Q_HEADS * head_dim
    heads_per_split: tl.constexpr = Q_HEADS // SPLIT_K
    k_start = pid_k * (heads_per_split * head_dim)
    col0 = pid_n * BLOCK_N
    if PDL:
        _prefetch_l2(w_ptr, col0, BLOCK_N, k_start, heads_per_split * head_dim, K, PREFETCH_BLOCK)
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    ty = out_ptr.dtype.element_ty
    rows = tl.arange(0, BLOCK_M)
    row_mask = rows < num_tokens
    cols = col0 + tl.arange(0, BLOCK_N)
    w_ptrs = w_ptr + cols.to(tl.int64)[:, None] * K + k_start + tl.arange(0, head_dim)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in tl.static_range(heads_per_split):
        head = pid_k * heads_per_split + i
        kv_head = head // (Q_HEADS // K_HEADS)
        attended = _whole_head(qkv_ptr, stride_t, seq_ptr, pos_ptr, table_ptr, qk_w_ptr, eps, qk_scale, num_tokens,
                               rows, row_mask, head, (Q_HEADS + kv_head) * head_dim,
                               (Q_HEADS + K_HEADS + kv_head) * head_dim, HALF, BLOCK_M, CAUSAL, NORM_ROPE)
        acc = tl.dot(attended.to(ty), tl.trans(tl.load(w_ptrs + i * head_dim)), acc)
    _add_partial(acc, res_ptr, out_ptr, g_ptr, scaled_ptr, ss_ptr, ws_ptr, count_ptr, num_tokens, stride_res,
                 stride_out, stride_scaled, stride_ss, pid_n, pid_k, 0, N, BLOCK_M, BLOCK_N, SPLIT_K, SCALED)


@triton.jit
def _add_partial(acc, res_ptr, out_ptr, g_ptr, scaled_ptr, ss_ptr, ws_ptr, count_ptr, num_tokens, stride_res,
                 stride_out, stride_scaled, stride_ss, pid_n, pid_k, pid_m, N: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, SPLIT_K: tl.constexpr, SCALED: tl.constexpr):
    # a program's fp32 partial product ``acc`` of one output tile: written to ``ws``; the last of the tile's
    # SPLIT_K programs sums them in split order, adds the residual, stores (and with SCALED the next norm's inputs)
    ty = out_ptr.dtype.element_ty
    m_idx = tl.arange(0, BLOCK_M)
    n_idx = tl.arange(0, BLOCK_N)
    rows = pid_m * BLOCK_M + m_idx
    cols = pid_n * BLOCK_N + n_idx
    row_mask = rows[:, None] < num_tokens
    tile = pid_m * (N // BLOCK_N) + pid_n
    tile_ws = ws_ptr + tile.to(tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N) + m_idx[:, None] * BLOCK_N + n_idx[None, :]
    tl.store(tile_ws + pid_k * (BLOCK_M * BLOCK_N), acc)
    # NOTE: every thread's partial must be written before one thread publishes the count (release),
    # and every thread must read after that thread saw the last count (acquire): barriers both sides.
    tl.debug_barrier()
    count = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
    tl.debug_barrier()
    if count == SPLIT_K - 1:
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for split in range(SPLIT_K):
            total += tl.load(tile_ws + split * (BLOCK_M * BLOCK_N), cache_modifier=".cg")
        res = tl.load(res_ptr + rows.to(tl.int64)[:, None] * stride_res + cols[None, :], mask=row_mask, other=0.0)
        out = total.to(ty).to(tl.float32) + res.to(tl.float32)
        out16 = out.to(ty)
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_out + cols[None, :], out16, mask=row_mask)
        if SCALED:
            g = tl.load(g_ptr + cols).to(tl.float32)
            out32 = out16.to(tl.float32)
            tl.store(scaled_ptr + rows.to(tl.int64)[:, None] * stride_scaled + cols[None, :],
                     (out32 * g[None, :]).to(ty), mask=row_mask)
            tl.store(ss_ptr + pid_n * stride_ss + rows, tl.sum(out32 * out32, axis=1), mask=rows < num_tokens)
        tl.atomic_xchg(count_ptr + tile, 0, sem="relaxed", scope="gpu")

"""Triton kernels of ``engine/layers/small_attention.py`` (imported only where Triton is).

Kept at module level, apart from the wrapper, because Triton resolves the helpers a kernel calls
through the kernel's module globals.
"""

import triton
import triton.language as tl


@triton.jit
def _norm_rope(x1, x2, pos, table_ptr, w_row, eps, HALF: tl.constexpr):
    # x1, x2: [R, HALF] fp32 halves of one head; pos: [R] int32 -> RMSNorm * w, then NeoX RoPE
    d = tl.arange(0, HALF)[None, :]
    inv_rms = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)
    x1 = x1 * inv_rms[:, None] * tl.load(w_row + d).to(tl.float32)
    x2 = x2 * inv_rms[:, None] * tl.load(w_row + HALF + d).to(tl.float32)
    row = table_ptr + pos.to(tl.int64)[:, None] * (2 * HALF)
    cos = tl.load(row + d)
    sin = tl.load(row + HALF + d)
    return x1 * cos - x2 * sin, x2 * cos + x1 * sin


@triton.jit
def _whole_head(qkv_ptr, stride_t, seq_ptr, pos_ptr, table_ptr, w_ptr, eps, qk_scale, num_tokens, rows, row_mask,
                head, k_col, v_col, HALF: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                NORM_ROPE: tl.constexpr):
    # one head's attention for ``rows`` over keys 0..num_tokens-1 (all of them in one block, loads first):
    # returns [rows, head_dim] float32 (``engine/layers/skinny_linear.py``'s attention + O kernel uses it too)
    head_dim: tl.constexpr = 2 * HALF
    ty = qkv_ptr.dtype.element_ty
    d = tl.arange(0, HALF)[None, :]
    dv = tl.arange(0, 2 * HALF)[None, :]
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < num_tokens
    q_ptr = qkv_ptr + rows.to(tl.int64)[:, None] * stride_t + head * head_dim
    k_ptr = qkv_ptr + cols.to(tl.int64)[:, None] * stride_t + k_col
    q1 = tl.load(q_ptr + d, mask=row_mask[:, None], other=0.0).to(tl.float32)
    q2 = tl.load(q_ptr + HALF + d, mask=row_mask[:, None], other=0.0).to(tl.float32)
    k1 = tl.load(k_ptr + d, mask=col_mask[:, None], other=0.0).to(tl.float32)
    k2 = tl.load(k_ptr + HALF + d, mask=col_mask[:, None], other=0.0).to(tl.float32)
    v = tl.load(qkv_ptr + cols.to(tl.int64)[:, None] * stride_t + v_col + dv, mask=col_mask[:, None], other=0.0)
    seq_q = tl.load(seq_ptr + rows, mask=row_mask, other=-1)
    seq_k = tl.load(seq_ptr + cols, mask=col_mask, other=-2)
    if NORM_ROPE:
        pos_q = tl.load(pos_ptr + rows, mask=row_mask, other=0)
        pos_k = tl.load(pos_ptr + cols, mask=col_mask, other=0)
        q1, q2 = _norm_rope(q1, q2, pos_q, table_ptr, w_ptr, eps, HALF)
        k1, k2 = _norm_rope(k1, k2, pos_k, table_ptr, w_ptr + head_dim, eps, HALF)
    # NOTE: rounded to the activation dtype before the products, as in the blocked path
    scores = tl.dot(q1.to(ty), tl.trans(k1.to(ty))) + tl.dot(q2.to(ty), tl.trans(k2.to(ty)))  # [BLOCK_M, BLOCK_N]
    valid = seq_q[:, None] == seq_k[None, :]
    if CAUSAL:
        valid = valid & (cols[None, :] <= rows[:, None])
    scores = tl.where(valid, scores * qk_scale, -1.0e30)
    m = tl.max(scores, axis=1)
    p = tl.where(valid, tl.exp2(scores - m[:, None]), 0.0)
    return tl.dot(p.to(ty), v) / tl.maximum(tl.sum(p, axis=1), 1e-30)[:, None]


@triton.jit
def _whole_bucket(qkv_ptr, stride_t, out_ptr, stride_out, seq_ptr, pos_ptr, table_ptr, w_ptr, eps, qk_scale,
                  num_tokens, rows, row_mask, head, k_col, v_col, HALF: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr, NORM_ROPE: tl.constexpr):
    out = _whole_head(qkv_ptr, stride_t, seq_ptr, pos_ptr, table_ptr, w_ptr, eps, qk_scale, num_tokens, rows,
                      row_mask, head, k_col, v_col, HALF, BLOCK_N, CAUSAL, NORM_ROPE)
    dv = tl.arange(0, 2 * HALF)[None, :]
    out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_out + head * 2 * HALF + dv
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])


@triton.jit
def small_attention_kernel(qkv_ptr, stride_t, out_ptr, stride_out, seq_ptr, cu_ptr, pos_ptr, table_ptr, w_ptr,
                           eps, qk_scale, num_tokens,
                           Q_HEADS: tl.constexpr, K_HEADS: tl.constexpr, HALF: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                           NORM_ROPE: tl.constexpr, PDL: tl.constexpr, WHOLE: tl.constexpr = False):
    if PDL:  # launched during the previous kernel: wait for its qkv, then let the next kernel start
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    head = tl.program_id(0)
    first_row = tl.program_id(1) * BLOCK_M
    kv_head = head // (Q_HEADS // K_HEADS)
    head_dim: tl.constexpr = 2 * HALF
    ty = qkv_ptr.dtype.element_ty
    d = tl.arange(0, HALF)[None, :]
    dv = tl.arange(0, 2 * HALF)[None, :]
    rows = first_row + tl.arange(0, BLOCK_M)
    row_mask = rows < num_tokens
    k_col = Q_HEADS * head_dim + kv_head * head_dim
    v_col = (Q_HEADS + K_HEADS) * head_dim + kv_head * head_dim
    if WHOLE:
        # every token slot of the step is one key block (num_tokens <= BLOCK_N): q, k, v, the sequence ids
        # and positions are loaded at once, with no offsets to look up first (their loads would come one
        # after another); the sequence ids mask the keys of other sequences.
        _whole_bucket(qkv_ptr, stride_t, out_ptr, stride_out, seq_ptr, pos_ptr, table_ptr, w_ptr, eps, qk_scale,
                      num_tokens, rows, row_mask, head, k_col, v_col, HALF, BLOCK_N, CAUSAL, NORM_ROPE)
        return
    q_ptr = qkv_ptr + rows.to(tl.int64)[:, None] * stride_t + head * head_dim
    q1 = tl.load(q_ptr + d, mask=row_mask[:, None], other=0.0).to(tl.float32)
    q2 = tl.load(q_ptr + HALF + d, mask=row_mask[:, None], other=0.0).to(tl.float32)
    if NORM_ROPE:
        pos_q = tl.load(pos_ptr + rows, mask=row_mask, other=0)
        q1, q2 = _norm_rope(q1, q2, pos_q, table_ptr, w_ptr, eps, HALF)
    # NOTE: q and k are rounded to the activation dtype before the product, as the unfused path
    # (in-place norm + RoPE, then the attention kernel) does.
    q1 = q1.to(ty)
    q2 = q2.to(ty)
    seq_q = tl.load(seq_ptr + rows, mask=row_mask, other=-1)
    last_row = tl.minimum(first_row + BLOCK_M, num_tokens) - 1
    key_start = tl.load(cu_ptr + tl.load(seq_ptr + first_row))
    key_end = tl.load(cu_ptr + tl.load(seq_ptr + last_row) + 1)
    if CAUSAL:
        key_end = tl.minimum(key_end, last_row + 1)
    # NOTE: a finite start for the running max keeps fully masked blocks at exp(-inf) = 0, not NaN.
    m_i = tl.full((BLOCK_M,), -1.0e30, dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, 2 * HALF), dtype=tl.float32)
    for start in range(key_start, key_end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_mask = cols < key_end
        k_ptr = qkv_ptr + cols.to(tl.int64)[:, None] * stride_t + k_col
        k1 = tl.load(k_ptr + d, mask=col_mask[:, None], other=0.0).to(tl.float32)
        k2 = tl.load(k_ptr + HALF + d, mask=col_mask[:, None], other=0.0).to(tl.float32)
        if NORM_ROPE:
            pos_k = tl.load(pos_ptr + cols, mask=col_mask, other=0)
            k1, k2 = _norm_rope(k1, k2, pos_k, table_ptr, w_ptr + head_dim, eps, HALF)
        scores = tl.dot(q1, tl.trans(k1.to(ty))) + tl.dot(q2, tl.trans(k2.to(ty)))  # [BLOCK_M, BLOCK_N]
        seq_k = tl.load(seq_ptr + cols, mask=col_mask, other=-2)
        valid = seq_q[:, None] == seq_k[None, :]
        if CAUSAL:
            valid = valid & (cols[None, :] <= rows[:, None])
        scores = tl.where(valid, scores * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(qkv_ptr + cols.to(tl.int64)[:, None] * stride_t + v_col + dv, mask=col_mask[:, None],
                    other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(ty), v)
        m_i = m_new
    out = acc / tl.maximum(l_i, 1e-30)[:, None]
    out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_out + head * head_dim + dv
    tl.store(out_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_mask[:, None])

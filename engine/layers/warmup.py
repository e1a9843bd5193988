"""Triton kernels compiled in a background thread while the weights load (``start_warmup``).

A cold compile of the fused kernels took ~1.4 s on the H200 host; started beside the weight load
it costs the first step nothing. The warm-up calls each kernel the model will run with dummy
inputs of the real calls' dtypes, strides, alignments and integer specialisations, so Triton
compiles (and caches on disk) the very variant the model launches.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from petal.engine.batch import token_buckets
from petal.engine.config import ModelConfig
from petal.engine.layers.fused_mlp import fits as fused_mlp_fits
from petal.engine.layers.fused_mlp import gate_up_silu
from petal.engine.layers.skinny_linear import (
    LayerSizes,
    SkinnyLayerWeights,
    SkinnyOptions,
    layer_tiles,
    norm_input,
    skinny_layer,
)
from petal.engine.layers.small_attention import SMALL_ATTENTION_HEAD_DIMS, SmallAttention, attend
from petal.engine.layers.tma_mlp import fits as tma_mlp_fits
from petal.engine.layers.tma_mlp import gate_up_silu_tma, tma_available
from petal.engine.layers.triton_kernels import add_layer_norm, qk_norm_rope_, triton_available

_warmups: dict[tuple[object, ...], threading.Thread] = {}
WARMUP_THREADS = max(1, min(8, (os.cpu_count() or 1) - 1))  # leave a core to the weight load


def start_warmup(cfg: ModelConfig, dtype: torch.dtype, device: torch.device, skinny_tokens: int = 0,
                 skinny: SkinnyOptions | None = None) -> threading.Thread | None:
    """Compile (or load from Triton's on-disk cache) the Triton kernels ``cfg``'s model will run, in a
    background thread, so it overlaps the weight load instead of delaying the first step (a cold
    compile took ~1.4 s on the H200 host). Idempotent; ``join()`` the thread before any CUDA graph
    capture. ``None`` when no Triton kernel will run. ``skinny_tokens``, ``skinny``: the buckets that run the
    skinny layer kernels and how they launch (``SmallBatchKernels``; each choice is a variant of its own).
    """
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16) or not triton_available():
        return None
    skinny = skinny or SkinnyOptions()
    key = (cfg.architecture, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, dtype, str(device),
           skinny_tokens, skinny)
    thread = _warmups.get(key)
    if thread is None:
        thread = threading.Thread(target=_warm, args=(cfg, dtype, device, skinny_tokens, skinny),
                                  name="petal-kernel-warmup", daemon=True)
        _warmups[key] = thread
        thread.start()
    return thread


def _warm(cfg: ModelConfig, dtype: torch.dtype, device: torch.device, skinny_tokens: int,
          skinny: SkinnyOptions) -> None:
    # NOTE: a failure here is ignored: the real call compiles again and raises where it can be reported.
    # Dummy inputs match the real calls' dtypes, strides and sizes, so Triton specialises (and caches)
    # the very kernel the model launches.
    jobs: list[Callable[[], None]] = [lambda: _warm_common(cfg, dtype, device)]
    jobs += [functools.partial(_warm_skinny_bucket, cfg, dtype, device, bucket, skinny)
             for bucket in token_buckets(max(skinny_tokens, 1)) if bucket <= skinny_tokens]
    # NOTE: one thread per job (each skinny bucket is a chain of its own variants): cold compiles in threads
    # overlap, their LLVM and ptxas parts at least (H200 host, all four skinny buckets: 14.7-16.8 s on one
    # thread, 6.6-6.8 s on these; README "Small-batch latency, fourth round").
    with ThreadPoolExecutor(min(len(jobs), WARMUP_THREADS), thread_name_prefix="petal-kernel-warmup") as pool:
        for future in [pool.submit(_guarded, job) for job in jobs]:
            future.result()
    with contextlib.suppress(Exception):
        torch.cuda.synchronize(device)


def _guarded(job: Callable[[], None]) -> None:
    with contextlib.suppress(Exception), torch.inference_mode():  # NOTE: inference mode is per thread
        job()


def _warm_common(cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
    if cfg.architecture == "qwen3":
        width = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        qk_norm_rope_(torch.zeros(1, width, dtype=dtype, device=device),
                      torch.zeros(1, dtype=torch.int32, device=device),
                      torch.zeros(2, cfg.head_dim, dtype=torch.float32, device=device),
                      torch.zeros(2, cfg.head_dim, dtype=dtype, device=device), 1e-6,
                      cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    else:  # BERT family: post-norm LayerNorm(x + residual)
        x = torch.zeros(1, cfg.hidden_size, dtype=dtype, device=device)
        weight = torch.ones(cfg.hidden_size, dtype=dtype, device=device)
        bias = torch.zeros(cfg.hidden_size, dtype=dtype, device=device)
        add_layer_norm(x, torch.zeros_like(x), weight, bias, 1e-12)
        add_layer_norm(x, bias, weight, bias, 1e-12)  # the residual added by the GEMM: the bias row only
    _warm_small_batch(cfg, dtype, device)


def _attention_inputs(cfg: ModelConfig, dtype: torch.dtype, device: torch.device, num_tokens: int) -> SmallAttention:
    """Dummy inputs of the fused attention as a bucket of ``num_tokens`` slots passes them (Qwen3: with its q/k
    norm and RoPE). NOTE: one sequence of num_tokens tokens; every index the kernels read (sequence ids,
    positions, offsets) stays inside its own tensor."""
    qwen3 = cfg.architecture == "qwen3"
    return SmallAttention(torch.zeros(num_tokens, dtype=torch.int32, device=device),
                          torch.tensor([0, num_tokens], dtype=torch.int32, device=device), cfg.num_heads,
                          cfg.num_kv_heads, cfg.head_dim, cfg.causal, cfg.head_dim**-0.5,
                          torch.zeros(num_tokens, dtype=torch.int32, device=device) if qwen3 else None,
                          torch.zeros(8, cfg.head_dim, dtype=torch.float32, device=device) if qwen3 else None,
                          torch.zeros(2, cfg.head_dim, dtype=dtype, device=device) if qwen3 else None, cfg.norm_eps)


def _warm_attention(cfg: ModelConfig, dtype: torch.dtype, device: torch.device, num_tokens: int) -> None:
    """The fused attention as a bucket of ``num_tokens`` slots calls it (the skinny layers' own PDL launches
    are compiled by ``_warm_skinny_bucket``)."""
    width = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    attend(torch.zeros(num_tokens, width, dtype=dtype, device=device),
           _attention_inputs(cfg, dtype, device, num_tokens))


def _warm_small_batch(cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
    """The small-batch path's kernels (engine/small_batch.py) as a graph bucket calls them: 64 token slots."""
    num_tokens = 64
    if cfg.head_dim in SMALL_ATTENTION_HEAD_DIMS:
        _warm_attention(cfg, dtype, device, num_tokens)  # one key block (buckets up to 64 tokens)
        _warm_attention(cfg, dtype, device, 2 * num_tokens)  # one key block of 65-128 slots (its own tiles)
    if cfg.architecture == "qwen3" and fused_mlp_fits(cfg.hidden_size, cfg.intermediate_size):
        gate_up_silu(torch.zeros(num_tokens, cfg.hidden_size, dtype=dtype, device=device),
                     torch.zeros(2 * cfg.intermediate_size, cfg.hidden_size, dtype=dtype, device=device))
    if cfg.architecture == "qwen3" and tma_mlp_fits(cfg.hidden_size, cfg.intermediate_size) and \
            tma_available(device.index if device.index is not None else torch.cuda.current_device()):
        # NOTE: one variant serves every large bucket (rows and programs are runtime arguments; enough rows here
        # that the program count is the SM count, as in the buckets that run it)
        rows = 2048
        gate_up_silu_tma(torch.zeros(rows, cfg.hidden_size, dtype=dtype, device=device),
                         torch.zeros(2 * cfg.intermediate_size, cfg.hidden_size, dtype=dtype, device=device))


def _warm_skinny_bucket(cfg: ModelConfig, dtype: torch.dtype, device: torch.device, num_tokens: int,
                        options: SkinnyOptions) -> None:
    """The skinny layer kernels as the graph bucket of ``num_tokens`` slots calls them (a variant each; the
    engine's buckets up to ``SmallBatchKernels.skinny_tokens``, which is 0 for a model they do not fit):
    ``skinny_layer`` itself, on zeros, as a first layer, then as the last one."""
    q_size = cfg.num_heads * cfg.head_dim
    width = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim

    def zeros(*shape: int, dtype: torch.dtype = dtype) -> torch.Tensor:
        return torch.zeros(*shape, dtype=dtype, device=device)

    norm = zeros(cfg.hidden_size)
    attention = _attention_inputs(cfg, dtype, device, num_tokens)
    assert attention.qk_norm_weights is not None  # (skinny layers are Qwen3's)
    layer = SkinnyLayerWeights(norm, zeros(width, cfg.hidden_size), zeros(cfg.hidden_size, q_size), norm,
                               zeros(2 * cfg.intermediate_size, cfg.hidden_size),
                               zeros(cfg.hidden_size, cfg.intermediate_size), attention.qk_norm_weights, cfg.norm_eps)
    h = zeros(num_tokens, cfg.hidden_size)
    tiles = layer_tiles(num_tokens, LayerSizes(cfg.hidden_size, q_size, cfg.intermediate_size))
    # NOTE: the first layer's norm input has one partial sum per row, later ones one per column tile of the
    # down projection (another NUM_PARTS, another variant); the last layer's down projection writes no norm
    # input: every variant is compiled.
    x = skinny_layer(h, norm_input(h, norm), layer, layer, attention, tiles, options)
    assert x is not None
    skinny_layer(h, x, layer, None, attention, tiles, options)

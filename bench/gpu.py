"""GPU scenarios (PERFORMANCE.md): T1 fixed 512-token documents, T2 lognormal lengths, L1 latency,
and the GEMM + attention ceiling; petal against Hugging Face transformers in the same process.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from petal.bench.corpus import lognormal_lengths
from petal.bench.shapes import Shape, hf_model, native_from_hf, shape
from petal.engine.batch import PackedBatch
from petal.engine.config import EngineConfig
from petal.engine.engine import Engine, attention_backend
from petal.engine.layers.warmup import start_warmup
from petal.engine.models import model_class_for
from petal.engine.small_batch import SmallBatchKernels
from petal.pipeline.ingest.pack import PackConfig, pack
from petal.pipeline.jobs.inflight import InFlight


def cuda_engine(s: Shape, token_budget: int = 16384) -> Engine:
    """An engine on CUDA (bf16, graphs) over random weights in ``s``'s shape, made through Hugging Face's model."""
    hf = hf_model(s, torch.device("cuda"), torch.bfloat16)
    spec, model = native_from_hf(s, hf, torch.device("cuda"), torch.bfloat16)
    del hf
    return Engine(spec, EngineConfig(device="cuda", dtype="bfloat16", token_budget=token_budget), model=model)


def probe_engine(argv: list[str]) -> tuple[str, Engine, list[int]]:
    """The L1 probes' command line, ``[SHAPE] [NUM_TOKENS ...]`` (default: pplx-embed-0.6b 16 128): the shape's
    name, its ``cuda_engine`` and the token counts."""
    name = argv[1] if len(argv) > 1 else "pplx-embed-0.6b"
    return name, cuda_engine(shape(name)), [int(a) for a in argv[2:]] or [16, 128]


def warm_lone_batch(engine: Engine, num_tokens: int, steps: int = 10) -> PackedBatch:
    """One sequence of ``num_tokens`` random tokens, stepped ``steps`` times (its bucket's graph captured)."""
    batch = PackedBatch.from_sequences(random_docs(np.array([num_tokens]), engine.spec.config.vocab_size))
    for _ in range(steps):
        engine.step(batch).result()
    return batch


def random_docs(lengths: np.ndarray, vocab: int, seed: int = 0) -> list[np.ndarray]:
    """Token ids for documents of the given lengths (values do not change the speed)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1000, vocab - 1, int(n)).astype(np.int32) for n in lengths]


def cuda_time(fn: Callable[[], Any]) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - started


def replay_in_graph(fn: Callable[[], object], replays: int = 3) -> None:
    """Capture ``fn`` in a CUDA graph, replay it ``replays`` times and wait: what a probe compares with the
    eager run it made before (graph replays must equal eager)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()


def graph_us_per_call(fn: Callable[[], object], calls_in_graph: int, reps: int = 30) -> float:
    """Device microseconds per call of ``fn`` captured ``calls_in_graph`` times... (``fn`` runs them all)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / reps / calls_in_graph)
    return float(np.median(times))


def run_sections(table: dict[str, Callable[[], None]], chosen: list[str], summary: list[str]) -> None:
    """A probe's sections by name, in order: a failing one prints its traceback and is marked in ``summary``
    (the others still run), each prints its time; then the summary lines."""
    for name in chosen:
        started = time.perf_counter()
        try:
            table[name]()
        except Exception:
            traceback.print_exc()
            summary.append(f"  {name}: FAILED (traceback above)")
        print(f"[{name}: {time.perf_counter() - started:.1f} s]", flush=True)
    print("\n=== summary")
    print("\n".join(summary))


def petal_throughput(engine: Engine, docs: list[np.ndarray]) -> tuple[float, np.ndarray]:
    """Seconds to embed ``docs`` (pack, step, results), and the vectors in input order."""
    config = PackConfig(engine.config.token_budget, engine.config.max_seqs)
    out = np.empty((len(docs), engine.dim), dtype=np.float32)

    def run() -> None:
        flight = InFlight(engine.config.steps_in_flight)
        for batch in pack(enumerate(docs), config):
            for done, vectors in flight.push(batch, engine.step(batch)):
                out[list(done.keys)] = vectors
        for done, vectors in flight.drain():
            out[list(done.keys)] = vectors

    return cuda_time(run), out


def hf_pool(hidden: torch.Tensor, mask: torch.Tensor, shape: Shape) -> torch.Tensor:
    if shape.pooling == "cls":
        pooled = hidden[:, 0]
    elif shape.pooling == "last":
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), mask.sum(1) - 1]
    else:
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    pooled = pooled.float()
    return torch.nn.functional.normalize(pooled, dim=-1) if shape.normalize else pooled


def hf_throughput(model: Any, shape: Shape, docs: list[np.ndarray], batch_size: int = 64,
                  sort: bool = True, bidirectional: bool = False) -> tuple[float, np.ndarray]:
    """Hugging Face baseline: (length-sorted) right-padded batches of ``batch_size`` with a mask."""
    order = sorted(range(len(docs)), key=lambda i: len(docs[i])) if sort else list(range(len(docs)))
    device = next(model.parameters()).device
    out = np.empty((len(docs), model.config.hidden_size), dtype=np.float32)
    pad_id = int(shape.hf_config.get("pad_token_id", 0) or 0)

    def run() -> None:
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                idx = order[start : start + batch_size]
                width = max(len(docs[i]) for i in idx)
                ids = np.full((len(idx), width), pad_id, dtype=np.int64)
                mask = np.zeros((len(idx), width), dtype=np.int64)
                for row, i in enumerate(idx):
                    ids[row, : len(docs[i])] = docs[i]
                    mask[row, : len(docs[i])] = 1
                ids_t = torch.from_numpy(ids).to(device, non_blocking=True)
                mask_t = torch.from_numpy(mask).to(device, non_blocking=True)
                attn = mask_t
                if bidirectional:  # NOTE: HF Qwen3 is causal; a 4-D boolean mask makes it attend both ways
                    attn = (mask_t[:, None, None, :] & mask_t[:, None, :, None]).bool()
                hidden = model(input_ids=ids_t, attention_mask=attn).last_hidden_state
                out[idx] = hf_pool(hidden, mask_t, shape).cpu().numpy()

    return cuda_time(run), out


def latency(engine: Engine, num_tokens: int, calls: int, vocab: int) -> dict[str, float]:
    """``step`` -> ``result`` of one sequence, warm, in process: p50 / p99 in milliseconds."""
    batch = PackedBatch.from_sequences(random_docs(np.array([num_tokens]), vocab, seed=num_tokens))
    for _ in range(5):  # eager, capture, replays
        engine.step(batch).result()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        engine.step(batch).result()
        times.append(time.perf_counter() - started)
    ms = np.array(times) * 1000
    return {"tokens": num_tokens, "calls": calls, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean())}


def ceiling(shape: Shape, engine: Engine, num_tokens: int = 8192, seq_len: int = 512) -> dict[str, float]:
    """Tokens/s if every layer ran only its GEMMs at ``num_tokens`` plus attention timed alone."""
    cfg = engine.spec.config
    dtype, device = engine.dtype, engine.device
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    if cfg.architecture == "qwen3":
        gemms = [(cfg.hidden_size, q + 2 * kv), (q, cfg.hidden_size), (cfg.hidden_size, 2 * cfg.intermediate_size),
                 (cfg.intermediate_size, cfg.hidden_size)]
    else:
        gemms = [(cfg.hidden_size, 3 * q), (q, cfg.hidden_size), (cfg.hidden_size, cfg.intermediate_size),
                 (cfg.intermediate_size, cfg.hidden_size)]
    x = {k: torch.randn(num_tokens, k, device=device, dtype=dtype) for k, _ in gemms}
    w = {(k, n): torch.randn(n, k, device=device, dtype=dtype) for k, n in gemms}

    def layer_gemms() -> None:
        for k, n in gemms:
            torch.nn.functional.linear(x[k], w[(k, n)])

    for _ in range(3):
        layer_gemms()
    reps = 20
    def repeated() -> None:
        for _ in range(reps):
            layer_gemms()

    gemm_s = cuda_time(repeated) / reps
    flops = sum(2 * num_tokens * k * n for k, n in gemms)
    # attention alone on the same tokens, packed as sequences of seq_len, through the engine's backend
    from petal.engine.inputs import InputLayout, fill_inputs, make_context

    batch = PackedBatch.from_sequences([np.ones(seq_len, np.int32)] * (num_tokens // seq_len))
    layout = InputLayout(batch.num_tokens, batch.num_seqs)
    host = torch.zeros(layout.size, dtype=torch.int32).pin_memory()
    fill_inputs(host.numpy(), layout, batch)
    ctx = make_context(host.to(device), host[layout.slices()["cu_seqlens"]], layout, seq_len, engine.attention,
                       padded=False)
    engine.attention.plan(ctx)
    qt = torch.randn(batch.num_tokens, cfg.num_heads, cfg.head_dim, device=device, dtype=dtype)
    kt = torch.randn(batch.num_tokens, cfg.num_kv_heads, cfg.head_dim, device=device, dtype=dtype)
    for _ in range(3):
        engine.attention.forward(qt, kt, kt, ctx)
    attn_s = cuda_time(lambda: [engine.attention.forward(qt, kt, kt, ctx) for _ in range(reps)]) / reps
    total = cfg.num_layers * (gemm_s + attn_s)
    return {"tokens_per_s": num_tokens / total, "gemm_tflops": flops / gemm_s / 1e12,
            "gemm_ms_per_layer": gemm_s * 1000, "attention_ms_per_layer": attn_s * 1000,
            "gemm_only_tokens_per_s": num_tokens / (cfg.num_layers * gemm_s)}


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-30)


def run_gpu_bench(shape: Shape, scenarios: tuple[str, ...], *, token_budget: int, max_seqs: int = 256,
                  attention: str = "auto", cuda_graphs: bool = True, hf_baseline: bool = True,
                  t1_docs: int = 2048, t2_docs: int = 8192, latency_calls: int = 1000) -> dict[str, Any]:
    """Run the chosen scenarios for one shape; every ratio is measured in this one process."""
    device, dtype = torch.device("cuda"), torch.bfloat16
    config = EngineConfig(device="cuda", dtype="bfloat16", attention=attention_backend(attention),
                          cuda_graphs=cuda_graphs, token_budget=token_budget, max_seqs=max_seqs)
    # as in `petal index`, Triton kernels compile while the weights are made (engine/layers/warmup.py): the
    # very warm-up the engine asks for (same kernels, so Engine() joins this one)
    model_config = model_class_for(shape.hf_config).config_from_hf(shape.hf_config)
    small = SmallBatchKernels.for_engine(config, model_config, device, dtype)
    start_warmup(model_config, dtype, device, small.skinny_tokens, small.skinny_options())
    hf = hf_model(shape, device, dtype)
    spec, model = native_from_hf(shape, hf, device, dtype)
    if not hf_baseline:
        del hf
        hf = None
        torch.cuda.empty_cache()
    started = time.perf_counter()
    engine = Engine(spec, config, model=model)
    first = PackedBatch.from_sequences(random_docs(np.array([100]), spec.config.vocab_size))
    engine.step(first).result()
    first_embedding_s = time.perf_counter() - started
    bidirectional = not spec.config.causal and spec.config.architecture == "qwen3"  # HF Qwen3 needs the 4-D mask
    vocab = spec.config.vocab_size
    result: dict[str, Any] = {"shape": shape.name, "engine": engine.describe(),
                              "first_embedding_s": first_embedding_s, "scenarios": {}}
    torch.cuda.reset_peak_memory_stats()

    def throughput(name: str, docs: list[np.ndarray], hf_runs: dict[str, bool]) -> dict[str, Any]:
        tokens = int(sum(len(d) for d in docs))
        petal_throughput(engine, docs[: max(64, len(docs) // 8)])  # warm every bucket (eager + capture)
        times, vectors = [], None
        for _ in range(2):
            seconds, vectors = petal_throughput(engine, docs)
            times.append(seconds)
        seconds = min(times)
        row: dict[str, Any] = {"docs": len(docs), "tokens": tokens, "petal_tokens_per_s": tokens / seconds,
                               "petal_seqs_per_s": len(docs) / seconds}
        if hf is not None:
            for label, sort in hf_runs.items():
                # NOTE: best of two full passes, like petal's: the first pass pays one-time costs for every
                # padded width it meets (kernel selection, allocator growth), which is not HF's steady state.
                runs = [hf_throughput(hf, shape, docs, sort=sort, bidirectional=bidirectional) for _ in range(2)]
                hf_s, hf_vectors = min(runs, key=lambda run: run[0])
                row[f"hf_{label}_tokens_per_s"] = tokens / hf_s
                row[f"ratio_vs_hf_{label}"] = hf_s / seconds
                assert vectors is not None
                cos = cosine_rows(vectors, hf_vectors)
                row[f"min_cosine_vs_hf_{label}"] = float(cos.min())
        return row

    longest = min(512, spec.pooling.max_length)  # MiniLM takes 256 tokens at most
    if "t1" in scenarios:
        docs = random_docs(np.full(t1_docs, longest), vocab, seed=1)
        result["scenarios"]["t1"] = throughput("t1", docs, {"batch64": False})
    if "t2" in scenarios:
        docs = random_docs(lognormal_lengths(t2_docs, 150, 0.8, 8, longest, seed=0), vocab, seed=2)
        result["scenarios"]["t2"] = throughput("t2", docs, {"sorted": True, "unsorted": False})
    if "l1" in scenarios:
        result["scenarios"]["l1"] = {str(n): latency(engine, n, latency_calls, vocab) for n in (16, 128)}
    if "ceiling" in scenarios:
        result["scenarios"]["ceiling"] = ceiling(shape, engine)
    result["counters"] = engine.stats.as_dict()
    result["peak_device_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    try:
        import resource

        result["host_max_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    except ImportError:  # pragma: no cover - not POSIX
        pass
    return result


def format_gpu_table(result: dict[str, Any]) -> str:
    e = result["engine"]
    lines = [f"{result['shape']}: {e['device']} {e['dtype']}, attention {e['attention']}, "
             f"cuda graphs {e['cuda_graphs']}, token budget {e['token_budget']}; "
             f"first embedding {result['first_embedding_s']:.2f}s after load"]
    sc = result["scenarios"]
    ceil = sc.get("ceiling", {}).get("tokens_per_s")
    for name in ("t1", "t2"):
        if name in sc:
            r = sc[name]
            line = (f"  {name.upper()}: petal {r['petal_tokens_per_s'] / 1e3:,.0f}k tok/s "
                    f"({r['petal_seqs_per_s']:,.0f} seq/s)")
            for key, value in r.items():
                if key.startswith("ratio_vs_hf_"):
                    label = key.removeprefix("ratio_vs_hf_")
                    line += (f"; HF {label} {r[f'hf_{label}_tokens_per_s'] / 1e3:,.0f}k -> {value:.2f}x"
                             f" (min cos {r[f'min_cosine_vs_hf_{label}']:.4f})")
            if ceil:
                line += f"; {r['petal_tokens_per_s'] / ceil:.0%} of ceiling"
            lines.append(line)
    if "l1" in sc:
        for n, r in sc["l1"].items():
            lines.append(f"  L1 {n:>3} tokens: p50 {r['p50_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms ({r['calls']} calls)")
    if "ceiling" in sc:
        c = sc["ceiling"]
        lines.append(f"  ceiling: {c['tokens_per_s'] / 1e3:,.0f}k tok/s (GEMMs {c['gemm_tflops']:.0f} TFLOP/s, "
                     f"{c['gemm_ms_per_layer']:.3f} ms + attention {c['attention_ms_per_layer']:.3f} ms per layer)")
    k = result["counters"]
    lines.append(f"  counters: {k['graph_captures']} captures, {k['graph_replays']} replays, {k['eager_steps']} eager, "
                 f"{k['padded_tokens']} padded tokens of {k['tokens']}; peak device "
                 f"{result['peak_device_memory_gib']:.1f} GiB, host RSS {result.get('host_max_rss_gib', 0):.1f} GiB")
    return "\n".join(lines)


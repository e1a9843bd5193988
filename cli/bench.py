"""``petal bench``: the benchmark protocol of PERFORMANCE.md (ratios measured in one run)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import click
from click.core import ParameterSource

from petal.cli.common import MODEL_DIR, PATH, require_stdout, usage, user_errors
from petal.cli.options import FiniteFloatRange
from petal.engine.config import MAX_SEQS, MAX_TOKEN_BUDGET
from petal.pipeline.index.bounds import MAX_K

F = TypeVar("F", bound=Callable[..., Any])
INPUTS = ("corpus", "tokenizer_dir", "index_path", "model")  # the parameters of the paths a benchmark reads
TEMPORARY = "petal-"  # NOTE: the prefix of every temporary directory a benchmark makes (petal/bench/*.py)


def _temporary(path: object) -> bool:
    """``path`` lies in a temporary directory a benchmark made (``$TMPDIR/petal-*``)."""
    try:
        rel = os.path.relpath(os.path.abspath(os.fsdecode(path)), tempfile.gettempdir())  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return not rel.startswith(os.pardir) and rel.split(os.sep, 1)[0].startswith(TEMPORARY)


def bench_errors(writes: bool) -> Callable[[F], F]:
    """``user_errors`` for a benchmark: permission denied that nothing mapped is classified by the path's role, as
    ``petal index``/``embed`` do. On a path inside one it reads (``--corpus``, ``--model``, ``--tokenizer-dir``,
    ``--index``) 66; inside what it writes (``--workdir``, or a temporary ``$TMPDIR/petal-*`` directory it made),
    73 (cannot create output); elsewhere 66 (a file it reads: the packaged model...). ``writes``: the benchmark
    writes files; then a denial that names no path stays 74 (its role is unknown), as ``user_errors`` has it."""

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return command(*args, **kwargs)
            except OSError as exc:
                from petal.pipeline.reliability.errors import DENIED, inside, io_error

                if not writes or exc.errno not in DENIED:
                    raise
                if not exc.filename:
                    raise io_error(exc, [tempfile.gettempdir()]) from exc  # 74: written or read, unknown
                read = [kwargs[name] for name in INPUTS if kwargs.get(name) is not None]
                if any(inside(exc.filename, path) for path in read):
                    raise  # 66 (user_errors: not an output)
                written = [kwargs["workdir"]] if kwargs.get("workdir") is not None else []
                if _temporary(exc.filename):
                    written.append(exc.filename)
                if written:
                    raise io_error(exc, written) from exc  # 73 inside them, else 66
                raise

        # NOTE: outputs=(): what is still an OSError here is on a path the benchmark reads (66)
        return user_errors(outputs=())(cast(F, wrapper))

    return decorate

# NOTE: path options (``PATH``) check nothing at parsing but an empty value; each command judges them first
# (``paths``): an input missing or unreadable is 66, a --workdir it cannot create or write 73, naming the flag

# NOTE: bench/shapes.py's SHAPES names, spelled out (importing it imports torch): every --shape is checked by
# click before anything heavy loads. tests/test_lazy_imports.py keeps the two equal.
SHAPE_NAMES = ("pplx-embed-0.6b", "qwen3-embedding-0.6b", "bge-m3", "minilm")
GPU_SCENARIOS = ("t1", "t2", "l1", "ceiling")  # what bench/gpu.py's run_gpu_bench runs
# NOTE: --corpus's default is the repository's sample corpus, relative to the working directory: petal's install does
# not include it (``paths`` says to give --corpus where there is none)
SAMPLE_CORPUS = Path("sample_data")
SAMPLE_DEFAULT = "sample_data, the repository's (run from its root)"
TOKENIZER_FILE = "tokenizer.json"  # what bench/shapes.py's save_model_dir needs in --tokenizer-dir (its TOKENIZER_FILE)

# NOTE: upper bounds of the number flags (there were none: --vectors 1e20 was a numpy casting traceback once the
# store was started, --dim or --queries 1e11 "out of host memory" after the work began), far above any run worth
# timing and below the C ints FAISS and the kernels take; a float flag is finite (FiniteFloatRange: click's
# FloatRange let --seconds nan and --target-recall nan through, to a traceback)
MAX_COUNT = (1 << 31) - 1  # vectors, documents, texts, requests, calls, rounds, tokens per step
MAX_DIM = 1 << 16  # a vector's dimension (embedding models have up to a few thousand)
MAX_QUERIES = 1 << 20  # held-out queries whose exact neighbours are computed
MAX_TEXT_TOKENS = 1 << 16  # tokens of one generated text
MAX_PARALLEL = 1 << 12  # processes, workers, clients at once, shards
MAX_SECONDS = 86_400.0  # a day per scenario


def distinct(values: Sequence[object], flag: str, shown: Sequence[object] | None = None) -> None:
    """Each of a list flag's ``values`` once (``shown``: as given, when ``values`` are parsed from them); a repeat is
    2 naming ``flag``. NOTE: every list flag of petal bench refuses them (was: a row, a run or a size measured twice,
    and --index-memory 8G twice exit 74 'File exists' after the store was written)."""
    seen: dict[object, object] = {}
    for value, text in zip(values, shown if shown is not None else values):
        if value in seen:
            same = f"{seen[value]!s} and {text!s}" if str(seen[value]) != str(text) else f"{text!s} twice"
            raise click.BadParameter(f"{same}: give each value once", param_hint=flag)
        seen[value] = text


def count(low: int, high: int = MAX_COUNT) -> click.IntRange:
    """A whole-number flag from ``low`` to ``high``."""
    return click.IntRange(min=low, max=high)


@click.group()
def bench() -> None:
    """Benchmarks: petal against named baselines, measured in the same process."""


@bench.command("cpu")
@click.option("--corpus", type=PATH, default=SAMPLE_CORPUS, show_default=SAMPLE_DEFAULT,
              help="Parquet files whose sentences build the benchmark texts.")
@click.option("--texts", "num_texts", type=count(16), default=2000, show_default=True,
              help="Texts embedded per system and round (lengths lognormal, median 150 tokens).")
@click.option("--rounds", type=count(1), default=3, show_default=True,
              help="Interleaved rounds per system; the median is reported.")
@click.option("--token-budget", type=count(256, MAX_TOKEN_BUDGET), default=4096, show_default=True,
              help="petal's tokens per engine step (as petal index --token-budget).")
@click.option("--model", type=MODEL_DIR, default=None,
              help="Model directory (default: the packaged all-MiniLM-L6-v2).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@bench_errors(writes=False)
def bench_cpu(corpus: Path, num_texts: int, rounds: int, token_budget: int, model: str | None, as_json: bool) -> None:
    """MiniLM on the CPU: petal (fp32, and bf16 GEMMs) vs sentence-transformers encode()."""
    require_stdout("petal bench cpu")  # NOTE: its table (or JSON) is its result: 74, not a run measured for nothing
    paths({"--corpus": corpus})
    judge_model(model)  # before torch and sentence-transformers load
    require_modules("cpu", "sentence_transformers")  # its baseline: the table's every ratio is to it
    from petal.bench.cpu import format_cpu_table, run_cpu_bench

    result = run_cpu_bench(corpus, num_texts=num_texts, rounds=rounds, token_budget=token_budget, model=model)
    click.echo(json.dumps(result) if as_json else format_cpu_table(result))


@bench.command("gpu")
@click.option("--shape", "shapes", multiple=True, type=click.Choice(SHAPE_NAMES), default=["pplx-embed-0.6b"],
              show_default=True, help="Model shape (random weights).")
@click.option("--scenario", "scenarios", default="t1,t2,l1,ceiling", show_default=True,
              help="Comma-separated: t1, t2, l1, ceiling.")
@click.option("--token-budget", type=count(512, MAX_TOKEN_BUDGET), default=16384, show_default=True,
              help="Tokens per engine step (as petal index --token-budget).")
@click.option("--max-seqs", type=count(1, MAX_SEQS), default=256, show_default=True,
              help="Sequences per engine step (as petal index --max-seqs).")
@click.option("--attention", type=click.Choice(["auto", "flashinfer", "torch", "sdpa"]), default="auto",
              show_default=True, help="Attention kernel (as petal index --attention).")
@click.option("--no-cuda-graphs", is_flag=True, help="Run the engine eagerly (as petal index --no-cuda-graphs).")
@click.option("--no-baseline", is_flag=True, help="Skip Hugging Face transformers.")
@click.option("--t1-docs", type=count(64), default=2048, show_default=True,
              help="T1: documents embedded, each of 512 tokens (the model's limit when lower).")
@click.option("--t2-docs", type=count(64), default=8192, show_default=True,
              help="T2: documents of lognormal length (median 150 tokens) embedded.")
@click.option("--latency-calls", type=count(10), default=1000, show_default=True,
              help="L1: one-query steps timed at 16 and at 128 tokens (p50 and p99 reported).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON lines.")
@bench_errors(writes=False)
def bench_gpu(shapes: tuple[str, ...], scenarios: str, token_budget: int, max_seqs: int, attention: str,
              no_cuda_graphs: bool, no_baseline: bool, t1_docs: int, t2_docs: int, latency_calls: int,
              as_json: bool) -> None:
    """T1 / T2 / L1 / ceiling on CUDA for model shapes with random weights, vs HF transformers."""
    chosen = tuple(s.strip().lower() for s in scenarios.split(",") if s.strip())
    unknown = [s for s in chosen if s not in GPU_SCENARIOS]
    if unknown or not chosen:  # NOTE: was ignored (a typo ran nothing of it), after torch had loaded
        raise click.BadParameter(f"{scenarios!r}: choose from {', '.join(GPU_SCENARIOS)}", param_hint="--scenario")
    distinct(chosen, "--scenario")
    distinct(shapes, "--shape")
    require_stdout("petal bench gpu")
    import torch

    if not torch.cuda.is_available():
        raise click.UsageError("petal bench gpu needs a CUDA device")
    require_modules("gpu", "transformers")  # the shapes' random-weight models are built with it
    from petal.bench.gpu import format_gpu_table, run_gpu_bench
    from petal.bench.shapes import shape

    for name in shapes:
        result = run_gpu_bench(shape(name), chosen, token_budget=token_budget, max_seqs=max_seqs, attention=attention,
                               cuda_graphs=not no_cuda_graphs, hf_baseline=not no_baseline, t1_docs=t1_docs,
                               t2_docs=t2_docs, latency_calls=latency_calls)
        click.echo(json.dumps(result) if as_json else format_gpu_table(result))
        torch.cuda.empty_cache()


@bench.command("e2e")
@click.option("--model", type=MODEL_DIR, default=None,
              help="Model directory (default: the packaged all-MiniLM-L6-v2).")
@click.option("--shape", type=click.Choice(SHAPE_NAMES), default=None,
              help="Instead of --model: random weights in this shape, saved to a temp dir.")
@click.option("--tokenizer-dir", type=PATH, default=None,
              help="With --shape: where tokenizer.json (and vocab) come from (default: the packaged MiniLM's).")
@click.option("--corpus", type=PATH, default=SAMPLE_CORPUS, show_default=SAMPLE_DEFAULT,
              help="Parquet files whose sentences build the benchmark documents.")
@click.option("--docs", "num_docs", default="50000", show_default=True,
              help="Documents in the generated corpus; comma-separated for one run per size (one model, one "
                   "engine-T2 measure) and a side-by-side table.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where the model runs (as petal index --device).")
@click.option("--no-baseline", is_flag=True, help="Skip sentence-transformers.")
@click.option("--tokenize-workers", default="2", show_default=True,
              help="Comma-separated: one petal run (after its own tokenizer-only run) per value.")
@click.option("--devices", default=None, metavar="all|N|0,1",
              help="Embed through worker processes, one per CUDA device (as petal index --devices).")
@click.option("--workers", type=count(1, MAX_PARALLEL), default=None,
              help="Embed through this many worker processes (as petal index --workers).")
@click.option("--index-factory", default="Flat", show_default=True,
              help="petal's --index-factory (auto: the planner and tuner, as petal index runs by default).")
@click.option("--engine-t2/--no-engine-t2", default=None,
              help="Also time the engine alone on T2 lengths [default: on with CUDA].")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON lines.")
@bench_errors(writes=True)
def bench_e2e(model: str | None, shape: str | None, tokenizer_dir: Path | None, corpus: Path, num_docs: str,
              device: str, no_baseline: bool, tokenize_workers: str, devices: str | None, workers: int | None,
              index_factory: str, engine_t2: bool | None, as_json: bool) -> None:
    """Parquet -> FAISS end to end: petal vs sentence-transformers vs tokenizer-only, same data."""
    # NOTE: every flag and path is judged before torch loads and a --shape model is made (was: after)
    try:
        sizes = [int(n) for n in num_docs.split(",") if n.strip()]
        if not sizes or any(not 100 <= n <= MAX_COUNT for n in sizes):
            raise ValueError
    except ValueError:
        raise click.BadParameter(f"{num_docs!r} is not a comma-separated list of whole numbers from 100 to "
                                 f"{MAX_COUNT}", param_hint="--docs") from None
    try:
        tokenizers = [int(w) for w in tokenize_workers.split(",") if w.strip()]
        if not tokenizers or any(not 1 <= w <= MAX_PARALLEL for w in tokenizers):  # NOTE: "," ran with 2
            raise ValueError
    except ValueError:
        raise click.BadParameter(f"{tokenize_workers!r} is not a comma-separated list of whole numbers from 1 to "
                                 f"{MAX_PARALLEL}", param_hint="--tokenize-workers") from None
    distinct(sizes, "--docs")
    distinct(tokenizers, "--tokenize-workers")
    if shape is not None and model is not None:  # NOTE: was --model ignored without a word
        raise click.UsageError("--shape and --model exclude each other")
    if shape is not None:
        require_modules("e2e --shape", "transformers")
    from petal.cli.scale_options import scale_config

    scale = usage(lambda: scale_config(devices, workers, None))
    require_stdout("petal bench e2e")
    paths({"--corpus": corpus, "--tokenizer-dir": tokenizer_dir})
    judge_tokenizer_dir(shape, tokenizer_dir)
    from petal.pipeline.config import IndexSettings

    if shape is None:  # NOTE: a --shape model's dim is known once it is made (below), still before the runs
        check_factory(usage(lambda: IndexSettings(factory=index_factory)), judge_model(model).dim, min(sizes),
                      "the smallest of --docs")
    from petal.bench.e2e import format_e2e_summary, format_e2e_table, run_e2e_bench
    from petal.bench.runs import temporary_workdir
    from petal.engine.engine import resolve_device
    from petal.engine.loader import default_model_dir

    dev = usage(lambda: resolve_device(device))
    if engine_t2 and dev != "cuda":
        raise click.UsageError("--engine-t2 times the CUDA engine (petal bench gpu's T2); the device is the CPU")
    skipped: dict[str, str] = {}
    baseline = st_baseline(not no_baseline, skipped)
    if shape is None:
        model_dir = Path(model) if model else default_model_dir()
    else:
        import torch

        from petal.bench.shapes import hf_model, save_model_dir
        from petal.bench.shapes import shape as get_shape

        s = get_shape(shape)
        hf = hf_model(s, torch.device("cpu"), torch.float32)
        # NOTE: removed when the command ends (was left behind: the model's weights, 2.4 GB for pplx-embed-0.6b)
        model_dir = save_model_dir(s, hf, tokenizer_dir or default_model_dir(),
                                   click.get_current_context().with_resource(temporary_workdir(f"petal-{shape}-")))
        del hf
        check_factory(usage(lambda: IndexSettings(factory=index_factory)), judge_model(model_dir).dim, min(sizes),
                      "the smallest of --docs")
    results: list[dict] = []
    with work_removed_when_interrupted("e2e"):
        for size in sizes:
            result = run_e2e_bench(model_dir, corpus, size, dev, baseline=baseline,
                                   tokenize_workers=tokenizers or [2], scale=scale, index_factory=index_factory,
                                   engine_t2=dev == "cuda" if engine_t2 is None else engine_t2,
                                   engine_t2_tokens_per_s=results[0].get("engine_t2_tokens_per_s") if results else None)
            results.append(result)
            result = with_skipped(result, skipped)
            click.echo(json.dumps(result) if as_json else format_e2e_table(result) + skipped_lines(result))
    if len(results) > 1 and not as_json:
        click.echo(format_e2e_summary(results))


@bench.command("index")
@click.option("--vectors", "num_vectors", type=count(1000), default=1_000_000, show_default=True,
              help="Clustered random vectors indexed per scenario.")
@click.option("--dim", "dims", type=count(8, MAX_DIM), multiple=True, default=[384, 1024], show_default=True,
              help="Vector dimension; repeat for one scenario per dimension.")
@click.option("--queries", "num_queries", type=count(10, MAX_QUERIES), default=1000, show_default=True,
              help="Held-out query vectors searched (recall@10 against exact search, queries/s).")
@click.option("--index-memory", "memories", multiple=True, default=["8G"], show_default=True,
              help="petal's memory budget; repeat for one petal row per budget.")
@click.option("--target-recall", type=FiniteFloatRange(0.0, 1.0, min_open=True), default=0.95, show_default=True,
              help="petal's --target-recall.")
@click.option("--shards", "num_shards", type=count(1, MAX_PARALLEL), default=10, show_default=True,
              help="Store entries the vectors are split into (as shards of petal index).")
@click.option("--factory", default="auto", show_default=True, help="petal's --index-factory.")
@click.option("--no-baseline", is_flag=True, help="Skip the IVF4096,Flat baseline (IndexFlatIP always runs: "
              "it is the ground truth).")
@click.option("--data", type=click.Choice(["clustered", "sphere"]), default="clustered", show_default=True,
              help="The vectors: 1024 Gaussian clusters, or uniform on the unit sphere (no structure: the "
                   "hardest case for HNSW and IVF).")
@click.option("--order", type=click.Choice(["shuffled", "by-cluster"]), default="shuffled", show_default=True,
              help="How the clusters fall into the shards: mixed, or one after another (data appended by topic). "
                   "by-cluster needs --data clustered.")
@click.option("--workdir", type=PATH, default=None,
              help="Where the store is written: a new directory under WORKDIR/d<DIM>, removed after the run "
              "(nothing else there is touched; WORKDIR/.petal-bench.lock: one benchmark there at a time).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON lines.")
@bench_errors(writes=True)
def bench_index(num_vectors: int, dims: tuple[int, ...], num_queries: int, memories: tuple[str, ...],
                target_recall: float, num_shards: int, factory: str, no_baseline: bool, data: str, order: str,
                workdir: Path | None, as_json: bool) -> None:
    """Index build and search: petal auto vs IndexFlatIP and IVF4096,Flat (nprobe 1), same data. The table's
    recall@10 is what fresh queries (not in the index) get; "tuned" is what petal measured while it chose the
    search parameters."""
    from petal.pipeline.config import IndexSettings, parse_size

    # NOTE: before the store is written and anything is built (was: a ValueError traceback after the store)
    def budget(text: str) -> int:
        try:
            size = parse_size(text)
        except ValueError as exc:  # naming the flag, as petal index does
            raise ValueError(f"--index-memory: {exc}") from exc
        IndexSettings(memory_bytes=size)  # NOTE: under 1M refused here, as petal index refuses it (was a traceback)
        return size

    if order == "by-cluster" and data != "clustered":
        raise click.UsageError("--order by-cluster needs --data clustered (uniform vectors have no clusters)")
    budgets = [usage(functools.partial(budget, m)) for m in memories]
    distinct(budgets, "--index-memory", memories)  # by bytes: 8G and 8192M are one budget
    distinct(dims, "--dim")
    if num_shards > num_vectors:  # NOTE: was an AssertionError traceback once the store was being written
        raise click.BadParameter(f"{num_shards} shards of {num_vectors} vectors: give at most --vectors",
                                 param_hint="--shards")
    if not factory:  # NOTE: was IndexSettings' ValueError traceback
        raise click.UsageError("--factory must not be empty (auto, or a FAISS index factory string)")
    settings = IndexSettings(factory=factory, memory_bytes=budgets[0])
    for dim in dims:
        check_factory(settings, dim, num_vectors, "--vectors", "--factory")
    require_stdout("petal bench index")
    paths({}, workdir)
    if workdir is not None:
        from petal.pipeline.reliability.safe_files import check_output_dir

        for dim in dims:
            check_output_dir("--workdir", workdir / f"d{dim}")
        hold_workdir(workdir, "index")
    from petal.bench.index import IVF_BASELINE, IVF_BASELINE_LISTS, format_index_table, run_index_bench

    skipped: dict[str, str] = {}
    if not no_baseline and num_vectors < IVF_BASELINE_LISTS:  # NOTE: was a FAISS traceback once the store was written
        skipped[f"FAISS {IVF_BASELINE}"] = f"it trains on {IVF_BASELINE_LISTS} vectors or more, --vectors {num_vectors}"
        click.echo(f"petal bench: note: the FAISS {IVF_BASELINE} baseline is skipped: it trains on "  # as st_baseline's
                   f"{IVF_BASELINE_LISTS} vectors or more, --vectors {num_vectors}", err=True)
    for dim in dims:
        result = run_index_bench(num_vectors, dim, num_queries=num_queries, memories=memories,
                                 target_recall=target_recall, num_shards=num_shards,
                                 baselines=not no_baseline and not skipped,
                                 factory=factory, data=data, order=order,
                                 workdir=workdir / f"d{dim}" if workdir else None)
        result = with_skipped(result, skipped)
        click.echo(json.dumps(result) if as_json else format_index_table(result) + skipped_lines(result))


@bench.command("outputs")
@click.option("--corpus", type=PATH, default=SAMPLE_CORPUS, show_default=SAMPLE_DEFAULT,
              help="Parquet files whose sentences build the documents and queries.")
@click.option("--docs", "num_docs", type=count(100), default=3000, show_default=True,
              help="Texts embedded and indexed in each format.")
@click.option("--queries", "num_queries", type=count(10, MAX_QUERIES), default=200, show_default=True,
              help="Further texts searched as queries (recall@10 against exact float32 search).")
@click.option("--dims", default="384,128", show_default=True, help="Comma-separated --dim values to measure.")
@click.option("--model", type=MODEL_DIR, default=None,
              help="Model directory (default: the packaged all-MiniLM-L6-v2).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@bench_errors(writes=True)
def bench_outputs(corpus: Path, num_docs: int, num_queries: int, dims: str, model: str | None, as_json: bool) -> None:
    """Recall@10 vs index bytes per vector for float32, float16, int8 and binary (+ rescoring)."""
    try:  # NOTE: every flag and path before torch loads (was: --dims and --model after)
        chosen = tuple(int(d) for d in dims.split(",") if d.strip())
    except ValueError as exc:
        raise click.UsageError(f"--dims {dims!r}: expected comma-separated integers") from exc
    distinct(chosen, "--dims")
    if not chosen or min(chosen) < 1:  # NOTE: a usage error before the paths (was 66 for a missing --corpus first)
        raise click.UsageError(f"--dims {dims!r}: expected comma-separated integers from 1 to the model's dim")
    require_stdout("petal bench outputs")
    paths({"--corpus": corpus})
    model_dim = judge_model(model).dim
    if max(chosen) > model_dim:
        raise click.UsageError(f"--dims {dims!r}: expected comma-separated integers from 1 to the model's dim "
                               f"{model_dim}")
    from petal.bench.outputs import format_outputs_table, run_outputs_bench

    result = run_outputs_bench(corpus, num_docs=num_docs, num_queries=num_queries, dims=chosen, model=model)
    click.echo(json.dumps(result) if as_json else format_outputs_table(result))


def paths(inputs: dict[str, Path | None], workdir: Path | None = None) -> None:
    """The command's path flags, before anything loads: ``inputs`` (flag -> path) readable (66), ``workdir`` a
    directory this process can create or write (73)."""
    from petal.pipeline.reliability.errors import NoInputError
    from petal.pipeline.reliability.safe_files import check_input_path, check_output_dir

    ctx = click.get_current_context()
    for flag, path in inputs.items():
        if flag == "--corpus" and ctx.get_parameter_source("corpus") is ParameterSource.DEFAULT \
                and not os.path.lexists(path):  # type: ignore[arg-type]
            raise NoInputError(f"--corpus not given, and no {path}/ in the working directory (the repository's "
                               "sample corpus: petal's install does not include it): run from the repository's root "
                               "or give --corpus PATH (Parquet files with a text column)")
        if path is not None:
            check_input_path(flag, path)
    if workdir is not None:
        check_output_dir("--workdir", workdir)


def judge_tokenizer_dir(shape: str | None, tokenizer_dir: Path | None) -> None:
    """``--tokenizer-dir`` (read: ``paths``) is a directory holding ``tokenizer.json``, before a ``--shape`` model is
    made: else 2 naming it. Was: the model built, then 78 naming a removed temporary directory (``e2e``), or 78 with
    ``serve --workdir``'s model directory left marked complete without a tokenizer (every later run failed). Without
    ``--shape`` it is 2 too (it applies only to a --shape model; was ignored without a word)."""
    if tokenizer_dir is None:
        return
    if shape is None:
        raise click.UsageError("--tokenizer-dir applies only with --shape (the random-weight model's tokenizer); "
                               "--model and the packaged model bring their own")
    from petal.pipeline.reliability.errors import quote_path

    if not tokenizer_dir.is_dir():
        raise click.BadParameter(f"{quote_path(tokenizer_dir)} is not a directory (give the one that holds "
                                 f"{TOKENIZER_FILE})", param_hint="--tokenizer-dir")
    if not (tokenizer_dir / TOKENIZER_FILE).is_file():
        raise click.BadParameter(f"{quote_path(tokenizer_dir)} holds no {TOKENIZER_FILE}", param_hint="--tokenizer-dir")


@contextlib.contextmanager
def work_removed_when_interrupted(command: str) -> Iterator[None]:
    """A stop signal during ``petal bench COMMAND``'s in-process ``petal index`` runs: said as the benchmark's (its
    temporary index is removed: nothing to resume), not petal index's 'finished shards are committed, rerun to
    resume'; still 128 + the signal's number."""
    from petal.pipeline.reliability.errors import Interrupted

    try:
        yield
    except Interrupted as exc:
        import signal

        stopped = Interrupted(exc.signum)
        stopped.args = (f"interrupted by {signal.Signals(exc.signum).name}; petal bench {command} removes its "
                        "temporary work (nothing to resume)",)
        raise stopped from None


def hold_workdir(workdir: Path, command: str) -> None:
    """``--workdir``'s bench lock, held until the command ends: another benchmark writing there (its index rebuilt
    under the first's server, its log truncated) is refused, 75 naming the holder (bench/workdir.py)."""
    from petal.bench.workdir import workdir_lock

    click.get_current_context().with_resource(workdir_lock(workdir, command))


def judge_model(model: str | Path | None) -> Any:
    """``--model`` (or, without it, the packaged model) judged as the model commands judge it, before torch loads:
    not there, not a model directory or a bad config is ``ModelError`` (78), ``--model ""`` was refused by click
    (2), a file petal may not read in it 66. Reads the configuration only. Returns its ``ModelSpec``."""
    from petal.engine.loader import inspect_model

    return inspect_model(model)


def check_factory(settings: Any, dim: int, num_vectors: int, counted: str, flag: str = "--index-factory") -> None:
    """An explicit index factory FAISS cannot build at ``dim`` or train on ``num_vectors`` (``FlagError``, 2, naming
    ``flag``), before any vector is made (FAISS loads; torch does not). ``counted``: the flag that sets
    ``num_vectors``, as the message says it (not a run's "rows read", which a benchmark has none of)."""
    from petal.pipeline.index.plan import check_index_factory
    from petal.pipeline.reliability.errors import FlagError

    try:
        check_index_factory(settings, "float32", dim, num_vectors, counted)
    except FlagError as exc:
        if flag == "--index-factory":
            raise
        raise FlagError(str(exc).replace("--index-factory", flag)) from None  # NOTE: every mention: the advice too


BENCH_EXTRA = "pip install 'petal[bench]'"
ST_BASELINE = "sentence-transformers"


def missing_modules(*names: str) -> list[str]:
    """The modules of ``names`` that cannot be imported here (judged without importing them)."""
    return [name for name in names if not _importable(name)]


def _importable(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def require_modules(command: str, *names: str) -> None:
    """What ``petal bench COMMAND`` cannot run without (the ``bench`` extra's ``transformers``, ...): missing, a
    configuration error (78) naming them, before torch loads. Was a ModuleNotFoundError traceback (exit 1)."""
    from petal.pipeline.reliability.errors import ConfigError

    missing = missing_modules(*names)
    if missing:
        raise ConfigError(f"petal bench {command} needs {', '.join(missing)}, not installed here: {BENCH_EXTRA}")


def st_baseline(wanted: bool, skipped: dict[str, str]) -> bool:
    """Whether the sentence-transformers baseline runs: asked for (no ``--no-baseline``) and installed. Asked for and
    not installed, it is skipped, said on stderr and in ``skipped`` (the result's table and JSON say so too); was a
    traceback (exit 1) after the runs before it."""
    if not wanted:
        return False
    if missing_modules("sentence_transformers"):
        skipped[ST_BASELINE] = f"not installed ({BENCH_EXTRA})"
        click.echo(f"petal bench: note: {ST_BASELINE} is not installed: its baseline is skipped ({BENCH_EXTRA})",
                   err=True)
        return False
    return True


def with_skipped(result: dict[str, Any], skipped: dict[str, str]) -> dict[str, Any]:
    """``result`` with the baselines that were asked for and skipped (``skipped``, when any)."""
    return {**result, "skipped": skipped} if skipped else result


def skipped_lines(result: dict[str, Any]) -> str:
    """The table's lines for ``result``'s skipped baselines (``with_skipped``)."""
    return "".join(f"\n{name}: skipped, {why}" for name, why in result.get("skipped", {}).items())


# NOTE: what bench serve gives petal serve itself and --serve-arg may not give again: the server would serve another
# index or model than the one the queries are made for (the last value wins). --device is the server's (given last,
# _serve_arg_device); --port and --log-level are taken as given (the address is read from the server's log).
OWN_SERVE_ARGS = {"index_path": "OUT (bench serve's --index, or the index it builds)",
                  "model": "--model (bench serve's --model or --shape)"}


def judge_serve_args(serve_args: tuple[str, ...]) -> None:
    """``--serve-arg``'s flags parsed by ``petal serve``'s own command (nothing starts): one it refuses (unknown, a
    value missing or out of its range), --help, or one of ``OWN_SERVE_ARGS`` is a usage error (2) naming --serve-arg
    and the flag, before any index is built or model made. Was: petal serve's exit 2 once the index was built."""
    if not serve_args:
        return
    from petal.cli.serve import serve

    shown = " ".join(serve_args)
    if any(arg in ("--help", "-h") for arg in serve_args):
        raise click.BadParameter(f"{shown}: --help starts no server; see petal serve --help", param_hint="--serve-arg")
    try:
        with serve.make_context("petal serve", list(serve_args)) as ctx:
            given = [name for name in OWN_SERVE_ARGS if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE]
    except click.UsageError as exc:
        raise click.BadParameter(f"{shown}: petal serve refuses it: {exc.format_message()}",
                                 param_hint="--serve-arg") from None
    if given:
        raise click.BadParameter(f"{shown}: gives {OWN_SERVE_ARGS[given[0]]} again; petal bench serve sets it",
                                 param_hint="--serve-arg")


def _serve_arg_device(serve_args: tuple[str, ...], device: str) -> str:
    """The device petal serve is started on: the last ``--device`` of ``serve_args`` (``--device=X`` or ``--device``
    then ``X``, as they follow bench serve's own ``--device`` on its command line), else ``device``."""
    for i, arg in enumerate(serve_args):
        if arg.startswith("--device="):
            device = arg.partition("=")[2]
        elif arg == "--device" and i + 1 < len(serve_args):
            device = serve_args[i + 1]
    return device


def _int_list(value: str, name: str, high: int) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        out = ()
    if not out or min(out) < 1 or max(out) > high:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of whole numbers from 1 to {high}",
                                 param_hint=name)
    return out


@bench.command("serve")
@click.option("--index", "index_path", type=PATH, default=None,
              help="Serve this index (OUT). Default: build one with petal index from --corpus (or --index-docs).")
@click.option("--model", type=MODEL_DIR, default=None,
              help="Model directory (default: the index's, else the packaged MiniLM).")
@click.option("--shape", type=click.Choice(SHAPE_NAMES), default=None,
              help="Instead of --model: random weights in this shape.")
@click.option("--tokenizer-dir", type=PATH, default=None,
              help="With --shape: where tokenizer.json comes from (default: the packaged MiniLM's).")
@click.option("--corpus", type=PATH, default=SAMPLE_CORPUS, show_default=SAMPLE_DEFAULT,
              help="Parquet files: the index's documents (without --index) and the queries' sentences.")
@click.option("--index-docs", type=count(100), default=None,
              help="Build the index from N texts made of --corpus sentences (e.g. 1000000) instead of --corpus.")
@click.option("--index-doc-tokens", type=count(8, MAX_TEXT_TOKENS), default=64, show_default=True,
              help="With --index-docs: median tokens per text (shorter texts build a large index sooner).")
@click.option("--workdir", type=PATH, default=None,
              help="Where a built index goes (reused when it holds one) and the server log.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where the server's model runs (petal serve --device).")
@click.option("--endpoints", default="embeddings,search", show_default=True, help="Comma-separated.")
@click.option("--tokens", default="16,128", show_default=True, help="Query lengths (tokens), comma-separated.")
@click.option("--concurrency", default="1,16,64", show_default=True, help="Clients at once, comma-separated.")
@click.option("--requests", "max_requests", type=count(1), default=2000, show_default=True,
              help="Requests per scenario, at most.")
@click.option("--seconds", type=FiniteFloatRange(min=0.1, max=MAX_SECONDS), default=10.0, show_default=True,
              help="Seconds per scenario in which requests are sent, at most (the answers then in flight are "
                   "awaited: a row of C clients lasts at least as long as C requests take).")
@click.option("-k", "k", type=count(1, MAX_K), default=10, show_default=True, help="Hits per /search request.")
@click.option("--client-processes", type=count(1, MAX_PARALLEL), default=None,
              help="Load-generator processes (default: cores / 4, at most 8).")
@click.option("--serve-arg", "serve_args", multiple=True,
              help="Extra petal serve flag (repeat), e.g. --serve-arg=--max-wait-ms=1; checked by petal serve's parser "
                   "before anything starts. OUT and --model are bench serve's own (--index, --model); --device, "
                   "--port, --log-level given here win.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@bench_errors(writes=True)
def bench_serve(index_path: Path | None, model: str | None, shape: str | None, tokenizer_dir: Path | None,
                corpus: Path, index_docs: int | None, index_doc_tokens: int, workdir: Path | None, device: str,
                endpoints: str, tokens: str,
                concurrency: str, max_requests: int, seconds: float, k: int, client_processes: int | None,
                serve_args: tuple[str, ...], as_json: bool) -> None:
    """petal serve under load on loopback: p50/p99 latency and requests/s per endpoint, length, concurrency."""
    from petal.bench.serve import ENDPOINTS, format_serve_table, run_serve_bench

    # NOTE: every flag and path before a --shape model is made or an index built (was: --tokens, --concurrency
    # after them, --model when the server started)
    chosen = tuple(e.strip() for e in endpoints.split(",") if e.strip())
    unknown = [e for e in chosen if e not in ENDPOINTS]
    if unknown or not chosen:
        raise click.BadParameter(f"{endpoints!r}: choose from {', '.join(ENDPOINTS)}", param_hint="--endpoints")
    if shape is not None and model is not None:
        raise click.UsageError("--shape and --model exclude each other")
    distinct(chosen, "--endpoints")
    lengths = _int_list(tokens, "--tokens", MAX_TEXT_TOKENS)
    clients = _int_list(concurrency, "--concurrency", MAX_PARALLEL)
    distinct(lengths, "--tokens")
    distinct(clients, "--concurrency")
    judge_serve_args(serve_args)  # NOTE: before the index is built (was: petal serve's own exit 2 after it)
    require_stdout("petal bench serve")
    from petal.cli.serve import missing_serve_extra

    missing = missing_serve_extra()  # NOTE: was said by the server's log in a traceback, after the index was built
    if missing:
        from petal.pipeline.reliability.errors import ConfigError

        raise ConfigError(f"petal bench serve runs petal serve, which needs the optional 'serve' dependencies "
                          f"({', '.join(missing)} missing): pip install 'petal[serve]'")
    if shape is not None:
        require_modules("serve --shape", "transformers")
    # NOTE: --corpus always: the queries' sentences come from it (with --index it was skipped, then read: 66 naming
    # "source sample_data" after torch loaded)
    paths({"--index": index_path, "--tokenizer-dir": tokenizer_dir, "--corpus": corpus}, workdir)
    judge_tokenizer_dir(shape, tokenizer_dir)
    if model is not None:
        judge_model(model)
    if index_path is not None:  # not an index (78), a damaged manifest: before a --shape model is made
        from petal.pipeline.layout import resolve_index_dir

        resolve_index_dir(index_path)
    if workdir is not None:
        _serve_outputs(workdir, shape, build=index_path is None and "search" in chosen, docs=index_docs is not None)
        hold_workdir(workdir, "serve")
    served_on = _serve_arg_device(serve_args, device)  # NOTE: a --serve-arg --device is the server's (given last)
    if served_on == "cuda":  # NOTE: as e2e and startup judge it: was petal serve's refusal, after the model and index
        from petal.engine.engine import resolve_device

        usage(lambda: resolve_device(served_on))
    model_dir = Path(model) if model else None
    if shape is not None:
        import torch

        from petal.bench.runs import temporary_workdir
        from petal.bench.shapes import hf_model, save_model_dir
        from petal.bench.shapes import shape as get_shape
        from petal.engine.loader import default_model_dir

        s = get_shape(shape)
        # NOTE: without --workdir, removed when the command ends (was left behind)
        target = workdir / f"model-{shape}" if workdir else \
            click.get_current_context().with_resource(temporary_workdir(f"petal-{shape}-"))
        if not (target / "sentence_bert_config.json").is_file():  # written last: a complete directory
            if workdir:
                from petal.bench.workdir import Written

                Written(workdir).claim(target.name)
            hf = hf_model(s, torch.device("cpu"), torch.float32)
            save_model_dir(s, hf, tokenizer_dir or default_model_dir(), target)
            del hf
        model_dir = target
    result = run_serve_bench(index=index_path, model=model_dir, corpus=corpus, num_docs=index_docs,
                             doc_tokens=index_doc_tokens, workdir=workdir,
                             device=device, endpoints=chosen, tokens=lengths,
                             concurrency=clients, max_requests=max_requests,
                             seconds=seconds, k=k, processes=client_processes, serve_args=serve_args)
    click.echo(json.dumps(result) if as_json else format_serve_table(result))
    # NOTE: a row whose every request the server refused measured nothing (--tokens past the model's length: 413s,
    # -k past the server's --max-k: 422s, a --serve-arg=--api-key: 401s): it exited 0 with an empty row
    failed = [row for row in result["results"] if not row["requests"] and row["errors"]]
    if failed:
        from petal.pipeline.reliability.errors import FlagError

        row = failed[0]
        errors = ", ".join(f"{name}: {count}" for name, count in row["errors"].items())
        raise FlagError(f"{len(failed)} row(s) measured nothing: no request succeeded ({row['endpoint']}, "
                        f"{row['tokens']} tokens, {row['concurrency']} clients: {errors}); the server refused them: "
                        "check --tokens against the model's max length, -k against the server's --max-k and the "
                        "--serve-arg flags")


def _serve_outputs(workdir: Path, shape: str | None, build: bool, docs: bool) -> None:
    """What bench serve writes under ``--workdir``, judged before a model is made or an index built (73 naming it):
    ``model-<shape>`` and ``out`` (and ``docs`` with --index-docs) unless a complete one is reused, ``serve.log``."""
    from petal.bench.workdir import Written
    from petal.pipeline.reliability.errors import OutputError, quote_path
    from petal.pipeline.reliability.safe_files import check_output_dir

    if shape is not None and not (workdir / f"model-{shape}" / "sentence_bert_config.json").is_file():
        check_output_dir("--workdir", workdir / f"model-{shape}")
    if build and not (workdir / "out" / "CURRENT").is_file():
        for name in ("out", "docs") if docs else ("out",):
            check_output_dir("--workdir", workdir / name)
    log = workdir / "serve.log"
    if os.path.lexists(log) and not log.is_file():
        raise OutputError(f"--workdir {quote_path(log)} is not a regular file; petal bench serve writes the server's "
                          "log there")
    # NOTE: what it would reuse, overwrite or remove there and did not write (a user's index in out): 73, untouched
    owned = [f"model-{shape}"] if shape is not None else []
    owned += ["out", "built.json", "docs"] if build and docs else ["out", "built.json"] if build else []
    Written(workdir).check(*owned, "serve.log")


@bench.command("startup")
@click.option("--runs", type=count(1), default=5, show_default=True,
              help="Timed child processes per measurement (median reported).")
@click.option("--text", default="how do glaciers move", show_default=True, help="What petal embed embeds.")
@click.option("--vectors", "num_vectors", type=count(1000), default=200_000, show_default=True,
              help="Open + query: vectors in the index (1000000 with --dim 1024 for the issue's 4 GB case).")
@click.option("--dim", type=count(8, MAX_DIM), default=384, show_default=True,
              help="Open + query: the dimension of the index's vectors.")
@click.option("--index-factory", "factory", default="auto", show_default=True,
              help="FAISS factory of the opened index (auto: petal's rule, Flat up to 50k vectors, IVF above).")
@click.option("--shape", "shape_name", type=click.Choice(SHAPE_NAMES), default="minilm",
              show_default=True, help="Model load: random weights in this shape.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Model load: where the weights go (petal embed always runs on the CPU).")
@click.option("--no-baseline", is_flag=True, help="Skip the sentence-transformers script.")
@click.option("--workdir", type=PATH, default=None,
              help="Where the index and the model are written (default: a temporary directory, removed).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@bench_errors(writes=True)
def bench_startup(runs: int, text: str, num_vectors: int, dim: int, factory: str, shape_name: str, device: str,
                  no_baseline: bool, workdir: Path | None, as_json: bool) -> None:
    """One-shot start-up: import torch, petal embed, a sentence-transformers script, index open + query,
    model load, with the ratios to issue 14's targets."""
    # NOTE: every flag, output path and the packaged model are judged before the timed runs (the outputs were first
    # written after ~40 s of them) and before torch loads
    if not text.strip():
        raise click.BadParameter("is blank: petal embed has nothing to embed", param_hint="--text")
    from petal.pipeline.config import IndexSettings

    check_factory(usage(lambda: IndexSettings(factory=factory)), dim, num_vectors, "--vectors")
    require_stdout("petal bench startup")
    paths({}, workdir)
    from petal.bench.startup import check_outputs, format_startup_table, run_startup_bench
    from petal.engine.loader import default_model_dir

    if workdir is not None:
        check_outputs(workdir, num_vectors, dim, factory, shape_name)
    default_model_dir()  # petal embed's model: 78 when the packaged model is not installed
    require_modules("startup", "transformers")  # its model-load scenario's random-weight model is built with it
    if workdir is not None:
        hold_workdir(workdir, "startup")
    from petal.engine.engine import resolve_device

    skipped: dict[str, str] = {}
    result = run_startup_bench(runs=runs, text=text, num_vectors=num_vectors, dim=dim, factory=factory,
                               shape_name=shape_name, device=usage(lambda: resolve_device(device)),
                               baseline=st_baseline(not no_baseline, skipped),
                               workdir=workdir)
    result = with_skipped(result, skipped)
    click.echo(json.dumps(result) if as_json else format_startup_table(result) + skipped_lines(result))

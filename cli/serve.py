"""``petal serve OUT``: an HTTP service that embeds and searches a live index and follows re-indexing."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import sys
from pathlib import Path

import click

from petal.cli.common import (
    MODEL_DIR,
    NON_EMPTY,
    PATH,
    PetalClickError,
    device_flags,
    eprint,
    freeze_long_lived,
    given_flags,
    unused_flags,
    usage,
    user_errors,
)
from petal.cli.options import loading_options
from petal.engine.config import MAX_SEQS, MAX_TOKEN_BUDGET
from petal.pipeline.index.bounds import MAX_NPROBE, MAX_RESCORE
from petal.pipeline.reliability.signals import STOP_SIGNALS, HeldSignals
from petal.pipeline.serve.settings import API_KEY_ENV, MAX_WAIT_MS

# NOTE: every module the server imports unconditionally (httptools: its HTTP parser, pipeline/serve/server.py); uvloop
# and orjson are used when installed
SERVE_MODULES = ("starlette", "uvicorn", "prometheus_client", "httptools")
# NOTE: flags that set a part of the server it may not have: refused when given explicitly (a default is no request),
# never silently ignored
MODEL_FLAGS = ("max_tokens_per_text", "token_budget", "max_seqs", "max_wait_ms", "engine_spin_ms", "served_model_name",
               "device", "dtype", "attention", "query_prompt", "allow_pickle_weights")  # the embedding model and engine
INDEX_FLAGS = ("max_k", "nprobe", "rescore", "reload_interval_s", "search_threads", "search_device", "search_dtype",
               "search_exact")  # /search and following OUT
GPU_COPY_FLAGS = ("search_dtype", "search_exact")  # the GPU copy's: nothing to set where FAISS on the CPU searches


class _StderrLog(logging.Handler):
    """The server's own log records (``petal.serve``: a version swapped in or refused, the GPU copy made) on stderr,
    beside uvicorn's; the stream is looked up at each record, and a closed one is not an error."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:
            self.handleError(record)
            return
        with contextlib.suppress(BrokenPipeError, ValueError):
            sys.stderr.write(text + "\n")
            sys.stderr.flush()


def log_to_stderr(level: str) -> None:
    """``petal.serve``'s records at ``--log-level`` and above on stderr (once per process).

    NOTE: uvicorn configures only its own loggers: without a handler here, Python's last-resort handler printed
    warnings whatever --log-level said and dropped every info line ("now serving v2 (N vectors), was v1", the GPU
    copy's description)."""
    logger = logging.getLogger("petal.serve")
    logger.setLevel(level.upper())
    if not any(isinstance(handler, _StderrLog) for handler in logger.handlers):
        logger.addHandler(_StderrLog())


def argv_without_api_key(argv: list[str], api_key: str) -> list[str] | None:
    """``argv`` (the process's own command line) without its ``--api-key KEY`` and ``--api-key=KEY`` options, or
    ``None`` when none of them has ``api_key`` as its value (the key came from PETAL_API_KEY, or the command was
    invoked from Python)."""
    kept: list[str] = []
    found = False
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":  # NOTE: what follows is positional
            kept += argv[i:]
            break
        # NOTE: every --api-key goes (click takes the last one given): one left behind would be the key after the exec
        if arg == "--api-key" and i + 1 < len(argv):
            found = found or argv[i + 1] == api_key
            i += 2
            continue
        if arg.startswith("--api-key="):
            found = found or arg == f"--api-key={api_key}"
        else:
            kept.append(arg)
        i += 1
    return kept if found else None


def exec_without_api_key(api_key: str) -> None:
    """Start this process again (the same pid) with the key of ``--api-key KEY`` in PETAL_API_KEY instead of on its
    command line. NOTE: a process's command line is readable by every user of the machine (``ps``,
    /proc/PID/cmdline, for its whole life), its environment only by its owner: ``petal serve --api-key "$(cat
    KEYFILE)"`` showed the key to anyone who ran ``ps`` while it served. The command line wins over PETAL_API_KEY, so
    the key given there replaces the variable's."""
    argv = argv_without_api_key(list(getattr(sys, "orig_argv", ())), api_key)
    if argv is None or os.name != "posix" or api_key in argv:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    # NOTE: a stop signal while the new interpreter starts would kill it (143): blocked across the exec (a signal mask
    # is kept by execve), it waits until serve's HeldSignals takes it over and unblocks it (exit 0, as without a key)
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        os.execve(sys.executable, argv, {**os.environ, API_KEY_ENV: api_key})
    except OSError as exc:  # the key stays on the command line; the server runs
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        eprint(f"petal serve: note: could not start again without --api-key on the command line ({exc}); ps shows "
               f"it: set {API_KEY_ENV} instead")


def missing_serve_extra() -> list[str]:
    """The modules of the ``serve`` extra that cannot be imported here."""
    missing = []
    for name in SERVE_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):
            missing.append(name)
    return missing


@click.command()
# NOTE: readable=False: click's own check made an unreadable OUT a usage error (2); the run judges it (66)
@click.argument("index_path", metavar="[OUT]", required=False, type=PATH)
@click.option("--model", type=MODEL_DIR, default=None, metavar="PATH|HF_ID",
              help="A local model directory, or a Hugging Face model id already in the local cache: alone, "
                   "embeddings only; with OUT, the index's model if it moved (the weights must match).")
@click.option("--host", type=NON_EMPTY, default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0: all).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="Port (0: any free).")
@click.option("--api-key", envvar=API_KEY_ENV, default=None,
              help="Require 'Authorization: Bearer KEY' on /v1/* and /search (or set PETAL_API_KEY; this flag wins). "
                   "Given here, the server starts itself again with the key in PETAL_API_KEY, so that ps no "
                   "longer shows it.")
@click.option("--max-wait-ms", type=click.FloatRange(min=0, max=MAX_WAIT_MS), default=0.0, show_default=True,
              help="Hold a partial batch this long for more requests (0: launch at once; batches still form "
                   "from requests that arrive while a step runs; at most 60000).")
@click.option("--max-texts", type=click.IntRange(min=1), default=256, show_default=True,
              help="Texts (or vectors) per request.")
@click.option("--max-tokens-per-text", type=click.IntRange(min=2), default=None,
              help="Tokens per text, prompt included (default: the model's max length).")
@click.option("--max-k", type=click.IntRange(min=1), default=1000, show_default=True, help="Largest k of /search.")
@click.option("--max-body-bytes", type=click.IntRange(min=1024), default=4 << 20, show_default=True,
              help="Bytes of one request's body (then 413); the default is 4 MiB.")
@click.option("--max-body-bytes-in-flight", type=click.IntRange(min=1024), default=64 << 20, show_default=True,
              help="Request body bytes held at once by all requests together (being read, parsed or served); "
                   "beyond it a request gets 503 with Retry-After, so memory stays bounded. At least --max-body-bytes; "
                   "the default is 64 MiB.")
@click.option("--max-answer-bytes-in-flight", type=click.IntRange(min=1024), default=256 << 20, show_default=True,
              help="Answer bytes of /search and /v1/embeddings held at once until their clients take them; an answer "
                   "past it gets 503 with Retry-After instead (one answer of any size is always sent), so clients "
                   "that do not read cannot hold memory without bound. The default is 256 MiB.")
@click.option("--max-queue-texts", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Texts waiting for the engine; beyond it requests get 503 with Retry-After.")
@click.option("--token-budget", type=click.IntRange(min=64, max=MAX_TOKEN_BUDGET), default=None,
              help="Tokens per engine step, at least the model's max length [default: 8192 on CUDA, 2048 on the "
                   "CPU, or the model's max length where more].")
@click.option("--max-seqs", type=click.IntRange(min=1, max=MAX_SEQS), default=None,
              help="Texts per engine step (default: 256 on CUDA, 64 on the CPU).")
@click.option("--nprobe", type=click.IntRange(min=1, max=MAX_NPROBE), default=None,
              help="Override the tuned IVF nprobe.")
@click.option("--rescore", type=click.IntRange(min=0, max=MAX_RESCORE), default=None,
              help="Binary indexes: re-rank N x k Hamming candidates with float vectors (default 10; 0: Hamming "
                   "only).")
@click.option("--reload-interval-s", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
              help="How often OUT/CURRENT is checked for a new version.")
@click.option("--drain-timeout-s", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="On SIGTERM, how long in-flight requests may take before the server exits.")
@click.option("--header-timeout-s", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="How long a request's line and headers may take to arrive once begun (then 408, the connection "
                   "closed); a new connection that sends nothing is closed after --keep-alive-s, as an idle "
                   "keep-alive one.")
@click.option("--keep-alive-s", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="How long an idle keep-alive connection (or a new one that sends nothing) is kept. Behind a load "
                   "balancer, set it above the balancer's idle timeout (AWS ALB: 60 s), or a request it sends on a "
                   "connection the server is closing gets a 502.")
@click.option("--body-timeout-s", type=click.FloatRange(min=0.1), default=60.0, show_default=True,
              help="How long a request's body may take to arrive (then 408, the connection closed).")
@click.option("--send-timeout-s", type=click.FloatRange(min=0.1), default=60.0, show_default=True,
              help="How long an answer may wait for its client to read any of it (then the connection is aborted).")
@click.option("--threads", "search_threads", type=click.IntRange(min=1), default=4, show_default=True,
              help="Threads for reading stored text and metadata (include), off the event loop.")
@click.option("--search-device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="cuda: search a GPU copy of the index's vectors (an IVF index: its probed lists, as FAISS "
                   "does; auto: when the model runs on CUDA); cpu: FAISS.")
@click.option("--search-dtype", type=click.Choice(["float16", "float32"]), default="float16", show_default=True,
              help="The GPU copy's dtype (float16: half the memory; scores in float32).")
@click.option("--search-exact", is_flag=True,
              help="With the GPU copy: score every vector of an IVF index (the exact top k), not only the "
                   "lists that nprobe probes.")
@click.option("--switch-interval-ms", type=click.FloatRange(min=0.01), default=0.5, show_default=True,
              help="Python's GIL switch interval in the server (default 5 ms in Python): how long the engine thread "
                   "may wait for the GIL behind a busy event loop.")
@click.option("--engine-spin-ms", type=click.FloatRange(min=0, max=1000), default=None,
              help="With nothing queued, the engine thread polls this long before it sleeps: a step launched by a "
                   "sleeping thread is ~60 us slower [default: 2 on CUDA, 0 on the CPU].")
@click.option("--served-model-name", type=NON_EMPTY, default=None,
              help="The model id of /v1/models (default: the model directory's name; a cached Hugging Face "
                   "model's id, org/name).")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True, help="Which of the server's own log lines (and uvicorn's) are printed.")
@click.option("--access-log", is_flag=True, help="Log every request (uvicorn's access log).")
@device_flags
@loading_options
@user_errors(outputs=())  # NOTE: serve writes no file: permission denied on any path is one it reads (66), not 74
def serve(index_path: Path | None, model: str | None, host: str, port: int, api_key: str | None, max_wait_ms: float,
          max_texts: int, max_tokens_per_text: int | None, max_k: int, max_body_bytes: int,
          max_body_bytes_in_flight: int, max_answer_bytes_in_flight: int,
          max_queue_texts: int,
          token_budget: int | None, max_seqs: int | None, nprobe: int | None, rescore: int | None,
          reload_interval_s: float, drain_timeout_s: float, header_timeout_s: float, keep_alive_s: float,
          body_timeout_s: float, send_timeout_s: float, search_threads: int,
          search_device: str, search_dtype: str, search_exact: bool, switch_interval_ms: float,
          engine_spin_ms: float | None, served_model_name: str | None,
          log_level: str, access_log: bool, device: str, dtype: str, attention: str, query_prompt: str | None,
          allow_pickle_weights: bool) -> None:
    """Serve OUT (an index directory) over HTTP: OpenAI-compatible /v1/embeddings and /search.

    Keeps the model and the index warm, batches concurrent requests by tokens, and moves to every new
    version that `petal index`/`rebuild` publishes in OUT. `--model DIR` without OUT: embeddings only.
    SIGTERM drains in-flight requests, then exits 0.
    """
    if api_key is not None:
        exec_without_api_key(api_key)  # NOTE: first: nothing has started yet
    # NOTE: first: a stop signal during the imports and checks below (~2 s) must not kill the process (143)
    held = HeldSignals().install()
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked across exec_without_api_key's exec
    log_to_stderr(log_level)
    if index_path is None and model is None:
        raise click.UsageError("give OUT (an index directory) or --model DIR (embeddings only)")
    if api_key is None and os.environ.get(API_KEY_ENV) is not None:
        api_key = os.environ[API_KEY_ENV]  # NOTE: set but empty: refused below, never an open server
    # NOTE: what the flags and the index's manifest decide is a usage error before any other check (the serve extra)
    if index_path is None and given_flags(INDEX_FLAGS):
        raise unused_flags(given_flags(INDEX_FLAGS), "no index is served (no OUT given: --model DIR alone serves "
                           "/v1/embeddings only)", "give OUT to serve /search, or leave {them} out")
    if search_device == "cpu" and given_flags(GPU_COPY_FLAGS):
        raise unused_flags(given_flags(GPU_COPY_FLAGS), "--search-device cpu searches with FAISS on the CPU (no GPU "
                           "copy of the index is made)", "leave {them} out, or give --search-device cuda")
    from petal.pipeline.manifest import ModelRecord
    from petal.pipeline.serve.leases import lease_first_version, release_with
    from petal.pipeline.serve.settings import Limits, ServeSettings

    settings = usage(lambda: ServeSettings(
        limits=Limits(max_texts=max_texts, max_tokens_per_text=max_tokens_per_text, max_k=max_k,
                      max_body_bytes=max_body_bytes),
        max_wait_ms=max_wait_ms, max_queue_texts=max_queue_texts, max_body_bytes_in_flight=max_body_bytes_in_flight,
        max_answer_bytes_in_flight=max_answer_bytes_in_flight,
        reload_interval_s=reload_interval_s,
        drain_timeout_s=drain_timeout_s, header_timeout_s=header_timeout_s, keep_alive_s=keep_alive_s,
        body_timeout_s=body_timeout_s,
        send_timeout_s=send_timeout_s, search_threads=search_threads, api_key=api_key,
        served_model_name=served_model_name, search_dtype=search_dtype, search_exact=search_exact,
        switch_interval_ms=switch_interval_ms, engine_spin_ms=engine_spin_ms))
    # not an index (a typo): said at once, before any port or model; the version served first, leased now so that
    # a re-index while the model loads cannot prune it
    first_version = lease_first_version(index_path) if index_path is not None else None
    # an index of precomputed vectors (--vectors-column): /search by vectors; a model only if --model asks for one
    # (it serves /v1/embeddings), and without one neither torch nor a tokenizer is loaded
    vectors_only = first_version is not None and not isinstance(first_version[1].model, ModelRecord)
    with_model = model is not None or not vectors_only
    if not with_model and given_flags(MODEL_FLAGS):
        assert first_version is not None
        flags = given_flags(MODEL_FLAGS)
        hint = "; --search-device cuda alone searches a GPU copy of the index" if "--device" in flags else ""
        raise unused_flags(flags, f"the index has no model ({first_version[1].version} holds "
                           f"{first_version[1].model.display}) and no --model DIR was given",
                           "leave {them} out, or give --model DIR to serve /v1/embeddings with a model" + hint)
    from petal.engine.config import device_problem

    problem = device_problem(device, dtype, attention)  # NOTE: --device cpu: before torch (auto: EngineConfig's)
    if problem is not None:
        raise click.UsageError(problem)
    # NOTE: the GPU copy of a text index is searched with the query vectors the model makes on its device (a lone
    # query on the engine thread); an index of vectors is searched with the client's rows: its copy needs CUDA only
    if search_device == "cuda" and device == "cpu" and not vectors_only:
        raise click.UsageError("--search-device cuda searches the index's GPU copy with the query vectors the model "
                               "makes, so it needs the model on CUDA, and --device cpu was given: give --device cuda "
                               "(or leave --device out)")
    missing = missing_serve_extra()
    if missing:
        raise PetalClickError(f"petal serve needs the optional 'serve' dependencies ({', '.join(missing)} missing): "
                              "pip install 'petal[serve]'", 78)
    from dataclasses import replace

    from petal.engine.config import ModelOptions
    from petal.pipeline.index.search import IndexReader, import_for_serving
    from petal.pipeline.jobs.index_run import model_spec
    from petal.pipeline.jobs.query import (
        QueryModel,
        SearchIndex,
        check_query_model,
        check_token_budget,
        engine_config,
        model_for_index,
        query_tokenizers,
    )
    from petal.pipeline.serve.metrics import ServeMetrics
    from petal.pipeline.serve.server import bind
    from petal.pipeline.serve.server import serve as run_server
    from petal.pipeline.serve.service import THREAD_STOP_S, ServeState
    from petal.pipeline.serve.startup import Startup
    from petal.pipeline.serve.warmup import warm_up

    # NOTE: the model is found (and judged, where that is cheap) before torch loads and the port is bound: a missing
    # or unsupported --model bound the port, said '/health answers now' and imported torch, then exited 78
    given_spec = None  # --model alone (or beside an index of vectors): its spec; an index's model is judged in load()
    if model is not None and (first_version is None or vectors_only):
        options = usage(lambda: ModelOptions(query_prompt=query_prompt, allow_pickle_weights=allow_pickle_weights))
        given_spec = model_spec(model, None, options)
        if query_prompt is not None or max_tokens_per_text is not None:
            query_tokenizers(given_spec, max_tokens_per_text)  # NOTE: the room left for text (2), before the bind
        check_token_budget(given_spec, token_budget)
    elif first_version is not None:
        # NOTE: the index's model (at another path: --model; or gone from where it was built) judged now, as far as
        # that is cheap: a directory that is no usable model (no weights, a config.json that is not JSON or names no
        # supported architecture) and a --query-prompt or --max-tokens-per-text leaving no room for text bound the
        # port and said '/health answers now', then exited 78 or 2; whether the weights are the index's (their
        # sha256) is checked in load()
        check_query_model(first_version[1], model, allow_pickle_weights, query_prompt, max_tokens_per_text,
                          token_budget)
    cuda = False  # the model runs on CUDA
    if with_model and device != "cpu":  # NOTE: --device cpu: no torch to ask (it loads with the model)
        from petal.engine.engine import resolve_device

        cuda = usage(lambda: resolve_device(device)) == "cuda"
        if search_device == "cuda" and not cuda and not vectors_only:
            raise click.UsageError("--search-device cuda searches the index's GPU copy with the query vectors the "
                                   "model makes, so it needs the model on CUDA, and torch sees no CUDA device")
    if vectors_only:
        # NOTE: auto is the model's device where --model runs one, else FAISS on the CPU, as petal query --vector-file
        # (asking torch whether there is CUDA costs seconds); --search-device cuda makes the GPU copy
        if search_device == "cuda" and not cuda:
            from petal.engine.engine import resolve_device

            if resolve_device("auto") != "cuda":
                raise click.UsageError("--search-device cuda needs a CUDA device for the GPU copy of the index; torch "
                                       "sees none")
        searched_on = "cuda" if search_device == "cuda" or (cuda and search_device == "auto") else "cpu"
    else:
        searched_on = "cuda" if cuda and search_device != "cpu" and index_path is not None else "cpu"
    settings = replace(settings, search_device=searched_on)
    if searched_on == "cpu" and given_flags(GPU_COPY_FLAGS):  # NOTE: auto, found here: the server still starts
        flags = given_flags(GPU_COPY_FLAGS)
        why = "the model runs on the CPU" if with_model else "no model runs here"
        eprint(f"petal serve: note: {', '.join(flags)} {'has' if len(flags) == 1 else 'have'} no effect: the search "
               f"runs with FAISS on the CPU (--search-device auto: {why}); --search-device cuda makes a GPU copy of "
               "the index")
    sock = bind(host, port)  # before loading: a taken port fails in a second, not after the model load

    def load(metrics: ServeMetrics) -> ServeState:
        """The model and index, loaded and warm (in a thread, while the port answers /health and /ready)."""
        index = None
        query_model = spec = None
        if first_version is not None:
            version_dir, manifest, held = first_version
        if first_version is not None and not vectors_only:
            spec = model_for_index(manifest, model, allow_pickle_weights, query_prompt)
        else:  # --model alone, or beside an index of vectors: /v1/embeddings (judged before the bind)
            spec = given_spec
        if spec is not None:
            config = usage(lambda: engine_config(spec, device, dtype, attention,
                                                 token_budget, max_seqs or (256 if cuda else 64),
                                                 default_budget=8192 if cuda else 2048))
            if max_tokens_per_text is not None and max_tokens_per_text > spec.pooling.max_length:
                eprint(f"petal serve: note: --max-tokens-per-text {max_tokens_per_text} is over the model's max "
                       f"length ({spec.pooling.max_length}): a longer text is refused (413) or, with truncate, cut "
                       f"at {spec.pooling.max_length} tokens")
            query_model = QueryModel(spec, config, max_tokens=max_tokens_per_text)
            warm_up(query_model.engine)
            for tokenizer in query_model.tokenizers.values():
                tokenizer.prepare_lone()
        if first_version is not None:  # NOTE: modules a version's open imports, frozen below with the model
            import_for_serving()
            if settings.search_device == "cuda":
                from petal.engine.layers.triton_kernels import triton_available
                from petal.pipeline.serve import gather_dots, gpu_ivf  # noqa: F401  (and gpu_search: the GPU copy)

                if triton_available():  # NOTE: the lists copy scores its gathered rows with a Triton kernel
                    gather_dots.prepare(first_version[1].dim, "cuda")
        freeze_long_lived()
        if first_version is not None:
            # NOTE: opened after the freeze, so a version's objects stay collectable once it is replaced; the
            # very version the model was chosen for (the follower moves on if CURRENT moved meanwhile)
            reader = IndexReader(version_dir, nprobe=nprobe, rescore=rescore)
            for note in reader.ignored:  # --nprobe of a Flat index...
                eprint(f"petal serve: note: {note}")
            index = SearchIndex.from_reader(reader, None if vectors_only else spec)
            release_with(index, held)  # NOTE: held while it serves, released once the follower has moved on
            del reader, held
        # NOTE: only the follower may hold the live version (this frame ends here), so a replaced one is freed
        # after its last search
        return ServeState(query_model, settings, index_root=index_path, index=index, nprobe=nprobe,
                          rescore=rescore, metrics=metrics, query_prompt_fixed=query_prompt is not None)

    bound_host, bound_port = sock.getsockname()[:2]
    url = f"http://[{bound_host}]:{bound_port}" if ":" in bound_host else f"http://{bound_host}:{bound_port}"

    def ready(state: ServeState) -> None:
        live = state.follower.live if state.follower is not None else None
        what = f"{live.version} ({live.reader.ntotal} vectors)" if live is not None else "embeddings only"
        if live is not None and live.precomputed:
            what += f" of precomputed vectors (/search by vectors only, searched on {settings.search_device})"
        served = "no model" if state.model is None else f"{state.model_id} on {state.model.engine.device}"
        eprint(f"petal serve: {served}, {what}, listening on {url}")

    loading = "the index" if not with_model else "the model and index" if index_path is not None else "the model"
    eprint(f"petal serve: loading {loading}; {url}/health answers now, /ready once loaded")
    if held.signum is not None:  # stopped before it served
        sock.close()
        eprint(f"petal serve: stopped ({signal.Signals(held.signum).name} before the server started)")
        return
    startup = Startup(settings, ServeMetrics(), load, on_ready=ready)
    stopped = run_server(startup, sock, log_level=log_level, access_log=access_log, held=held)
    # NOTE: drained: a stop signal from here on changes nothing (Python's finalisation puts the default handlers back:
    # one in the last moments killed the process, 143, after a clean stop)
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if startup.cut_off or startup.forced:
        why = "a second stop signal came" if startup.forced else \
            f"the drain timeout ({drain_timeout_s:g} s, --drain-timeout-s) passed"
        eprint(f"petal serve: stopped before every request finished: {why}; {startup.cut_off} request(s) still "
               "running were answered 503")
    else:
        eprint("petal serve: stopped (in-flight requests drained)")
    if not stopped or startup.still_loading:
        # NOTE: a step still runs (a hung device?), or the model still loads (stopped while loading): ending the
        # interpreter under it would abort (SIGABRT, exit 134)
        if not stopped:
            eprint(f"petal serve: the engine did not finish its step within {THREAD_STOP_S:g} s; exiting without it")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

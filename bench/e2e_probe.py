"""Where the embed phase of `petal index` loses time against the engine alone (GPU host probe).

python3 bench/e2e_probe.py SHAPE DOCS TOKENIZER_DIR [WORKERS...]
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch

from petal.bench.corpus import load_sentences, lognormal_lengths
from petal.bench.e2e import write_corpus
from petal.bench.gpu import petal_throughput, random_docs
from petal.bench.shapes import hf_model, save_model_dir, shape
from petal.engine.config import EngineConfig
from petal.engine.engine import Engine
from petal.engine.loader import inspect_model
from petal.pipeline.config import IndexJob, IndexSettings, ReadConfig
from petal.pipeline.ingest.tokens import TextTokenizer
from petal.pipeline.jobs.index_run import run_index
from petal.pipeline.jobs.report import RunReport


def main() -> None:
    name, num_docs, tok_dir = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    workers = [int(w) for w in sys.argv[4:]] or [2]
    work = Path(tempfile.mkdtemp(prefix="petal-probe-"))
    s = shape(name)
    started = time.perf_counter()
    hf = hf_model(s, torch.device("cpu"), torch.float32)
    model_dir = save_model_dir(s, hf, tok_dir, work / "model")
    del hf
    print(f"model dir {time.perf_counter() - started:.1f}s", flush=True)
    spec = inspect_model(model_dir)
    tokenizer = TextTokenizer(spec.tokenizer_file, spec.pooling.max_length)
    _paths, tokens = write_corpus(load_sentences(Path("sample_data")), tokenizer, num_docs, work / "corpus")
    print(f"corpus {num_docs} docs {tokens} tokens ({tokens / num_docs:.0f}/doc)", flush=True)

    engine = Engine(spec, EngineConfig(device="cuda", dtype="bfloat16", token_budget=16384, max_seqs=256))
    docs = random_docs(lognormal_lengths(8192, 150, 0.8, 8, 512, seed=0), spec.config.vocab_size, seed=2)
    petal_throughput(engine, docs[:1024])
    t2 = max(sum(len(d) for d in docs) / petal_throughput(engine, docs)[0] for _ in range(2))
    print(f"engine T2 {t2 / 1e3:.0f}k tok/s", flush=True)
    del engine
    torch.cuda.empty_cache()

    for number, w in enumerate(workers):
        job = IndexJob(sources=(str(work / "corpus"),), out=work / f"out-{number}", model=str(model_dir),
                       read=ReadConfig(), index=IndexSettings(factory="auto"), device="cuda", quiet=True,
                       tokenize_workers=w)
        profile = cProfile.Profile() if number == len(workers) - 1 else None
        t0 = time.perf_counter()
        if profile:
            profile.enable()
        report = run_index(job, RunReport())
        if profile:
            profile.disable()
        wall = time.perf_counter() - t0
        t = report.timings_s
        st = report.engine["stats"]
        print(f"--- workers {w}{' (cProfile on)' if profile else ''}: whole {tokens / wall / 1e3:.0f}k tok/s "
              f"({tokens / wall / t2:.2f} of T2), embed {tokens / t['embed'] / 1e3:.0f}k tok/s "
              f"({tokens / t['embed'] / t2:.2f} of T2)", flush=True)
        print("    timings", t, flush=True)
        print("    engine", {k: (round(v, 3) if isinstance(v, float) else v) for k, v in st.items() if k != "buckets"},
              flush=True)
        print("    index", {k: report.index.get(k) for k in ("factory", "tuning", "storage")}, flush=True)
        if profile:
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(22)
            print(out.getvalue()[-6000:], flush=True)


if __name__ == "__main__":
    main()

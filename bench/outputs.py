"""Output formats: recall@10 against exact float32 search vs bytes per vector, same vectors for all.

Documents and queries are texts built from ``sample_data`` sentences (lengths lognormal, median 24
tokens), embedded once with the model; each format is then built through petal's own index path
(store -> ``build_index``) and searched the way ``petal query`` searches it. The reference
is exact inner-product search over the model's full-width float32 vectors.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from petal.bench.corpus import load_sentences, lognormal_lengths, make_texts
from petal.engine.config import EngineConfig
from petal.engine.engine import Engine
from petal.engine.loader import inspect_model
from petal.pipeline.config import IndexSettings, ReadConfig
from petal.pipeline.index.binary import open_binary_index
from petal.pipeline.index.writer import build_index
from petal.pipeline.ingest.tokens import tokenizer_for
from petal.pipeline.jobs.embed import encode_texts
from petal.pipeline.manifest import Manifest
from petal.pipeline.store.outputs import OutputConfig, OutputTransform

# (label, --quantize, --output-dtype, rescore multiplier for binary)
FORMATS = (("float32", "none", "float32", None), ("float16", "none", "float16", None),
           ("int8", "int8", "float32", None), ("binary", "binary", "float32", 0),
           ("binary+rescore4", "binary", "float32", 4), ("binary+rescore10", "binary", "float32", 10))


def _store_entries(vectors: np.ndarray, root: Path) -> list[Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from petal.pipeline.ingest.parquet import preflight
    from petal.pipeline.store.embeddings import EmbeddingStore, StoreSink, settings_fingerprint

    shard = root / "vectors.parquet"
    pq.write_table(pa.table({"id": np.arange(len(vectors)), "text": ["-"] * len(vectors)}), shard)
    info = preflight([shard], ReadConfig())[0]
    store = EmbeddingStore(root / "store")
    store.open()
    fingerprint = store.fingerprint(info, settings_fingerprint({"bench": vectors.shape[1]}))
    sink = StoreSink(store, [info], [fingerprint], {"bench": 1}, vectors.shape[1])
    sink.expect(0, len(vectors), [], [], final=True)
    return [entry for _, entry in sink.add([(0, i, i) for i in range(len(vectors))], vectors)]


def run_outputs_bench(corpus: Path, num_docs: int = 3000, num_queries: int = 200, dims: tuple[int, ...] = (384, 128),
                      model: str | None = None, k: int = 10) -> dict[str, Any]:
    import faiss

    spec = inspect_model(model)
    tokenizer = tokenizer_for(spec)
    lengths = lognormal_lengths(num_docs + num_queries, 24, 0.6, 6, 96, seed=0)
    texts = make_texts(load_sentences(corpus), tokenizer, lengths, seed=0)
    started = time.perf_counter()
    vectors, _ = encode_texts(Engine(spec, EngineConfig(token_budget=4096)), tokenizer, texts)
    embed_s = time.perf_counter() - started
    docs, queries = vectors[:num_docs], vectors[num_docs:]
    reference = OutputTransform.for_model(spec, OutputConfig())
    _, truth = faiss.knn(reference.stored(queries), reference.stored(docs), k, metric=faiss.METRIC_INNER_PRODUCT)
    rows = []
    for dim in dims:
        for label, quantize, dtype, rescore in FORMATS:
            transform = OutputTransform.for_model(spec, OutputConfig(dim=dim, quantize=quantize, output_dtype=dtype))
            with tempfile.TemporaryDirectory(prefix="petal-outputs-") as tmp:
                root = Path(tmp)
                staging = root / "staging"
                staging.mkdir()
                settings = IndexSettings()
                result = build_index(_store_entries(transform.stored(docs), root), transform.dim, settings, staging,
                                     transform)
                index_bytes = (staging / "index.faiss").stat().st_size
                rescore_bytes = (staging / "rescore.npy").stat().st_size if rescore else 0
                if quantize == "binary":
                    manifest = Manifest.bare(result.record(settings), transform.dim, result.output)
                    index: Any = open_binary_index(staging, manifest, rescore=rescore)
                else:
                    index = faiss.read_index(str(staging / "index.faiss"))
                started = time.perf_counter()
                _, found = index.search(transform.stored(queries), k)
                search_s = time.perf_counter() - started
            recall = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(found, truth)]))
            rows.append({"format": label, "dim": dim, "factory": result.factory,
                         "index_bytes_per_vector": round(index_bytes / num_docs, 1),
                         "rescore_bytes_per_vector": round(rescore_bytes / num_docs, 1),
                         "recall_at_10": round(recall, 3), "ms_per_query": round(1000 * search_s / num_queries, 3)})
    return {"model": str(spec.path), "model_dim": spec.dim, "docs": num_docs, "queries": num_queries,
            "embed_seconds": round(embed_s, 1), "reference": "exact float32 inner product at full width", "rows": rows}


def format_outputs_table(result: dict[str, Any]) -> str:
    lines = [f"{result['docs']} documents, {result['queries']} queries, {result['model']} "
             f"({result['model_dim']} dims); recall@10 against {result['reference']}",
             f"{'format':<18} {'dim':>4} {'index':<8} {'B/vector':>9} {'+ rescore':>10} {'recall@10':>10}"]
    for row in result["rows"]:
        extra = row["rescore_bytes_per_vector"] or ""
        lines.append(f"{row['format']:<18} {row['dim']:>4} {row['factory']:<8} {row['index_bytes_per_vector']:>9.1f} "
                     f"{extra:>10} {row['recall_at_10']:>10.3f}")
    return "\n".join(lines)

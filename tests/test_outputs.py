"""Output formats: Matryoshka ``--dim`` against sentence-transformers, the int8 schemes against their
definitions (pplx-embed's quantizer, FAISS SQ8's codec), recall of the quantized indexes against
exact float search, and the CLI round trips (the query applies exactly the index-time transform)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner, Result

from petal.cli.main import cli
from petal.engine.config import EngineConfig
from petal.engine.engine import Engine
from petal.pipeline.config import IndexSettings, ReadConfig
from petal.pipeline.index.binary import open_binary_index
from petal.pipeline.index.writer import build_index
from petal.pipeline.ingest.parquet import preflight
from petal.pipeline.ingest.tokens import tokenizer_for
from petal.pipeline.jobs.embed import encode_texts
from petal.pipeline.manifest import Manifest, output_from_dict, output_to_dict
from petal.pipeline.store.embeddings import EmbeddingStore, StoreEntry, StoreSink, settings_fingerprint
from petal.pipeline.store.outputs import OutputConfig, OutputTransform, calibrated_codes, tanh_int8
from tests.conftest import SAMPLE_DATA
from tests.tiny_models import TEXTS, make_model


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def transform_for(dim: int = 256, quantize: str = "none", scheme: str | None = None, dtype: str = "float32",
                  normalizes: bool = True) -> OutputTransform:
    return OutputTransform(model_dim=256, dim=dim, renormalize=normalizes, cosine=True, quantize=quantize,
                           int8_scheme=scheme, output_dtype=dtype)


def test_matryoshka_dim_matches_sentence_transformers(minilm_spec, minilm_dir):
    from sentence_transformers import SentenceTransformer

    engine = Engine(minilm_spec, EngineConfig(token_budget=2048))
    vectors, _ = encode_texts(engine, tokenizer_for(minilm_spec), TEXTS)
    for dim in (384, 128):
        transform = OutputTransform.for_model(minilm_spec, OutputConfig(dim=dim))
        ours = transform.output(vectors)
        ref = SentenceTransformer(str(minilm_dir), device="cpu", truncate_dim=dim).encode(TEXTS, convert_to_numpy=True)
        assert ours.shape == ref.shape == (len(TEXTS), dim)
        cosine = (ours * ref).sum(1) / np.linalg.norm(ref, axis=1)
        assert cosine.min() >= 0.9999
        np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)  # renormalised: MiniLM normalises
    half = OutputTransform.for_model(minilm_spec, OutputConfig(dim=64, output_dtype="float16")).output(vectors)
    assert half.dtype == np.float16 and half.shape == (len(TEXTS), 64)


def test_int8_and_binary_follow_pplx_embed_quantizer():
    """pplx-embed's FlexibleQuantizer: int8 = clamp(round(127 tanh(x)), -128, 127); ubinary = packbits(x >= 0)."""
    x = np.random.default_rng(0).standard_normal((50, 256)).astype(np.float32) * 2
    x[0, :4] = [0.0, -0.0, 10.0, -10.0]
    ref = torch.clamp(torch.round(torch.tanh(torch.from_numpy(x)) * 127), -128, 127).numpy().astype(np.int8)
    int8 = transform_for(quantize="int8", scheme="tanh", normalizes=False)
    np.testing.assert_array_equal(int8.codes(x), ref)
    np.testing.assert_array_equal(transform_for(128, "int8", "tanh", normalizes=False).codes(x), ref[:, :128])
    stored = int8.stored(x)  # what is indexed: the int8 vector, L2-normalised (the model compares by cosine)
    np.testing.assert_allclose(stored, unit(ref.astype(np.float32)), atol=1e-6)
    bits = transform_for(64, "binary").codes(x)
    assert bits.dtype == np.uint8 and bits.shape == (50, 8)
    np.testing.assert_array_equal(np.unpackbits(bits, axis=1), (x[:, :64] >= 0).astype(np.uint8))
    assert bits[0, 0] >> 7 == 1 and (bits[0, 0] >> 4) & 1 == 0  # first value in the high bit (numpy.packbits)


def test_calibrated_int8_codes_are_faiss_sq8_codes():
    import faiss

    x = unit(np.random.default_rng(1).standard_normal((2000, 64)))
    index = faiss.index_factory(64, "SQ8", faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    index.add(x)
    trained = faiss.vector_to_array(index.sq.trained)
    transform = transform_for(64, "int8", "calibrated").with_calibration(trained[:64], trained[64:])
    stored_codes = faiss.vector_to_array(index.codes).reshape(2000, 64)
    np.testing.assert_array_equal(transform.codes(x).astype(np.int16) + 128, stored_codes)
    own = transform_for(64, "int8", "calibrated").calibrate(x)  # the same rule as FAISS's training
    assert own.calibration is not None
    np.testing.assert_array_equal(calibrated_codes(x, own.calibration), transform.codes(x))
    restored = output_from_dict(json.loads(json.dumps(output_to_dict(transform))))
    assert restored == transform


def topic_vectors(n: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Embedding-like test data: documents mix a few of 48 topics plus noise; each query is a slightly
    moved document. On real MiniLM vectors of sample_data text the formats rank alike (README, Benchmarks)."""
    rng = np.random.default_rng(seed)
    topics = rng.standard_normal((48, dim))
    docs = unit(rng.dirichlet(np.full(48, 0.2), n) @ topics + 0.15 * rng.standard_normal((n, dim)))
    queries = unit(docs[rng.choice(n, 200, replace=False)] + 0.03 * rng.standard_normal((200, dim)))
    return docs, queries


def store_entries(tmp_path, shard_writer, vectors: np.ndarray) -> list:
    store = EmbeddingStore(tmp_path / "store")
    store.open()
    entries = []
    for part, rows in enumerate(np.array_split(np.arange(len(vectors)), 2)):
        path = shard_writer(f"part-{part}.parquet", {"id": [f"d{i}" for i in rows], "text": ["x"] * len(rows)})
        info = preflight([path], ReadConfig())[0]
        fingerprint = store.fingerprint(info, settings_fingerprint({"test": 1}))
        sink = StoreSink(store, [info], [fingerprint], {"test": 1}, vectors.shape[1])
        sink.expect(0, len(rows), [], [], final=True)
        entries += [entry for _, entry in sink.add([(0, r, f"d{i}") for r, i in enumerate(rows)], vectors[rows])]
    return entries


# format -> (transform kwargs, recall@10 floor against exact float search)
# Floors: float16 and SQ8 perturb each inner product by ~1e-3 of a unit vector's range, far below
# the gaps between neighbours: near-exact. Hamming over 256 sign bits estimates angles only to
# ~0.1 rad (sign random projections), coarser than the gap from the 1st to the 10th neighbour, so it
# finds about half of them; re-ranking 10 x k Hamming candidates with float16 vectors restores all
# but the few true neighbours outside that shortlist ("close to float"). pplx-embed's tanh int8 is
# the model's own (lossy) format: these synthetic vectors were not trained for it, so most of its
# loss is the scheme's, checked apart from the index's below.
FORMATS = {
    "float16": ({"dtype": "float16"}, 0.99),
    "int8-calibrated": ({"quantize": "int8", "scheme": "calibrated"}, 0.95),
    "int8-tanh": ({"quantize": "int8", "scheme": "tanh", "normalizes": False}, 0.85),
    "binary": ({"quantize": "binary"}, 0.4),
    "binary+rescore": ({"quantize": "binary"}, 0.93),
    # above flat_max_vectors: IVF lists; nprobe tuned to 0.95 (int8: vs exact float search; binary: vs all lists)
    "int8-ivf": ({"quantize": "int8", "scheme": "calibrated"}, 0.9),
    "binary-ivf+rescore": ({"quantize": "binary"}, 0.85),
}


@pytest.mark.parametrize("name", list(FORMATS))
def test_quantized_index_recall_against_exact_float(tmp_path, shard_writer, name, record_property):
    import faiss

    kwargs, floor = FORMATS[name]
    docs, queries = topic_vectors(4000, 256, seed=2)
    if name == "int8-tanh":  # unnormalised model output with per-value spread ~0.5, as tanh expects
        docs, queries = docs * 8, queries * 8
    transform = transform_for(**kwargs)  # type: ignore[arg-type]  # FORMATS mixes the keywords' value types
    _, truth = faiss.knn(unit(queries), unit(docs), 10, metric=faiss.METRIC_INNER_PRODUCT)  # exact float cosine
    staging = tmp_path / "staging"
    staging.mkdir()
    settings = IndexSettings(flat_max_vectors=1000 if "ivf" in name else 50_000)
    result = build_index(store_entries(tmp_path, shard_writer, transform.stored(docs)), transform.dim, settings,
                         staging, transform)
    transform = result.output
    assert result.factory.startswith(("IVF", "BIVF") if "ivf" in name else ("SQ", "BFlat")), result.factory
    if transform.quantize == "binary":
        manifest = Manifest.bare(result.record(settings), transform.dim, transform)
        index = open_binary_index(staging, manifest, rescore=0 if name == "binary" else None)
    else:
        index = faiss.read_index(str(staging / "index.faiss"))
    _, found = index.search(transform.stored(queries), 10)
    recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, truth)]))
    size = (staging / "index.faiss").stat().st_size
    record_property("recall_at_10", recall)
    print(f"{name}: recall@10 {recall:.3f}, index.faiss {size / len(docs):.0f} bytes/vector")
    assert recall >= floor, (name, recall)
    if transform.quantize == "int8":
        assert transform.calibration is not None and len(transform.calibration.low) == 256
    if name == "int8-tanh":  # the index against the scheme's own vectors: what FAISS adds (SQ8 of unit int8 vectors)
        _, own = faiss.knn(transform.stored(queries), transform.stored(docs), 10, metric=faiss.METRIC_INNER_PRODUCT)
        against_int8 = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, own)]))
        print(f"int8-tanh against exact search on the int8 vectors: {against_int8:.3f}")
        assert against_int8 >= 0.97


def first_doc() -> tuple[str, str]:
    import pyarrow.parquet as pq

    table = pq.read_table(SAMPLE_DATA / "shard-000.parquet")
    return table.column("id")[0].as_py(), table.column("text")[0].as_py()


def run(*args: object) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def tiny_indexes(tmp_path_factory, tiny_bert_dir):
    """sample_data indexed with the tiny BERT as int8 (dim 32) and as binary (dim 64)."""
    root = tmp_path_factory.mktemp("formats")
    out = {}
    for name, flags in (("int8", ["--quantize", "int8", "--dim", "32"]), ("binary", ["--quantize", "binary",
                                                                                    "--dim", "64"])):
        result = run("index", SAMPLE_DATA, "--out", root / name, "--model", tiny_bert_dir, "-q", *flags)
        assert result.exit_code == 0, result.output
        out[name] = root / name
    return out


@pytest.mark.parametrize("name", ["int8", "binary"])
def test_query_applies_the_index_time_transform(tiny_indexes, tiny_bert_dir, name):
    import faiss

    from petal.pipeline.api import open_index

    out = tiny_indexes[name]
    manifest = json.loads(run("info", out, "--json").stdout)
    output = manifest["output"]
    assert manifest["dim"] == output["dim"] == (32 if name == "int8" else 64) and output["quantize"] == name
    assert manifest["index"]["factory"] == ("SQ8" if name == "int8" else "BFlat")
    doc_id, text = first_doc()
    service = open_index(out).query_model()
    vectors, _ = encode_texts(service.engine, service.tokenizer, [text])
    query = service.transform.stored(vectors)
    metas = [(p.parent, json.loads(p.read_text())) for p in (out / "store" / "shards").glob("*/*/entry.json")]
    entry = next(StoreEntry(d, m) for d, m in metas if m["source"]["path"].endswith("shard-000.parquet"))
    # the query is embedded exactly as the document was stored and indexed
    np.testing.assert_allclose(query[0], entry.embeddings()[0], atol=1e-6)
    hits = json.loads(run("query", out, text, "-k", "3", "--json").stdout)["hits"]
    assert hits[0]["id"] == doc_id
    if name == "int8":
        index = faiss.read_index(str(next((out / "versions").glob("v*")) / "index.faiss"))
        codes = faiss.vector_to_array(index.codes).reshape(index.ntotal, 32)
        np.testing.assert_array_equal(service.transform.codes(vectors).astype(np.int16)[0] + 128, codes[0])
        embedded = run("embed", text, "--model", tiny_bert_dir, "--quantize", "int8", "--dim", "32",
                       "--calibration", out)
        assert embedded.exit_code == 0, embedded.output
        row = json.loads(embedded.stdout.splitlines()[0])["embedding"]
        np.testing.assert_array_equal(np.array(row) + 128, codes[0])
    else:
        hamming_only = json.loads(run("query", out, text, "-k", "3", "--json", "--rescore", "0").stdout)["hits"]
        assert hamming_only[0]["id"] == doc_id and hamming_only[0]["score"] == 1.0
        bits = run("embed", text, "--model", tiny_bert_dir, "--quantize", "binary", "--dim", "64")
        row = json.loads(bits.stdout.splitlines()[0])["embedding"]
        np.testing.assert_array_equal(row, np.packbits(query[0] >= 0))


def test_pplx_embed_int8_is_its_own_scheme(tmp_path):
    path = tmp_path / "pplx"
    make_model("pplx-embed", path)
    floats, codes = tmp_path / "f.npy", tmp_path / "c.npy"
    assert run("embed", *TEXTS, "--model", path, "--output", floats).exit_code == 0
    assert run("embed", *TEXTS, "--model", path, "--quantize", "int8", "--dim", "32",
               "--output", codes).exit_code == 0
    raw, int8 = np.load(floats), np.load(codes)
    assert raw.dtype == np.float32 and int8.dtype == np.int8 and int8.shape == (len(TEXTS), 32)
    np.testing.assert_array_equal(int8, tanh_int8(raw[:, :32]))
    result = run("index", SAMPLE_DATA, "--out", tmp_path / "idx", "--model", path, "--quantize", "int8", "-q")
    assert result.exit_code == 0, result.output
    output = json.loads(run("info", tmp_path / "idx", "--json").stdout)["output"]
    assert (output["int8_scheme"], output["renormalize"], output["cosine"]) == ("tanh", False, True)


def test_query_prompts_follow_the_model_and_the_flag(tmp_path):
    from petal.pipeline.api import open_index
    from tests.tiny_models import QUERY_PROMPT

    path = tmp_path / "qwen3-embedding"
    make_model("qwen3-embedding", path)
    good = tmp_path / "good.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1, 2, 3], "text": TEXTS[:3]}), good)
    assert run("index", good, "--out", tmp_path / "a", "--model", path, "-q").exit_code == 0
    assert open_index(tmp_path / "a").query_model().tokenizer.prompt == QUERY_PROMPT
    assert open_index(tmp_path / "a", query_prompt="Q: ").query_model().tokenizer.prompt == "Q: "
    assert run("index", good, "--out", tmp_path / "b", "--model", path, "--query-prompt", "Find: ",
               "-q").exit_code == 0
    service = open_index(tmp_path / "b").query_model()
    assert service.tokenizer.prompt == "Find: " and service.tokenizer.appends_eos is False  # the tokenizer adds EOS
    hits = json.loads(run("query", tmp_path / "b", TEXTS[1], "--json", "-k", "1").stdout)["hits"]
    assert len(hits) == 1


def test_conflicting_flags_and_refusals_at_the_cli(tmp_path, shard_writer, tiny_bert_dir):
    good = shard_writer("good.parquet", {"id": [1, 2], "text": ["fine", "also fine"]})
    base = ["index", good, "--out", tmp_path / "o", "--model", tiny_bert_dir, "-q"]
    for flags, says in ((["--quantize", "int8", "--output-dtype", "float16"], "conflicts with --quantize"),
                        (["--quantize", "binary", "--index-factory", "Flat"], "leave --index-factory auto"),
                        (["--dim", "65"], "--dim 65"),
                        (["--quantize", "binary", "--dim", "12"], "multiple of 8")):
        result = run(*base, *flags)
        assert result.exit_code == 2 and says in result.output, (flags, result.output)
    result = run("embed", "x", "--model", tiny_bert_dir, "--calibration", tmp_path)
    assert result.exit_code == 2 and "--quantize int8" in result.output
    bare = tmp_path / "qwen3-bare"
    make_model("qwen3-bare", bare)
    result = run("embed", "x", "--model", bare)
    assert result.exit_code == 78 and "will not guess" in result.stderr
    result = run("embed", "x", "--model", bare, "--pooling", "mean", "--attention-mask", "bidirectional")
    assert result.exit_code == 0, result.output
    assert run(*base).exit_code == 0
    drift = run(*base, "--dim", "32")
    assert drift.exit_code == 78 and "output" in drift.stderr and "--full" in drift.stderr


def test_binary_ivf_tuning_honours_target_recall(tmp_path, shard_writer):
    docs, _ = topic_vectors(4000, 256, seed=5)
    transform = transform_for(quantize="binary")
    entries = store_entries(tmp_path, shard_writer, transform.stored(docs))
    nprobes = {}
    for target in (0.3, 0.9):
        staging = tmp_path / f"staging-{target}"
        staging.mkdir()
        result = build_index(entries, 256, IndexSettings(flat_max_vectors=1000, target_recall=target), staging,
                             transform)
        assert result.factory.startswith("BIVF") and result.tuning.target_recall_at_10 == target
        assert result.tuning.reached, result.tuning
        nprobes[target] = result.search_params["nprobe"]
    assert nprobes[0.3] < nprobes[0.9]


@pytest.mark.parametrize("quantize, dtype, storage, codes", [("int8", "float32", "ondisk", ",SQ8"),
                                                           ("none", "float16", "memory", ",PQ")])
def test_quantized_formats_follow_index_memory(tmp_path, shard_writer, quantize, dtype, storage, codes):
    """4500 x 256: SQfp16 (2.3 MB) and SQ8 (1.2 MB) codes exceed a 1 MB budget (the smallest --index-memory): int8
    keeps its SQ8 codes on disk; float16 falls to PQ codes in memory, as float32 does."""
    # NOTE: 4500 vectors, not 8000: the same plans (IVF64 instead of IVF128) for about half the PQ64 training
    docs, _ = topic_vectors(4500, 256, seed=6)
    transform = transform_for(quantize=quantize, scheme="calibrated" if quantize == "int8" else None, dtype=dtype)
    staging = tmp_path / "staging"
    staging.mkdir()
    settings = IndexSettings(flat_max_vectors=1000, memory_bytes=1 << 20, tune_queries=200)
    result = build_index(store_entries(tmp_path, shard_writer, transform.stored(docs)), 256, settings, staging,
                         transform)
    assert result.storage == storage and codes in result.factory, result.plan
    assert (staging / "index.ivfdata").is_file() == (storage == "ondisk")
    if quantize == "int8":
        assert result.output.calibration is not None and result.tuning.reached


def test_index_factory_checked_against_dim_and_vector_count(tmp_path, tiny_bert_dir):
    base = ["index", SAMPLE_DATA, "--out", tmp_path / "o", "--model", tiny_bert_dir, "-q"]
    for factory, says in (("IVF1024,Flat", "1024 IVF lists need at least 1024 vectors"),
                          ("PQ5", "must divide the dimension 64"),
                          ("IVF8,Nope", "not a valid FAISS factory")):
        result = run(*base, "--index-factory", factory)
        assert result.exit_code == 2 and says in result.output, (factory, result.output)
        assert "348" in result.output or "IVF1024" not in factory

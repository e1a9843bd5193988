"""What the Python API hands out cannot change the open index: ``Index.manifest`` is read-only all the way down,
``Index.info`` is a fresh plain copy all the way down, and hits, notes and reports are the caller's own.

Was: ``Index.manifest`` handed out the index's own record, whose dicts (``index.search_params``, ``index.files``,
``counts.skipped``, ``tuning.curve``...) a caller could change, and ``Index.info`` (documented "a fresh copy")
shared the tuning curve's dicts with it: a caller's edit changed what the open index reported from then on.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import petal
from petal.pipeline.manifest import Manifest

DIM = 16


@pytest.fixture(scope="module")
def ivf_index(tmp_path_factory):
    """An IVF index of precomputed vectors (tuned: it has search parameters and a tuning curve) with a kept column."""
    root = tmp_path_factory.mktemp("readonly")
    vectors = np.random.default_rng(0).standard_normal((2000, DIM)).astype(np.float32)
    pq.write_table(pa.table({"id": list(range(2000)), "lang": ["en" if i % 2 else "de" for i in range(2000)],
                             "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), DIM)}),
                   root / "vectors.parquet")
    petal.index(root / "vectors.parquet", root / "out", vectors_column="emb", index_factory="IVF8,Flat",
                keep_columns="lang", quiet=True)
    return root / "out", vectors


def test_the_manifest_cannot_be_changed_through_the_api(ivf_index):
    out, _ = ivf_index
    index = petal.open_index(out)
    before = json.dumps(index.info, sort_keys=True)
    manifest = index.manifest
    assert manifest.index.tuning is not None and manifest.index.tuning.curve
    edits = [
        lambda: manifest.index.search_params.__setitem__("nprobe", 999),
        lambda: manifest.index.search_params.update(nprobe=999),
        lambda: manifest.index.files.pop("index.faiss"),
        lambda: manifest.index.files.clear(),
        lambda: manifest.index.timings_s.setdefault("x", 1.0),
        lambda: manifest.counts.skipped.__setitem__("null_text", 7),
        lambda: manifest.shards[0].skipped.__setitem__("null_text", 7),
        lambda: manifest.index.tuning.params.__delitem__("nprobe"),
        lambda: manifest.index.tuning.curve[0].__setitem__("recall_at_10", 0.0),
        lambda: manifest.index.tuning.curve[0]["params"].__setitem__("nprobe", 999),
        lambda: manifest.index.tuning.curve.append({}),
        lambda: manifest.shards.append(manifest.shards[0]),
    ]
    for i, edit in enumerate(edits):
        with pytest.raises((TypeError, AttributeError)):
            edit()
            pytest.fail(f"edit {i} changed the manifest")
    assert json.dumps(index.info, sort_keys=True) == before
    assert index.reader.search_params == {"nprobe": manifest.index.search_params["nprobe"]}


def test_the_manifest_stays_convenient_to_read(ivf_index):
    out, _ = ivf_index
    manifest = petal.open_index(out).manifest
    params = manifest.index.search_params
    assert isinstance(params, dict) and params["nprobe"] >= 1 and dict(params) == params
    assert json.loads(json.dumps(manifest.index.files)) == dict(manifest.index.files)
    mine = manifest.index.tuning.curve[0].copy()  # a plain, mutable copy, all the way down
    mine["params"]["nprobe"] = 999
    assert manifest.index.tuning.curve[0]["params"]["nprobe"] != 999
    json.dumps(dataclasses.asdict(manifest), default=str)
    assert pickle.loads(pickle.dumps(manifest)) == manifest and copy.deepcopy(manifest) == manifest
    assert Manifest.from_dict(manifest.to_dict()) == manifest
    again = dataclasses.replace(manifest.counts, rows=1)  # records are built as before
    with pytest.raises(TypeError):
        again.skipped["x"] = 1


def test_info_is_a_fresh_copy_all_the_way_down(ivf_index):
    """README: ``Index.info`` is the manifest (a fresh copy). Was: its tuning curve entries were the manifest's."""
    out, _ = ivf_index
    index = petal.open_index(out)
    info = index.info
    before = json.dumps(info, sort_keys=True)
    info["index"]["tuning"]["curve"][0]["params"]["nprobe"] = 999
    info["index"]["tuning"]["curve"][0]["recall_at_10"] = -1.0
    info["index"]["search_params"]["nprobe"] = 999
    info["counts"]["skipped"]["null_text"] = 7
    info["shards"][0]["skipped"]["null_text"] = 7
    assert json.dumps(index.info, sort_keys=True) == before
    assert type(info["index"]["tuning"]["curve"]) is list and type(info["index"]["files"]) is dict


def test_hits_and_notes_are_the_callers_own(ivf_index):
    out, vectors = ivf_index
    index = petal.open_index(out, nprobe=2)
    hits = index.search_stored(vectors[:1], 3)[0]
    assert hits[0].fields["lang"] in ("en", "de")
    hits[0].fields["lang"] = "changed"
    assert index.search_stored(vectors[:1], 3)[0][0].fields["lang"] != "changed"
    assert index.search_stored(vectors[:1], 3, where="lang = 'changed'") == [[]]
    index.notes.append("mine")
    assert "mine" not in index.notes


def test_a_change_to_any_record_of_the_manifest_raises_type_error(ivf_index):
    """README: ``Index.manifest`` is read-only all the way down and a change raises ``TypeError``. Was: assigning a
    field of a record (``manifest.dim = 1``, ``manifest.counts.rows = 1``) raised ``dataclasses.FrozenInstanceError``,
    an ``AttributeError`` that ``except TypeError`` let through; only the mappings inside raised ``TypeError``."""
    out, _ = ivf_index
    manifest = petal.open_index(out).manifest
    records = []

    def walk(value, where):
        if dataclasses.is_dataclass(value):
            records.append((value, where))
            for item in dataclasses.fields(value):
                walk(getattr(value, item.name), f"{where}.{item.name}")
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{where}[{key!r}]")
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{where}[{i}]")

    walk(manifest, "manifest")
    assert {type(record).__name__ for record, _ in records} >= {"Manifest", "Counts", "IndexRecord", "ShardRecord",
                                                                 "IndexSettings", "OutputTransform", "TuningRecord"}
    for record, where in records:
        for item in dataclasses.fields(record):
            before = getattr(record, item.name)
            with pytest.raises(TypeError, match="read-only"):
                setattr(record, item.name, None)
            with pytest.raises(TypeError, match="read-only"):
                delattr(record, item.name)
            with pytest.raises(dataclasses.FrozenInstanceError):  # code written against frozen dataclasses
                setattr(record, item.name, None)
            assert getattr(record, item.name) is before, f"{where}.{item.name} changed"

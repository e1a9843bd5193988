"""Tampering audit of the manifest (issue 14, item 3): a manifest that matches its own checksum (re-signed) but
holds a value no petal wrote in a key code picks its path by (a metric, a storage, a quantization) is refused by
every command alike, 78 naming the key, never a traceback or an answer read the wrong way.

Real FAISS and Parquet: an index of precomputed vectors (no model).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import petal
from petal.cli.main import cli
from petal.pipeline.index.checksums import CHECKSUM_KEY, canonical_sha256
from petal.pipeline.layout import OutputDir
from petal.pipeline.reliability.errors import ConfigError


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("manifest-audit")
    flat = np.random.default_rng(3).standard_normal((300, 16)).astype(np.float32).ravel()
    pq.write_table(pa.table({"id": np.arange(300), "emb": pa.FixedSizeListArray.from_arrays(pa.array(flat), 16)}),
                   root / "v.parquet")
    petal.index(root / "v.parquet", root / "out", vectors_column="emb", index_factory="Flat", quiet=True)
    return root / "out"


BAD_CHOICES = [
    (("output", "quantize"), "x"), (("output", "quantize"), "../../etc/passwd"), (("output", "output_dtype"), "int4"),
    (("output", "int8_scheme"), "x"), (("metric",), "cosine"), (("index", "metric"), "x"),
    (("index", "storage"), "gpu"), (("index", "plan", "storage"), "x"),
]


@pytest.mark.parametrize(("key", "value"), BAD_CHOICES, ids=[f"{'.'.join(k)}={v}" for k, v in BAD_CHOICES])
def test_a_value_no_petal_wrote_is_78_naming_the_key_in_every_command(built, tmp_path, key, value):
    """Was: petal info crashed with a KeyError traceback on output.quantize "x"; info --json, verify, query and
    the API took it (and any other such value) and answered."""
    out = tmp_path / "out"
    shutil.copytree(built, out)
    path = out / "versions" / str(OutputDir(out).current_version()) / "manifest.json"
    manifest = json.loads(path.read_text())
    section = manifest
    for part in key[:-1]:
        section = section[part]
    section[key[-1]] = value
    manifest.pop(CHECKSUM_KEY)
    manifest[CHECKSUM_KEY] = canonical_sha256(manifest)
    path.write_text(json.dumps(manifest))
    np.save(tmp_path / "q.npy", np.ones((1, 16), np.float32))
    dotted = ".".join(key)
    for argv in (["info", str(out)], ["info", str(out), "--json"], ["verify", str(out)],
                 ["query", str(out), "--vector-file", str(tmp_path / "q.npy")]):
        result = CliRunner().invoke(cli, argv)
        assert result.exit_code == 78, (argv, result.output, result.exception)
        assert not isinstance(result.exception, (KeyError, ValueError, TypeError)), result.exception
        last = result.output.strip().splitlines()[-1]
        assert f"manifest key {dotted} " in last and "expected one of" in last, last
    with pytest.raises(ConfigError, match=f"manifest key {dotted} "):
        petal.open_index(out)


@pytest.mark.parametrize("record", [None, "x", 7, [], True])
@pytest.mark.parametrize("name", ["index.faiss", "ids.parquet", "rejects.parquet"])
def test_verify_of_an_edited_manifest_with_a_record_that_is_no_object_is_65(built, tmp_path, name, record):
    """A manifest edited without signing it again (its own checksum no longer matches) whose integrity record of a
    file is not an object: petal verify (and --json) ended in an AttributeError traceback; the open, which ignores
    such a manifest's records, checked every file in full and answered. Now verify says the manifest mismatch, 65."""
    out = tmp_path / "out"
    shutil.copytree(built, out)
    path = out / "versions" / str(OutputDir(out).current_version()) / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["integrity"]["files"][name] = record
    path.write_text(json.dumps(manifest))
    result = CliRunner().invoke(cli, ["verify", str(out)])
    assert result.exit_code == 65, (result.output, result.exception)
    assert "does not match its own checksum" in result.output.strip().splitlines()[-1]
    result = CliRunner().invoke(cli, ["verify", str(out), "--json"])
    assert result.exit_code == 65, (result.output, result.exception)
    assert json.loads(result.stdout.splitlines()[0])["ok"] is False
    np.save(tmp_path / "q.npy", np.ones((1, 16), np.float32))
    result = CliRunner().invoke(cli, ["query", str(out), "--vector-file", str(tmp_path / "q.npy"), "-k", "2"])
    assert result.exit_code == 0, result.output


def _resigned(built: Path, tmp_path: Path, edit) -> Path:
    out = tmp_path / "out"
    shutil.copytree(built, out)
    path = out / "versions" / str(OutputDir(out).current_version()) / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    manifest.pop(CHECKSUM_KEY)
    manifest[CHECKSUM_KEY] = canonical_sha256(manifest)
    path.write_text(json.dumps(manifest))
    np.save(tmp_path / "q.npy", np.ones((1, 16), np.float32))
    return out


@pytest.mark.parametrize("name", ["index.faiss", "ids.parquet"])
def test_verify_agrees_with_the_open_on_an_index_file_left_out_of_index_files(built, tmp_path, name):
    """A manifest re-signed without an index file in index.files (its integrity record kept): every open refuses it
    (78, not listed); petal verify read the record as the listing and said OK (exit 0, "ok": true)."""
    out = _resigned(built, tmp_path, lambda m: m["index"]["files"].pop(name))
    for argv in (["verify", str(out)], ["query", str(out), "--vector-file", str(tmp_path / "q.npy")]):
        result = CliRunner().invoke(cli, argv)
        assert result.exit_code == 78, (argv, result.output, result.exception)
        assert name in result.output and "not listed in the manifest" in result.output, result.output
    result = CliRunner().invoke(cli, ["verify", str(out), "--json"])
    assert result.exit_code == 78 and json.loads(result.stdout.splitlines()[0])["ok"] is False, result.output


def test_verify_checks_index_files_own_sha256(built, tmp_path):
    """index.files naming another sha256 than the file's (re-signed; the integrity record still right): the open
    lists files by index.files; petal verify checked the record's value instead and said OK."""
    out = _resigned(built, tmp_path, lambda m: m["index"]["files"].update({"ids.parquet": "0" * 64}))
    result = CliRunner().invoke(cli, ["verify", str(out)])
    assert result.exit_code == 65, (result.output, result.exception)
    assert "ids.parquet" in result.output, result.output

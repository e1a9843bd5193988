"""A file of a model directory that is there but is no regular file (a directory, a FIFO, a broken symbolic link, a
link loop) is refused naming it (78), never read as absent; a read error (EIO) is 74 naming it, never a damaged
model (78).

Before: ``config.json`` or ``tokenizer.json`` as a directory said the directory "has no config.json" (misleading);
``modules.json``, ``sentence_bert_config.json``, ``config_sentence_transformers.json``, ``tokenizer_config.json``
and ``model.safetensors.index.json`` as a directory were skipped as absent (exit 0, the model run without its
pooling, prompts or length); ``model.safetensors`` or ``1_Pooling/config.json`` as a FIFO hung the process; an EIO
was 78 ("cannot read ...") and, in torch.load, "cannot load ... as weights".

Real ``petal embed`` processes (tests/forkrun.py) on a copy of the packaged MiniLM with one file broken per case; the
EIO is real: a link to ``/proc/self/mem``, whose read at offset 0 fails with EIO in the process that reads it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.forkrun import petal

FILES = ("config.json", "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
         "1_Pooling/config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors",
         "model.safetensors.index.json")
BROKEN = {
    "dir": (78, "{path} is a directory, not a file"),
    "fifo": (78, "{path} is a named pipe (FIFO), not a file"),
    "broken link": (78, "{path} is a broken symbolic link (to {path}.gone, which does not exist)"),
    "link loop": (78, "{path} is a symbolic link loop (too many levels of symbolic links)"),
    "EIO": (74, "I/O error on {path}: Input/output error"),
}


def model_copy(minilm_dir: Path, root: Path) -> Path:
    """The packaged model's files, copied (its weights linked: 90 MB), with an end-of-sequence token named in
    tokenizer_config.json (read for last-token pooling)."""
    model = root / "model"
    shutil.copytree(minilm_dir, model, ignore=shutil.ignore_patterns("model.safetensors"))
    (model / "model.safetensors").symlink_to(minilm_dir / "model.safetensors")
    tok_config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**tok_config, "eos_token": "[SEP]"}))
    return model


def break_file(path: Path, how: str) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    if how == "dir":
        path.mkdir()
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "broken link":
        path.symlink_to(f"{path}.gone")
    elif how == "link loop":
        path.symlink_to(path)
    else:
        path.symlink_to("/proc/self/mem")  # a regular file to stat and open; reading it at offset 0 is EIO


def embed(model: Path, *flags: str) -> tuple[int, str]:
    result = petal(["embed", "a query", "--model", str(model), *flags], timeout=60)
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.rc, result.last_line


@pytest.mark.parametrize("how", BROKEN)
@pytest.mark.parametrize("name", FILES)
def test_a_model_file_that_is_no_file_or_cannot_be_read_is_named(minilm_dir, tmp_path, name, how):
    model = model_copy(minilm_dir, tmp_path)
    path = model / name
    break_file(path, how)
    # tokenizer_config.json is read for last-token pooling only (its eos_token)
    rc, line = embed(model, *(["--pooling", "last"] if name == "tokenizer_config.json" else []))
    code, message = BROKEN[how]
    assert (rc, line) == (code, f"petal: error: {message.format(path=path)}")


@pytest.mark.parametrize("how", ["dir", "EIO"])
def test_pickle_weights_that_are_no_file_or_cannot_be_read_are_named(minilm_dir, tmp_path, how):
    """``--allow-pickle-weights``: a pytorch_model.bin that is a directory is named (it read as "no weights"); one
    whose read fails is 74 (torch.load's OSError read as damaged weights, 78)."""
    model = model_copy(minilm_dir, tmp_path)
    (model / "model.safetensors").unlink()
    break_file(model / "pytorch_model.bin", how)
    rc, line = embed(model, "--allow-pickle-weights")
    code, message = BROKEN[how]
    assert (rc, line) == (code, f"petal: error: {message.format(path=model / 'pytorch_model.bin')}")


def test_a_damaged_tokenizer_read_for_its_end_of_sequence_token_is_named(minilm_dir, tmp_path):
    """Last-token pooling reads tokenizer.json at inspection (the eos_token's id): a file the tokenizers library
    cannot use is 78 naming it."""
    model = model_copy(minilm_dir, tmp_path)
    (model / "tokenizer.json").write_text("{not json")
    rc, line = embed(model, "--pooling", "last")
    assert rc == 78 and line.startswith(f"petal: error: cannot read {model / 'tokenizer.json'} as a tokenizer: "), line


def test_an_intact_copy_embeds(minilm_dir, tmp_path):
    """The copy itself is a working model (each case above breaks one file of it)."""
    model = model_copy(minilm_dir, tmp_path)
    assert embed(model)[0] == 0
    assert embed(model, "--pooling", "last")[0] == 0

"""A prompt from the model's own files (config_sentence_transformers.json ``prompts``) that leaves no token for the
text at the model's own max length (sentence_bert_config.json ``max_seq_length``) was a usage error (2) telling the
user to give a shorter ``--query-prompt``, a flag nobody gave (``petal embed``, ``petal embed --query``, ``petal
index`` once OUT was made, ``petal.Embedder(model=DIR).encode``). Now 78 naming the file and the prompts key; 2
still where a flag (``--max-length``, ``--query-prompt``) set the length or the prompt, naming it.

Real tokenizer and model files (a copy of the packaged MiniLM), the real CLI in a child process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from petal.pipeline.reliability.errors import ConfigError, FlagError
from tests.test_model_dir_audit import copy_model

PETAL = str(Path(sys.executable).parent / "petal")
SAMPLE = str(Path(__file__).resolve().parent.parent / "sample_data")
LONG = "instruction " * 400


def _model(tmp_path: Path, minilm_dir: Path, side: str) -> Path:
    model = copy_model(minilm_dir, tmp_path / f"model-{side}")
    prompts = {"query": "", "document": ""} | {side: LONG}
    (model / "config_sentence_transformers.json").write_text(json.dumps({"prompts": prompts}))
    return model


def _petal(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PETAL, *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("side", ["document", "query"])
def test_a_prompt_of_the_model_files_with_no_room_is_78_naming_them(tmp_path, minilm_dir, side):
    model = _model(tmp_path, minilm_dir, side)
    done = _petal("embed", "--model", str(model), *(["--query"] if side == "query" else []), "hello world")
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 78, done.stderr
    assert f'{model}/config_sentence_transformers.json prompts["{side}"]' in last, last
    assert f"{model}/sentence_bert_config.json max_seq_length" in last and "take 402" in last, last
    assert "--query-prompt" not in last and "Traceback" not in done.stderr
    out = tmp_path / f"out-{side}"
    done = _petal("index", SAMPLE, "--model", str(model), "--out", str(out), "-q", "--device", "cpu")
    assert done.returncode == 78 and f'prompts["{side}"]' in done.stderr, done.stderr
    assert not out.exists()  # judged before OUT is made (the query side was never judged: published at exit 0)


def test_a_flag_that_set_the_length_is_still_a_usage_error(tmp_path, minilm_dir):
    model = _model(tmp_path, minilm_dir, "document")
    done = _petal("embed", "--model", str(model), "--max-length", "300", "hello world")
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and "give at least 403 (--max-length)" in last, done.stderr
    code = (f"import petal\ntry:\n    petal.Embedder(model={str(model)!r}, device='cpu').encode(['hi'])\n"
            "except petal.PetalError as e:\n    print(type(e).__name__, e.exit_code)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["ConfigError", "78"], done.stdout + done.stderr


def test_the_tokenizer_names_where_the_length_and_prompt_came_from(minilm_spec):
    from petal.engine.config import Source
    from petal.pipeline.ingest.tokens import RoomSources, TextTokenizer

    files = RoomSources(Source("sentence_bert_config.json max_seq_length"), Source('prompts["document"]'))
    with pytest.raises(ConfigError, match=r'prompts\["document"\].*give at least 5'):
        TextTokenizer(minilm_spec.tokenizer_file, 4, prompt="query: ", sources=files)
    with pytest.raises(ConfigError, match=r"sentence_bert_config\.json max_seq_length 2 leaves no token"):
        TextTokenizer(minilm_spec.tokenizer_file, 2, sources=files)
    flagged = RoomSources(Source("sentence_bert_config.json max_seq_length"), Source("--query-prompt", flag=True))
    with pytest.raises(FlagError, match=r"a shorter prompt \(--query-prompt\)"):
        TextTokenizer(minilm_spec.tokenizer_file, 4, prompt="query: ", sources=flagged)

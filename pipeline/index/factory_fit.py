"""Does an explicit ``--index-factory`` fit the data? Checked before any embedding work; and a
FAISS error during the build, mapped to an exit code with a message.

Before any work (exit 2, with the numbers): the vectors a run can index at most (the rows of the
named shards plus the kept ones) must be enough to train the factory: one per IVF list, and
``2**nbits`` per product quantizer (FAISS's k-means needs at least as many points as centroids).
After the embedding (fewer vectors than rows: skipped rows), a FAISS error is a configuration
error (78): the embeddings stay in the store, so a rerun with another factory embeds nothing again.
"""

from __future__ import annotations

from typing import Any

from petal.pipeline.config import IndexSettings
from petal.pipeline.reliability.errors import ConfigError


def vectors_to_train(factory: str, dim: int, metric: str) -> tuple[int, str]:
    """``(vectors, why)``: the fewest vectors FAISS can train ``factory`` on (1 and "" for none)."""
    import faiss

    index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT if metric == "ip" else faiss.METRIC_L2)
    needs = [(1, "")]
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        needs.append((int(ivf.nlist), f"{ivf.nlist} IVF lists"))
    pq = _product_quantizer(index)
    if pq is not None:
        needs.append((int(pq.ksub), f"{pq.ksub} centroids per PQ sub-quantizer ({pq.nbits} bits)"))
    return max(needs)


def _product_quantizer(index: Any) -> Any:
    import faiss

    for candidate in (index, faiss.try_extract_index_ivf(index)):
        if candidate is None:
            continue
        pq = getattr(faiss.downcast_index(candidate), "pq", None)
        if pq is not None:
            return pq
    return None


def check_factory_fits(settings: IndexSettings, dim: int, max_vectors: int) -> None:
    """``ValueError`` (exit 2) when ``settings.factory`` cannot be trained on ``max_vectors`` vectors of ``dim``."""
    if settings.factory == "auto":
        return
    try:
        needed, why = vectors_to_train(settings.factory, dim, settings.metric)
    except RuntimeError as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"--index-factory {settings.factory!r} is not a valid FAISS factory string for dim {dim}: "
                         f"{reason}") from exc
    if max_vectors < needed:
        raise ValueError(f"--index-factory {settings.factory!r} needs at least {needed} vectors of dim {dim} to "
                         f"train ({why}); this run can index at most {max_vectors} vectors: pick a smaller "
                         "factory or leave --index-factory auto")


def faiss_failure(exc: BaseException, factory: str, dim: int, num_vectors: int | None) -> ConfigError:
    """A FAISS error (``RuntimeError``) or a factory that cannot be trained (``ValueError``) during a build."""
    count = f"{num_vectors} vectors" if num_vectors is not None else "the stored vectors"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ConfigError(f"FAISS cannot build index {factory!r} from {count} of dim {dim}: {first}. Nothing was "
                       "published; the embeddings are kept in the store: rerun with another --index-factory "
                       "(or petal rebuild OUT --index-factory ...) to index them without embedding again")

"""Every public name of ``import petal`` says what it is: each class and function in ``petal.__all__`` has its own
docstring (not the signature a dataclass writes for itself), as does each public method and property of those
classes; ``Hit`` says what its score means for each metric."""

from __future__ import annotations

import inspect

import petal


def _own_doc(obj: object, name: str) -> str | None:
    doc = inspect.getdoc(obj) if not isinstance(obj, type) else obj.__dict__.get("__doc__")
    if not doc or doc.startswith(f"{name}("):  # NOTE: a dataclass without a docstring gets its signature as one
        return None
    return doc


def test_every_public_name_has_a_docstring():
    missing = []
    for name in petal.__all__:
        obj = getattr(petal, name)
        if not (isinstance(obj, type) or callable(obj)):
            continue
        if _own_doc(obj, name) is None:
            missing.append(name)
        if not isinstance(obj, type):
            continue
        for attr, value in vars(obj).items():
            if attr.startswith("_"):
                continue
            target = value.fget if isinstance(value, property) else value
            if (callable(target) or isinstance(value, (staticmethod, classmethod))) and \
                    not getattr(target, "__doc__", None):
                missing.append(f"{name}.{attr}")
    assert not missing, missing


def test_hit_says_what_its_score_means():
    doc = _own_doc(petal.Hit, "Hit")
    assert doc is not None and "--metric ip" in doc and "l2" in doc and "binary" in doc, doc


def test_encode_states_the_shape_of_every_output_format():
    doc = inspect.getdoc(petal.Embedder.encode)
    assert doc is not None and "[len(texts), dim]" in doc and "dim // 8" in doc, doc

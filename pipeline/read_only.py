"""Records that refuse changes: what ``Index.manifest`` hands out, read-only all the way down.

A frozen dataclass refuses an assignment with ``dataclasses.FrozenInstanceError``, an ``AttributeError``; the
mappings inside a manifest refuse a change with ``TypeError`` (``ReadOnlyDict``). ``read_only`` makes a record's
refusal both, so one ``except TypeError`` (the README's promise) catches a change anywhere in a manifest, and code
written against frozen dataclasses (``except FrozenInstanceError`` / ``AttributeError``) still does.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")


class ReadOnlyError(FrozenInstanceError, TypeError):
    """A change to a read-only record: a ``TypeError`` and a ``dataclasses.FrozenInstanceError``."""


def _refuse_set(self: Any, name: str, value: Any) -> NoReturn:
    raise ReadOnlyError(f"cannot assign to field {name!r} of {type(self).__name__}: it is read-only (build a new "
                        "one with dataclasses.replace)")


def _refuse_delete(self: Any, name: str) -> NoReturn:
    raise ReadOnlyError(f"cannot delete field {name!r} of {type(self).__name__}: it is read-only")


def read_only(cls: type[T]) -> type[T]:
    """Class decorator over ``@dataclass(frozen=True)``: assigning or deleting a field raises ``ReadOnlyError``.

    NOTE: the dataclass's own ``__init__`` (and ``__post_init__`` code calling ``object.__setattr__``) sets fields
    through ``object.__setattr__``, never these, so construction, ``dataclasses.replace``, copy and pickle work."""
    setattr(cls, "__setattr__", _refuse_set)  # noqa: B010 (mypy refuses assigning a method to a class)
    setattr(cls, "__delattr__", _refuse_delete)  # noqa: B010
    return cls

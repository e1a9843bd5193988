"""An Arrow type rebuilt with each of its leaf types mapped: the one walk of nested types that a cast target needs."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

_LISTS = {pa.types.is_list: pa.list_, pa.types.is_large_list: pa.large_list,
          pa.types.is_list_view: pa.list_view, pa.types.is_large_list_view: pa.large_list_view}


def map_leaves(type_: pa.DataType, leaf: Callable[[pa.DataType], pa.DataType]) -> pa.DataType:
    """``type_`` with ``leaf(t)`` in place of each type ``t`` in it that is no struct, map or list (of any layout):
    a struct's fields, a map's keys and items, a list's values (names, nullability and sizes kept). A dictionary or
    an extension type is a leaf."""
    if pa.types.is_struct(type_):
        return pa.struct([f.with_type(map_leaves(f.type, leaf)) for f in type_])
    if pa.types.is_map(type_):
        return pa.map_(type_.key_field.with_type(map_leaves(type_.key_type, leaf)),
                       type_.item_field.with_type(map_leaves(type_.item_type, leaf)), type_.keys_sorted)
    if pa.types.is_fixed_size_list(type_):
        return pa.list_(type_.value_field.with_type(map_leaves(type_.value_type, leaf)), type_.list_size)
    make = next((make for is_kind, make in _LISTS.items() if is_kind(type_)), None)
    if make is not None:
        return make(type_.value_field.with_type(map_leaves(type_.value_type, leaf)))
    return leaf(type_)

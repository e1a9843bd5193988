"""The settings an index was built with against this run's, as a sentence a person reads (exit 78)."""

from __future__ import annotations

from typing import Any

# what a setting that was not recorded meant (an index built before the setting existed, or left at its default)
OUTPUT_DEFAULTS = {"quantize": "none", "output_dtype": "float32", "int8_scheme": None}


def _flat(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, sub in value.items():
            out.update(_flat(sub, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def _show(value: Any) -> str:
    return "unset" if value is None else str(value)


def drift_details(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """``["output.dim: 384 -> 128", ...]`` for every setting that differs (nested ones by dotted name)."""
    old, new = _flat(before, ""), _flat(after, "")
    if before.get("output") is None and isinstance(after.get("output"), dict):  # built with the model's own output
        old.pop("output", None)
        old.update({f"output.{k}": v for k, v in OUTPUT_DEFAULTS.items()})
        old["output.dim"] = before.get("dim")
    if after.get("output") is None and isinstance(before.get("output"), dict):
        new.pop("output", None)
        new.update({f"output.{k}": v for k, v in OUTPUT_DEFAULTS.items()})
        new["output.dim"] = after.get("dim")
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    keys = [k for k in keys if not (k.startswith("output.") and k[7:] in ("renormalize", "cosine")
                                    and "output.dim" in keys)]  # follow from the dim: noise
    return [f"{k}: {_show(old.get(k))} -> {_show(new.get(k))}" for k in keys]

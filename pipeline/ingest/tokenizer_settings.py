"""What ``tokenizer.json`` says beyond its vocabulary, judged against what transformers (and so sentence-transformers)
does with it: settings petal cannot reproduce are refused (``ConfigError``, 78) naming the file and the key.

petal sets its own truncation (from the right, at the model's max length) and never pads (sequences are packed), so
``tokenizer.json``'s ``truncation.max_length`` and ``padding`` change nothing: sentence-transformers passes its own
``max_length`` on every call too. ``truncation.direction`` ``Left`` does change transformers' ids: it takes it as
``truncation_side`` unless ``tokenizer_config.json`` names one, and keeps a long text's end.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from petal.pipeline.reliability.errors import ConfigError, one_line


def check_tokenizer_settings(tokenizer: Any, tokenizer_file: Path) -> None:
    """Refuse (``ConfigError``) a ``tokenizer.json`` (loaded as ``tokenizer``) whose settings make
    sentence-transformers' token ids differ from petal's."""
    config = _tokenizer_config(tokenizer_file.parent / "tokenizer_config.json")
    _check_truncation_direction(tokenizer, tokenizer_file, config)


def _tokenizer_config(path: Path) -> dict[str, Any]:
    """tokenizer_config.json beside tokenizer.json ({} without one)."""
    from petal.engine.weight_files import model_file, read_text

    if not model_file(path):
        return {}
    try:
        value = json.loads(read_text(path))
    except ValueError as exc:
        raise ConfigError(f"cannot read {path}: {one_line(str(exc))}") from exc
    if not isinstance(value, dict):
        raise ConfigError(f"{path} holds no JSON object")
    return value


def _check_truncation_direction(tokenizer: Any, tokenizer_file: Path, config: dict[str, Any]) -> None:
    # NOTE: tokenizer_config.json's truncation_side wins over tokenizer.json's (transformers' setdefault); that one
    # is judged by engine/loader.py, so only a tokenizer.json direction nobody overrides is looked at here
    truncation = tokenizer.truncation
    if "truncation_side" in config or not truncation or truncation.get("direction", "right") == "right":
        return
    raise ConfigError(f"{tokenizer_file}: truncation.direction is {truncation['direction']!r}; transformers takes it "
                      "as the truncation side, so sentence-transformers keeps the end of a text longer than the "
                      "model's limit, while petal keeps its beginning and cannot reproduce those vectors. Set it to "
                      "\"Right\" (or truncation_side \"right\" in tokenizer_config.json) if keeping the beginning is "
                      "what you want.")

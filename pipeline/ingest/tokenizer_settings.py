"""What ``tokenizer.json`` says beyond its vocabulary, judged against what transformers (and so sentence-transformers)
does with it: settings petal cannot reproduce are refused (``ConfigError``, 78) naming the file and the key.

petal sets its own truncation (from the right, at the model's max length) and never pads (sequences are packed), so
``tokenizer.json``'s ``truncation.max_length`` and ``padding`` change nothing: sentence-transformers passes its own
``max_length`` on every call too. Two settings do change transformers' ids:

- ``truncation.direction`` ``Left``: transformers takes it as ``truncation_side`` unless ``tokenizer_config.json``
  names one, and keeps a long text's end;
- ``post_processor`` null: transformers 5 puts a post-processor back. A tokenizer class of its own
  (``BertTokenizer``, ...) rebuilds the one it always had ([CLS] ... [SEP]); the generic ``PreTrainedTokenizerFast``
  / ``TokenizersBackend`` one adds no token (even with ``add_bos_token`` / ``add_eos_token`` true, transformers
  5.x as pinned), as petal running the file as it is.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from petal.pipeline.reliability.errors import ConfigError, one_line

# tokenizer classes whose rebuilt post-processor transformers 5 leaves empty (no special token)
GENERIC_TOKENIZER_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")


def check_tokenizer_settings(tokenizer: Any, tokenizer_file: Path) -> None:
    """Refuse (``ConfigError``) a ``tokenizer.json`` (loaded as ``tokenizer``) whose truncation side or missing
    post-processor makes sentence-transformers' token ids differ from petal's."""
    config = _tokenizer_config(tokenizer_file.parent / "tokenizer_config.json")
    _check_truncation_direction(tokenizer, tokenizer_file, config)
    _check_post_processor(tokenizer, tokenizer_file, config)


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


def _check_post_processor(tokenizer: Any, tokenizer_file: Path, config: dict[str, Any]) -> None:
    tokenizer_class = config.get("tokenizer_class")
    if tokenizer.post_processor is not None or tokenizer_class in GENERIC_TOKENIZER_CLASSES:
        return  # NOTE: the generic class's post-processor adds no token, as the tokenizer.json petal runs
    why = (f"tokenizer_class {tokenizer_class!r} in tokenizer_config.json" if tokenizer_class is not None
           else "no tokenizer_class in tokenizer_config.json: the model type's class")
    raise ConfigError(f"{tokenizer_file}: post_processor is null; transformers builds one for this tokenizer ({why}), "
                      "so sentence-transformers adds special tokens this file does not, and petal cannot reproduce "
                      "its vectors. Save the tokenizer with transformers "
                      "(AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)) to write the post-processor it uses.")

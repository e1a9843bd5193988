"""The model a command runs, as a ``ModelSpec`` (light: no pyarrow, FAISS or the index pipeline)."""

from __future__ import annotations

from petal.engine.config import ModelOptions
from petal.engine.errors import ModelError, ModelFlagError
from petal.engine.loader import ModelSpec, inspect_model
from petal.pipeline.reliability.errors import DENIED, ConfigError, FlagError, io_error


def model_spec(model: str | None, max_length: int | None, options: ModelOptions | None = None) -> ModelSpec:
    """The model's configuration (no weights); a missing or unsafe model is a ``ConfigError`` (78), a model file
    petal may not read a ``NoInputError`` (66, naming it), a flag the model cannot take (a ``max_length`` above its
    limit, an ``--attention-mask`` its family lacks) a ``FlagError`` (2, as ``--dim`` above its width)."""
    try:
        return inspect_model(model, options, max_length=max_length)
    except ModelFlagError as exc:
        raise FlagError(str(exc)) from exc
    except ModelError as exc:
        raise ConfigError(str(exc)) from exc
    except OSError as exc:
        if exc.errno in DENIED:  # a model file petal may not read: 66 naming it (no bad model: 78)
            raise io_error(exc, ()) from exc
        raise

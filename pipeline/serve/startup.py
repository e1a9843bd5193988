"""Loading behind an open port: the server answers from its first second, and serves once the model and
the index are loaded and warm.

```
bind the port -> uvicorn answers: /health 200, /ready 503 {"status": "loading"}, the API 503 + Retry-After
             -> a thread loads (index files checked, model, warm-up: minutes for a large model on CUDA)
             -> ServeState.start() in the event loop -> /ready 200 and the API serve
a load that fails: the server stops and the process exits with the error's code (as before any port)
```

A liveness probe (``/health``) never kills a server that is still loading, and a readiness probe
(``/ready``) holds traffic back until it can be answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable

from petal.pipeline.serve import gc_clock
from petal.pipeline.serve.metrics import ServeMetrics
from petal.pipeline.serve.service import ServeState
from petal.pipeline.serve.settings import ServeSettings

log = logging.getLogger("petal.serve")


class Startup:
    """The server's ``ServeState`` to be: ``load(metrics)`` runs in a thread once the app starts (or
    ``state``, already loaded). ``state`` is ``None`` until it has started; ``error`` holds a failed load."""

    def __init__(self, settings: ServeSettings, metrics: ServeMetrics,
                 load: Callable[[ServeMetrics], ServeState] | None = None, state: ServeState | None = None,
                 on_ready: Callable[[ServeState], None] | None = None) -> None:
        assert (load is None) != (state is None), "give load or state"
        self.settings = settings
        self.metrics = metrics
        self.state: ServeState | None = None
        self.error: BaseException | None = None
        self.request_exit: Callable[[], None] = lambda: None  # set by the server: stop serving (a failed load)
        self._load = load
        self._loaded = state
        self._on_ready = on_ready
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loader: threading.Thread | None = None  # the load's thread (start(), when there is a load)
        self.cut_off = 0  # requests still running when the drain timeout passed (answered 503)
        self.forced = False  # a second stop signal ended the drain

    def phase(self) -> str:
        """What a request that needs the model or index is told while ``state`` is ``None``."""
        return "loading" if self.error is None else "failed"

    async def start(self) -> None:
        """The app's startup: the loaded state starts now, a load begins in its thread."""
        self._loop = asyncio.get_running_loop()
        if self._loaded is not None:
            await self._activate(self._loaded)
            return
        loop = asyncio.get_running_loop()
        # NOTE: a daemon thread: a SIGTERM while loading stops the server without waiting for the load (the process
        # then ends with os._exit: ``still_loading``)
        self._loader = threading.Thread(target=self._run, args=(loop,), name="petal-load", daemon=True)
        self._loader.start()

    @property
    def still_loading(self) -> bool:
        """The load's thread still runs (the server stopped before it finished): ending the interpreter under it
        (torch, a tokenizer mid-call) aborts the process (SIGABRT, exit 134)."""
        return self._loader is not None and self._loader.is_alive()

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self._load is not None
        try:
            state = self._load(self.metrics)
        except BaseException as exc:  # re-raised by the server's caller, for the CLI's exit code
            self.error = exc
            log.debug("petal serve: the load failed", exc_info=True)
            with contextlib.suppress(RuntimeError):  # the loop is closed: the server stopped meanwhile
                loop.call_soon_threadsafe(self.request_exit)
            return
        with contextlib.suppress(RuntimeError):
            asyncio.run_coroutine_threadsafe(self._activate(state), loop)

    async def _activate(self, state: ServeState) -> None:
        if self._closing:
            return
        state.on_failure = self._serving_failed
        try:
            await state.start()
        except Exception as exc:  # re-raised by the server's caller
            self.error = exc
            self.request_exit()
            return
        if self._closing:  # stopped meanwhile
            await state.stop()
            return
        self.state = state
        gc_clock.restart_longest()  # the longest pause from here on is one a request can meet (not the load's)
        if self._on_ready is not None:
            self._on_ready(state)

    def _serving_failed(self, stopped: BaseException) -> None:
        """(a serving thread, ending) It stopped on an unexpected error (``ThreadStopped``): the server stops, and
        ``serve`` raises the error once it has (exit 1)."""
        if self.error is None:
            self.error = stopped
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the server stopped meanwhile
                self._loop.call_soon_threadsafe(self.request_exit)

    async def stop(self) -> None:
        """The app's shutdown (after in-flight requests drained)."""
        self._closing = True
        if self.state is not None:
            await self.state.stop()

    def close_threads(self) -> bool:
        """(after the server stopped, its loop closed) The state's threads stopped, whether or not the app's
        shutdown ran (a second signal skips it). True when none is left running."""
        self._closing = True
        return self.state is None or self.state.close_threads()

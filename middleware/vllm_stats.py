"""vLLM stat logger plugin: one ``engine.stats`` event per finished request.

vLLM measures queue, prefill and decode inside its engine core, with ``time.monotonic()`` in
another process; only the durations reach the API-server process, in
``IterationStats.finished_requests`` (``FinishedRequestStats``). This logger forwards those
durations, stamped with this process's clock at the moment the request finished, so the stage
table can split the engine's TTFT into queue, prefill and frontend without comparing clocks.

vLLM loads it from the entry-point group ``vllm.stat_logger_plugins`` in ``AsyncLLM.__init__``
(the API-server process, where ``hopline.middleware.engine.EngineMiddleware`` also runs; ``vllm
serve`` has no flag for it; ``VLLM_PLUGINS``, when set, must name ``hopline``). It is inert
until hopline is configured: ``HOPLINE_SINK``, or ``hopline.middleware.emit.configure()`` (also
when that is called after vLLM built the logger: it follows the process-wide emitter). Configuration,
as for every hopline emitter: ``HOPLINE_SINK``,
``HOPLINE_SERVICE``, ``HOPLINE_REPLICA``, ``HOPLINE_MODEL`` (default: vLLM's served model name).

The request ID is ``FinishedRequestStats.request_id`` (vLLM >= 0.20): the caller's
``X-Request-Id`` behind vLLM's ``chatcmpl-`` / ``cmpl-`` prefix. Older vLLM reports no ID; such
requests are counted in ``skipped`` and nothing is emitted. vLLM gives a stat logger no request
headers, so the attempt number comes from the ``AttemptRegistry`` (``hopline.middleware.attempts``)
the engine middleware notes requests with ``X-Hopline-Attempt`` > 0 in; everything else is attempt 0.

Side effect of being installed: vLLM turns its stats collection on whenever a stat logger
plugin exists, even with ``--disable-log-stats`` (its console logger stays off).
"""

from __future__ import annotations

from typing import Any

from hopline.middleware.attempts import ATTEMPTS, AttemptRegistry
from hopline.middleware.contract.events import normalize_request_id
from hopline.middleware.emit import Emitter, configured_emitter
from hopline.middleware.log import logger, warn_throttled

try:
    from vllm.v1.metrics.loggers import StatLoggerBase
except ImportError:  # no vLLM here: the class stays importable, vLLM never loads it
    StatLoggerBase = object  # type: ignore[assignment,misc]

def _served_model_name(vllm_config: Any) -> str | None:
    """vLLM's served model name (what its Prometheus ``model_name`` label says)."""
    name = getattr(getattr(vllm_config, "model_config", None), "served_model_name", None)
    if isinstance(name, (list, tuple)):
        name = name[0] if name else None
    return name if isinstance(name, str) and name else None


class HoplineStatLogger(StatLoggerBase):
    """Emits ``engine.stats`` from vLLM's per-request durations; never raises into vLLM.

    vLLM calls ``HoplineStatLogger(vllm_config, engine_index)``; ``emitter`` (tests, embedding)
    replaces the process-wide one (``configure()`` / ``HOPLINE_*``) and makes the logger active
    without either; ``attempts`` is the registry the engine middleware notes failover attempts in
    (default: both use the process-wide ``ATTEMPTS``). ``skipped`` counts finished requests without
    a usable request ID, ``errors`` failures inside this logger (both caught and dropped).
    """

    def __init__(
        self,
        vllm_config: Any,
        engine_index: int = 0,
        *,
        emitter: Emitter | None = None,
        attempts: AttemptRegistry | None = None,
    ) -> None:
        self.engine_index = engine_index
        self.attempts = ATTEMPTS if attempts is None else attempts
        self.skipped = 0
        self.errors = 0
        self._given = emitter
        self._served_model = _served_model_name(vllm_config)
        self._emitter: Emitter | None = None  # the emitter in use (None: inert)
        self._model: str | None = None
        self._current()

    def _current(self) -> Emitter | None:
        """The emitter to use now: the one given, else the process-wide one once hopline is
        configured (``configure()`` or ``HOPLINE_SINK``), followed when ``configure()`` replaces it."""
        try:
            emitter = self._given if self._given is not None else configured_emitter()
            if emitter is not self._emitter:
                self._emitter = emitter
                if emitter is not None:
                    self.attempts.attach()
                    # HOPLINE_MODEL unset: vLLM's served model name
                    self._model = None if "model" in emitter.static else self._served_model
            return emitter
        except Exception as exc:  # noqa: BLE001 - never stop vLLM
            self.errors += 1
            warn_throttled("vllm_stat_logger_disabled", "vllm_stat_logger_disabled", error=str(exc))
            return None

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        """Called by vLLM once per engine step; does work only when requests finished."""
        if iteration_stats is None or (self._emitter is None and self._current() is None):
            return
        try:
            finished = iteration_stats.finished_requests
            if not finished:
                return
            # configure() replaced (closed) the emitter: follow it (checked only when there is work)
            if self._emitter.closed and self._current() is None:  # type: ignore[union-attr]
                return
            for stats in finished:
                try:
                    self._emit(stats)
                except Exception:  # this request's stats are lost, the others' are not
                    self.errors += 1
        except Exception:
            self.errors += 1

    def _emit(self, stats: Any) -> None:
        request_id = normalize_request_id(getattr(stats, "request_id", None))
        if request_id is None:
            if not self.skipped:
                logger.warning(
                    "vllm_stats_without_request_id",
                    hint="vLLM < 0.20 reports none; else the X-Request-Id broke the ID rule",
                )
            self.skipped += 1
            return
        attrs: dict[str, Any] = {
            "queue_s": stats.queued_time,
            "prefill_s": stats.prefill_time,
            "decode_s": stats.decode_time,
            "prompt_tokens": stats.num_prompt_tokens,
            "output_tokens": stats.num_generation_tokens,
            "cached_tokens": stats.num_cached_tokens,
            "finish_reason": str(stats.finish_reason),
        }
        if stats.max_tokens_param is not None:
            attrs["max_tokens"] = stats.max_tokens_param
        if self._model is not None:
            attrs["model"] = self._model
        attempt = self.attempts.get(request_id)
        if attempt is not None:
            attrs["attempt"] = attempt
        leg = self.attempts.leg(request_id)
        if leg is not None:
            attrs["leg"] = leg
        self._emitter.emit("engine.stats", request_id, **attrs)  # type: ignore[union-attr]

    def log_engine_initialized(self) -> None:
        if self._emitter is not None:
            logger.info("vllm_stat_logger_ready", engine=self.engine_index, model=self._model)

    def log(self) -> None:
        """vLLM's periodic stats tick: nothing to do, events are shipped by the emitter."""

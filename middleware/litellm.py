"""Gateway hops from inside LiteLLM's proxy: a ``CustomLogger`` that one line of proxy config registers.

    # litellm proxy config.yaml (hopline installed in the proxy's environment, HOPLINE_SINK set)
    litellm_settings:
      callbacks: hopline.middleware.litellm.proxy_handler

Written against litellm 1.106.12 (``litellm/integrations/custom_logger.py``,
``litellm/proxy/utils.py``, ``litellm/utils.py``, ``litellm/proxy/litellm_pre_call_utils.py``).
Which hook gives which hop, and whose clock:

=====================  ==========================================================================
``gateway.received``   LiteLLM's own arrival stamp ``data["proxy_server_request"]["arrival_time"]``
                       (``request.state.litellm_received_at``, the first line of
                       ``user_api_key_auth``, before any auth work), emitted from
                       ``async_pre_call_hook`` (after auth), or from the failure hook when auth
                       itself refused the request. LiteLLM hands that hook no request headers,
                       so an auth refusal is reported under an ID of its own, not the caller's.
``gateway.admitted``   the first upstream attempt: ``async_pre_call_deployment_hook`` runs after
                       auth, budgets, every pre-call hook (LiteLLM's rate limiters are pre-call
                       hooks) and routing (the router's rpm/tpm checks) let the request through.
``gateway.forwarded``  every upstream attempt (``async_pre_call_deployment_hook`` runs per try:
                       first, each retry, each fallback), ``upstream`` = the deployment's
                       ``model_info.id`` (set ``model_info: {id: r1}`` per deployment: it becomes a
                       label, so name it after the engine replica), ``attempt`` counting from the
                       caller's ``X-Hopline-Attempt`` (0).
``first/last_token``   the response as the proxy relays it: ``async_post_call_streaming_iterator_hook``
                       sees every chunk on its way out (same first-token rule as everywhere,
                       ``sse.StreamReader.feed_object``); a non-streaming response ends at
                       ``async_post_call_success_hook``.
``rejected / error``   ``async_post_call_failure_hook``: ``gateway.rejected`` for 401/403/429
                       (auth, budget, rate limit), ``gateway.error`` with ``status`` otherwise.
=====================  ==========================================================================

Times are ``time.time()``: LiteLLM stamps ``arrival_time`` with the wall clock, so the callback
reads the same clock for the hops it times itself and ``gateway = forwarded - received`` is a
difference on one clock of one process.

The request ID: LiteLLM does not send the caller's ``X-Request-Id`` upstream (it forwards client
``x-*`` headers only with ``forward_client_headers_to_llm_api``). The pre-call hook adopts the
caller's ID (a fresh one when missing or invalid) and puts ``X-Request-Id`` into the request's
``extra_headers``, and each attempt's ``X-Hopline-Attempt``, so the engine's hops (and vLLM's own
request ID) carry the same ID. Nothing else of the caller's is forwarded. An engine that takes
its request ID from the body instead (SGLang's ``rid``; it ignores the header) gets it there when
``HOPLINE_REQUEST_ID_BODY_FIELD=rid`` is set in the proxy's environment (LiteLLM's ``extra_body``).

Never raises into LiteLLM (every hook body is guarded and counted in the emitter's ``errors``) and
never blocks its event loop: an emission is an append to the emitter's bounded buffer.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from typing import Any

from hopline.middleware.asgi import adopt_request_id, parse_attempt, resolve_emitter
from hopline.middleware.emit import Emitter
from hopline.middleware.gateway import REJECTED_STATUSES
from hopline.middleware.sse import StreamReader, request_attrs
from litellm.integrations.custom_logger import CustomLogger

MAX_OPEN = 10_000  # requests remembered between hooks; the oldest is forgotten beyond this
REQUEST_ID_HEADER = "X-Request-Id"
ATTEMPT_HEADER = "X-Hopline-Attempt"
BODY_FIELD_ENV = "HOPLINE_REQUEST_ID_BODY_FIELD"  # e.g. ``rid``: SGLang takes its request ID from the body


class _Request:
    """One proxy request between LiteLLM's hooks (keyed by ``litellm_call_id``)."""

    __slots__ = ("attempts", "base_attempt", "final", "request_id")

    def __init__(self, request_id: str, base_attempt: int) -> None:
        self.request_id = request_id
        self.base_attempt = base_attempt
        self.attempts = 0  # upstream attempts started
        self.final = False  # last_token / error / rejected emitted

    @property
    def attempt(self) -> int:
        return self.base_attempt + max(self.attempts - 1, 0)


def _headers_of(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """The caller's request headers as LiteLLM keeps them (lower-cased names, credentials redacted)."""
    proxy_request = data.get("proxy_server_request")
    headers = proxy_request.get("headers") if isinstance(proxy_request, Mapping) else None
    if not isinstance(headers, Mapping):
        metadata = data.get("metadata") or data.get("litellm_metadata")
        headers = metadata.get("headers") if isinstance(metadata, Mapping) else None
    return headers if isinstance(headers, Mapping) else {}


def _arrival_of(data: Mapping[str, Any]) -> float | None:
    """LiteLLM's arrival stamp of the request (epoch seconds), where it recorded one."""
    proxy_request = data.get("proxy_server_request")
    arrival = proxy_request.get("arrival_time") if isinstance(proxy_request, Mapping) else None
    if isinstance(arrival, (int, float)) and not isinstance(arrival, bool):
        return float(arrival)
    metadata = data.get("metadata") or data.get("litellm_metadata")
    received = metadata.get("litellm_received_at") if isinstance(metadata, Mapping) else None
    if received is None:
        received = data.get("start_time")  # an auth refusal's request data carries only this
    if isinstance(received, (int, float)) and not isinstance(received, bool):
        return float(received)
    return received.timestamp() if hasattr(received, "timestamp") else None


def _upstream_of(kwargs: Mapping[str, Any]) -> str:
    """The deployment an attempt goes to: its ``model_info.id``, else its model name."""
    info = kwargs.get("model_info")
    name = info.get("id") if isinstance(info, Mapping) else None
    return str(name or kwargs.get("model") or "unknown")[:256]


def _status_of(exc: BaseException) -> int | None:
    """The HTTP status LiteLLM answers an exception with (``status_code``, or ``code`` on ProxyException)."""
    for attr in ("status_code", "code"):
        value = getattr(exc, attr, None)
        try:
            status = int(value)
        except (TypeError, ValueError):
            continue
        if 100 <= status <= 599:
            return status
    return None


def _error_label(exc: BaseException, status: int | None) -> str:
    """``http_429`` or ``exception:Name``: never the message (it may quote the request)."""
    return f"http_{status}" if status is not None else f"exception:{type(exc).__name__}"[:64]


class HoplineLogger(CustomLogger):
    """LiteLLM ``CustomLogger`` emitting hopline's gateway hops (see the module docstring).

    Args:
        emitter: where events go; default the process-wide one from ``HOPLINE_*`` (resolved at
            the first hook, so the proxy's environment is read when the proxy runs). Without a
            usable configuration the logger stays inert.
    """

    def __init__(
        self, emitter: Emitter | None = None, *, body_request_id: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self._emitter = emitter
        # opt-in: also put the ID into this body field of each upstream request (SGLang: ``rid``)
        field = body_request_id if body_request_id is not None else os.environ.get(BODY_FIELD_ENV, "")
        self.body_request_id = field.strip() or None
        self._resolved = emitter is not None
        self._open: OrderedDict[str, _Request] = OrderedDict()

    # -- plumbing -------------------------------------------------------------------------------

    @property
    def emitter(self) -> Emitter | None:
        if not self._resolved:
            self._resolved = True
            self._emitter = resolve_emitter(None, "HoplineLogger")
        return self._emitter

    def _count_error(self) -> None:
        emitter = self._emitter
        if emitter is not None:
            emitter.errors += 1

    def _emit(self, req: _Request, hop: str, ts: float, **attrs: Any) -> None:
        emitter = self.emitter
        if emitter is not None:
            emitter.emit(hop, req.request_id, ts, attempt=req.attempt, **attrs)

    def _key(self, data: Mapping[str, Any]) -> str | None:
        key = data.get("litellm_call_id")
        return key if isinstance(key, str) and key else None

    def _begin(self, data: Mapping[str, Any]) -> _Request | None:
        """The request's state, created (and ``gateway.received`` emitted) at its first hook."""
        key = self._key(data)
        req = self._open.get(key) if key is not None else None
        if req is not None or self.emitter is None:
            return req
        headers = _headers_of(data)
        req = _Request(
            adopt_request_id(headers.get("x-request-id"), "litellm"),
            parse_attempt(headers.get("x-hopline-attempt")),
        )
        if key is not None:
            self._open[key] = req
            while len(self._open) > MAX_OPEN:
                self._open.popitem(last=False)
        arrival = _arrival_of(data)
        attrs = request_attrs(data) if "model" in data else {}
        self._emit(req, "gateway.received", arrival if arrival is not None else time.time(), **attrs)
        return req

    def _end(self, data: Mapping[str, Any]) -> None:
        key = self._key(data)
        if key is not None:
            self._open.pop(key, None)

    # -- LiteLLM's hooks ------------------------------------------------------------------------

    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict, call_type: Any
    ) -> dict | None:
        """After auth: ``gateway.received`` (at LiteLLM's arrival stamp); the ID goes upstream."""
        try:
            req = self._begin(data)
            if req is None:
                return None
            extra = data.get("extra_headers")
            extra = dict(extra) if isinstance(extra, Mapping) else {}
            extra[REQUEST_ID_HEADER] = req.request_id
            data["extra_headers"] = extra
            return data
        except Exception:  # noqa: BLE001 - never into LiteLLM
            self._count_error()
            return None

    async def async_pre_call_deployment_hook(self, kwargs: dict, call_type: Any) -> dict | None:
        """One upstream attempt: ``gateway.admitted`` (first only), ``gateway.forwarded``."""
        try:
            req = self._begin(kwargs)
            if req is None or req.final:
                return None
            now = time.time()
            req.attempts += 1
            if req.attempts == 1:
                self._emit(req, "gateway.admitted", now)
            self._emit(req, "gateway.forwarded", now, upstream=_upstream_of(kwargs))
            extra = kwargs.get("extra_headers")
            extra = dict(extra) if isinstance(extra, Mapping) else {}
            extra[REQUEST_ID_HEADER] = req.request_id
            extra[ATTEMPT_HEADER] = str(req.attempt)
            kwargs["extra_headers"] = extra
            if self.body_request_id is not None:
                body = kwargs.get("extra_body")
                kwargs["extra_body"] = {
                    **(body if isinstance(body, Mapping) else {}),
                    self.body_request_id: req.request_id,
                }
            return kwargs
        except Exception:  # noqa: BLE001 - never into LiteLLM
            self._count_error()
            return None

    async def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: Any, response: Any, request_data: dict
    ) -> AsyncIterator[Any]:
        """Relay the stream unchanged, timing its first output and its end."""
        try:
            req = self._begin(request_data)
        except Exception:  # noqa: BLE001 - never into LiteLLM
            self._count_error()
            req = None
        reader = StreamReader()
        async for item in response:
            if req is not None:
                try:
                    now = time.time()
                    if reader.feed_object(item, now):
                        self._emit(req, "gateway.first_token", now)
                except Exception:  # noqa: BLE001 - never into LiteLLM
                    self._count_error()
            yield item
        if req is not None and not req.final:
            try:
                req.final = True
                self._emit(req, "gateway.last_token", time.time(), **reader.summary())
                self._end(request_data)
            except Exception:  # noqa: BLE001 - never into LiteLLM
                self._count_error()

    async def async_post_call_success_hook(self, data: dict, user_api_key_dict: Any, response: Any) -> Any:
        """A non-streaming response is complete: ``gateway.last_token``."""
        try:
            req = self._begin(data)
            if req is None or req.final or data.get("stream") is True:
                return None
            req.final = True
            reader = StreamReader()
            reader.feed_object(response, time.time())
            attrs = {
                "output_tokens": reader.output_tokens,
                "reasoning_tokens": reader.reasoning_tokens,
                "finish_reason": reader.finish_reason,
            }
            self._emit(
                req, "gateway.last_token", time.time(), **{k: v for k, v in attrs.items() if v is not None}
            )
            self._end(data)
        except Exception:  # noqa: BLE001 - never into LiteLLM
            self._count_error()
        return None

    async def async_post_call_failure_hook(
        self,
        request_data: dict,
        original_exception: Exception,
        user_api_key_dict: Any,
        traceback_str: str | None = None,
    ) -> Any:
        """LiteLLM answers with an error: ``gateway.rejected`` (401/403/429) or ``gateway.error``."""
        try:
            req = self._begin(request_data)
            if req is None or req.final:
                return None
            req.final = True
            status = _status_of(original_exception)
            hop = "gateway.rejected" if status in REJECTED_STATUSES else "gateway.error"
            attrs: dict[str, Any] = {"error": _error_label(original_exception, status)}
            if status is not None:
                attrs["status"] = status
            self._emit(req, hop, time.time(), **attrs)
            self._end(request_data)
        except Exception:  # noqa: BLE001 - never into LiteLLM
            self._count_error()
        return None


# What a proxy config names: ``litellm_settings: callbacks: hopline.middleware.litellm.proxy_handler``
proxy_handler = HoplineLogger()

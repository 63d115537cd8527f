"""The OpenAI wire format as hopline reads it: SSE streams and bounded JSON body summaries.

One rule decides "this is the first token" for the client, the gateway and the engine alike, so
their TTFTs measure the same moment: an SSE event carries output when one of its choices has a
non-empty ``content``, ``reasoning_content`` (or ``reasoning``), ``tool_calls`` / ``function_call``,
or completion ``text``. A role-only chunk (vLLM and OpenAI send one first), a usage-only chunk and
``[DONE]`` carry none.

``StreamReader`` parses an SSE byte stream incrementally: events split across network chunks or
several events in one chunk come out the same. It keeps counts and timestamps, never text: a
chunk's JSON is decoded, a few fields are read, and the object is dropped. Because it runs once per
streamed chunk inside the engine's server, the stream's plain content chunk is learnt once and its
repeats (same bytes around different text, or around an empty text: no output) are counted without
decoding; ``feed_batch`` reads chunks a middleware kept, in one loop.

``request_summary`` / ``response_summary`` read the few attributes hopline records from a JSON
request or a non-streaming response body, refusing bodies over ``MAX_JSON_BYTES``. Where the
engine reports its own per-request durations in the response (vLLM's ``metrics`` object,
``REPORTED_METRICS``), the reader of the stream or body keeps them too.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

MAX_JSON_BYTES = 1 << 20  # bodies above this are passed on untouched and not parsed
MAX_EVENT_BYTES = 1 << 20  # an SSE event (or a line without newline) above this is dropped
_DONE = b"[DONE]"
_DONE_EVENT = b"data: [DONE]\n\n"
_CONTENT_KEY = b'"content":"'  # a plain chunk's text follows it (StreamReader._learn)
# The body of one JSON string, exactly as JSON allows it: any byte but a quote, a backslash or a
# control character, and the escapes. A plain chunk's text whose quotes are all escaped is still
# one string (code and JSON in an answer have many); this tells it without decoding.
_JSON_STRING_BODY = re.compile(rb'(?:[^"\\\x00-\x1f]+|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*')


# The first-token rule as data: a choice carries output when its ``delta`` has a non-empty one of
# OUTPUT_DELTA_FIELDS (chat), or, without a delta, a non-empty ``text`` (completions).
OUTPUT_DELTA_FIELDS = ("content", "reasoning_content", "reasoning", "tool_calls", "function_call")
OUTPUT_TEXT_FIELD = "text"


# vLLM's per-request metrics (``--enable-per-request-metrics``, vLLM >= 0.25; fields as in vLLM
# 0.33 ``PerRequestMetrics``, vllm/entrypoints/generate/base/protocol.py): a ``metrics`` object on
# a non-streaming response and on the final usage chunk of a stream (n == 1 only). Milliseconds,
# each a difference of two engine-core monotonic timestamps (build_per_request_timing_metrics):
#   queue_time_ms          = scheduled_ts - queued_ts        (vLLM's queue; the stat logger's queued_time)
#   time_to_first_token_ms = first_token_ts - scheduled_ts   (prefill: it EXCLUDES the queue)
#   generation_time_ms     = last_token_ts - first_token_ts  (decode)
# Read as the attribute on the right (seconds) of the ``*.last_token`` event that saw the response.
REPORTED_METRICS = {
    "queue_time_ms": "engine_queue_s",
    "time_to_first_token_ms": "engine_prefill_s",
    "generation_time_ms": "engine_decode_s",
}


# vLLM's per-request speculative decoding (``--per-request-spec-decode-metrics``; vLLM 0.32.0
# ``SpeculativeDecodingMetrics`` in vllm/entrypoints/generate/base/protocol.py, filled by
# ``RequestSpecDecodeMetrics.to_dict`` in vllm/v1/metrics/stats.py): ``metrics.speculative_decoding``,
# read as the attribute on the right. ``mean_acceptance_length`` counts the bonus token.
REPORTED_SPEC_DECODE = {
    "mean_acceptance_length": "spec_acceptance_length",
    "num_draft_tokens": "spec_draft_tokens",
    "num_accepted_draft_tokens": "spec_accepted_tokens",
}


# How many of the completion tokens were reasoning, where the engine counts them in its usage
# (a usage object of the final chunk of a stream with ``stream_options.include_usage``, or of a
# non-streaming body). vLLM and OpenAI: ``usage.completion_tokens_details.reasoning_tokens`` (vLLM
# 0.32.0: ``CompletionTokenUsageInfo`` in vllm/entrypoints/serve/engine/protocol.py, filled on chat
# completions only, by openai/chat_completion/serving.py from the reasoning parser's
# ``count_reasoning_tokens`` over the generated token IDs, and only when served with
# ``--reasoning-parser``: 0 when nothing was reasoned). SGLang: ``usage.reasoning_tokens`` (its
# UsageInfo's default is 0 even where nothing counted: only a count above 0 is read). Never
# estimated from the reasoning deltas: where no usage says it, it is unknown.
def reasoning_count(usage: Any) -> int | None:
    """The reasoning tokens a ``usage`` object (a dict, or an object with those attributes) reports,
    or None where it says none."""
    if usage is None:
        return None
    get = usage.get if isinstance(usage, dict) else lambda name: getattr(usage, name, None)
    details = get("completion_tokens_details")
    if details is not None:
        if isinstance(details, dict):
            count = details.get("reasoning_tokens")
        else:
            count = getattr(details, "reasoning_tokens", None)
        if type(count) is int and count >= 0:
            return count
    count = get("reasoning_tokens")
    return count if type(count) is int and count > 0 else None


def reported_durations(metrics: Any) -> dict[str, float]:
    """``REPORTED_METRICS`` of a ``metrics`` object (a dict, or an object with those attributes)
    as seconds, and its ``speculative_decoding`` counts (``REPORTED_SPEC_DECODE``); absent, null,
    negative or non-numeric fields are left out."""
    out: dict[str, float] = {}
    if metrics is None:
        return out
    get = metrics.get if isinstance(metrics, dict) else lambda name: getattr(metrics, name, None)
    for field, attr in REPORTED_METRICS.items():
        value = get(field)
        if type(value) in (int, float) and 0 <= value < 1e12:
            out[attr] = value / 1000.0
    spec = get("speculative_decoding")
    if spec is not None:
        spec_get = spec.get if isinstance(spec, dict) else lambda name: getattr(spec, name, None)
        for field, attr in REPORTED_SPEC_DECODE.items():
            value = spec_get(field)
            if type(value) in (int, float) and 0 <= value < 1e12:
                out[attr] = value
    return out


# LiteLLM's per-phase timing headers (``LITELLM_DETAILED_TIMING=true`` on the proxy; read in litellm
# 1.106.12: ``set_timing_metrics`` in litellm/litellm_core_utils/llm_response_utils/response_metadata.py,
# the headers in ``get_custom_headers``, litellm/proxy/common_request_processing.py). Milliseconds on
# the proxy's clock, in the response's headers (a stream's too, sent before its body):
#   pre-processing  = the provider call's start - the proxy's arrival stamp (``litellm_received_at``,
#                     taken at auth: the same anchor as hopline's callback's gateway.received)
#   llm-api         = the provider call (on a stream: until the engine's response began)
#   post-processing = the response time - pre - llm-api (0 where negative)
# (``message-copy``, the copy of the request's messages for logging, falls inside pre-processing
# and is not read.) Read as the attribute on the right (seconds) of the client's ``*.last_token``.
REPORTED_GATEWAY_TIMING = {
    "x-litellm-timing-pre-processing-ms": "gateway_pre_s",
    "x-litellm-timing-llm-api-ms": "gateway_upstream_s",
    "x-litellm-timing-post-processing-ms": "gateway_post_s",
}


def reported_gateway_timing(headers: Any) -> dict[str, float]:
    """``REPORTED_GATEWAY_TIMING`` of a response's headers (anything with ``get``) as seconds;
    absent, non-numeric, negative or non-finite values are left out."""
    out: dict[str, float] = {}
    for header, attr in REPORTED_GATEWAY_TIMING.items():
        raw = headers.get(header)
        if raw is None or len(raw) > 32:
            continue
        try:
            value = float(raw)
        except ValueError:
            continue
        if 0 <= value < 1e12:  # NaN and inf fail this too
            out[attr] = value / 1000.0
    return out


def _output_in_choice(choice: Any) -> bool:
    """The rule for one decoded (dict) choice."""
    if not isinstance(choice, dict):
        return False
    delta = choice.get("delta")
    if isinstance(delta, dict):
        for name in OUTPUT_DELTA_FIELDS:  # a loop, not any(genexpr): it runs for every parsed chunk
            if delta.get(name):
                return True
        return False
    return bool(choice.get(OUTPUT_TEXT_FIELD))


def _output_in_choice_object(choice: Any) -> bool:
    """The same rule for a choice object (a gateway's parsed chunk, e.g. LiteLLM's ``StreamingChoices``)."""
    delta = getattr(choice, "delta", None)
    if delta is not None:
        return any(getattr(delta, name, None) for name in OUTPUT_DELTA_FIELDS)
    return bool(getattr(choice, OUTPUT_TEXT_FIELD, None))


class StreamReader:
    """Incremental SSE parser that tracks what hopline reports about a streamed completion.

    Call ``feed(chunk, ts)`` with every body chunk and its arrival time; it returns True when that
    chunk brought the first output. Afterwards read ``first_at``, ``output_chunks``, ``max_gap_s``,
    ``max_gap_at``, ``finish_reason``, ``output_tokens``, ``reasoning_tokens`` (where the usage
    says it: ``reasoning_count``), ``prompt_tokens``, ``done`` (``[DONE]``
    seen) and ``error`` / ``error_status`` (an error event inside the stream). ``malformed`` counts
    events that were not JSON or oversized lines; they are skipped, never raised.
    """

    __slots__ = (
        "_after_cr",
        "_buf",
        "_data",
        "_event",
        "_plain",
        "done",
        "error",
        "error_status",
        "finish_reason",
        "first_at",
        "first_content_at",
        "first_reasoning_at",
        "last_output_at",
        "malformed",
        "max_gap_at",
        "max_gap_s",
        "output_chunks",
        "output_tokens",
        "prompt_tokens",
        "reasoning_tokens",
        "reported",
    )

    def __init__(self) -> None:
        self._buf = b""  # an incomplete line carried over to the next chunk
        self._after_cr = False  # the previous chunk ended with CR (maybe half a CRLF)
        self._data: list[bytes] = []  # data lines of the event being read
        self._event = b""  # its `event:` field
        # The stream's plain-chunk template (see ``_learn``): the bytes before and after the
        # content text, their lengths, and the chunk with an empty text
        self._plain: tuple[bytes, bytes, int, int, bytes] | None = None
        self.first_at: float | None = None
        # a reasoning model's first reasoning delta and first content delta (chat streams)
        self.first_reasoning_at: float | None = None
        self.first_content_at: float | None = None
        self.last_output_at: float | None = None
        self.output_chunks = 0
        self.max_gap_s: float | None = None
        self.max_gap_at: float | None = None
        self.finish_reason: str | None = None
        self.output_tokens: int | None = None
        self.reasoning_tokens: int | None = None  # of output_tokens, as the usage says (reasoning_count)
        self.prompt_tokens: int | None = None
        self.done = False
        self.error: str | None = None
        self.error_status: int | None = None
        self.malformed = 0
        self.reported: dict[str, float] = {}  # the engine's own durations (REPORTED_METRICS)

    def feed(self, chunk: bytes, ts: float) -> bool:
        """Parse one network chunk received at ``ts``; True when it carried the first output."""
        if self._plain is not None and self.take_plain(chunk, ts):
            return False
        return self._feed_exact(chunk, ts)

    def feed_batch(self, chunks: list[bytes], times: list[float]) -> float | None:
        """``feed`` every chunk of ``chunks`` (arrived at ``times``) in order, up to the first error event.

        Returns the arrival time of the chunk that brought an error (``error`` is then set and
        the rest is not read), else None. The same result as feeding them one by one when they
        arrived: a middleware keeps a stream's chunks after its first token and reads them here
        in one loop, once per batch, rather than once per chunk between the server's own code.
        """
        feed_exact = self._feed_exact
        i, n = 0, len(chunks)
        while i < n:
            plain = self._plain
            run = plain is not None and not (self._buf or self._data)
            if run and chunks[i][-plain[3] :] == plain[1]:  # its tail (else the run declines it at once)
                i = self._take_plain_run(chunks, times, i)
                if i >= n:
                    break
            chunk, ts = chunks[i], times[i]
            i += 1
            # a bytes chunk the run declined is one take_plain declines too (the same tests), and
            # without a run (no template, or a partial event pending) take_plain declines any chunk
            if chunk and (not run or type(chunk) is bytes or not self.take_plain(chunk, ts)):
                feed_exact(chunk, ts)
                if self.error is not None:
                    return ts
        return None

    def _take_plain_run(self, chunks: list[bytes], times: list[float], i: int) -> int:
        """``take_plain`` over ``chunks[i:]`` in one loop, with the template and the counts in
        locals, up to the first chunk it declines (returned: its index; ``len(chunks)`` when it
        took them all). The same decisions and bookkeeping as ``take_plain``, once per chunk.

        The chunk's tail and head are cut with ``bytes.removesuffix`` / ``removeprefix`` (one C
        call each, which returns the very same object when the affix is not there, so ``is``
        tells a match), leaving the content text: about half the instructions of slicing the
        head, the tail and the text apart (bench/README.md, "asgi: a streamed chunk")."""
        head, tail, _, _, _ = self._plain  # type: ignore[misc]
        count, last, gap_s, gap_at = self.output_chunks, self.last_output_at, self.max_gap_s, self.max_gap_at
        fullmatch = _JSON_STRING_BODY.fullmatch
        n = len(chunks)
        while i < n:
            chunk = chunks[i]
            rest = chunk.removesuffix(tail)
            if rest is chunk or type(chunk) is not bytes:  # (a bytearray's removesuffix always copies)
                break
            text = rest.removeprefix(head)
            if text is rest:
                break
            if text:  # else the same chunk with an empty text: no output, nothing to read
                # one JSON string: no '"' in it and not ending in a backslash that would escape the
                # closing quote; else (an answer with quotes) every quote escaped, checked exactly
                if (34 in text or text[-1] == 92) and fullmatch(text) is None:
                    break
                ts = times[i]
                count += 1
                gap = ts - last  # type: ignore[operator]  # a template is learnt from an output chunk
                if gap_s is None or gap > gap_s:
                    gap_s, gap_at = gap, last
                last = ts
            i += 1
        self.output_chunks, self.last_output_at, self.max_gap_s, self.max_gap_at = count, last, gap_s, gap_at
        return i

    def _feed_exact(self, chunk: bytes, ts: float) -> bool:
        if chunk == _DONE_EVENT and not (self._buf or self._data):
            self.done = True
            return False
        had_output = self.first_at is not None
        # one whole event, "data: " + a line without LF + "\n\n", told by slices and ``in`` (the
        # payload's slice is needed anyway): fewer instructions than startswith / find / endswith
        if (
            chunk[:6] == b"data: "
            and chunk[-2:] == b"\n\n"
            and not (self._buf or self._data or self._after_cr)
            and 10 not in (payload := chunk[6:-2])  # no LF (an int needle: memchr; see _learn)
        ):
            if self._dispatch(payload, b"", ts) and self._plain is None:
                self._learn(chunk)
        else:
            self._feed_lines(chunk, ts)
        return not had_output and self.first_at is not None

    def take_plain(self, chunk: bytes, ts: float) -> bool:
        """Count ``chunk`` if it is the stream's plain chunk again (see ``_learn``); False otherwise.

        The per-chunk hot path of every streamed response once output has begun: a few byte
        comparisons, no JSON, and nothing read but the arrival time. A chunk it declines (an
        unusual chunk, a split or merged event) must go to ``feed``, which parses it exactly.
        """
        plain = self._plain
        if plain is None or self._buf or self._data:
            return False
        head, tail, h, t, empty = plain
        n = len(chunk)
        if n > h + t and chunk[:h] == head and chunk[n - t :] == tail:
            text = chunk[h : n - t]
            # one JSON string: no '"' in it and not ending in a backslash that would escape the
            # closing quote; else (an answer with quotes) every quote escaped, checked exactly
            if (34 in text or text[-1] == 92) and _JSON_STRING_BODY.fullmatch(text) is None:
                return False
            self.output_chunks += 1
            last = self.last_output_at
            gap = ts - last
            if self.max_gap_s is None or gap > self.max_gap_s:
                self.max_gap_s = gap
                self.max_gap_at = last
            self.last_output_at = ts
            return True
        return n == h + t and chunk == empty  # the same chunk with an empty text: no output, nothing to read

    def _learn(self, chunk: bytes) -> None:
        """Remember a plain chunk as the template for the rest of the stream.

        A plain chunk is one complete event with exactly one choice, whose delta is only a
        non-empty ``content``, unfinished, with no usage and no error (``_dispatch`` decided).
        Engines send the same bytes around the content text in every such chunk (id, model,
        ``"finish_reason":null``...), so a later chunk made of the same head, a content text
        without quotes, and the same tail is the same kind of event: ``feed`` counts it without
        decoding JSON. That keeps the per-chunk cost of a long stream small.
        """
        # ``partition`` rather than count and three finds: the key exactly once (no other in the
        # rest after its first occurrence, where count's non-overlapping search goes on; ``find``
        # there: ``in`` with a bytes needle raises and clears a TypeError first), then a non-empty
        # text up to the next quote, without a backslash
        before, key, after = chunk.partition(_CONTENT_KEY)
        if not key or after.find(_CONTENT_KEY) >= 0:
            return
        text, quote, _ = after.partition(b'"')
        if not quote or not text or 92 in text:  # a backslash (an int: memchr)
            return
        start = len(before) + len(_CONTENT_KEY)
        end = start + len(text)
        self._plain = (chunk[:start], chunk[end:], start, len(chunk) - end, chunk[:start] + chunk[end:])

    def _feed_lines(self, chunk: bytes, ts: float) -> None:
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the LF of a CRLF split across chunks
        self._after_cr = False
        data = self._buf + chunk if self._buf else chunk
        if b"\r" in data:
            # CR, LF and CRLF all end a line
            self._after_cr = data.endswith(b"\r")
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = data.split(b"\n")
        tail = lines.pop()
        if len(tail) > MAX_EVENT_BYTES:
            self.malformed += 1
            tail = b""
        self._buf = tail
        for line in lines:
            if not line:
                if self._data:
                    payload = b"\n".join(self._data)
                    self._data = []
                    self._dispatch(payload, self._event, ts)
                self._event = b""
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value[:1] == b" " else value)
                if len(self._data) > 1 and sum(map(len, self._data)) > MAX_EVENT_BYTES:
                    self.malformed += 1
                    self._data = []
            elif line.startswith(b"event:"):
                self._event = line[6:].strip()
            # comments (":"), id:, retry: and unknown fields carry nothing hopline reads

    def _dispatch(self, payload: bytes, event: bytes, ts: float) -> bool:
        """Read one event; True when it is a plain chunk (see ``_learn``)."""
        if payload.strip() == _DONE:
            self.done = True
            return False
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self.malformed += 1
            if event == b"error" and self.error is None:
                self.error = "stream_error"
            return False
        if not isinstance(obj, dict):
            self.malformed += 1
            return False
        err = obj.get("error")
        if err or event == b"error":
            if self.error is None:
                self.error, self.error_status = _describe_error(err)
            return False
        usage = obj.get("usage")
        if isinstance(usage, dict):
            out, prompt = usage.get("completion_tokens"), usage.get("prompt_tokens")
            if type(out) is int:
                self.output_tokens = out
            if type(prompt) is int:
                self.prompt_tokens = prompt
            reasoning = reasoning_count(usage)
            if reasoning is not None:
                self.reasoning_tokens = reasoning
            if "metrics" in obj:
                self.reported = reported_durations(obj["metrics"])
        choices = obj.get("choices")
        if not choices or not isinstance(choices, list):
            return False
        output = False
        for choice in choices:
            if _output_in_choice(choice):
                output = True
            reason = choice.get("finish_reason") if isinstance(choice, dict) else None
            if isinstance(reason, str):
                self.finish_reason = reason[:32]
        if not output:
            return False
        self._output(ts)
        choice = choices[0]
        if self.first_content_at is None and isinstance(choice, dict):
            self._channels(choice.get("delta"), ts)
        return (
            len(choices) == 1
            and choice.get("finish_reason") is None
            and usage is None
            and isinstance(choice.get("delta"), dict)
            and len(choice["delta"]) == 1  # its only key "content" (no set built per chunk)
            and isinstance(choice["delta"].get("content"), str)
        )

    def _channels(self, delta: Any, ts: float) -> None:
        """Note the first reasoning and the first content delta (until content has come: a plain
        content chunk, counted without decoding, only ever follows the first content delta)."""
        if not isinstance(delta, dict):
            return
        if self.first_reasoning_at is None and (delta.get("reasoning_content") or delta.get("reasoning")):
            self.first_reasoning_at = ts
        if delta.get("content"):
            self.first_content_at = ts

    def feed_object(self, chunk: Any, ts: float) -> bool:
        """Read one already-parsed chunk object (attributes ``choices``, ``usage``), as a gateway
        that relays parsed chunks holds them; True when it carried the first output.

        Same rule and counts as ``feed``; for gateways that never see the SSE bytes (LiteLLM's
        proxy hands its callbacks ``ModelResponseStream`` objects).
        """
        had_output = self.first_at is not None
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            out, prompt = getattr(usage, "completion_tokens", None), getattr(usage, "prompt_tokens", None)
            if type(out) is int:
                self.output_tokens = out
            if type(prompt) is int:
                self.prompt_tokens = prompt
            reasoning = reasoning_count(usage)
            if reasoning is not None:
                self.reasoning_tokens = reasoning
            metrics = getattr(chunk, "metrics", None)
            if metrics is not None:
                self.reported = reported_durations(metrics)
        choices = getattr(chunk, "choices", None) or ()
        output = False
        for choice in choices:
            if _output_in_choice_object(choice):
                output = True
            reason = getattr(choice, "finish_reason", None)
            if isinstance(reason, str):
                self.finish_reason = reason[:32]
        if output:
            self._output(ts)
            delta = getattr(choices[0], "delta", None) if self.first_content_at is None else None
            if delta is not None:
                self._channels(
                    {name: getattr(delta, name, None) for name in ("content", "reasoning_content", "reasoning")}, ts
                )
        return not had_output and self.first_at is not None

    def _output(self, ts: float) -> None:
        """Count an event carrying output and track the largest gap between such events."""
        self.output_chunks += 1
        last = self.last_output_at
        if last is None:
            self.first_at = ts
        else:
            gap = ts - last
            if self.max_gap_s is None or gap > self.max_gap_s:
                self.max_gap_s = gap
                self.max_gap_at = last
        self.last_output_at = ts

    def summary(self) -> dict[str, Any]:
        """The ``*.last_token`` attributes (None values are left out)."""
        attrs: dict[str, Any] = {}  # in this order; once per stream, so no dict of Nones filtered after
        if self.output_tokens is not None:
            attrs["output_tokens"] = self.output_tokens
        if self.reasoning_tokens is not None:
            attrs["reasoning_tokens"] = self.reasoning_tokens
        attrs["output_chunks"] = self.output_chunks
        if self.finish_reason is not None:
            attrs["finish_reason"] = self.finish_reason
        if self.max_gap_s is not None:
            attrs["max_gap_s"] = self.max_gap_s
        if self.max_gap_at is not None:
            attrs["max_gap_at"] = self.max_gap_at
        if self.reported:
            attrs.update(self.reported)  # reported_durations: never a None value
        if self.first_reasoning_at is not None:  # a reasoning model: when it began to think, and to answer
            attrs["first_reasoning_at"] = self.first_reasoning_at
            if self.first_content_at is not None:
                attrs["first_content_at"] = self.first_content_at
        return attrs


def _describe_error(err: Any) -> tuple[str, int | None]:
    """A short error label and status from an error object; never its (free-text) message."""
    if isinstance(err, dict):
        code = err.get("code")
        status = code if type(code) is int and 100 <= code <= 599 else None
        kind = err.get("type") if isinstance(err.get("type"), str) else None
        if kind is None and isinstance(code, str):
            kind = code
        return _label("stream_error", kind), status
    return "stream_error", None


def _label(prefix: str, kind: str | None) -> str:
    """``stream_error:BadRequestError``: a bounded identifier, nothing else kept."""
    if not kind:
        return prefix
    clean = "".join(c for c in kind[:48] if c.isalnum() or c in "_.-")
    return f"{prefix}:{clean}" if clean else prefix


def _load_json_object(body: bytes) -> dict[str, Any] | None:
    if not body or len(body) > MAX_JSON_BYTES:
        return None
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def request_summary(body: bytes) -> dict[str, Any]:
    """``model``, ``stream``, ``n``, ``max_tokens``/``max_tokens_set``, ``prompt_tokens`` of a request.

    ``max_tokens`` comes from ``max_tokens`` or ``max_completion_tokens``; ``prompt_tokens`` only
    when the prompt is given as token IDs. An unreadable body (not JSON, not an object, over
    ``MAX_JSON_BYTES``) gives ``{}``: attributes unknown, never an error. Never any text.
    """
    obj = _load_json_object(body)
    return {} if obj is None else request_attrs(obj)


def request_attrs(obj: dict[str, Any]) -> dict[str, Any]:
    """``request_summary`` of a request already decoded (a gateway that parsed the body itself)."""
    attrs: dict[str, Any] = {"stream": obj.get("stream") is True}
    model = obj.get("model")
    if isinstance(model, str) and model:
        attrs["model"] = model[:256]
    n = obj.get("n")
    if type(n) is int:
        attrs["n"] = n
    max_tokens = obj.get("max_tokens")
    if max_tokens is None:
        max_tokens = obj.get("max_completion_tokens")
    attrs["max_tokens_set"] = type(max_tokens) is int
    if type(max_tokens) is int:
        attrs["max_tokens"] = max_tokens
    prompt = obj.get("prompt")
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        attrs["prompt_tokens"] = len(prompt)
    return attrs


def response_summary(body: bytes) -> dict[str, Any]:
    """``output_tokens``, ``reasoning_tokens`` (``reasoning_count``), ``prompt_tokens``, ``finish_reason``
    of a non-streaming JSON response."""
    obj = _load_json_object(body)
    if obj is None:
        return {}
    attrs: dict[str, Any] = {}
    usage = obj.get("usage")
    if isinstance(usage, dict):
        if type(usage.get("completion_tokens")) is int:
            attrs["output_tokens"] = usage["completion_tokens"]
        if type(usage.get("prompt_tokens")) is int:
            attrs["prompt_tokens"] = usage["prompt_tokens"]
        reasoning = reasoning_count(usage)
        if reasoning is not None:
            attrs["reasoning_tokens"] = reasoning
    choices = obj.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            reason = choice.get("finish_reason") if isinstance(choice, dict) else None
            if isinstance(reason, str):
                attrs["finish_reason"] = reason[:32]
    attrs.update(reported_durations(obj.get("metrics")))
    return attrs


def error_summary(body: bytes) -> str | None:
    """The short label of an error body such as ``{"error": {"type": ...}}``; None if none."""
    obj = _load_json_object(body)
    if obj is None or not obj.get("error"):
        return None
    return _describe_error(obj["error"])[0]

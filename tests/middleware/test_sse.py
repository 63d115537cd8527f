"""The SSE reader and the "does this chunk carry output" rule shared by client, gateway and engine."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from hopline.middleware.sse import (
    MAX_EVENT_BYTES,
    MAX_JSON_BYTES,
    StreamReader,
    error_summary,
    request_summary,
    response_summary,
)


def event(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chat(delta: dict | None, finish: str | None = None, **extra: object) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return event({"id": "chatcmpl-x", "choices": choices, **extra})


ROLE = chat({"role": "assistant", "content": ""})
USAGE = chat(None, usage={"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10})
DONE = b"data: [DONE]\n\n"
# a vLLM-shaped stream: role chunk, 3 content chunks, finish chunk, usage chunk, [DONE]
STREAM = [ROLE, chat({"content": "a"}), chat({"content": "b"}), chat({"content": "c"}), chat({}, "length"), USAGE, DONE]


def read(chunks: list[bytes], times: list[float] | None = None) -> tuple[StreamReader, list[int]]:
    """Feed chunks (at times 0, 1, 2... unless given); return the reader and the indexes that were first."""
    reader = StreamReader()
    firsts = [i for i, c in enumerate(chunks) if reader.feed(c, float(i) if times is None else times[i])]
    return reader, firsts


def test_role_chunk_is_not_output_and_first_content_chunk_is():
    reader, firsts = read(STREAM)
    assert firsts == [1]  # chunk 0 is the role-only chunk
    assert reader.first_at == 1.0
    assert reader.output_chunks == 3
    assert reader.finish_reason == "length"
    assert reader.output_tokens == 3 and reader.prompt_tokens == 7
    assert reader.done and reader.error is None and reader.malformed == 0


def test_usage_only_chunk_and_empty_content_do_not_count():
    reader, firsts = read([ROLE, chat({"content": ""}), USAGE, chat({"content": "x"}), DONE])
    assert firsts == [3]
    assert reader.output_chunks == 1


def test_every_output_field_counts():
    for delta in (
        {"reasoning_content": "hmm"},
        {"reasoning": "hmm"},
        {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]},
        {"function_call": {"name": "f"}},
    ):
        reader, firsts = read([ROLE, chat(delta)])
        assert firsts == [1], delta
    completion = event({"id": "cmpl-x", "choices": [{"index": 0, "text": "hello", "finish_reason": None}]})
    empty_completion = event({"id": "cmpl-x", "choices": [{"index": 0, "text": "", "finish_reason": None}]})
    assert read([empty_completion, completion])[1] == [1]


def test_largest_gap_and_when_it_began():
    # output at t=1, 2, 5.5, 6: the largest gap is 3.5 s, starting at t=2
    chunks = [ROLE] + [chat({"content": c}) for c in "abcd"] + [DONE]
    reader, _ = read(chunks, [0.0, 1.0, 2.0, 5.5, 6.0, 6.1])
    assert reader.max_gap_s == 3.5
    assert reader.max_gap_at == 2.0
    assert reader.summary() == {"output_chunks": 4, "max_gap_s": 3.5, "max_gap_at": 2.0}


def test_events_merged_in_one_chunk_and_split_across_chunks():
    whole = b"".join(STREAM)
    merged, firsts = read([whole])
    assert firsts == [0] and merged.output_chunks == 3 and merged.done
    # split in the middle of the JSON of the first content event, and of the data: prefix
    cut1 = len(ROLE) + 20
    cut2 = len(ROLE) + len(STREAM[1]) + 3
    split, firsts = read([whole[:cut1], whole[cut1:cut2], whole[cut2:]])
    assert firsts == [1]  # the first content event is complete only in the second chunk
    assert (split.output_chunks, split.output_tokens, split.finish_reason) == (3, 3, "length")


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=12), crlf=st.booleans())
def test_any_chunking_gives_the_same_result(cuts, crlf):
    whole = b"".join(STREAM)
    if crlf:
        whole = whole.replace(b"\n", b"\r\n")
    points = sorted({c % (len(whole) + 1) for c in cuts})
    chunks = [whole[a:b] for a, b in zip([0, *points], [*points, len(whole)]) if b > a]
    reader, firsts = read(chunks)
    assert len(firsts) == 1
    assert (reader.output_chunks, reader.output_tokens, reader.finish_reason, reader.done) == (3, 3, "length", True)
    assert reader.malformed == 0


def test_multiline_data_comments_and_other_fields():
    # data lines of one event are joined with a newline (JSON whitespace between tokens)
    chunk = (
        b": keep-alive\nid: 7\nretry: 100\nevent: message\n"
        b'data: {"choices":\ndata: [{"index":0,"delta":{"content":"x"}}]}\n\n'
    )
    reader, firsts = read([chunk])
    assert firsts == [0]
    assert reader.output_chunks == 1 and reader.malformed == 0


def test_error_event_inside_a_200_stream():
    err = event({"error": {"message": "secret prompt text", "type": "InternalServerError", "code": 500}})
    reader, firsts = read([ROLE, chat({"content": "a"}), err, DONE])
    assert firsts == [1]
    assert reader.error == "stream_error:InternalServerError"
    assert reader.error_status == 500
    named = StreamReader()
    named.feed(b"event: error\ndata: not json\n\n", 0.0)
    assert named.error == "stream_error"


def test_malformed_input_is_counted_never_raised():
    reader, firsts = read([b"data: {not json\n\n", b"data: [1,2]\n\n", b"garbage line\n\n", chat({"content": "ok"})])
    assert firsts == [3]
    assert reader.malformed == 2
    huge = StreamReader()
    huge.feed(b"data: " + b"x" * (MAX_EVENT_BYTES + 10), 0.0)  # no newline: buffered line too long
    assert huge.malformed == 1
    huge.feed(b"\n\n" + chat({"content": "after"}), 1.0)
    assert huge.first_at == 1.0  # the reader recovered


def test_request_summary_reads_attributes_never_text():
    body = orjson.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": "SECRET"}], "stream": True, "max_completion_tokens": 64, "n": 2}
    )
    attrs = request_summary(body)
    assert attrs == {"model": "tiny", "stream": True, "n": 2, "max_tokens": 64, "max_tokens_set": True}
    assert "SECRET" not in repr(attrs)
    assert request_summary(orjson.dumps({"model": "m", "prompt": [1, 2, 3]})) == {
        "model": "m", "stream": False, "max_tokens_set": False, "prompt_tokens": 3,
    }
    assert request_summary(b"not json") == {}
    assert request_summary(b"[1]") == {}
    assert request_summary(b'{"stream": true, "pad": "' + b"x" * MAX_JSON_BYTES + b'"}') == {}


def test_response_and_error_summaries():
    body = orjson.dumps(
        {"choices": [{"message": {"content": "SECRET"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 4, "completion_tokens": 9}}
    )
    assert response_summary(body) == {"output_tokens": 9, "prompt_tokens": 4, "finish_reason": "stop"}
    assert response_summary(b"\x00\xff") == {}
    assert error_summary(orjson.dumps({"error": {"type": "bad\nrequest", "message": "SECRET"}})) == "stream_error:badrequest"
    assert error_summary(body) is None


TRICKY = [
    chat({"content": 'say \\"content\\":\\"\\" and \\"finish_reason\\":null'}),  # look-alike text, escaped
    chat({"content": 'a "quoted" "finish_reason":"stop" word'}),
    chat({"content": "x"}, "stop"),  # content and finish in one chunk
    event({"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None},
                       {"index": 1, "delta": {"content": "y"}, "finish_reason": "length"}]}),
    chat({"content": "x"}, usage={"prompt_tokens": 1, "completion_tokens": 2}),
    chat({"content": "x"}, error={"type": "Overloaded"}),
    chat({"reasoning_content": "r", "content": ""}),
    chat({"content": "x", "tool_calls": []}),
    event({"choices": [{"index": 0, "delta": {"content": "x"}, "logprobs": {"content": []}, "finish_reason": None}]}),
]


def test_fast_path_agrees_with_full_parse():
    """Single-event chunks may skip JSON decoding; a comment line in front forces the exact path."""
    for chunk in TRICKY:
        fast, slow = StreamReader(), StreamReader()
        fast.feed(chunk, 1.0)
        slow.feed(b": force the line parser\n" + chunk, 1.0)
        state = lambda r: (r.first_at, r.output_chunks, r.finish_reason, r.output_tokens, r.error, r.malformed)  # noqa: E731
        assert state(fast) == state(slow), chunk


def test_plain_chunk_fast_path_agrees_with_full_parse_once_learnt():
    """After the first plain content chunk, look-alikes of it must still be read exactly."""
    plain = chat({"content": "first"})
    look_alikes = [
        *TRICKY,
        chat({"content": "again"}),  # the plain chunk: counted by take_plain
        chat({"content": ""}),  # same head and tail, no text: not output
        chat({"content": 'with \\"escaped\\" quotes'}),
        chat({"content": "ends in a backslash \\"}),
        chat({"content": "a"}) + chat({"content": "b"}),  # two plain events in one chunk
        chat({"content": "a"}) + USAGE,
        chat({"content": "a"})[:-1],  # an event split across chunks...
        b"\n",  # ...completed by the next one
        chat({"role": "assistant", "content": "x"}),
        chat({"content": "x"}, "stop"),
        DONE,
    ]
    for chunk in look_alikes:
        fast, slow = StreamReader(), StreamReader()
        for reader, prefix in ((fast, b""), (slow, b": force the line parser\n")):
            reader.feed(ROLE, 0.0)
            reader.feed(plain, 1.0)
            reader.feed(prefix + chunk, 3.0)
        state = lambda r: (r.first_at, r.output_chunks, r.max_gap_s, r.max_gap_at, r.finish_reason,
                           r.output_tokens, r.error, r.malformed, r.done)
        assert state(fast) == state(slow), chunk
    split = StreamReader()
    for part in (ROLE, plain, chat({"content": "a"})[:-1], b"\n", chat({"content": "b"})):
        split.feed(part, 1.0)
    assert split.output_chunks == 3 and split.malformed == 0


def _learnt() -> StreamReader:
    reader = StreamReader()
    for i, chunk in enumerate([ROLE, chat({"content": "first"})]):
        reader.feed(chunk, float(i))
    return reader


def test_take_plain_counts_a_text_with_quotes_and_backslashes_without_decoding():
    """Answers with code or JSON in them are full of quotes: escaped, the text is still one JSON
    string and the chunk still the plain one. A quote that ends the string early is not."""
    reader = _learnt()
    for i, text in enumerate(['say "hi"', "C:\\", 'x = {"a": "\\"}', "\\", '"', "é\n\t\u0001"]):
        assert reader.take_plain(chat({"content": text}), 2.0 + i), text
    assert reader.output_chunks == 7  # first + 6
    injected = event({"id": "chatcmpl-x", "choices": [{"index": 0, "delta": {"content": "a", "role": "x"},
                                                       "finish_reason": None}]})  # fmt: skip
    for chunk in (
        chat({"content": "a"}).replace(b'"a"', b'"a","k":"b"'),  # the string ends, a key follows
        chat({"content": "a"}).replace(b'"a"', b'"a\\"'),  # a backslash that escapes the closing quote
        chat({"content": "a"}).replace(b'"a"', b'"a\\\\\\"'),  # an escaped backslash, then the same
        injected,
    ):
        assert not reader.take_plain(chunk, 9.0), chunk
    assert reader.output_chunks == 7


@settings(max_examples=300, deadline=None, database=None)
@given(st.text(max_size=40))
def test_any_content_text_reads_the_same_by_template_and_by_json(text):
    fast, slow = _learnt(), _learnt()
    fast.feed(chat({"content": text}), 3.0)
    slow.feed(b": force the line parser\n" + chat({"content": text}), 3.0)
    state = lambda r: (r.output_chunks, r.max_gap_s, r.max_gap_at, r.malformed)  # noqa: E731
    assert state(fast) == state(slow)


def test_take_plain_counts_only_the_learnt_chunk_and_tracks_the_gap():
    reader = StreamReader()
    assert not reader.take_plain(chat({"content": "a"}), 0.5)  # nothing learnt yet
    for i, chunk in enumerate([ROLE, chat({"content": "a"})]):
        reader.feed(chunk, float(i))
    assert reader.take_plain(chat({"content": "b"}), 4.0)
    assert reader.take_plain(chat({"content": "c"}), 4.5)
    assert not reader.take_plain(chat({}, "length"), 5.0) and not reader.take_plain(DONE, 5.0)
    assert (reader.output_chunks, reader.max_gap_s, reader.max_gap_at) == (3, 3.0, 1.0)


# A reasoning model's stream as vLLM 0.32.0 sends it with a reasoning parser: role chunk, the
# thinking as ``reasoning_content`` deltas (vllm/entrypoints/openai/chat_completion/serving.py
# puts the parser's reasoning there), then the answer as ``content``.
REASONING_STREAM = [
    ROLE,
    chat({"reasoning_content": "let"}),
    chat({"reasoning_content": " me think"}),
    chat({"content": "42"}),
    chat({"content": "."}),
    chat({}, "stop"),
    DONE,
]


def test_a_reasoning_stream_reports_its_first_reasoning_and_first_content_delta():
    """TTFT counts the first reasoning delta (chunk 1); the user reads content from chunk 3."""
    reader, firsts = read(REASONING_STREAM, [10.0, 10.5, 11.0, 12.5, 13.0, 13.1, 13.2])
    assert firsts == [1] and reader.first_at == 10.5
    summary = reader.summary()
    assert (summary["first_reasoning_at"], summary["first_content_at"]) == (10.5, 12.5)
    assert summary["output_chunks"] == 4


def test_first_content_is_read_the_same_through_the_plain_chunk_fast_path():
    """Content after reasoning, fed in one batch (as the middlewares read kept chunks): the
    template learnt from the first content chunk counts the rest without decoding."""
    reader = StreamReader()
    assert reader.feed(REASONING_STREAM[0], 0.0) is False
    assert reader.feed(REASONING_STREAM[1], 1.0) is True
    rest = REASONING_STREAM[2:] + [chat({"content": "x"})] * 5
    reader.feed_batch(rest, [2.0 + i for i in range(len(rest))])
    assert (reader.first_reasoning_at, reader.first_content_at) == (1.0, 3.0)
    assert reader.output_chunks == 9


def test_a_stream_without_reasoning_first_reports_neither_time():
    """A plain answer (and one whose reasoning comes after content) adds no attribute: TTFT is
    already the first content token."""
    assert "first_content_at" not in read(STREAM)[0].summary()
    late = read([ROLE, chat({"content": "a"}), chat({"reasoning_content": "b"}), DONE])[0].summary()
    assert "first_reasoning_at" not in late and "first_content_at" not in late


def test_vllm_per_request_spec_decode_metrics_are_read_from_the_usage_chunk():
    """``--per-request-spec-decode-metrics`` (vLLM 0.32.0 ``SpeculativeDecodingMetrics``, from
    ``RequestSpecDecodeMetrics.to_dict``): mean acceptance length with the bonus token, drafts."""
    spec = {
        "mean_acceptance_length": 2.5, "draft_acceptance_rate": 0.5, "acceptance_histogram": [10, 20, 30],
        "num_spec_steps": 60, "num_accepted_draft_tokens": 90, "num_draft_tokens": 180, "num_spec_tokens": 3,
    }
    usage = chat(None, usage={"prompt_tokens": 7, "completion_tokens": 150},
                 metrics={"queue_time_ms": 5.0, "speculative_decoding": spec})
    summary = read([ROLE, chat({"content": "a"}), usage, DONE])[0].summary()
    assert (summary["spec_acceptance_length"], summary["spec_draft_tokens"], summary["spec_accepted_tokens"]) == (2.5, 180, 90)
    assert summary["engine_queue_s"] == 0.005
    body = orjson.dumps({"choices": [], "metrics": {"speculative_decoding": {**spec, "num_draft_tokens": -1}}})
    assert "spec_draft_tokens" not in response_summary(body)  # a negative count is dropped, never an error
    assert response_summary(body)["spec_acceptance_length"] == 2.5


def test_take_plain_searching_in_place_agrees_with_exact_parsing_on_random_texts():
    """take_plain checks the text inside the chunk without slicing it; on texts full of quotes,
    backslashes, escapes and control characters it must count exactly what parsing counts."""
    import random

    rng = random.Random(26)
    alphabet = ['"', "\\", "a", " ", "\n", "é", "\\u00e9", "'", "}", ":", "\x01"]
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8)))
        fast, exact = StreamReader(), StreamReader()
        for reader in (fast, exact):
            reader.feed(chat({"content": "first"}), 1.0)
        chunk = chat({"content": text})
        fast.feed(chunk, 2.0)
        exact._feed_exact(chunk, 2.0)
        assert (fast.output_chunks, fast.max_gap_s, fast.malformed) == (exact.output_chunks, exact.max_gap_s, exact.malformed), text


def test_feed_batch_gives_what_feeding_one_by_one_gives():
    """The batch path (runs of plain chunks in one loop) must end with every count, time and
    label equal to feeding the same chunks one at a time: plain runs broken by quoted texts, empty
    chunks, the empty-text chunk, a split event, irregular gaps, the finish, usage and [DONE]."""
    import random

    rng = random.Random(7)
    texts = ["a", ' "q" ', "b\\\\", "", "c"]
    for _ in range(50):
        body = [chat({"role": "assistant", "content": ""}), chat({"content": "first"})]
        for _ in range(rng.randint(0, 40)):
            kind = rng.random()
            if kind < 0.05:
                body.append(b"")
            elif kind < 0.1:
                split = chat({"content": "split"})
                body += [split[:20], split[20:]]
            else:
                body.append(chat({"content": rng.choice(texts)}))
        body += [chat({}, "length"), chat(None, usage={"prompt_tokens": 3, "completion_tokens": 9}), b"data: [DONE]\n\n"]
        times = [0.0]
        for _ in body[1:]:
            times.append(times[-1] + rng.choice([0.001, 0.5, 0.002, 1.25]))
        one, batch = StreamReader(), StreamReader()
        for chunk, ts in zip(body, times):
            if chunk:
                one.feed(chunk, ts)
        batch.feed(body[0], times[0])
        batch.feed(body[1], times[1])
        assert batch.feed_batch(body[2:], times[2:]) is None
        assert batch.summary() == one.summary()
        assert (batch.done, batch.malformed, batch.prompt_tokens) == (one.done, one.malformed, one.prompt_tokens)

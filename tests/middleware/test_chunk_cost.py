"""What a streamed chunk costs the engine middleware, in instructions under callgrind (issue 39).

A figure the machine's load does not move: bench/asgi_instructions.py --per-chunk runs
bench_asgi.py's Starlette app in-process under valgrind, bare and with ``EngineMiddleware``, with
30 and with 130 content chunks per response, and takes what hopline adds per content chunk (the
send wrapper on the request path and the emitter worker's exact reading of the kept chunks). It
was 6.6k before issue 39 and is 4.6-5.0k since (bench/README.md, "asgi: a streamed chunk"); the
bound leaves a quarter of margin and fails on the code before.
"""

from __future__ import annotations

from support.callgrind import bench_figures

MAX_PER_CHUNK = 6_000


def test_a_streamed_chunk_costs_under_six_thousand_instructions():
    figures = bench_figures("asgi_instructions.py", "--per-chunk")
    # the bare app's own cost per chunk (Starlette + the fake server): a sanity check of the harness
    assert 4_000 < figures["bare_per_chunk"] < 20_000, figures
    assert 0 < figures["hopline_adds_per_chunk"] <= MAX_PER_CHUNK, figures


def test_the_batch_run_reads_bytearray_chunks_as_it_reads_bytes():
    """The plain-chunk run tells a match by identity (``removesuffix`` returns the same bytes object
    when the tail is absent); a bytearray's ``removesuffix`` always copies, so such chunks must
    leave the run and be read exactly, with the same counts, finish and usage as bytes."""
    import orjson

    from hopline.middleware.sse import _DONE_EVENT as DONE, StreamReader

    def chunk(delta, finish=None):
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return b"data: " + orjson.dumps({"id": "c", "choices": [choice]}) + b"\n\n"

    usage = b"data: " + orjson.dumps({"id": "c", "choices": [], "usage": {"completion_tokens": 7}}) + b"\n\n"
    split = chunk({"content": "no tail here"})
    cut = split.index(b"no tail") + 2  # inside the text: the first part has the head and no quote after it
    rest = [chunk({"content": "b"}), split[:cut], split[cut:], chunk({"content": ""})]
    rest += [chunk({"content": 'q "x"'}), chunk({"content": "c"}), chunk({}, "stop"), usage, DONE]
    summaries = []
    for kind in (bytes, bytearray):
        reader = StreamReader()
        reader.feed(chunk({"role": "assistant", "content": ""}), 0.0)
        reader.feed(chunk({"content": "a"}), 1.0)
        assert reader.feed_batch([kind(c) for c in rest], [2.0 + i for i in range(len(rest))]) is None
        summaries.append(reader.summary())
    assert summaries[0] == summaries[1]
    # the split event counts when its second part came (4.0): the largest gap is b (2.0) -> it
    first = summaries[0]
    assert (first["output_chunks"], first["max_gap_s"], first["max_gap_at"]) == (5, 2.0, 2.0)
    assert (first["finish_reason"], first["output_tokens"]) == ("stop", 7)

"""One streaming chat completion against a real OpenAI-compatible server, read chunk by chunk."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from hopline.middleware.contract import normalize_request_id


def chat_stream(client: httpx.Client, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST ``body`` to ``url`` and read its SSE stream: ``request_id`` (the engine's chunk ID,
    normalized; one for the whole stream), ``usage`` (the last usage seen, required) and the
    parsed ``chunks``; an error event in the stream fails."""
    ids, usage, chunks = set(), None, []
    with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200, response.read()
        data = (line[6:] for line in response.iter_lines() if line.startswith("data: "))
        for chunk in (orjson.loads(raw) for raw in data if raw != "[DONE]"):
            assert "error" not in chunk, chunk
            ids.add(chunk["id"])
            usage = chunk.get("usage") or usage
            chunks.append(chunk)
    assert len(ids) == 1 and usage is not None, (ids, usage)
    return {"request_id": normalize_request_id(ids.pop()), "usage": usage, "chunks": chunks}

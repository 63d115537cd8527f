"""The shared vocabulary: what every part of hopline agrees on, apart from the code that runs
inside a user's process.

- ``events``: the hop event contract (fields, hops, validation, request IDs). Its names are
  re-exported here, so ``hopline.middleware.contract`` is the contract's import path.
- ``rules``: the stage table (data) and its evaluators, outcomes, scopes, the stage vocabulary.
- ``spans``: OTLP span → hop event mapping; ``records``: engine-record readers;
  ``trace_export``: timelines → OTLP spans.
- ``kv``: KV-cache arithmetic; ``times`` and ``durations``: parsing of instants and durations.
- ``errors``: ``HoplineError``, the base of every error hopline raises for a caller to catch.
- ``docs``: docs/contract.md, generated from the above.

Nothing here imports the host-side modules (client, gateway, engine, emit, sinks).
"""

from hopline.middleware.contract.events import *  # noqa: F403  (the contract's public names)

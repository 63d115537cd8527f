"""Helpers every test folder shares, written once (tests/conftest.py puts tests/ on ``sys.path``).

* ``servers``: a real uvicorn server in a thread on a free 127.0.0.1 port (optionally TLS), free
  ports, ``wait_until``, an environment without ``HOPLINE_*``;
* ``events``: hop-event builders (one argument order: hop, request ID, time), NDJSON, in-memory
  emitters and what they caught;
* ``collector``: a real collector on uvicorn, and the events its store holds;
* ``golden``: the golden fixture (events in, stages out);
* ``fakes``: an OpenAI-compatible engine and a gateway, for the middleware tests;
* ``demo``: ``hopline demo`` in a child process and the processes it left;
* ``synth``: the event generator with injected incidents (tests and bench only; not shipped).
"""

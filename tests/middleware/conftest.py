"""Fixtures of the middleware tests; the helpers themselves live once in tests/support/.

* ``tls``: a ``ServerTLS`` (trustme CA, certificate for 127.0.0.1, client SSL context);
* ``mw``: the shared helpers by name (``mw.running_server``, ``mw.fake_engine_app`` …), as the
  middleware tests have always called them.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from support import events, fakes, servers
from support.servers import ServerTLS, make_server_tls


@pytest.fixture(scope="session")
def tls() -> Iterator[ServerTLS]:
    with tempfile.TemporaryDirectory() as tmp:
        yield make_server_tls(Path(tmp))


@pytest.fixture(scope="session")
def mw() -> SimpleNamespace:
    """The shared helpers for test modules (a conftest is not imported by name: several may exist)."""
    return SimpleNamespace(
        running_server=servers.running_server,
        closed_port_url=servers.closed_port_url,
        memory_emitter=events.memory_emitter,
        events_of=events.events_of,
        wait_for=events.wait_for,
        hops_of=events.hops_of,
        one=events.one,
        fake_engine_app=fakes.fake_engine_app,
        fake_gateway_app=fakes.fake_gateway_app,
        PROMPT_TOKENS=fakes.PROMPT_TOKENS,
    )

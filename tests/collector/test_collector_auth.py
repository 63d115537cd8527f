"""Read endpoints can be protected; an empty token is refused at start (issue 10, items 9 and 10).

Before: with ``--token``, ``/metrics`` and ``/v1/requests/{id}`` (a request's service, model,
replica and timings) answered anyone; ``--token ""`` and ``HOPLINE_TOKEN=`` silently ran without auth.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from support.collector import serve
from support.events import event, ndjson
from support.servers import env_without_hopline
from hopline.collector.config import CollectorConfig

NDJSON = {"Content-Type": "application/x-ndjson"}
READS = ("/metrics", "/v1/requests/auth-1")


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def post_one(running, token: str | None) -> None:
    body = ndjson([event("client.sent", "auth-1", 1767225600.0, stream=True)])
    headers = {**NDJSON, **(bearer(token) if token else {})}
    assert running.client.post("/v1/events", content=body, headers=headers).status_code == 200


def test_the_token_protects_the_read_endpoints_and_healthz_stays_open(tmp_path):
    with serve(CollectorConfig(data_dir=tmp_path, token="w-token")) as c:
        post_one(c, "w-token")
        for path in READS:
            assert c.client.get(path).status_code == 401, path
            assert c.client.get(path, headers=bearer("wrong")).status_code == 401, path
            assert c.client.get(path, headers=bearer("w-token")).status_code == 200, path
        assert c.client.get("/healthz").status_code == 200


def test_a_read_token_opens_reads_but_not_writes(tmp_path):
    with serve(CollectorConfig(data_dir=tmp_path, token="w-token", read_token="r-token")) as c:
        post_one(c, "w-token")
        for path in READS:
            assert c.client.get(path, headers=bearer("r-token")).status_code == 200, path
            assert c.client.get(path, headers=bearer("w-token")).status_code == 200, path
            assert c.client.get(path).status_code == 401, path
        body = ndjson([event("client.sent", "auth-2", 1767225600.0, stream=True)])
        assert c.client.post("/v1/events", content=body, headers={**NDJSON, **bearer("r-token")}).status_code == 401


def test_open_reads_keeps_the_read_endpoints_open_with_a_token(tmp_path):
    with serve(CollectorConfig(data_dir=tmp_path, token="w-token", open_reads=True)) as c:
        post_one(c, "w-token")
        for path in READS:
            assert c.client.get(path).status_code == 200, path


@pytest.mark.parametrize("token", ["", "   "])
def test_an_empty_token_is_a_configuration_error(tmp_path, token):
    with pytest.raises(ValueError, match="token is empty"):
        CollectorConfig(data_dir=tmp_path, token=token)
    with pytest.raises(ValueError, match="read_token is empty"):
        CollectorConfig(data_dir=tmp_path, read_token=token)


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--token", ""], {}, "hopline collector: token is empty"),
        ([], {"HOPLINE_TOKEN": ""}, "hopline collector: HOPLINE_TOKEN is set but empty"),
        ([], {"HOPLINE_READ_TOKEN": ""}, "hopline collector: HOPLINE_READ_TOKEN is set but empty"),
    ],
)
def test_the_collector_refuses_to_start_with_an_empty_token(tmp_path, args, env, says):
    """One line on stderr, exit 2, and no server (before: it started without auth and ran on)."""
    proc = subprocess.run(
        [sys.executable, "-m", "hopline.collector", "--data-dir", str(tmp_path), "--port", "0", *args],
        env={**env_without_hopline(), **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith(says), proc.stderr

"""The watcher's server secured like the collector's (issue 34, item 6): ``--listen`` without a
host is loopback, ``--read-token`` (``HOPLINE_READ_TOKEN``) closes ``/v1/findings`` and
``/metrics``; the collector serves no ``/openapi.json`` while its reads need a token."""

from __future__ import annotations

import httpx
import pytest
from hopline.analyzer.live.cli import parse_listen
from hopline.analyzer.live.detector import LiveConfig, LiveDetector
from hopline.analyzer.live.server import FindingsApp
from hopline.analyzer.live.watch import Watch
from hopline.collector.config import CollectorConfig
from support.collector import serve
from support.servers import running_server

TOKEN = "s3cret-read"


def test_a_port_alone_listens_on_loopback_only():
    assert parse_listen(":9800") == ("127.0.0.1", 9800)
    assert parse_listen("0.0.0.0:9800") == ("0.0.0.0", 9800)  # every interface only when asked for


@pytest.mark.parametrize("path", ["/v1/findings", "/metrics"])
def test_the_read_token_closes_findings_and_metrics(path):
    app = FindingsApp(Watch(LiveDetector(LiveConfig())), read_token=TOKEN)
    with running_server(app) as url:
        assert httpx.get(url + path).status_code == 401
        wrong = httpx.get(url + path, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        assert httpx.get(url + path, headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
        ok = httpx.get(url + path, headers={"Authorization": f"Bearer {TOKEN}"})
        assert ok.status_code == 200 and ok.content


def test_without_a_token_the_endpoints_stay_open():
    with running_server(FindingsApp(Watch(LiveDetector(LiveConfig())))) as url:
        assert httpx.get(url + "/v1/findings").json()["findings"] == []


@pytest.mark.parametrize(("settings", "status"), [({"token": TOKEN}, 404), ({"read_token": TOKEN}, 404), ({}, 200)])
def test_the_collectors_openapi_is_closed_while_its_reads_need_a_token(tmp_path, settings, status):
    with serve(CollectorConfig(data_dir=tmp_path, **settings)) as running:
        assert running.client.get("/openapi.json").status_code == status

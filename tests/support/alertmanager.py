"""A real Alertmanager (Debian's prometheus-alertmanager) on 127.0.0.1 with a webhook receiver
that is a local HTTP server recording every notification: for the live alerting tests."""

from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from support.servers import free_port

ALERTMANAGER = "/usr/bin/prometheus-alertmanager"


class Webhook:
    """An HTTP server on 127.0.0.1 keeping every JSON body POSTed to it (Alertmanager's webhook
    notifications), in order, and when each arrived (``received``: wall-clock epoch seconds)."""

    def __init__(self) -> None:
        self.notifications: list[dict] = []
        self.received: list[float] = []  # one per notification, same order
        self.lock = threading.Lock()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with hook.lock:
                    hook.notifications.append(json.loads(body))
                    hook.received.append(time.time())
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def alerts(self, status: str | None = None) -> list[dict]:
        """Every alert of every notification so far (``status``: only firing / resolved ones)."""
        with self.lock:
            found = [a for n in self.notifications for a in n["alerts"]]
        return [a for a in found if status is None or a["status"] == status]

    def records(self) -> list[dict]:
        """Every notification so far with its arrival: ``{"received": epoch seconds, "body": …}``."""
        with self.lock:
            return [
                {"received": t, "body": n} for t, n in zip(self.received, self.notifications, strict=True)
            ]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Alertmanager:
    """One Alertmanager process: short group_wait / group_interval, one webhook receiver that sends
    resolved alerts too; ``stop`` and ``start`` again on the same port and storage."""

    def __init__(self, tmp_path: Path, webhook_url: str, resolve_timeout: str = "5m") -> None:
        self.config = tmp_path / "alertmanager.yml"
        self.config.write_text(
            f"global: {{resolve_timeout: {resolve_timeout}}}\n"
            "route:\n"
            "  receiver: hook\n"
            "  group_by: [alertname, stage, pitfall, replica, service, model]\n"
            "  group_wait: 1s\n"
            "  group_interval: 1s\n"
            "  repeat_interval: 1h\n"
            "receivers:\n"
            "  - name: hook\n"
            f"    webhook_configs: [{{url: '{webhook_url}', send_resolved: true}}]\n"
        )
        self.storage = tmp_path / "alertmanager-data"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                ALERTMANAGER,
                f"--config.file={self.config}",
                f"--storage.path={self.storage}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",  # no gossip port: one Alertmanager
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, "alertmanager exited"
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return
            assert time.monotonic() < deadline, "alertmanager not ready"
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=15)

    def alerts(self) -> list[dict]:
        """What Alertmanager holds now (its own API)."""
        return httpx.get(self.url + "/api/v2/alerts", timeout=5).json()


@contextlib.contextmanager
def alertmanager_with_webhook(tmp_path: Path, **kw: str) -> Iterator[tuple[Alertmanager, Webhook]]:
    webhook = Webhook()
    am = Alertmanager(tmp_path, webhook.url, **kw)
    try:
        am.start()
        yield am, webhook
    finally:
        am.stop()
        webhook.close()

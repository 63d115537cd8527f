"""``hopline poll-trtllm``: save trtllm-serve's per-request records with the clock offset they lack.

Runs on the engine's host. ``GET /perf_metrics`` returns and drains the records of the requests
finished since the last call (``return_perf_metrics: true``, ``perf_metrics_max_requests: N`` in
the LLM API options); their times are the engine's steady clock, so each record is saved with
``hopline_clock_offset_s`` = this host's wall clock minus its monotonic clock (the same clock on
Linux), which the ``tensorrt-llm`` row of ``contract/records.py`` adds to every time. Feed the file
to ``hopline analyze`` or the collector's ``--tail``.

Before this was a command it was ``python -m hopline.middleware.contract.records poll-trtllm``;
that spelling still runs this command.
"""

from __future__ import annotations

import time

import orjson
import typer

from hopline.middleware.exits import ClickException, UsageError

EXAMPLE = "Example: hopline poll-trtllm http://127.0.0.1:8000 --out /var/log/hopline/trt.ndjson"


def poll_trtllm(url: str, out_path: str, *, interval_s: float = 5.0, rounds: int | None = None) -> int:
    """Fetch ``URL/perf_metrics`` every ``interval_s`` (it drains on read) and append each record,
    with ``hopline_clock_offset_s``, as one NDJSON line to ``out_path``; returns records saved.

    ``rounds`` None polls until interrupted. An HTTP or connection error is raised (``httpx``'s).
    """
    import httpx

    saved = 0
    done = 0
    with httpx.Client(timeout=10) as client, open(out_path, "ab") as out:
        while rounds is None or done < rounds:
            done += 1
            records = client.get(url.rstrip("/") + "/perf_metrics").raise_for_status().json()
            offset = time.time() - time.monotonic()
            for record in records if isinstance(records, list) else ():
                if isinstance(record, dict):
                    out.write(orjson.dumps({**record, "hopline_clock_offset_s": offset}) + b"\n")
                    saved += 1
            out.flush()
            if rounds is None or done < rounds:
                time.sleep(interval_s)
    return saved


def poll_trtllm_command(
    url: str = typer.Argument(..., help="trtllm-serve's base URL (its /perf_metrics is polled)."),
    out: str = typer.Option(..., "--out", help="NDJSON file to append to (feed it to --tail or analyze)."),
    interval: float = typer.Option(5.0, "--interval", help="Seconds between polls."),
) -> None:
    """Save trtllm-serve's per-request records (/perf_metrics) for hopline, with this host's clock offset.

    Run it on the engine's host until interrupted; the records are appended to --out.
    """
    import httpx

    if not interval > 0:
        raise UsageError(f"--interval must be a positive number of seconds, got {interval}")
    try:
        poll_trtllm(url, out, interval_s=interval)
    except KeyboardInterrupt:
        return
    except OSError as exc:
        raise ClickException(f"cannot write {out}: {exc.strerror or exc}") from exc
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: an answer that is not JSON
        raise ClickException(f"{url.rstrip('/')}/perf_metrics: {exc}") from exc


def register(app: typer.Typer) -> None:
    """Add ``hopline poll-trtllm`` to the ``hopline`` command."""
    app.command(name="poll-trtllm", help=(poll_trtllm_command.__doc__ or "") + "\n\n" + EXAMPLE)(
        poll_trtllm_command
    )

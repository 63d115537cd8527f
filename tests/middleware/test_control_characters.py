"""Control characters (ESC, CR, NUL, C1) never reach a terminal or an alert label (issue 34,
item 5): the contract refuses them in every known string attribute, at the collector and in
every reader (``hopline analyze``, ``hopline watch``), keeping the valid lines; a value of an
attribute the contract does not know (``--by tenant``) is escaped wherever it is shown."""

from __future__ import annotations

import json

import pytest
from hopline.analyzer.io import ScanReport, parse_ndjson
from hopline.middleware.contract.events import EventError, printable, validate_event
from support.cli import hopline
from support.synth import StageShift, generate, write_ndjson

FORGED = "r2\x1b[2K\r[2026-01-05T10:06:40Z +0s since onset] FIRING HoplineShift{severity=critical}"


@pytest.mark.parametrize("field", ["service", "replica", "model", "route", "region", "finish_reason"])
@pytest.mark.parametrize("char", ["\x1b", "\r", "\x00", "\x7f", "\x9b"])
def test_the_contract_refuses_a_control_character_in_a_known_string(field, char):
    event = {"ts": 1.0, "request_id": "a", "hop": "client.sent", field: f"x{char}y"}
    with pytest.raises(EventError, match=f"{field} must not hold control characters"):
        validate_event(event)


def test_unicode_text_without_control_characters_is_kept():
    assert validate_event({"ts": 1.0, "request_id": "a", "hop": "client.sent", "service": "kite-chat 東京 ✓"})


def test_printable_escapes_every_control_character_and_nothing_else():
    assert printable(FORGED).count("\\x1b") == 1 and "\r" not in printable(FORGED) and "\x1b" not in printable(FORGED)
    assert printable("kite-chat 東京") == "kite-chat 東京"


def test_a_reader_reports_the_forged_line_and_keeps_the_valid_ones():
    lines = [
        {"ts": 1.0, "request_id": "ok-1", "hop": "client.sent", "service": "chat"},
        {"ts": 1.0, "request_id": "bad-1", "hop": "client.sent", "replica": FORGED},
        {"ts": 2.0, "request_id": "ok-1", "hop": "client.first_token"},
    ]
    report = ScanReport()
    frame = parse_ndjson(b"".join(json.dumps(e).encode() + b"\n" for e in lines), "log.ndjson", report)
    assert frame["request_id"].to_list() == ["ok-1", "ok-1"]
    assert report.bad_lines == 1


def test_an_unknown_attributes_control_characters_are_escaped_in_analyze_output(tmp_path):
    """``--by tenant`` reads an attribute the contract does not know; its value is shown escaped."""
    import polars as pl

    events = generate(duration_s=300, rate=20, seed=3, incidents=[StageShift("queue", 4.0, 150, {"replica": "r2"})])
    tenant = pl.when(pl.col("request_id").hash() % 2 == 0).then(pl.lit("acme\x1b[31m\r")).otherwise(pl.lit("other"))
    sent = pl.col("hop") == "client.sent"
    events = events.with_columns(attrs=pl.when(sent).then(pl.format('{{"tenant": {}}}', tenant.map_elements(json.dumps, return_dtype=pl.String))))
    path = tmp_path / "events.ndjson"
    with path.open("wb") as out:
        for row in events.iter_rows(named=True):
            extra = json.loads(row.pop("attrs")) if row.get("attrs") else {}
            out.write(json.dumps({k: v for k, v in row.items() if v is not None} | extra).encode() + b"\n")
    run = hopline("analyze", str(path), "--by", "tenant", timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "\x1b[31m" not in run.stdout and "\r" not in run.stdout
    assert "acme\\x1b[31m\\x0d" in run.stdout, run.stdout[-3000:]  # the value, shown escaped
    assert "queue" in run.stdout


def test_the_checked_strings_and_shapes_remembered_for_speed_do_not_let_a_bad_value_through():
    """validate_event remembers strings it checked and the attribute plan of each field order
    (issue 39): a string passed as an attribute (no length limit there) is still too long for a
    scope field, and a shape seen valid still checks each value's type, bound and characters."""
    long = "x" * 300
    base = {"ts": 1.0, "request_id": "a", "hop": "client.sent"}
    assert validate_event({**base, "route": long})["route"] == long
    with pytest.raises(EventError, match="service must be a string of at most 256 characters"):
        validate_event({**base, "service": long})
    assert validate_event({**base, "service": "svc", "route": "r", "stream": True, "n": 1})
    for field, value, message in [
        ("route", "r\x1b", "route must not hold control characters"),
        ("stream", 1, "stream must be bool"),
        ("n", True, "n must be int"),
        ("n", 2**64, "n must be an integer that fits in 64 bits"),
    ]:
        event = {**base, "service": "svc", "route": "r", "stream": True, "n": 1, field: value}
        with pytest.raises(EventError, match=message):
            validate_event(event)

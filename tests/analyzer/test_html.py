"""The HTML report: one self-contained file whose plots really render, offline, in headless Chromium.

The report's input is the real pipeline: synthetic events with an injected incident, written to
Parquet, scanned, turned into timelines and analysed.
"""

from __future__ import annotations

import html
import json
import re
import struct
import subprocess
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hopline.analyzer.html import STAGE_COLOURS, choose_window, render_html
from hopline.analyzer.io import scan_events
from hopline.analyzer.findings import Findings, Pitfall, Shift
from hopline.analyzer.pipeline import analysis
from hopline.analyzer.report import Analysis, Facts
from hopline.analyzer.timelines import timelines
from support import synth
from support.synth import StageShift

CHROMIUM = "/usr/bin/chromium"
WIDTH, HEIGHT = 1400, 2600
FACTS = Facts(requests=1)


def shift(**kw) -> Shift:
    """A shift finding with plausible numbers; ``kw`` sets what a test is about."""
    base = {"summary": "queue moved", "stage": "queue", "scope": {"replica": "r2"}, "at": 1.7e9,
            "statistic": "p50", "before_ms": 40.0, "after_ms": 120.0, "z": 9.0, "affected_requests": 100,
            "impact_s": 8.0, "factor": 3.0}  # fmt: skip
    return Shift(**{**base, **kw})


HOSTILE = Analysis(
    Findings(findings=(
        Pitfall(name="no_max_tokens", summary="<script>alert(1)</script> set no max_tokens", scope={},
                affected_requests=1, evidence={"share": 1.0}, impact_s=0.0, spent_in="decode"),
    )),
    FACTS,
)  # fmt: skip


def read_png(path: Path) -> np.ndarray:
    """Decode an 8-bit RGB/RGBA PNG (what Chromium writes) to an (h, w, channels) array.

    Rows filtered with None/Sub/Up are undone with numpy; Average and Paeth need the pixel to
    the left, so those rows are undone byte by byte.
    """
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, [], None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    stride = width * bpp
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8).reshape(height, stride + 1)
    out = np.zeros((height, stride), dtype=np.uint8)
    prev = np.zeros(stride, dtype=np.uint8)
    for y in range(height):
        kind, line = raw[y, 0], raw[y, 1:]
        if kind == 0:
            row = line.copy()
        elif kind == 1:
            row = (
                (np.cumsum(line.reshape(width, bpp), axis=0, dtype=np.uint64) % 256).astype(np.uint8).ravel()
            )
        elif kind == 2:
            row = line + prev
        else:
            cur, up, filt = bytearray(stride), prev.tobytes(), line.tobytes()
            for i in range(stride):
                a = cur[i - bpp] if i >= bpp else 0
                b = up[i]
                if kind == 3:
                    pred = (a + b) // 2
                else:
                    c = up[i - bpp] if i >= bpp else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                cur[i] = (filt[i] + pred) & 0xFF
            row = np.frombuffer(bytes(cur), dtype=np.uint8)
        out[y] = row
        prev = row
    return out.reshape(height, width, bpp)[:, :, :3]


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}", "--virtual-time-budget=5000", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.fixture(scope="module")
def frame(tmp_path_factory) -> pl.DataFrame:
    """3,000 synthetic requests over two replicas (client, gateway, engine, skewed clocks) whose
    queue on r2 triples 90 s in, written to Parquet and read back with scan_events."""
    events = synth.generate(
        n_requests=3000, seed=3, incidents=[StageShift("queue", 3.0, at_s=90, scope={"replica": "r2"})]
    )
    path = tmp_path_factory.mktemp("events") / "events.parquet"
    events.write_parquet(path)
    scanned, _ = scan_events([path])
    return timelines(scanned).collect()


@pytest.fixture(scope="module")
def analysed(frame: pl.DataFrame) -> Analysis:
    return analysis(frame)


@pytest.fixture(scope="module")
def findings(analysed: Analysis) -> dict:
    return analysed.to_json()


@pytest.fixture(scope="module")
def report(frame: pl.DataFrame, analysed: Analysis, tmp_path_factory) -> Path:
    return render_html(analysed, frame, tmp_path_factory.mktemp("report") / "report.html")


def test_report_is_one_self_contained_file(report: Path) -> None:
    assert report.stat().st_size <= 1.5e6, report.stat().st_size  # plotly.js's basic bundle, once
    text = report.read_text()
    assert not re.search(r"<script[^>]+src=", text)  # plotly.js inlined, nothing fetched
    assert not re.search(r"<link[^>]+href=", text)
    assert len(re.findall(r"\* plotly\.js \(basic - minified\) v", text)) == 1
    assert text.count('class="plotly-graph-div"') == 4


def test_report_shows_the_findings_with_their_evidence(report: Path, findings: dict) -> None:
    text = report.read_text()
    shifts = [f for f in findings["findings"] if f["kind"] == "shift"]
    # the injected incident is found (the analyzer's job) and shown with its numbers (this one's)
    assert any(f["stage"] == "queue" and f["scope"] == {"replica": "r2"} for f in shifts)
    for f in shifts:
        assert html.escape(f["summary"]) in text
    # evidence in words and rounded numbers, never the JSON's keys or raw structures
    queue = next(f for f in shifts if f["stage"] == "queue")
    before, after = round(queue["before_ms"], 1), round(queue["after_ms"])
    assert f"<th>p50 before → after</th><td>{before:,.3g} ms → {after:,} ms</td>" in text
    assert "<th>where</th><td>replica r2</td>" in text
    findings_part = text[text.index('<ol class="findings">') : text.index("</ol>")]
    for raw in ("before_ms", "impact_s", "<th>z</th>", "context", "{", "}"):
        assert raw not in findings_part, raw
    assert "<th>p50 ms</th>" in text and "<th>queue</th>" in text  # the stage table


def test_findings_text_is_escaped(frame: pl.DataFrame, tmp_path: Path) -> None:
    text = render_html(HOSTILE, frame, tmp_path / "hostile.html").read_text()
    assert "<script>alert(1)</script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text


MINOR = Analysis(
    Findings(
        findings=(shift(summary="queue time tripled"),),
        minor=(
            Pitfall(name="new_connection_per_request", scope={}, affected_requests=9,
                    summary="clients open a new connection for 100% of requests, adding 0 ms", evidence={},
                    impact_s=0.001, spent_in="connect", share_of_users_time=0.0001),
        ),
    ),
    FACTS,
)  # fmt: skip


def test_minor_findings_are_one_line_or_listed_with_all(frame: pl.DataFrame, tmp_path: Path) -> None:
    text = render_html(MINOR, frame, tmp_path / "minor.html", command="hopline analyze logs/").read_text()
    assert "1 minor finding (each under 1% of users&#x27; time), see `hopline analyze logs/ --all`" in text
    assert "adding 0 ms" not in text and "queue time tripled" in text
    listed = render_html(MINOR, frame, tmp_path / "all.html", show_minor=True).read_text()
    assert '<ol class="findings minor" start="2">' in listed and "adding 0 ms" in listed
    assert "--all`" not in listed


def test_plots_render_in_headless_chromium(report: Path, tmp_path: Path) -> None:
    dom = chromium("--dump-dom", report.as_uri(), profile=tmp_path / "dom-profile")
    assert dom.returncode == 0, dom.stderr[-2000:]
    # plotly draws two <svg class="main-svg"> layers per plot, and one bar path per drawn bar
    assert dom.stdout.count('class="main-svg"') >= 8
    assert len(re.findall(r'<g class="point">', dom.stdout)) > 100

    shot = tmp_path / "report.png"
    run = chromium(f"--screenshot={shot}", report.as_uri(), profile=tmp_path / "shot-profile")
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    pixels = read_png(shot)
    assert pixels.shape == (HEIGHT, WIDTH, 3)
    flat = pixels.reshape(-1, 3)
    non_white = int((flat.min(axis=1) < 235).sum())
    assert non_white > 0.05 * len(flat), non_white  # a blank page with text is ~2%
    colours = Counter(map(bytes, flat[::7]))
    assert len(colours) > 200
    # the stage colours fill bars: queue red and prefill green cover thousands of pixels each
    for stage in ("queue", "prefill"):
        rgb = bytes.fromhex(STAGE_COLOURS[stage][1:])
        assert int((flat == np.frombuffer(rgb, dtype=np.uint8)).all(axis=1).sum()) > 5000, stage


def test_empty_timelines_still_write_a_report(tmp_path: Path) -> None:
    frame, _ = scan_events([])
    path = render_html(Analysis(Findings(), Facts.EMPTY), timelines(frame).collect(),
                       tmp_path / "empty.html")  # fmt: skip
    text = path.read_text()
    assert "No requests in the input." in text and "No findings" in text


@pytest.mark.parametrize(("span", "window"), [(30, 1), (61, 2), (600, 10), (3600, 60), (14 * 3600, 900)])
def test_window_adapts_to_the_span(span: float, window: int) -> None:
    assert choose_window(span) == window


def test_kv_chart_when_bytes_per_token_are_known(frame: pl.DataFrame, tmp_path: Path) -> None:
    with_kv = render_html(
        Analysis(Findings(), Facts.EMPTY), frame, tmp_path / "kv.html", kv_bytes_per_token=98_304
    ).read_text()
    assert with_kv.count('class="plotly-graph-div"') == 5 and "KV cache in flight per replica" in with_kv


def test_bundled_plotly_js_is_the_version_plotly_writes_for() -> None:
    """The inlined basic bundle must match the plotly.js the Python package targets."""
    import plotly

    from hopline.analyzer.html import PLOTLY_JS

    bundled = re.search(r"plotly\.js \(basic - minified\) v(\d+\.\d+)", PLOTLY_JS.read_text()[:400]).group(1)
    full = (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_text()[:200]
    assert re.search(r"plotly\.js v(\d+\.\d+)", full).group(1) == bundled


MEASURE = """<script>
window.addEventListener("load", () => setTimeout(() => {
  const out = [];
  document.querySelectorAll(".plotly-graph-div").forEach((plot, i) => {
    plot.querySelectorAll("g.annotation").forEach((a) => {
      const r = a.getBoundingClientRect();
      out.push([i, r.left, r.top, r.right, r.bottom, a.textContent]);
    });
  });
  const pre = document.createElement("pre"); pre.id = "boxes"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 300));
</script>"""


def test_shift_labels_never_overlap_in_chromium(frame: pl.DataFrame, tmp_path: Path) -> None:
    """Six shifts, some seconds apart: on every chart, no two marker labels' boxes intersect
    (measured by the browser on a copy of the report with a measuring script appended)."""
    at = [90, 92, 95, 97, 150, 151]
    stages = ["queue", "prefill", "network", "decode", "gateway", "frontend"]
    shifts = tuple(
        shift(summary=f"{s} moved", stage=s, factor=2.5, at=float(int(frame["start"].min() + t)))
        for s, t in zip(stages, at, strict=True)
    )
    marked = Analysis(Findings(findings=shifts), Facts(requests=frame.height))
    page = render_html(marked, frame, tmp_path / "marks.html")
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    dom = chromium("--dump-dom", probe.as_uri(), profile=tmp_path / "probe-profile")
    assert dom.returncode == 0, dom.stderr[-2000:]
    boxes = json.loads(html.unescape(re.search(r'<pre id="boxes">(.*?)</pre>', dom.stdout, re.S).group(1)))
    by_plot: dict[int, list] = {}
    for plot, *box, text in boxes:
        by_plot.setdefault(plot, []).append((box, text))
    assert len(by_plot) == 2 and all(len(v) == 6 for v in by_plot.values())  # both time charts
    for labels in by_plot.values():
        for i, ((l1, t1, r1, b1), a) in enumerate(labels):
            assert r1 - l1 > 10  # drawn, with a width
            for (l2, t2, r2, b2), b in labels[i + 1 :]:
                assert r1 <= l2 or r2 <= l1 or b1 <= t2 or b2 <= t1, (a, b)


def test_slowest_requests_show_their_full_ids_to_copy(
    frame: pl.DataFrame, analysed: Analysis, tmp_path: Path
) -> None:
    """Issue 24: the chart's labels cut request IDs to 18 characters and the full ID was nowhere in
    the file, so ``hopline timeline <what the report showed>`` answered "not found". Each of the
    slowest requests' full ID (32 characters here) is in a table cell, one click selects it, its
    title is the timeline command, and the chart's hover names it too."""
    long_ids = frame.with_columns(request_id=pl.format("{}-4f1c2a9e8b7d4c3a9e8b7d4c", "request_id"))
    text = render_html(analysed, long_ids, tmp_path / "ids.html").read_text()
    slowest = long_ids.top_k(12, by=pl.coalesce("client_ttft", "gateway_ttft", "engine_ttft"))["request_id"]
    assert len(slowest) == 12 and min(map(len, slowest)) > 18
    table = text[text.index('<table class="slowest">') :]
    cells = re.findall(r'<code class="rid" title="hopline timeline ([^" ]+) PATH">([^<]+)</code>', table)
    assert [rid for rid, _ in cells] == [shown for _, shown in cells] == slowest.to_list()  # slowest first
    assert "code.rid { user-select: all;" in text
    plot = text[text.index("<h2>Slowest requests</h2>") : text.index('<table class="slowest">')]
    hovered = set(re.findall(r'\[[0-9.e+-]+,"([^"]+-4f1c2a9e8b7d4c3a9e8b7d4c)"\]', plot))
    assert hovered == set(slowest), hovered


def test_arrivals_are_per_second_in_the_finding_detail(report: Path, findings: dict) -> None:
    """Issue 24: the shift's detail showed arrivals per second in seconds ("arrivals/s 9.95 s →
    9.08 s"). They read "arrivals 9.71/s → 10.3/s", as the terminal writes them; durations keep " s"."""
    text = report.read_text()
    queue = next(f for f in findings["findings"] if f["kind"] == "shift" and f["stage"] == "queue")
    before, after = queue["context"]["before"]["arrivals_per_s"], queue["context"]["after"]["arrivals_per_s"]
    assert f"<th>arrivals</th><td>{before:,.3g}/s → {after:,.3g}/s</td>" in text
    assert not re.search(r"arrivals[^<]*</th><td>[0-9.,]+ s ", text)

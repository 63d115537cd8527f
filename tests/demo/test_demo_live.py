"""``hopline demo`` answers live: the demo's watch (``hopline watch --follow`` on the collector's
store) is started with the analysis window ``hopline analyze`` picks, and the closing lines say
what fired. (The end-to-end run of the demo against a real Alertmanager is not here: its resolved
notification did not arrive in the last run, see the closing note of 2026-12-03.)
"""

from __future__ import annotations

from hopline.demo.live import watch_argv


def test_the_demos_watch_uses_the_window_hopline_analyze_chooses_and_holds_the_whole_run(tmp_path):
    argv = watch_argv(tmp_path, 60, ["http://am1:9093", "http://am2:9093"])
    assert argv[argv.index("-m") + 2] == "hopline.analyzer.live"  # hopline watch, via the demo's launcher
    args = dict(zip(argv, argv[1:], strict=False))
    assert args["--window"] == "1s"  # hopline analyze's auto window for a 70 s log (≤ 200 windows)
    assert float(args["--horizon"].rstrip("s")) >= 2 * 70  # the whole run, before and after
    assert argv.count("--alertmanager") == 2 and argv[-1] == "http://am2:9093"
    assert args["--follow"] == str(tmp_path / "events")  # the collector's store, not the demo's own files


def test_the_closing_lines_say_what_fired_live_after_any_busy_machine_warning():
    from hopline.demo.cli import closing_lines
    from hopline.demo.orchestrate import TRUSTED_LAG_MS, DemoRun

    alert = {"labels": {"alertname": "HoplineShift", "stage": "queue", "replica": "r2"},
             "annotations": {"summary": "queue time tripled at 10:06 on replica r2"}}  # fmt: skip
    fired = ({"seconds_since_onset": 12.0, "alert": alert},
             {"seconds_since_onset": 30.0, "alert": alert | {"endsAt": "2026-01-05T10:07:00Z"}})  # fmt: skip
    lines = closing_lines(DemoRun({}, None, TRUSTED_LAG_MS * 4, None, live_alerts=fired), html=None)
    assert "too busy to trust the timings" in lines[0]
    assert lines[1] == "live: 1 alert fired while it ran, the first 12 s after its onset: queue time tripled at 10:06 on replica r2"
    quiet = closing_lines(DemoRun({}, None, 3.0, None), html=None)
    assert quiet[0] == "live: no alert fired while it ran"

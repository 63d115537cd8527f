"""clock.now(): the wall clock read once, advanced by perf_counter, so NTP steps never show."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from hopline.middleware import clock


def test_now_is_anchored_to_the_wall_clock() -> None:
    # The anchor was the wall clock at import; with no NTP step since, both agree to well
    # under a second (the anchor's error is the gap between two clock reads).
    assert abs(clock.now() - time.time()) < 1.0


def test_now_ignores_a_wall_clock_step_after_import(monkeypatch) -> None:
    before = clock.now()
    # NTP steps the system clock forward an hour, then back a day.
    monkeypatch.setattr(time, "time", lambda: before + 3600.0)
    after_forward = clock.now()
    monkeypatch.setattr(time, "time", lambda: before - 86400.0)
    after_back = clock.now()
    assert before <= after_forward <= after_back < before + 60.0


def test_now_never_goes_backwards() -> None:
    readings = [clock.now() for _ in range(10_000)]
    assert all(b >= a for a, b in zip(readings, readings[1:]))


def test_from_perf_matches_now() -> None:
    perf = time.perf_counter()
    stamped = clock.from_perf(perf)
    assert stamped <= clock.now()
    assert abs(clock.from_perf(perf + 2.5) - stamped - 2.5) < 1e-6


def test_a_process_whose_clock_is_stepped_before_its_first_event_keeps_the_anchor() -> None:
    # A fresh interpreter: import hopline's clock, then the wall clock jumps by a day (as
    # time.time() sees it); events stamped afterwards still follow the anchor.
    script = textwrap.dedent(
        """
        import time
        from hopline.middleware import clock
        anchor = time.time()
        real = time.time
        time.time = lambda: real() + 86400.0
        stamped = clock.now()
        print(stamped - anchor)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    # the anchor may sit a few microseconds off time.time(); a day's step would show as 86400
    assert -0.01 < float(out.stdout) < 60.0

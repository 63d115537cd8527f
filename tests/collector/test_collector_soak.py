"""Memory levels off in a soak (issue 10, item 8): 2 minutes here, 10 in bench/bench_reliability.py.

Before: at 100 requests/s with 10% never completing, RSS rose 128 -> 183 MB in 5 minutes and was
still rising; nothing bounded the join's memory but a request count. Here every bound is set to
be reached within the warm-up, so what follows must be flat.
"""

from __future__ import annotations

from soak import run_soak

SOAK_S, WARMUP_S, TTL_S, RATE = 120.0, 45.0, 10, 100


def test_rss_is_flat_after_warmup_and_open_requests_are_bounded(tmp_path):
    report = run_soak(
        tmp_path / "data", SOAK_S, WARMUP_S, RATE,
        "--ttl", f"{TTL_S}s", "--finished-cache", "1000", "--recent-requests", "1000", "--dedup-capacity", "10000",
    )
    print(report.summary())
    assert set(report.statuses) == {200}
    assert report.requests >= RATE * SOAK_S * 0.5  # the load was really applied (noisy machine)
    # never-completing requests live one TTL, completed ones a grace period (2 s) and a sweep: about
    # 420 open at once; twice that allows for bursts after a stall of the shared machine, and is
    # still below the 1,200 that 120 s of never-expiring requests would reach
    bound = 2 * (RATE // 10 * (TTL_S + 2) + RATE * 3)
    assert max(report.after_warmup(report.open_requests)) <= bound, report.summary()
    assert report.rss_growth <= 1.10, report.summary()

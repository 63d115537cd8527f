"""Collector soak (issue 24 item 11): a real collector process with its default settings, 100
requests/s for 25 minutes, RSS sampled every 10 s.

    .venv/bin/python bench/bench_soak.py                      # 25 minutes, defaults
    .venv/bin/python bench/bench_soak.py --minutes 20 -- --ttl 60s   # extra collector options after --

Traffic is the CI soak's (``tests/collector/soak.py``): batches every 100 ms, 8-10 hops per request,
a tenth never completing (they expire after the TTL). With the defaults the bounded structures fill
at different times: finished-request LRU (10,000) after ~2 min, a dedup generation (500,000 events)
after ~9 min, never-completing requests reach their TTL (15 min: ~9,000 open) at 15 min, the
recent-request summaries (100,000) at ~17 min. RSS must level off once all are full: the figure is
the growth over the last 5 minutes against the RSS at their start.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "collector"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from soak import run_soak  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=25.0)
    parser.add_argument("--rate", type=int, default=100)
    parser.add_argument("--sample", type=float, default=10.0, help="seconds between RSS samples")
    parser.add_argument("options", nargs="*", help="extra collector options (after --)")
    args = parser.parse_args()
    seconds = args.minutes * 60
    tmp = Path(tempfile.mkdtemp(prefix="hopline-soak-"))
    report = run_soak(tmp / "data", seconds, seconds - 300, args.rate, *args.options, sample_s=args.sample)
    print(f"## soak: {args.rate} requests/s, 10% never complete, {args.minutes:.0f} min, options {args.options}")
    print(report.summary())
    print("t_s rss_mib open_requests")
    for (t, rss), (_, open_) in zip(report.rss, report.open_requests, strict=True):
        print(f"{t:6.0f} {rss / 2**20:7.1f} {open_:6d}")
    last = report.after_warmup(report.rss)
    print(
        f"last 5 min: RSS {last[0] / 2**20:.1f} -> {last[-1] / 2**20:.1f} MiB, max {max(last) / 2**20:.1f} MiB "
        f"(x{max(last) / last[0]:.3f} of the first sample); peak over the whole run {max(r for _, r in report.rss) / 2**20:.1f} MiB"
    )


if __name__ == "__main__":
    main()

"""hopline's ``gateway`` stage on LiteLLM's proxy against LiteLLM's own ``x-litellm-overhead-duration-ms``.

    python bench/bench_litellm.py [--requests 40]     # needs .ci/litellm-setup.sh's venv (.litellm/)

The real proxy (the tests' setup: tests/gateways/litellm_testing.py) in front of a fake engine
that answers at once; streaming and non-streaming requests alternate, through hopline's client.
Per request: ``gateway`` (LiteLLM's arrival stamp -> the upstream attempt, from hopline's events)
and LiteLLM's overhead header (its total time minus the provider call). Prints medians and the
per-request ratio gateway / overhead (median [min, max]).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gateways"))

from litellm_testing import running_proxy
from test_litellm import events_of, one, sdk

MESSAGES = [{"role": "user", "content": "hello"}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_proxy(Path(tmp)) as proxy,
        sdk(proxy, "bench") as client,
    ):
        for i in range(args.requests + 4):
            stream = i % 2 == 0
            raw = client.chat.completions.with_raw_response.create(
                model="tiny",
                messages=MESSAGES,
                max_tokens=4,
                stream=stream,
                **({"stream_options": {"include_usage": True}} if stream else {}),
            )
            list(raw.parse()) if stream else raw.parse()
            rid = raw.http_request.headers["x-request-id"]
            events = events_of(proxy, rid, {"gateway.last_token"})
            gateway_ms = (
                one(events, "gateway.forwarded")["ts"] - one(events, "gateway.received")["ts"]
            ) * 1000
            if i >= 4:  # the first requests warm LiteLLM's caches and connection pools
                rows.append((stream, gateway_ms, float(raw.headers["x-litellm-overhead-duration-ms"])))
    for label, keep in (("streaming", True), ("non-streaming", False), ("all", None)):
        chosen = [r for r in rows if keep is None or r[0] is keep]
        ratios = sorted(g / o for _, g, o in chosen)
        print(
            f"{label:14s} n={len(chosen):3d}"
            f"  gateway p50 {statistics.median(g for _, g, _ in chosen):7.2f} ms"
            f"  overhead p50 {statistics.median(o for _, _, o in chosen):7.2f} ms"
            f"  gateway/overhead {statistics.median(ratios):.2f} [{ratios[0]:.2f}, {ratios[-1]:.2f}]"
        )


if __name__ == "__main__":
    main()

"""Property-based fuzzing of ingest against a real collector (issue 10, "Measured").

2,000 hypothesis cases here (bench/bench_reliability.py --fuzz runs 10,000): 0 crashes, 0 5xx,
every valid line of a mixed batch stored exactly as validated, every rejection with a reason.
"""

from __future__ import annotations

from support.collector import serve, stored_lines
from hopline.collector.config import CollectorConfig
from ingest_fuzz import run_fuzz

CI_CASES = 2000


def test_fuzzed_batches_never_5xx_and_every_valid_line_is_stored(tmp_path):
    config = CollectorConfig(data_dir=tmp_path / "data", fsync="none", grace=0.0)
    with serve(config) as c:
        report = run_fuzz(c.url, CI_CASES)
        assert c.client.get("/healthz").status_code == 200
    assert report.cases == CI_CASES
    assert report.server_errors == []
    assert report.wrong_answers == []
    assert report.valid_lines > CI_CASES and report.invalid_lines > CI_CASES  # both kinds were exercised
    stored = {e["eid"]: e for e in stored_lines(config.data_dir)}
    missing = report.expected.keys() - stored.keys()
    assert not missing, f"{len(missing)} valid events not stored"
    differ = [eid for eid, ev in report.expected.items() if stored[eid] != ev]
    assert not differ, f"{len(differ)} stored events differ from what was validated, e.g. {differ[:3]}"

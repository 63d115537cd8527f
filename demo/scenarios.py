"""The demo's scenarios: steady traffic, one incident mid-run, and the finding that must name it.

Every scenario runs the same baseline (a chat service and a document-QA service at a steady
Poisson rate, spread over two replicas by conversation) and injects one thing at ``incident_at``
(a fraction of the run, late enough that the analyzer has a "before" to compare with, early
enough for an "after"). ``expect`` is the first finding the analyzer must report.

The sizes are meant to be realistic for an 8B model on one GPU, scaled in time: a batch job
that saturates one replica (its queue time goes from milliseconds to a second, steadily: a closed
loop of more workers than the replica has batch slots), a 4x prefill regression (a kernel
fallback), 15 ms more each way on one client's path, 14k-token prompts, a client opening a
connection per request, a client that sends no ``max_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from hopline.analyzer.live.alertmanager import scope_label
from hopline.analyzer.live.incidents import ALERTNAMES
from hopline.demo.gateway_app import home_replica
from hopline.demo.loadgen import Traffic

REPLICAS = ("r1", "r2")
INCIDENT_AT = 0.55
# Every scenario's engines stream 4 tokens per chunk (SGLang's --stream-interval 4): a quarter of
# the SSE events for the gateway and the clients to relay, parse and time, which is most of the
# demo's CPU. On a busy 2-core machine that is what keeps the load generator's and the gateway's
# event loops on time, so their lag does not pile up in every request's network time and outrank
# the incident (a user-vs-engine gap of the machine's making).
ENGINE: dict[str, Any] = {"stream_interval": 4}
# A client that always opened a connection per request, or never set max_tokens, runs from the
# start: were it to appear mid-run, the traffic it adds would itself be a shift (connect p90 of all
# traffic, say) whose cost to users is, rightly, at least the pitfall's, and would be reported first.


def pinned_user(prefix: str, replica: str) -> str:
    """A conversation key whose home replica (the gateway's rendezvous hash) is ``replica``."""
    return next(key for i in range(1000) if home_replica(key := f"{prefix}-{i}", list(REPLICAS)) == replica)


BASELINE: tuple[Traffic, ...] = (
    Traffic("kite-chat", rate=4.5, api_key="sk-demo-chat", users=30),
    Traffic(
        "kite-docs",
        rate=3.5,
        api_key="sk-demo-docs",
        users=20,
        system_tokens=1200,
        prompt_median_tokens=60,
        max_turns=2,
        max_tokens=300,
    ),
)


# A batch job pinned to r2 by its conversation key: non-streaming, short answers, a closed loop.
BATCH_EVAL = Traffic(
    "batch-eval",
    rate=0.0,
    concurrency=12,
    api_key="sk-demo-batch",
    pinned_user=pinned_user("batch-eval", "r2"),
    system_tokens=100,
    prompt_median_tokens=150,
    prompt_sigma=0.5,
    max_turns=1,
    max_tokens=128,
    stream=False,
)


@dataclass(frozen=True)
class Scenario:
    name: str
    injected: str  # one line for the terminal
    expect: dict[str, Any]  # the first finding's identifying fields
    background: tuple[Traffic, ...] = ()  # the scenario's own clients, all along
    incident_traffic: tuple[Traffic, ...] = ()  # clients that start at the incident
    via_proxy: frozenset[str] = frozenset()  # services whose traffic goes through the delay proxy
    proxy_delay_ms: float = 0.0
    engine: dict[str, Any] = field(default_factory=dict)  # EngineConfig overrides, both replicas
    engine_incident: dict[str, dict[str, Any]] = field(default_factory=dict)  # replica -> overrides
    incident_at: float = INCIDENT_AT
    # At most this long before the end (None: no limit). A saturated replica's queue wanders by
    # 1.5x and more from second to second; over a long incident the analyzer's change points
    # would follow those waves (each one a "shift") instead of the onset.
    incident_s: float | None = None
    # The shortest run whose incident can be told apart from noise: a shift needs ``min_side``
    # (50) requests of its scope on each side of the change, and its scope 100 to be searched on
    # its own. One replica of two gets ~4 requests/s of the baseline's 8, 45% of them after the
    # change: under ~30 s that side is too few (20 s runs found nothing); tests/demo runs the
    # shift scenarios at 36 s. A change plain in all traffic (slow-network: a service's network
    # x3) is confined to its service from fewer (``shifts.scopes.confine``).
    min_seconds: float = 20.0

    def engine_config(self) -> dict[str, Any]:
        """``EngineConfig`` overrides of both replicas: the demo's ``ENGINE``, then the scenario's."""
        return {**ENGINE, **self.engine}

    def starts_at(self, seconds: float) -> float:
        """When the incident begins, as a fraction of a run of ``seconds``."""
        if self.incident_s is None:
            return self.incident_at
        return max(self.incident_at, 1.0 - self.incident_s / seconds)

    def traffic(self, seconds: float) -> list[Traffic]:
        """Baseline and background (through the proxy where the scenario says so), then the incident's
        own clients."""
        start = self.starts_at(seconds)
        clients = [*BASELINE, *self.background, *(replace(t, start=start) for t in self.incident_traffic)]
        return [replace(t, via_proxy=t.service in self.via_proxy) for t in clients]

    def api_keys(self) -> dict[str, tuple[float, float]]:
        """Every client's key, with a rate limit well above what it sends (rate, burst)."""
        keys: dict[str, tuple[float, float]] = {}
        for t in self.traffic(seconds=1.0):
            rate, burst = keys.get(t.api_key, (0.0, 0.0))
            peak = 10 * t.rate + 20 * (t.concurrency or 0)
            keys[t.api_key] = (rate + peak, burst + max(20, peak))
        return keys


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            "queue-burst",
            "the batch job pinned to replica r2 (by its conversation key) goes from 12 to 32 workers",
            expect={"kind": "shift", "stage": "queue", "scope": {"replica": "r2"}},
            background=(BATCH_EVAL,),  # 12 workers from the start: within r2's capacity
            incident_traffic=(replace(BATCH_EVAL, concurrency=20),),  # then 20 more
            incident_s=16.0,
        ),
        Scenario(
            "prefill-regression",
            "replica r2's prefill becomes 4x slower per token (a kernel fallback after a deploy)",
            expect={"kind": "shift", "stage": "prefill", "scope": {"replica": "r2"}},
            engine_incident={"r2": {"prefill_per_token_s": 0.00016}},
            min_seconds=36.0,
        ),
        Scenario(
            "slow-network",
            "kite-chat's traffic is rerouted through another region: 15 ms more each way to the gateway",
            expect={"kind": "shift", "stage": "network", "scope": {"service": "kite-chat"}},
            via_proxy=frozenset({"kite-chat"}),
            proxy_delay_ms=15.0,
            incident_at=0.5,
            # kite-chat sends 4.5 requests/s: a 20 s run has ~45 of them after the onset, at the edge
            # of what tells a shift from noise (a 20 s run on a busy machine found nothing); 30 s ~70
            min_seconds=30.0,
        ),
        Scenario(
            "huge-prompt",
            "kite-rag starts sending 14k-token prompts; the engines run without chunked prefill",
            expect={"kind": "pitfall", "name": "long_prefill_stall"},
            engine={"chunked_prefill": False},
            incident_traffic=(
                Traffic(
                    "kite-rag",
                    rate=0.3,
                    api_key="sk-demo-rag",
                    users=30,
                    system_tokens=14000,
                    prompt_median_tokens=100,
                    max_turns=1,
                    max_tokens=256,
                ),
            ),
            # from the start, as below: a rare client (one prompt every ~3 s) needs the whole run
            # to send enough prompts for the finding (one came in the last seconds of one run)
            incident_at=0.0,
        ),
        Scenario(
            "cold-connections",
            "kite-cli, a command-line tool on laptops 12 ms away, opens a new TLS connection per request",
            expect={"kind": "pitfall", "name": "new_connection_per_request"},
            incident_traffic=(
                Traffic(
                    "kite-cli",
                    rate=2.5,
                    api_key="sk-demo-cli",
                    new_connection_per_request=True,
                    # it summarises files, 2k tokens each: a chance burst of them on one replica (a
                    # dozen in flight) stays well inside its KV cache (55k tokens); at 4k such a burst
                    # filled it and queued r2's requests for seconds, an incident of its own that
                    # outranked the pitfall (2 of 26 runs, seeds 1-26 at 25 s)
                    system_tokens=2000,
                    max_turns=1,
                ),
            ),
            via_proxy=frozenset({"kite-cli"}),
            proxy_delay_ms=12.0,
            incident_at=0.0,  # see the note at the top
        ),
        Scenario(
            "no-max-tokens",
            "kite-notebook sends its requests without max_tokens",
            expect={"kind": "pitfall", "name": "no_max_tokens"},
            incident_traffic=(
                # 6 requests/s: its answers are drawn as everyone's, so about a tenth of them run past
                # the capped requests' p90, and the finding needs 5 that did. At 4/s a 25 s run sent
                # ~107, 2% of such runs (a Poisson mean of 10.7) had 4 or fewer: one CI run found
                # nothing at all. At 6/s (~160, a mean of 16) 0.04% do.
                Traffic("kite-notebook", rate=6.0, api_key="sk-demo-notebook", max_tokens=None),
            ),
            incident_at=0.0,  # see the note at the top
        ),
    )
}
DEFAULT_SCENARIO = "queue-burst"


def matches(finding: dict[str, Any], expect: dict[str, Any]) -> bool:
    """Does ``finding`` carry every field of ``expect`` (scopes compared on the expected keys)?"""
    for key, value in expect.items():
        if key == "scope":
            scope = finding.get("scope") or {}
            if any(scope.get(k) != v for k, v in value.items()):
                return False
        elif finding.get(key) != value:
            return False
    return True


def alert_matches(alert: dict[str, Any], expect: dict[str, Any]) -> bool:
    """Does the live ``alert`` (Alertmanager's shape) say what ``expect`` says: its kind (the
    alertname), its stage or pitfall, and the expected scope among its labels?"""
    labels = alert["labels"]
    for key, value in expect.items():
        if key == "kind":
            ok = labels.get("alertname") == ALERTNAMES.get(value)
        elif key == "name":
            ok = labels.get("pitfall") == value
        elif key == "scope":
            ok = all(labels.get(scope_label(k)) == str(v) for k, v in value.items())
        else:
            ok = labels.get(key) == value
        if not ok:
            return False
    return True

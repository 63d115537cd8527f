"""``hopline demo`` end to end: start the stack, drive traffic, inject the incident, stop, analyse.

The stack, on 127.0.0.1 and ports the OS picks, each component a child process the demo owns
(``process.Child``: own process group, SIGTERM on the demo's death, stopped in order):

    load generator (this process, OpenAI SDK + hopline client transport, TLS)
        → [delay proxy, slow-network only] → gateway (uvicorn + TLS, gateway middleware)
        → engine r1 / engine r2 (simulated, engine middleware + engine.stats)
    every component's events → collector (HTTP) → events on disk → analyzer

Shutdown order matters for the data: clients flush first, then the proxy, gateway and engines
stop (flushing their emitters on exit), then the collector (flushing its store), and only then
does the analyzer read the events.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import ssl
import tempfile
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import trustme
from hopline.demo.engine_sim import EngineConfig
from hopline.demo.loadgen import LiveStats, LoadGenerator
from hopline.demo.process import Child, free_port, python_module
from hopline.demo.scenarios import REPLICAS, Scenario
from hopline.demo.wiring import make_emitter
from rich.console import Console
from rich.live import Live
from rich.table import Table

if TYPE_CHECKING:
    from hopline.analyzer.report import Analysis

DEMO = "hopline.demo"
WARMUP_S = 4.0  # unrecorded traffic before the run (see wiring.WARMUP_PREFIX)
LAG_PROBE_S = 0.1  # the load generator's event loop is probed this often
LIVE_FINISH_S = 90.0  # after the run, the live watch's time to read the last events and finish
TRUSTED_LAG_MS = 50.0  # above this p99 loop lag the machine was too busy for the timings to be trusted


@dataclass
class Stack:
    """The running children (in start order) and how to reach them."""

    run_dir: Path
    children: dict[str, Child] = field(default_factory=dict)
    collector_url: str = ""
    gateway_url: str = ""
    proxy_url: str | None = None
    ca_path: Path | None = None

    def write_pids(self) -> None:
        """``pids.json``: every child's pid, so anyone can check that none outlives the demo."""
        (self.run_dir / "pids.json").write_bytes(orjson.dumps({n: c.pid for n, c in self.children.items()}))


def make_tls(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a certificate for 127.0.0.1 / localhost: (CA, certificate, key) PEM files."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = directory / "ca.pem", directory / "cert.pem", directory / "key.pem"
    ca.cert_pem.write_to_path(str(paths[0]))
    cert.private_key_pem.write_to_path(str(paths[2]))
    for i, pem in enumerate(cert.cert_chain_pems):
        pem.write_to_path(str(paths[1]), append=i > 0)
    return paths


def start_stack(scenario: Scenario, stack: Stack, seed: int | None = None) -> None:
    """Start collector, engines, gateway (and the delay proxy); children land in ``stack`` at once,
    so whatever started is stopped even if a later step fails."""
    logs = stack.run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    ca, cert, key = make_tls(stack.run_dir / "tls")
    stack.ca_path = ca

    collector_port = free_port()  # the collector takes a --port; it cannot tell us one it chose
    stack.collector_url = f"http://127.0.0.1:{collector_port}"
    collector = Child(
        "collector",
        python_module(
            "hopline.collector",
            "--host",
            "127.0.0.1",
            "--port",
            str(collector_port),
            "--data-dir",
            str(stack.run_dir),
        ),
        logs,
    )
    stack.children["collector"] = collector
    # the simulator's own record of each request (not hop events: kept out of what hopline reads)
    truth_dir = stack.run_dir / "simulator"
    truth_dir.mkdir(parents=True, exist_ok=True)
    for i, replica in enumerate(REPLICAS):
        config = {
            **scenario.engine_config(),
            "incident": scenario.engine_incident.get(replica, {}),
            "seed": None if seed is None else seed + i,
        }
        stack.children[f"engine-{replica}"] = Child(
            f"engine-{replica}",
            python_module(
                f"{DEMO}.engine_sim",
                "--replica",
                replica,
                "--sink",
                stack.collector_url,
                "--truth",
                str(truth_dir / f"truth-{replica}.log"),
                "--port-file",
                str(logs / f"engine-{replica}.port"),
                "--config",
                orjson.dumps(config).decode(),
            ),
            logs,
        )
    stack.write_pids()
    collector.wait_listening(collector_port)
    upstreams = [
        f"{replica}=http://127.0.0.1:{stack.children[f'engine-{replica}'].wait_port()}"
        for replica in REPLICAS
    ]
    gateway = Child(
        "gateway",
        python_module(
            f"{DEMO}.gateway_app",
            *(arg for upstream in upstreams for arg in ("--upstream", upstream)),
            "--keys",
            orjson.dumps(scenario.api_keys()).decode(),
            "--sink",
            stack.collector_url,
            "--port-file",
            str(logs / "gateway.port"),
            "--certfile",
            str(cert),
            "--keyfile",
            str(key),
        ),
        logs,
    )
    stack.children["gateway"] = gateway
    stack.write_pids()
    gateway_port = gateway.wait_port()
    stack.gateway_url = f"https://127.0.0.1:{gateway_port}"
    if scenario.via_proxy:
        proxy = Child(
            "delay-proxy",
            python_module(
                f"{DEMO}.delay_proxy",
                "--target",
                f"127.0.0.1:{gateway_port}",
                "--delay-ms",
                str(scenario.proxy_delay_ms),
                "--port-file",
                str(logs / "delay-proxy.port"),
            ),
            logs,
        )
        stack.children["delay-proxy"] = proxy
        stack.write_pids()
        stack.proxy_url = f"https://127.0.0.1:{proxy.wait_port()}"


def stop_stack(stack: Stack, timeout: float = 8.0) -> None:
    """Everything but the collector first (they flush their events to it), then the collector."""
    front = [c for name, c in stack.children.items() if name != "collector"]
    for group in (front, [stack.children["collector"]] if "collector" in stack.children else []):
        for child in group:
            child.terminate()
        deadline = time.monotonic() + timeout
        for child in group:
            child.wait_or_kill(deadline)


def inject(scenario: Scenario, stack: Stack) -> None:
    """The incident's server side: SIGUSR1 switches a replica's overrides / the proxy's delay on.
    (Its client side, new traffic, is scheduled by the load generator.)"""
    for replica in scenario.engine_incident:
        stack.children[f"engine-{replica}"].signal(signal.SIGUSR1)
    if "delay-proxy" in stack.children:
        stack.children["delay-proxy"].signal(signal.SIGUSR1)


def _panel(scenario: Scenario, stats: LiveStats, elapsed: float, seconds: float, incident_at: float) -> Table:
    table = Table(title=f"hopline demo · {scenario.name}", show_header=False, box=None, padding=(0, 2))
    p50 = stats.p50_ttft_ms()
    table.add_row("time", f"{min(elapsed, seconds):4.0f} / {seconds:.0f} s")
    table.add_row("requests", f"{stats.sent} sent · {stats.ok} ok · {stats.errors} failed")
    table.add_row("in flight", str(stats.in_flight))
    table.add_row("p50 TTFT (client, last 200)", "–" if p50 is None else f"{p50:.0f} ms")
    when = f"at {incident_at:.0f} s"
    table.add_row("incident", f"{scenario.injected} ({'injected ' if elapsed >= incident_at else ''}{when})")
    if stats.last_error:
        table.add_row("last error", stats.last_error)
    return table


async def probe_lag(lags: list[float]) -> None:
    """Append how late the event loop woke for each ``LAG_PROBE_S`` sleep (seconds): on a machine
    too busy to keep time, every latency the demo measures is inflated and its story may not hold."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + LAG_PROBE_S
        await asyncio.sleep(LAG_PROBE_S)
        lags.append(max(0.0, loop.time() - due))


async def drive(
    scenario: Scenario, stack: Stack, seconds: float, console: Console, seed: int | None
) -> float:
    """Run the traffic for ``seconds`` with the live display; inject the incident on time.
    Returns the p99 lag of the load generator's event loop, in ms."""
    assert stack.ca_path is not None
    emitters: dict[str, Any] = {}

    def emitter_for(service: str) -> Any:
        if service not in emitters:
            emitters[service] = make_emitter(stack.collector_url, service=service)
        return emitters[service]

    load = LoadGenerator(
        scenario.traffic(seconds),
        gateway_url=stack.gateway_url,
        proxy_url=stack.proxy_url,
        verify=ssl.create_default_context(cafile=str(stack.ca_path)),
        emitter_for=emitter_for,
        model=EngineConfig().model.name,
        seconds=seconds,
        grace=5.0,
        seed=seed,
    )
    await load.warm_up()
    console.print(f"[dim]warming up for {WARMUP_S:g} s (not recorded)…[/dim]")
    await load.warm_traffic(WARMUP_S)
    incident_at = scenario.starts_at(seconds) * seconds
    started = time.monotonic()

    async def incident() -> None:
        await asyncio.sleep(incident_at)
        inject(scenario, stack)

    async def display(live: Live) -> None:
        while True:
            live.update(_panel(scenario, load.stats, time.monotonic() - started, seconds, incident_at))
            await asyncio.sleep(0.25)

    lags: list[float] = []
    with live_panel(console) as live:
        tasks = [
            asyncio.create_task(incident()),
            asyncio.create_task(display(live)),
            asyncio.create_task(probe_lag(lags)),
        ]
        try:
            await load.run()
        finally:
            for task in tasks:
                task.cancel()
            live.update(_panel(scenario, load.stats, time.monotonic() - started, seconds, incident_at))
    for emitter in emitters.values():
        await asyncio.to_thread(emitter.close)  # the clients' last events reach the collector
    lags.sort()
    return lags[min(len(lags) - 1, int(0.99 * len(lags)))] * 1e3 if lags else 0.0


@contextlib.contextmanager
def live_panel(console: Console) -> Iterator[Live]:
    """rich's ``Live``, its last frame ended by a newline on a console that is no terminal too
    (``demo --json 2> log``): rich ends it only on a terminal, so the next line joined it."""
    with Live(console=console, refresh_per_second=4, transient=False) as live:
        yield live
    if not console.is_terminal:
        console.line()


def _run_async(coro: Coroutine[Any, Any, float]) -> float:
    """Run the load on uvloop when it is installed: the client side then costs less CPU."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM to the demo behaves like Ctrl-C: unwind, stop the children, exit."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass(frozen=True)
class DemoRun:
    """What a run leaves: the analyzer's report (as ``hopline analyze`` gives it for the folder),
    one request worth a look, how late the load generator's loop ran, and the kept folder."""

    report: dict[str, Any]
    example_request: str | None
    loop_lag_p99_ms: float
    folder: Path | None  # None: the run's temporary folder was deleted
    analysis: Analysis | None = None  # the report as typed findings, for the terminal
    live_alerts: tuple[dict[str, Any], ...] = ()  # the live watch's alerts (``live.LiveWatch``)

    @property
    def reported_lag_ms(self) -> float:
        """The loop lag as the demo shows it, to 0.1 ms."""
        return round(self.loop_lag_p99_ms, 1)

    @property
    def trusted(self) -> bool:
        # decided on the shown figure: a run is never shown "50.0 ms" and called over 50 ms
        return self.reported_lag_ms <= TRUSTED_LAG_MS


def run_demo(
    scenario: Scenario,
    *,
    seconds: float,
    out: Path | None,
    html: Path | None,
    console: Console,
    seed: int | None = None,
    alertmanager: list[str] | None = None,
) -> DemoRun:
    """Run the whole demo; the events, simulator logs, report.json, dashboards and logs stay in
    ``out`` (else in a temporary folder, removed). The live watch (``live.LiveWatch``) prints
    its alerts as they come and sends them to ``alertmanager`` URLs."""
    from hopline.demo.analysis import analyze_run, example_request, render_html, write_dashboards
    from hopline.demo.live import LiveWatch

    run_dir = Path(out) if out else Path(tempfile.mkdtemp(prefix="hopline-demo-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    stack = Stack(run_dir)
    watch: LiveWatch | None = None
    ran = False
    try:
        with _terminate_as_interrupt():
            try:
                console.print(f"[dim]starting collector, engines r1 r2, gateway… ({run_dir})[/dim]")
                start_stack(scenario, stack, seed)
                watch = LiveWatch.start(run_dir, seconds, alertmanager or [], console)
                lag_ms = _run_async(drive(scenario, stack, seconds, console, seed))
                ran = True
            finally:
                stop_stack(stack)
                if watch is not None:  # after a full run it reads the last events, then finishes
                    watch.finish(timeout=LIVE_FINISH_S if ran else 0.0)
        analysis, frame = analyze_run(run_dir)
        report = analysis.to_json()
        if html is not None:
            render_html(analysis, frame, html)
        if out is not None:
            (run_dir / "report.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
            write_dashboards(run_dir / "dashboards", stack.collector_url)
        folder = run_dir if out is not None else None
        alerts = tuple(watch.alerts) if watch is not None else ()
        return DemoRun(report, example_request(report, frame), lag_ms, folder, analysis, alerts)
    finally:
        if out is None:
            shutil.rmtree(run_dir, ignore_errors=True)

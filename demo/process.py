"""Child processes the demo owns: started in their own process group, always stopped, never orphaned.

Three layers make sure nothing the demo started outlives it:

* every child is its own session / process group (``start_new_session``), so the demo can stop a
  child together with anything it spawned, and a Ctrl-C in the terminal reaches only the demo,
  which then stops its children in order (load first, collector last, so no event is lost);
* every child starts through this module (``python -m hopline.demo.process MODULE …``),
  which first asks the kernel for ``SIGTERM`` when its parent dies (``prctl(PR_SET_PDEATHSIG)``,
  Linux; this also covers a ``kill -9`` of the demo), then runs ``MODULE`` as ``__main__``;
* the demo's own servers additionally run ``watch_parent``: a thread that exits the process when
  its parent pid changes (the portable fallback where ``prctl`` does not exist).

A child reports that it is listening by writing its port to a file (``announce_port``); the
parent waits for that file (``Child.wait_port``), so ports are always chosen by the OS (port 0)
and never guessed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import runpy
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

PR_SET_PDEATHSIG = 1


PARENT_ENV = "HOPLINE_DEMO_PARENT"


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel for SIGTERM when the parent dies (Linux); exit now if it already has."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def watch_parent(interval: float = 0.5) -> None:
    """Exit this process (SIGTERM to itself, so servers shut down cleanly) once its parent is gone."""
    parent = os.getppid()

    def run() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        os._exit(1)

    threading.Thread(target=run, name="watch-parent", daemon=True).start()


def listening_socket() -> socket.socket:
    """A TCP socket listening on 127.0.0.1 on a port the OS chose (connections queue until served)."""
    return socket.create_server(("127.0.0.1", 0), backlog=1024)  # SO_REUSEADDR set on POSIX


def free_port() -> int:
    """A port that was free a moment ago (only for programs that insist on being told a port)."""
    with listening_socket() as sock:
        return sock.getsockname()[1]


def announce_port(path: str | Path, port: int) -> None:
    """Tell the parent which port this child listens on (atomically: write, then rename)."""
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(str(port))
    tmp.rename(path)


class Child:
    """One started child process (its own process group), with its log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_dir: Path,
        env: dict[str, str] | None = None,
        stdout: int = subprocess.DEVNULL,
    ):
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.port_path = log_dir / f"{name}.port"
        self.port_path.unlink(missing_ok=True)
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=log,
                env={**os.environ, **(env or {}), PARENT_ENV: str(os.getpid())},
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _check_alive(self) -> None:
        if self.popen.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.name} exited with {self.popen.returncode} while starting:\n{tail}")

    def wait_port(self, timeout: float = 20.0) -> int:
        """The port the child announced (see ``announce_port``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.port_path.exists():
                return int(self.port_path.read_text())
            self._check_alive()
            time.sleep(0.05)
        raise TimeoutError(
            f"{self.name} did not start listening within {timeout:.0f} s (log: {self.log_path})"
        )

    def wait_listening(self, port: int, timeout: float = 20.0) -> None:
        """Wait until something accepts TCP connections on ``port`` (for children we cannot change)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} did not listen on port {port} within {timeout:.0f} s")

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, sig)

    def terminate(self) -> None:
        """SIGTERM the child's process group (it flushes and exits)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGTERM)

    def wait_or_kill(self, deadline: float) -> None:
        """Wait for the child until ``deadline`` (monotonic), then SIGKILL whatever is left of its group."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()


def python_module(module: str, *args: str) -> list[str]:
    """argv to run ``python -m module args…`` as a child that dies with the demo."""
    return [sys.executable, "-m", __name__, module, *args]


def _launch(argv: list[str]) -> None:
    """``python -m hopline.demo.process MODULE ARGS…``: tie this process to its parent,
    then run MODULE as ``python -m MODULE ARGS…`` would."""
    die_with_parent(int(os.environ.get(PARENT_ENV) or os.getppid()))
    sys.argv = argv
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _launch(sys.argv[1:])

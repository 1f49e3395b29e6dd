"""Run a set of processes as one job: prefixed output, first failure tears the rest down.

Each process gets its own session (process group) so that torchrun's children go with it and
a terminal's Ctrl-C reaches only us: we turn it into SIGTERM, which the training treats as a
preemption (checkpoint, exit), then SIGKILL whatever is left after a grace period. Nothing is
left running when `run` returns.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import IO, TextIO

from dist_jobs.constants import REQUEUE_EXIT_CODE

GRACE_SECONDS = 30.0


class ProcessGroup:
    def __init__(self, out: TextIO, grace: float = GRACE_SECONDS) -> None:
        self.out = out
        self.grace = grace
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen[bytes]] = []

    def _pump(self, label: str, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._lock:
                self.out.write(f"[{label}] {line}\n")
                self.out.flush()
        stream.close()

    def _start(
        self, jobs: list[tuple[str, list[str], dict[str, str]]], cwd: os.PathLike[str]
    ) -> list[threading.Thread]:
        pumps = []
        for label, argv, env in jobs:
            proc = subprocess.Popen(
                argv,
                env=env,
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            self._procs.append(proc)
            pump = threading.Thread(target=self._pump, args=(label, proc.stdout), daemon=True)
            pump.start()
            pumps.append(pump)
        return pumps

    def run(self, jobs: list[tuple[str, list[str], dict[str, str]]], cwd: os.PathLike[str]) -> int:
        pumps: list[threading.Thread] = []
        try:
            pumps = self._start(jobs, cwd)
            return self._wait()
        except KeyboardInterrupt:
            self._signal_all(signal.SIGTERM)
            self._reap(self.grace)
            return 130
        finally:
            self._signal_all(signal.SIGTERM)
            self._reap(self.grace)
            self._signal_all(signal.SIGKILL)
            self._reap(5.0)
            for pump in pumps:
                pump.join(timeout=5.0)

    def _wait(self) -> int:
        """Until all exit 0, or the first non-zero exit; then the others get the same end."""
        while True:
            codes = [p.poll() for p in self._procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                first = failed[0]
                if first != REQUEUE_EXIT_CODE:
                    self._signal_all(signal.SIGTERM)
                self._reap(self.grace)
                return self._exit_code(first)
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.05)

    @staticmethod
    def _exit_code(code: int) -> int:
        return 128 - code if code < 0 else code  # killed by signal N -> 128+N, like a shell

    def _signal_all(self, sig: int) -> None:
        # The whole group, even when its leader has exited: torchrun's workers may outlive it.
        for proc in self._procs:
            try:
                os.killpg(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _reap(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for proc in self._procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass

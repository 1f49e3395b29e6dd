"""The keeper of one local rank: whatever happens to the launcher, the rank's whole tree dies with it.

procs.py runs `python -I keeper.py FD -- CMD...` (as a script: it imports nothing of
dist-jobs, so it starts in milliseconds). The keeper

- becomes a child subreaper, so every process CMD starts and orphans (torchrun's workers, which
  torchrun puts in sessions of their own) is re-parented to it instead of to init;
- starts CMD with the parent-death signal SIGKILL, so CMD dies if the keeper itself is killed;
- watches FD, the read end of a pipe whose write end only the launcher holds: EOF means the
  launcher is gone (for any reason, SIGKILL included) or wants the run ended now. Then it
  SIGKILLs every descendant, waits for them, and exits;
- shares its process group with CMD, so the launcher's preemption signal reaches CMD directly;
  the keeper itself lets such signals pass (a no-op handler, reset to default in CMD by exec);
- stops CMD's tree (SIGSTOP) when the launcher is stopped (Ctrl-Z, SIGSTOP, a suspended
  session): the ranks run in sessions of their own, which a terminal's stop does not reach, and
  a stopped launcher beats no lock, so ranks left running could write beside a run that took the
  lock over. It looks every LOOK_SECONDS, and continues the tree only when the launcher, running
  again and still holding the lock, sends the keeper SIGCONT;
- when CMD exits, kills what CMD left behind and exits with CMD's code (128+N for signal N).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
LOOK_SECONDS = 2.0  # how often the launcher's state is read: far inside the lock's stale limit
_PASSED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option})")


def _stat(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, ...); None when the
    process is gone. The name, in parentheses, may hold spaces and parentheses itself."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, for every process this user can see."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        fields = _stat(entry) if entry.isdigit() else None
        if fields is not None:
            tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def descendants(root: int) -> list[int]:
    tree, out, todo = _children(), [], [root]
    while todo:
        kids = tree.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _reap(child: int, status: list[int]) -> None:
    """Collect every exited child (orphans come to us); keep the status of CMD's own process."""
    while True:
        try:
            pid, code = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == child:
            status.append(code)


def kill_tree(child: int, status: list[int], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = descendants(os.getpid())
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
        _reap(child, status)


def parent_stopped() -> bool:
    """Whether the launcher (this keeper's parent) is stopped by a signal (state T)."""
    fields = _stat(os.getppid())
    return fields is not None and fields[0] == b"T"


def signal_tree(sig: int) -> None:
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _spawn(argv: list[str]) -> int:
    keeper = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != keeper:  # the keeper died before the prctl took effect
            os._exit(137)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # Python ignores it; a program expects the default
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(2, f"dist-jobs: cannot run {argv[0]!r}: {exc.strerror}\n".encode())
        os._exit(127)


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def main(args: list[str]) -> int:
    watch, argv = int(args[0]), args[2:]
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    for sig in _PASSED:
        signal.signal(sig, lambda *_: None)
    # Asleep until something happens: a child's exit (SIGCHLD, through the wakeup pipe) or the
    # watched pipe. A timed poll would wake beside the busy ranks many times a second.
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    continued: list[bool] = []  # the launcher's SIGCONT since the last look
    signal.signal(signal.SIGCONT, lambda *_: continued.append(True))
    child = _spawn(argv)
    status: list[int] = []
    stopped = False
    while not status:
        ready, _, _ = select.select([watch, woken], [], [], LOOK_SECONDS)
        if watch in ready and not os.read(watch, 1):  # EOF: the launcher is gone or ends the run now
            kill_tree(child, status)
            return 137
        if woken in ready:
            os.read(woken, 512)
        if stopped and continued:
            signal_tree(signal.SIGCONT)
            stopped = False
        continued.clear()
        if not stopped and parent_stopped():
            signal_tree(signal.SIGSTOP)
            stopped = True
        _reap(child, status)
    kill_tree(child, status)  # what CMD left behind has no one to answer to
    return _exit_code(status[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

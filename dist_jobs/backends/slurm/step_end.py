"""`python -m dist_jobs.backends.slurm.step_end ...`: the batch script asks this after each job step
what the step's end means (dist_jobs.rundir.verdict decides) and what to do next.

It gathers the evidence only the allocation has: srun's own lines about the tasks (which failed
first, how), the PREEMPTED marker and the HANG record newer than the step's start, whether the
lock is still this job's, and, before a restart in place, whether every node of the allocation
still answers and passes the node check (one task per node). The verdict is recorded in the run
directory, told on stderr (the batch log) and printed as `ACTION EXIT_CODE` for the script:

    done 0 | restart 200 | requeue 200 | fail 3 | stop 6 | none 143

With `--before`, it checks the nodes before the step starts (every node answers and passes
dist_jobs.backends.slurm.nodecheck: the run directory is the shared one, the GPUs are there):
`go 0` to start the step, else the verdict on a node lost or unfit, as above.

Before a requeue, the nodes the verdict blames are kept away from the job's next attempts
(dist_jobs.rundir.quarantine): a third word then gives the job's whole node exclusion from now on,
for `scontrol update JobId=... ExcNodeList=...` once the job is requeued (SLURM takes it only on
a pending job), or `none` when every quarantine has expired. When SLURM requeues the job itself
(it declared a node down: the batch shell gets SIGTERM), sinfo names the failed node:

    requeue 200 n2
    none 143 n2
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from dist_jobs.backends.slurm.batchlog import srun_failures
from dist_jobs.backends.slurm.faults import SINFO_NODE_STATES, parse_node_states
from dist_jobs.backends.slurm.nodecheck import NONCE_FILE, NOT_SHARED, parse_reports
from dist_jobs.backends.slurm.stepwatch import step_lost
from dist_jobs.ranks.nodelist import expand
from dist_jobs.rundir.hang import attempt_hang, describe_hang, job_id, preempted_since
from dist_jobs.rundir.lock import LOCK_NAME, Fence, LockLost, stamp_of
from dist_jobs.rundir.quarantine import Quarantine, active_quarantines, blamed_nodes, exclusion, keep_away, kept_away
from dist_jobs.rundir.verdict import Action, Ending, Evidence, Verdict, decide, record

PROBE_SECONDS = 30  # a node that cannot run the node check within this is lost to this allocation

Probe = Callable[[list[str]], dict[str, str]]  # nodes -> each answering node's problem ("" when fit)
Failed = Callable[[list[str]], list[str]]  # nodes -> those the scheduler says failed


def node_reports(nodes: list[str], run_dir: Path, gpus: int = 0) -> dict[str, str]:
    """The allocation's nodes that run a task now, each with what makes it unfit for the job (""
    when nothing): one node check (dist_jobs.backends.slurm.nodecheck) per node, against a nonce
    this process (on the batch host) writes into the run directory first."""
    nonce = secrets.token_hex(8)
    try:
        (run_dir / NONCE_FILE).write_text(nonce + "\n", encoding="ascii")
    except OSError as exc:  # the batch host's own trouble, not a node's: the step will meet it
        print(f"dist-jobs: cannot check the nodes: {exc}", file=sys.stderr)
        return dict.fromkeys(nodes, "")
    argv = ["srun", f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1", "--cpus-per-task=1"]
    argv += ["--kill-on-bad-exit=0", "--wait=5", sys.executable, "-m", "dist_jobs.backends.slurm.nodecheck"]
    argv += [str(run_dir), nonce, f"--gpus={gpus}"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"dist-jobs: checking the nodes failed: {exc}", file=sys.stderr)
        return {}
    finally:
        (run_dir / NONCE_FILE).unlink(missing_ok=True)
    return parse_reports(done.stdout)


def evidence(args: argparse.Namespace) -> Evidence:
    """What the step left, probes aside. The marker and the hang record count when this job's lock
    (`--token`) stamped them and they are newer than the step's start: a restart in place keeps
    the lock, and a holder that lost the run directory to this job may still land one late."""
    since = args.since.stat().st_mtime if args.since.exists() else time.time()
    stamp = stamp_of(args.token)
    hang = attempt_hang(args.run_dir, since, stamp, job=job_id())
    text = args.errors.read_text(errors="replace") if args.errors.exists() else ""
    try:
        Fence(args.run_dir / LOCK_NAME, args.token).check("decide how the step ended")
        lock_lost = False
    except LockLost:
        lock_lost = True
    return Evidence(
        exit_code=args.rc,
        failures=srun_failures(text, cancelled=args.cancelled, tasks_are_ranks=not args.tasks_are_nodes),
        warned=args.warned,
        cancelled=args.cancelled,
        preempted=preempted_since(args.run_dir, since, stamp),
        hang=describe_hang(hang) if hang is not None else "",
        lock_lost=lock_lost,
        step_lost=step_lost(text),
    )


def failed_nodes(nodes: list[str]) -> list[str]:
    """The allocation's nodes SLURM says do not answer or are down (sinfo), once the job is gone
    from them: the probe's srun cannot run there any more."""
    argv = ["sinfo", "--noheader", "--Node", "--nodes", ",".join(nodes), "--format", SINFO_NODE_STATES]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"dist-jobs: asking sinfo about the nodes failed: {exc}", file=sys.stderr)
        return []
    states = parse_node_states(done.stdout)
    return [n for n, s in states.items() if not s.responding or s.state.startswith(("down", "fail"))]


def batch_host() -> str:
    """The node this process (the batch script's) runs on: the one that wrote the nonce."""
    return os.environ.get("SLURMD_NODENAME", "")


def silent_nodes(nodes: list[str], answered: Iterable[str], failed: Failed, here: str | None = None) -> tuple[str, ...]:
    """The allocation's nodes that did not answer the probe. The batch host runs this process, so
    it answers; a probe that reached no node at all failed as a whole (its srun cannot start a
    step while a node of the allocation is dead): then sinfo's failed nodes, when it names any."""
    here = batch_host() if here is None else here
    answered = set(answered)
    if not answered:
        down = [n for n in failed(nodes) if n != here]
        if down:
            return tuple(down)
    return tuple(n for n in nodes if n not in answered and n != here)


def unfit_nodes(reports: dict[str, str], here: str | None = None) -> tuple[tuple[str, str], ...]:
    """The answering nodes that cannot run the job's ranks, each with why, in node order.

    The batch host (`here`) wrote the nonce the others read back, so a node that does not see it
    has another run directory than the batch host's. When those nodes are more than the batch host
    and the nodes that do see it, the batch host's side is the odd one out (its own mount is
    missing, say): its nodes are the ones to keep away. A tie (two nodes) blames the others."""
    here = batch_host() if here is None else here
    unfit = {node: why for node, why in reports.items() if why}
    blind = [node for node in reports if node != here and NOT_SHARED in unfit.get(node, "")]
    seeing = [node for node in reports if node not in blind]
    if here in reports and len(blind) > len(seeing):
        for node in blind:
            del unfit[node]
        for node in seeing:
            shared = f"its run directory is not the one {len(blind)} of the job's {len(reports)} nodes share"
            unfit[node] = f"{shared}; {unfit[node]}" if node in unfit else shared
    return tuple(sorted(unfit.items()))


def judge(ev: Evidence, nodes: list[str], restarts_left: int, probe: Probe, failed: Failed) -> Verdict:
    """The verdict; a restart in place only once every node has answered the node check, and
    passed it. The program's own error is checked too: a rank that failed because its node lost
    the run directory (its writes failing) is the node's fault, not a bug; only a node that
    answers and fails the check says so (a node slow to answer does not turn a bug into a requeue).
    A cancel (SLURM's own requeue when it declares a node down) asks sinfo which node failed."""
    verdict = decide(ev, restarts_left=restarts_left)
    if verdict.fault_in_place:
        reports = probe(nodes)
        lost, unfit = silent_nodes(nodes, reports, failed), unfit_nodes(reports)
        if lost or unfit:
            verdict = decide(replace(ev, lost_nodes=lost, unfit=unfit), restarts_left=restarts_left)
    elif verdict.ending is Ending.PROGRAM_ERROR and nodes:
        unfit = unfit_nodes(probe(nodes))
        if unfit:
            verdict = decide(replace(ev, unfit=unfit), restarts_left=restarts_left)
    elif verdict.ending is Ending.CANCELLED and nodes:
        down = tuple(failed(nodes))
        if down:
            verdict = decide(replace(ev, lost_nodes=down), restarts_left=restarts_left)
    return verdict


def before_step(nodes: list[str], probe: Probe, failed: Failed, kept: Iterable[Quarantine] = ()) -> Verdict | None:
    """Before the step starts: a verdict when a node of the allocation is lost or unfit (the
    attempt ends here, to run again elsewhere), else None (start the step). A probe that reached
    no node and sinfo naming none failed for its own reasons: the step itself will tell.

    A node the job keeps away (`kept`: its active quarantines) is unfit even when it answers:
    SLURM hands it back when the exclusion never landed (SLURM requeued the job itself while the
    batch host was still cleaning up, and refuses ExcNodeList on a job that is not pending)."""
    held = tuple((q.node, f"is kept away from this job ({q.why})") for q in kept if q.node in nodes)
    if held:
        return decide(Evidence(exit_code=0, unfit=held))
    reports = probe(nodes)
    down = [] if reports else failed(nodes)  # asked once: silent_nodes asks it only of a probe that reached nobody
    if not reports and not down:
        return None
    lost, unfit = silent_nodes(nodes, reports, lambda _: down), unfit_nodes(reports)
    if not lost and not unfit:
        return None
    return decide(Evidence(exit_code=0, lost_nodes=lost, unfit=unfit))


def excluded_now(scontrol_show_job: str) -> list[str]:
    """The nodes a job excludes, from `scontrol show job -o JOBID` ("(null)": none)."""
    found = re.search(r"\bExcNodeList=(\S+)", scontrol_show_job)
    return [] if found is None or found.group(1) == "(null)" else expand(found.group(1))


def _job_exclusion(job: str) -> list[str]:
    try:
        done = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return excluded_now(done.stdout)


def _in_service() -> list[str]:
    """The nodes of the job's partition that could run it (sinfo: answering, not down or drained)."""
    argv = ["sinfo", "--noheader", "--Node", "--format", SINFO_NODE_STATES]
    partition = os.environ.get("SLURM_JOB_PARTITION", "")
    try:
        done = subprocess.run(
            argv + (["--partition", partition] if partition else []), capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    states = parse_node_states(done.stdout)
    return [n for n, s in states.items() if s.responding and not s.state.startswith(("down", "drain", "fail", "maint"))]


def quarantine(
    run_dir: Path,
    job: str,
    verdict: Verdict,
    current: Callable[[str], list[str]] = _job_exclusion,
    in_service: Callable[[], list[str]] = _in_service,
) -> str:
    """Before a requeue (the script's, or SLURM's own after a node failed): keep the nodes the
    verdict blames away from the job's next attempts and say so on stderr; the job's node
    exclusion from now on (`none`: clear it), or "" when the job never kept a node away. A node
    is not kept away when the partition would be left with too few nodes for the job
    (SLURM_JOB_NUM_NODES): the job would never start again."""
    blamed = blamed_nodes(verdict)
    if not blamed and (verdict.action is not Action.REQUEUE or not kept_away(run_dir, job)):
        return ""
    now, excluded = time.time(), current(job)
    needed = int(os.environ.get("SLURM_JOB_NUM_NODES", "0") or 0)
    left = [n for n in in_service() if n not in excluded and n not in blamed] if blamed and needed else []
    if blamed and len(left) < needed:
        print(
            f"dist-jobs: {', '.join(blamed)} not kept away: the job needs {needed} nodes and "
            f"only {len(left)} other{'s' if len(left) != 1 else ''} can run it",
            file=sys.stderr,
        )
    else:
        for kept in keep_away(run_dir, job, verdict, now):
            print(f"dist-jobs: the next attempt keeps away from {kept.told()}", file=sys.stderr)
    records = kept_away(run_dir, job)
    if not records:
        return ""
    return ",".join(exclusion(excluded, records, now)) or "none"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python3 -m dist_jobs.backends.slurm.step_end")
    p.add_argument("--before", action="store_true", help="before the step: check the nodes (prints go 0 when fit)")
    p.add_argument("--rc", type=int, help="the step's exit code")
    p.add_argument("--errors", type=Path, help="srun's stderr of the step")
    p.add_argument("--since", type=Path, help="a file touched when the step started")
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--token", default="", help="this job's lock token")
    p.add_argument("--attempt", default="0", help="the step's label: requeue count[.restart]")
    p.add_argument("--nodes", default="", help="the allocation's SLURM_JOB_NODELIST")
    p.add_argument("--gpus", type=int, default=0, help="GPUs per node the job asks for (the node check lists them)")
    p.add_argument("--restarts-left", type=int, default=0)
    p.add_argument("--tasks-are-nodes", action="store_true", help="torchrun mode: srun's task N is node N's torchrun")
    p.add_argument("--warned", action="store_true", help="the batch shell got the scheduler's warning")
    p.add_argument("--cancelled", action="store_true", help="the batch shell got SIGTERM (scancel, requeue)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not args.before and (args.rc is None or args.errors is None or args.since is None):
        parser.error("--rc, --errors and --since are required after a step")
    nodes = expand(args.nodes) if args.nodes else []

    def probe(nodes: list[str]) -> dict[str, str]:
        return node_reports(nodes, args.run_dir, args.gpus)

    if args.before:
        found = before_step(nodes, probe, failed_nodes, active_quarantines(args.run_dir, job_id(), time.time()))
        if found is None:
            print("go 0")
            return 0
        verdict = found
    else:
        verdict = judge(evidence(args), nodes, args.restarts_left, probe, failed_nodes)
    verdict = replace(verdict, attempt=args.attempt, time=time.time(), stamp=stamp_of(args.token))
    try:
        record(args.run_dir, job_id(), verdict)
    except OSError as exc:  # the run directory's own trouble fails the next step loudly anyway
        print(f"dist-jobs: cannot record the verdict: {exc}", file=sys.stderr)
    print(f"dist-jobs: attempt {args.attempt} ended: {verdict.told()} (exit {verdict.exit_code})", file=sys.stderr)
    try:
        excluded = quarantine(args.run_dir, job_id(), verdict)
    except OSError as exc:  # the requeue matters more than the quarantine
        print(f"dist-jobs: cannot record the nodes to keep away: {exc}", file=sys.stderr)
        excluded = ""
    print(f"{verdict.action} {verdict.exit_code}" + (f" {excluded}" if excluded else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

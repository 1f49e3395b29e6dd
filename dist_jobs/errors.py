"""Typed errors. Each carries a hint; only the CLI turns them into text and an exit code."""

from __future__ import annotations

from dataclasses import dataclass

from dist_jobs.constants import REQUEUE_EXIT_CODE


class DistJobsError(Exception):
    """Base error: a message that says what is wrong and a hint that says what to do."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  hint: {self.hint}" if self.hint else self.message


class UsageError(DistJobsError):
    """Bad input from the user (spec, flags, arguments): exit code 2, never a traceback."""

    exit_code = 2


@dataclass(frozen=True)
class Problem:
    """One problem in the input: where, what was given, what is wrong, and the fix."""

    field: str
    value: object
    message: str
    hint: str = ""

    def render(self) -> str:
        given = "" if self.value is _MISSING else f" (given: {self.value!r})"
        fix = f"\n    fix: {self.hint}" if self.hint else ""
        return f"  - {self.field}: {self.message}{given}{fix}"


_MISSING = object()
MISSING = _MISSING


class SpecError(UsageError):
    """All problems found in a job spec, collected and raised once."""

    def __init__(self, problems: list[Problem], source: str = "job spec") -> None:
        self.problems = list(problems)
        self.source = source
        count = len(self.problems)
        head = f"{source}: {count} problem{'s' if count != 1 else ''}"
        super().__init__("\n".join([head, *(p.render() for p in self.problems)]))


class RankError(DistJobsError):
    """The launch environment is inconsistent: fail loudly instead of hanging in rendezvous."""

    exit_code = 3


class Preempted(DistJobsError):
    """A run checkpointed after a preemption signal and stopped: exit with `exit_code` (200,
    dist_jobs.constants.REQUEUE_EXIT_CODE) and the launcher requeues it; it resumes from there."""

    exit_code = REQUEUE_EXIT_CODE


class BackendError(DistJobsError):
    """A scheduler or API call failed; the message says which and the hint what to try."""

    exit_code = 1

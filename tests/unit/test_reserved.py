"""Reserved environment names (dist_jobs/spec/reserved.py): the table matches real bash and job_env."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from dist_jobs.errors import SpecError
from dist_jobs.spec.env import job_env
from dist_jobs.spec.load import load_spec
from dist_jobs.spec.reserved import BASH_OWNED, DIST_JOBS_OWNED, TORCH_OWNED
from support.paths import PYTHON

# Every variable of the bash 5.2/5.3 manual ("Shell Variables"), plus a user-style name as a control.
BASH_MANUAL = """
_ BASH BASHOPTS BASHPID BASH_ALIASES BASH_ARGC BASH_ARGV BASH_ARGV0 BASH_CMDS BASH_COMMAND BASH_COMPAT
BASH_ENV BASH_EXECUTION_STRING BASH_LINENO BASH_LOADABLES_PATH BASH_MONOSECONDS BASH_REMATCH BASH_SOURCE
BASH_SUBSHELL BASH_TRAPSIG BASH_VERSINFO BASH_VERSION BASH_XTRACEFD CHILD_MAX COLUMNS COMP_CWORD COMP_LINE
COMP_POINT COMP_TYPE COMP_KEY COMP_WORDBREAKS COMP_WORDS COMPREPLY COPROC DIRSTACK EMACS ENV EPOCHREALTIME
EPOCHSECONDS EUID EXECIGNORE FCEDIT FIGNORE FUNCNAME FUNCNEST GLOBIGNORE GLOBSORT GROUPS histchars HISTCMD
HISTCONTROL HISTFILE HISTFILESIZE HISTIGNORE HISTSIZE HISTTIMEFORMAT HOSTFILE HOSTNAME HOSTTYPE IGNOREEOF
INPUTRC INSIDE_EMACS LANG LC_ALL LC_COLLATE LC_CTYPE LC_MESSAGES LC_NUMERIC LC_TIME LINENO LINES MACHTYPE
MAILCHECK MAPFILE OLDPWD OPTERR OSTYPE PIPESTATUS POSIXLY_CORRECT PPID PROMPT_COMMAND PROMPT_DIRTRIM PS0 PS3
PS4 PWD RANDOM READLINE_ARGUMENT READLINE_LINE READLINE_MARK READLINE_POINT REPLY SECONDS SHELL SHELLOPTS
SHLVL SRANDOM TIMEFORMAT TMOUT TMPDIR UID CDPATH HOME IFS MAIL MAILPATH OPTARG OPTIND PS1 PS2 MY_VAR
""".split()
NEWER_BASH = {"BASH_MONOSECONDS", "BASH_TRAPSIG"}  # dynamic variables of bash 5.3


def _misbehaves(name: str, folder: Path) -> bool:
    """True when `export NAME=VALUE` in bash (as the batch script does) runs code or loses the value."""
    canary = folder / f"ran-{name}"
    value = f"PWD[$(touch {canary})]"
    script = f"set -u\nexport {name}='{value}' 2>/dev/null\nprintenv {name}\n"
    proc = subprocess.run(
        ["bash", "-c", script], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30
    )
    return canary.exists() or proc.stdout != value + "\n"


def test_bash_owned_table_is_what_bash_does(tmp_path: Path) -> None:
    bad = {name for name in BASH_MANUAL if _misbehaves(name, tmp_path)}
    assert {"RANDOM", "SRANDOM", "OPTIND", "HISTCMD", "UID", "PPID"} <= bad  # the probe sees them
    assert bad - BASH_OWNED == set(), "bash mishandles these, add them to BASH_OWNED"
    assert BASH_OWNED - bad - NEWER_BASH == set(), "these reach the job fine: drop them from BASH_OWNED"


def test_dist_jobs_owned_is_what_job_env_sets() -> None:
    spec = load_spec(data={"procs_per_node": 1, "nccl": {"debug": "INFO"}})
    keys = set(job_env(spec, "slurm")) | set(job_env(spec, "k8s", "/shared/ck"))
    assert {k for k in keys if k.startswith("DIST_JOBS_")} == DIST_JOBS_OWNED


@pytest.mark.parametrize(
    "name,words",
    [
        ("RANDOM", "bash itself owns"),
        ("SECONDS", "bash itself owns"),
        ("DIST_JOBS_CHECKPOINT_DIR", "`checkpoint_dir`"),
        ("DIST_JOBS_RUN", "`name (or train.run_name)`"),
        ("MASTER_PORT", "`master_port`"),
        ("RANK", "per process"),
        ("MASTER_ADDR", "per process"),
    ],
)
def test_reserved_names_are_refused_with_the_fix(name: str, words: str) -> None:
    with pytest.raises(SpecError) as err:
        load_spec(data={"procs_per_node": 1, "env": {name: "1", "FINE": "2"}})
    (problem,) = err.value.problems
    assert problem.field == f"env.{name} (the key)" and words in problem.render()


def test_user_knobs_stay_allowed() -> None:
    env = {"DIST_JOBS_ENV": "torchrun", "DIST_JOBS_RDZV_TIMEOUT": "600", "PATH": "/opt/bin:/bin", "HOME": "/h"}
    assert load_spec(data={"procs_per_node": 1, "env": env}).env == env
    assert not TORCH_OWNED & BASH_OWNED


def test_arithmetic_env_value_runs_nothing(tmp_path: Path) -> None:
    """The reported exploit: the CLI refuses it (exit 2) instead of rendering a script that runs `touch`."""
    proc = subprocess.run(
        [PYTHON, "-m", "dist_jobs", "render", "--backend", "slurm", "--procs-per-node", "1"]
        + ["--env", f"RANDOM=PWD[$(touch {tmp_path / 'pwned'})]"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "env.RANDOM (the key)" in proc.stderr and proc.stdout == ""

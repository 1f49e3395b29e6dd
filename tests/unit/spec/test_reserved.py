"""Reserved environment names (dist_jobs/spec/reserved.py): the table matches real bash and job_env."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from dist_jobs.errors import SpecError
from dist_jobs.render import render
from dist_jobs.spec.env import job_env
from dist_jobs.spec.load import load_spec
from dist_jobs.spec.reserved import BASH_OWNED, DIST_JOBS_OWNED, TORCH_OWNED, reserved
from support.paths import PYTHON, REPO
from support.render_helpers import make_stubs, run_script, step_calls
from support.waiting import HUNG_S

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
        ["bash", "-c", script], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=HUNG_S
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
    env = {"DIST_JOBS_ENV": "torchrun", "DIST_JOBS_RDZV_TIMEOUT": "600", "HOME": "/h", "MY_SLURM_JOB_ID": "1"}
    assert load_spec(data={"procs_per_node": 1, "env": env}).env == env
    assert not TORCH_OWNED & BASH_OWNED


def test_arithmetic_env_value_runs_nothing(tmp_path: Path) -> None:
    """The reported exploit: the CLI refuses it (exit 2) instead of rendering a script that runs `touch`."""
    proc = subprocess.run(
        [PYTHON, "-m", "dist_jobs", "render", "--backend", "slurm", "--procs-per-node", "1"]
        + ["--env", f"RANDOM=PWD[$(touch {tmp_path / 'pwned'})]"],
        capture_output=True,
        text=True,
        timeout=HUNG_S,
    )
    assert proc.returncode == 2 and "env.RANDOM (the key)" in proc.stderr and proc.stdout == ""


# (name, value, a line of bash, what it prints without the export): bash acts on each of these.
ACTS_ON = [
    ("BASH_ENV", "{folder}/rc", 'bash -c "echo child"', "child"),  # the file runs in every child bash
    ("BASH_ARGV0", "other", 'echo "$0"', "bash"),
    ("BASH_XTRACEFD", "1", 'bash -xc ":" 2>/dev/null; echo done', "done"),  # a trace lands in the output
    ("BASH_COMPAT", "1", "echo done", "done"),
    ("EXECIGNORE", "*", "mkdir -p -- {folder}/made && echo made", "made"),
    ("PATH", "{folder}/empty", "mkdir -p -- {folder}/made && echo made", "made"),
]


@pytest.mark.parametrize("name,value,line,plain", ACTS_ON, ids=[a[0] for a in ACTS_ON])
def test_names_bash_acts_on_change_what_the_script_does_and_are_refused(
    tmp_path: Path, name: str, value: str, line: str, plain: str
) -> None:
    """Measured in real bash, as the batch script runs: `export NAME=VALUE` first, then a line of its own."""
    (tmp_path / "rc").write_text("echo sourced-by-child\n")
    line, value = line.format(folder=tmp_path), value.format(folder=tmp_path)

    def out(export: str) -> str:
        proc = subprocess.run(
            ["bash", "-c", f"set -u\n{export}\n{line}\n", "bash"],
            env={"PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=HUNG_S,
        )
        return proc.stdout + proc.stderr

    assert out("").strip() == plain
    assert out(f"export {name}='{value}'").strip() != plain, f"bash ignores {name}: it need not be reserved"
    assert reserved(name) is not None


SEED = {"name": "own-job", "nodes": 2, "procs_per_node": 1}


def _run_with(tmp_path: Path, env: dict[str, str], rc: int = 0) -> tuple[subprocess.CompletedProcess[str], list]:
    """The rendered script with `env:` as an older dist-jobs let it through (the spec's checks bypassed)."""
    spec = msgspec.structs.replace(load_spec(data=SEED), env=env)
    with pytest.raises(SpecError):
        load_spec(data={**SEED, "env": env})  # refused now
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return run_script(render(spec, "slurm"), work, make_stubs(tmp_path / "bin", sys.executable), rc=rc)


def test_pwd_in_env_moves_the_run_directory(tmp_path: Path) -> None:
    proc, _ = _run_with(tmp_path, {"PWD": str(tmp_path / "elsewhere")})
    assert (tmp_path / "elsewhere" / "checkpoints" / "own-job").is_dir()  # not work/checkpoints: job.json's
    assert not (tmp_path / "work" / "checkpoints").exists(), proc.stderr


def test_slurm_job_id_in_env_makes_the_script_requeue_another_job(tmp_path: Path) -> None:
    proc, calls = _run_with(tmp_path, {"SLURM_JOB_ID": "1234", "SLURM_JOB_NODELIST": "othernode"}, rc=200)
    scontrol = [c["argv"] for c in calls if c["prog"] == "scontrol"]
    assert ["requeue", "1234"] in scontrol  # not 4242, its own
    assert all("4242" not in " ".join(argv) for argv in scontrol), scontrol
    # othernode does not answer the node check: the job is requeued before any step starts
    (check,) = [c for c in calls if c["prog"] == "srun"]
    assert step_calls(calls) == [] and check["env"]["MASTER_ADDR"] == "othernode"


@pytest.mark.parametrize("env", [{"PATH": "/nonexistent"}, {"EXECIGNORE": "*"}])
def test_path_or_execignore_in_env_stops_the_script_at_start(tmp_path: Path, env: dict[str, str]) -> None:
    proc, calls = _run_with(tmp_path, env)
    # mkdir or python is not found: the script says its python "cannot import dist_jobs"
    assert proc.returncode != 0 and calls == [] and "cannot import dist_jobs" in proc.stderr


def test_every_slurm_and_bash_name_is_refused() -> None:
    template = (REPO / "templates" / "sbatch.sh.j2").read_text()
    read = set(re.findall(r"\bSLURM_[A-Z_]+", template))
    assert {"SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NNODES", "SLURM_RESTART_COUNT"} <= read
    more = {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_CPU_BIND", "SLURM_ANYTHING_NEW"}
    bash = {n for n in BASH_MANUAL if n.startswith("BASH_")}
    for name in sorted(read | more | bash):
        assert reserved(name) is not None, name
    assert reserved("SLURM_JOB_ID") is not None and "requeue" in reserved("SLURM_JOB_ID")[0]
    assert reserved("MY_SLURM_JOB_ID") is None and reserved("BASHFUL") is None

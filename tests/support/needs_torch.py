"""Which test files need torch, read from the source with `ast` (nothing is imported).

The torch-free sessions (`nox -s torch_free`, Pythons without a torch wheel here) run every test
file that does not need torch: one that imports torch, torchvision, lightning or a `dist_jobs.train`
module that does, directly or through a `support` module, at any depth (an import inside a
function does not: such a test runs in the torch-free sessions unless it is listed below).

Tests that need torch without their file importing it (they start the trainer in a child process,
submit the built-in trainer, which refuses a python without torch, or import a trainer module
inside the test) are listed in IN_A_CHILD: tests/conftest.py marks them `torch`, and
`--torch-free` deselects them. A test missing there fails in the torch-free sessions with
"No module named 'torch'" (or submit's "has no torch"): add it. tests/unit/test_needs_torch.py
checks that every name listed is a test that exists.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from support.paths import REPO

TORCH_PACKAGES = {"torch", "torchvision", "lightning", "pytorch_lightning"}
ROOTS = {"dist_jobs": REPO, "support": REPO / "tests"}
ALL = frozenset({"*"})
# Test file (relative to tests/) -> the names of its tests that need torch (ALL: every test).
IN_A_CHILD: dict[str, frozenset[str]] = {
    "integration/test_checkpoint_agree.py": ALL,
    "integration/test_env_contract.py": frozenset(
        {
            "test_call_local_preempted_function_resumes_when_called_again",
            "test_call_local_runs_your_function_on_every_rank",
            "test_local_backend_gives_an_unmodified_script_its_ranks",
            "test_users_thread_setting_wins",
        }
    ),
    "integration/test_hang_local.py": ALL,
    "integration/test_local_backend.py": frozenset(
        {
            "test_a_checkpoint_dir_that_is_a_file_is_bad_input",
            "test_args_with_dollars_reach_the_program_intact",  # its torchrun case runs torchrun
            "test_real_allreduce_srun_mode",
            "test_real_allreduce_torchrun_mode",
            "test_sigkill_of_the_launcher_leaves_no_process_and_the_next_run_takes_over",
            "test_torchrun_mode_keeps_the_interpreter_and_its_flags",
        }
    ),
    "integration/test_local_jobs.py": frozenset(
        {
            "test_python_api_submit_attach_from_another_process_wait_logs_result",
        }
    ),
    "integration/test_local_preemption.py": ALL,
    "integration/test_notebook.py": ALL,  # the notebook trains; nbclient is a dev tool, not a test one
    "integration/test_submitit.py": frozenset(
        {
            "test_train_task_under_the_local_executor_returns_every_ranks_metrics",
            "test_your_own_function_gets_the_ranks_under_the_local_executor",
        }
    ),
    "integration/test_train_exact.py": ALL,
    "integration/test_train_lock.py": ALL,
    "unit/test_imports.py": frozenset({"test_the_trainer_is_one_import_and_importing_the_package_loads_no_torch"}),
    "unit/test_job_scripts_lock.py": frozenset(
        {
            "test_a_pod_that_lost_its_lock_kills_its_program_and_exits_6",
        }
    ),
    "unit/test_train_strategy.py": ALL,  # placement and export run torch, in-process or in a child
    "unit/test_render_slurm.py": frozenset(
        {
            "test_home_in_folders_is_the_submitters_for_the_job_its_record_and_status",
        }
    ),
    "unit/test_slurm_backend.py": frozenset(
        {
            "test_a_failed_submit_leaves_no_folders_it_made",
            "test_gres_error_names_the_gpu_request",
            "test_job_json_names_the_run_directory_the_trainer_uses",
            "test_logs_before_the_job_wrote_any",
            "test_logs_follow_until_the_job_ends",
            "test_logs_in_torchrun_mode_find_a_rank_by_its_prefix_not_the_nodes_file_name",
            "test_logs_in_torchrun_mode_read_the_node_file_of_the_rank",
            "test_logs_stitch_attempts_in_order",
            "test_sbatch_errors_become_clear_backend_errors",
            "test_sbatch_not_installed",
            "test_submit_makes_its_own_python_the_jobs_python",
            "test_submit_with_workdir_keeps_its_chdir_and_logs_there",
            "test_submit_writes_the_job_dir_and_parses_the_id",
            "test_unparsable_sbatch_output_is_an_error",
        }
    ),
    "unit/test_watchdog.py": frozenset(
        {
            "test_a_floor_too_close_to_the_collective_timeout_is_clamped_with_a_warning",
            "test_collective_timeout_prefers_the_field_then_the_template_then_twice_the_floor",
            "test_firing_leaves_the_hang_record_and_the_requeue_marker",
            "test_the_limit_stays_below_the_collective_timeout_for_a_60_s_step",
            "test_the_trainers_save_and_preemption_wait_pause_it",
        }
    ),
}


def marked_torch(relative_file: str, test_name: str) -> bool:
    """Whether IN_A_CHILD lists this test (its function name, without parameters)."""
    names = IN_A_CHILD.get(relative_file, frozenset())
    return names is ALL or test_name in names


def _imports(path: Path) -> set[str]:
    """What the file imports when it is imported: its module-level statements (also those under
    `if`/`try`), not the bodies of its functions and classes."""
    names: set[str] = set()
    for node in _module_level(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        names.update(_required(node))
    return names


def _required(node: ast.stmt) -> set[str]:
    """`require_module("torch")` (support.tiers) at module level imports it as surely as `import`."""
    value = getattr(node, "value", None)
    if not isinstance(value, ast.Call) or not value.args or not isinstance(value.args[0], ast.Constant):
        return set()
    func = value.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    return {str(value.args[0].value)} if name == "require_module" else set()


def _module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    found: list[ast.stmt] = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        found.append(node)
        for field in ("body", "orelse", "finalbody", "handlers"):
            found += _module_level([n for n in getattr(node, field, []) if isinstance(n, ast.stmt)])
        for handler in getattr(node, "handlers", []):
            found += _module_level(handler.body)
    return found


def _source(module: str) -> Path | None:
    """The file of a dist_jobs or support module (a package's __init__.py), None for others."""
    top = module.split(".")[0]
    if top not in ROOTS:
        return None
    base = ROOTS[top].joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def file_needs_torch(path: Path) -> bool:
    """True when the file imports torch, at any depth through dist_jobs and support modules."""
    seen: set[Path] = set()
    stack = [path]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        for name in _imports(current):
            if name.split(".")[0] in TORCH_PACKAGES:
                return True
            source = _source(name)
            if source is not None:
                stack.append(source)
    return False

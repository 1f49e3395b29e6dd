"""The flight recorder's settings (dist_jobs.train.flight): on by default while a run trains, into
the attempt's folder of the run directory, the user's own choice (a size, 0 for off, another dump
path) kept, and the environment as it was afterwards. The trace a hang leaves is checked with the
real training: tests/integration/test_hang_local.py."""

from __future__ import annotations

from pathlib import Path

from dist_jobs.train import flight


def test_a_run_turns_the_recorder_on_aims_torchs_dumps_at_its_folder_and_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    """Afterwards nothing is left that a process started later (a notebook's local job) would
    inherit and take for the user's choice: its ranks would dump into this run's folder."""
    env: dict[str, str] = {"PATH": "/bin"}
    with flight.armed(tmp_path, "1234", 2, env):
        assert env == {
            "PATH": "/bin",
            "TORCH_FR_BUFFER_SIZE": str(flight.ENTRIES),
            "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "flight-recorder" / "1234-attempt2" / "rank"),
        }
        assert flight.recording(env)
    assert env == {"PATH": "/bin"}


def test_the_users_own_settings_win_and_a_size_of_0_is_off(tmp_path: Path) -> None:
    users = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_FR_DUMP_TEMP_FILE": "/scratch/fr_"}
    env = dict(users)
    with flight.armed(tmp_path, "", 0, env):
        assert env == users
        assert not flight.recording(env)
        assert flight.dump(0, "gloo", env) is None  # off: nothing to dump
    assert env == users
    assert flight.dump(0, "gloo", {"TORCH_FR_BUFFER_SIZE": "100"}) is None  # no prefix: nowhere to write
    assert not (tmp_path / flight.FOLDER).exists()


def test_without_a_run_directory_only_the_recorder_is_turned_on() -> None:
    env = {"TORCH_FR_BUFFER_SIZE": "500"}
    with flight.armed(None, "", 0, env):
        assert env == {"TORCH_FR_BUFFER_SIZE": "500"} and flight.recording(env)
    assert not flight.recording({"TORCH_FR_BUFFER_SIZE": "many"})
    assert not flight.recording({})


def test_a_second_run_in_the_same_process_aims_the_dumps_at_its_own_folder(tmp_path: Path) -> None:
    """A notebook's second fit(): what the first run set is not taken for the user's choice."""
    env: dict[str, str] = {}
    with flight.armed(tmp_path / "one", "", 0, env):
        pass
    with flight.armed(tmp_path / "two", "", 0, env):
        assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "two" / "flight-recorder" / "run-attempt0" / "rank")

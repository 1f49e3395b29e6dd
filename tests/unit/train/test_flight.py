"""The flight recorder's settings (dist_jobs.train.flight): on by default, into the attempt's folder
of the run directory, and the user's own choice (a size, 0 for off, another dump path) kept. The
trace a hang leaves is checked with the real training: tests/integration/test_hang_local.py."""

from __future__ import annotations

from pathlib import Path

from dist_jobs.train import flight


def test_arming_turns_the_recorder_on_and_aims_torchs_dumps_at_the_attempts_folder(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    flight.arm(tmp_path, "1234", 2, env)
    assert env == {
        "TORCH_FR_BUFFER_SIZE": str(flight.ENTRIES),
        "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "flight-recorder" / "1234-attempt2" / "rank"),
    }
    assert flight.recording(env)


def test_the_users_own_settings_win_and_a_size_of_0_is_off(tmp_path: Path) -> None:
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_FR_DUMP_TEMP_FILE": "/scratch/fr_"}
    flight.arm(tmp_path, "", 0, env)
    assert env == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_FR_DUMP_TEMP_FILE": "/scratch/fr_"}
    assert not flight.recording(env)
    assert flight.dump(0, "gloo", env) is None  # off: nothing to dump
    assert flight.dump(0, "gloo", {"TORCH_FR_BUFFER_SIZE": "100"}) is None  # no prefix: nowhere to write
    assert not (tmp_path / flight.FOLDER).exists()


def test_without_a_run_directory_only_the_recorder_is_turned_on() -> None:
    env = {"TORCH_FR_BUFFER_SIZE": "500"}
    flight.arm(None, "", 0, env)
    assert env == {"TORCH_FR_BUFFER_SIZE": "500"} and flight.recording(env)
    assert not flight.recording({"TORCH_FR_BUFFER_SIZE": "many"})
    assert not flight.recording({})


def test_a_second_run_in_the_same_process_aims_the_dumps_at_its_own_folder(tmp_path: Path) -> None:
    """A notebook's second fit(): what the first run set is not taken for the user's choice."""
    env: dict[str, str] = {}
    flight.arm(tmp_path / "one", "", 0, env)
    flight.arm(tmp_path / "two", "", 0, env)
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "two" / "flight-recorder" / "run-attempt0" / "rank")

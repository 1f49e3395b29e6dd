"""`dist-jobs submit|status|list|cancel|logs --backend k8s` against the stand-in apiserver, through a
kubeconfig file, the way a user runs them: output, exit codes, and errors without tracebacks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dist_jobs.cli import main
from dist_jobs.render import render
from dist_jobs.render.k8s import access_manifest
from dist_jobs.spec.load import load_spec
from support.k8s_offline.validate import crd_path
from support.kube_standin import TOKEN, FakeKubeAPI, untrusted_https, write_kubeconfig
from support.paths import PYTHON, REPO
from support.tiers import require_module
from support.waiting import HUNG_S

require_module("kubernetes")


SPEC = {
    "name": "cli-ddp",
    "nodes": 2,
    "gpus_per_node": 2,
    "cpus_per_task": 4,
    "memory": "32G",
    "image": "reg.example/train:1",
    "k8s": {"pvc": "ckpt"},
}
JOB, PLURAL = "cli-ddp", "pytorchjobs"
OP = "training.kubeflow.org/"


@pytest.fixture()
def api() -> Iterator[FakeKubeAPI]:
    with FakeKubeAPI([crd_path("PyTorchJob")]) as server:
        yield server


@pytest.fixture()
def kubeconfig(api: FakeKubeAPI, tmp_path: Path) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", api.url)


def write_spec(tmp_path: Path, **changes: Any) -> Path:
    path = tmp_path / f"job-{len(list(tmp_path.glob('job-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump({**SPEC, **changes}))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def k8s(verb: str, kubeconfig: Path, *rest: str) -> list[str]:
    return [verb, "--backend", "k8s", "--kubeconfig", str(kubeconfig), *rest]


def test_submit_prints_the_job_handle_and_uses_the_kubeconfig(
    capsys: pytest.CaptureFixture[str], api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path
) -> None:
    code, out, err = run(capsys, *k8s("submit", kubeconfig, str(write_spec(tmp_path))))
    assert (code, out, err) == (0, f"k8s://default/PyTorchJob/{JOB}\n", "")
    (post,) = [r for r in api.requests if r.method == "POST" and "pytorchjobs" in r.path]
    assert post.headers.get("authorization") == f"Bearer {TOKEN}"  # the kubeconfig's user
    assert post.query["fieldValidation"] == ["Strict"]
    assert (PLURAL, "default", JOB) in api.store


def test_submit_dry_run_prints_the_manifest_and_the_server_check(
    capsys: pytest.CaptureFixture[str], api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path)
    code, out, err = run(capsys, *k8s("submit", kubeconfig, "--dry-run", str(spec)))
    assert code == 0, err
    assert out == render(load_spec(spec), "k8s") + access_manifest(load_spec(spec))
    assert "server-side dry run: accepted by the apiserver" in err
    assert api.store == {}
    assert {str(r.query.get("dryRun")) for r in api.requests if r.method == "POST"} == {str(["All"])}


def test_submit_of_a_spec_kubernetes_would_refuse_exits_2_before_any_request(
    capsys: pytest.CaptureFixture[str], api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path
) -> None:
    """The stand-in (like the real apiserver) would answer 422 for this label key; the spec rules say it first."""
    spec = write_spec(tmp_path, k8s={"pvc": "ckpt", "labels": {"bad key!": "x"}})
    for extra in (["--dry-run"], []):
        code, out, err = run(capsys, *k8s("submit", kubeconfig, *extra, str(spec)))
        assert (code, out) == (2, "") and "k8s.labels (key)" in err and "'bad key!'" in err and "fix:" in err
    assert api.requests == []


def test_errors_exit_1_with_message_and_hint_and_no_traceback(
    capsys: pytest.CaptureFixture[str], kubeconfig: Path, tmp_path: Path
) -> None:
    spec = str(write_spec(tmp_path))
    assert run(capsys, *k8s("submit", kubeconfig, spec))[0] == 0
    code, out, err = run(capsys, *k8s("submit", kubeconfig, spec))
    assert (code, out) == (1, "")
    assert err.startswith(
        f'dist-jobs submit: create PyTorchJob default/{JOB}: pytorchjobs.kubeflow.org "{JOB}" '
        "already exists (409 AlreadyExists)"
    )
    assert "\n  hint: pick another --name" in err and "Traceback" not in err


def test_crd_not_installed_and_server_down_are_messages(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    spec = str(write_spec(tmp_path))
    with FakeKubeAPI([]) as bare:
        config = write_kubeconfig(tmp_path / "bare", bare.url)
        code, _, err = run(capsys, *k8s("submit", config, spec))
    assert code == 1 and "404 page not found" in err and "CRD is not installed" in err and "hint:" in err
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        down = write_kubeconfig(tmp_path / "down", f"http://127.0.0.1:{sock.getsockname()[1]}")
    code, _, err = run(capsys, *k8s("status", down, JOB))
    assert code == 1 and "cannot reach the Kubernetes apiserver" in err and "Traceback" not in err


def test_a_missing_kubeconfig_or_context_is_a_message(
    capsys: pytest.CaptureFixture[str], kubeconfig: Path, tmp_path: Path
) -> None:
    code, _, err = run(capsys, *k8s("list", tmp_path / "absent"))
    assert code == 1 and "cannot load kubeconfig" in err and "--kubeconfig" in err
    code, _, err = run(capsys, *k8s("list", kubeconfig, "--context", "nope"))
    assert code == 1 and "context nope" in err


def test_status_list_cancel(
    capsys: pytest.CaptureFixture[str], api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path
) -> None:
    run(capsys, *k8s("submit", kubeconfig, str(write_spec(tmp_path))))
    run(capsys, *k8s("submit", kubeconfig, str(write_spec(tmp_path, name="other-ddp"))))
    api.set_status(
        PLURAL,
        "default",
        JOB,
        {
            "conditions": [
                {"type": "Created", "status": "True"},
                {"type": "Running", "status": "True", "message": f"PyTorchJob {JOB} is running."},
            ],
            "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 1}},
        },
    )

    code, out, _ = run(capsys, *k8s("status", kubeconfig, JOB))
    assert code == 0
    assert out.splitlines() == [
        f"k8s://default/PyTorchJob/{JOB}  {JOB}  running (Running)  PyTorchJob {JOB} is running.",
        "  Master: active=1",
        "  Worker: active=1",
    ]
    code, out, _ = run(capsys, *k8s("status", kubeconfig, "--json", JOB))
    assert json.loads(out) == {
        "handle": f"k8s://default/PyTorchJob/{JOB}",
        "name": JOB,
        "state": "running",
        "word": "Running",
        "detail": f"PyTorchJob {JOB} is running.",
        "ranks": {},
        "extra": {"Master": "active=1", "Worker": "active=1"},
        "progress": None,  # its run directory (/shared/checkpoints/...) is not on this machine
        "goodput": None,  # nor its ledger
        "attempts": [],
    }

    code, out, _ = run(capsys, *k8s("list", kubeconfig))
    assert code == 0
    assert [line.split()[:4] for line in out.splitlines()] == [
        ["HANDLE", "NAME", "STATE", "SCHEDULER"],
        [f"k8s://default/PyTorchJob/{JOB}", JOB, "running", "Running"],
        ["k8s://default/PyTorchJob/other-ddp", "other-ddp", "pending", "Pending"],
    ]

    assert run(capsys, *k8s("cancel", kubeconfig, JOB))[:2] == (0, f"cancelled k8s://default/PyTorchJob/{JOB}\n")
    code, out, err = run(capsys, *k8s("status", kubeconfig, JOB))
    assert (code, out) == (1, "") and f'"{JOB}" not found (404 NotFound)' in err and "hint:" in err


def test_namespace_comes_from_the_flag_or_the_kubeconfig_context(
    capsys: pytest.CaptureFixture[str], kubeconfig: Path, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, k8s={"pvc": "ckpt", "namespace": "ml"})
    assert run(capsys, *k8s("submit", kubeconfig, str(spec)))[:2] == (0, f"k8s://ml/PyTorchJob/{JOB}\n")
    assert run(capsys, *k8s("status", kubeconfig, JOB))[0] == 1  # current context: namespace default
    assert run(capsys, *k8s("status", kubeconfig, "--namespace", "ml", JOB))[0] == 0
    code, out, _ = run(capsys, *k8s("status", kubeconfig, "--context", "team-ml", JOB))
    assert code == 0 and out.startswith(f"k8s://ml/PyTorchJob/{JOB}  {JOB}  pending (Pending)")


def test_logs_print_every_rank_prefixed_and_one_rank_bare(
    capsys: pytest.CaptureFixture[str], api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path
) -> None:
    """As on the local and SLURM backends: every rank's lines `[rank N] ...`, --rank N its own."""
    spec = write_spec(tmp_path, gpus_per_node=1, k8s={"pvc": "ckpt", "launch": "direct"})
    run(capsys, *k8s("submit", kubeconfig, str(spec)))
    for rtype, index, text in (("master", 0, "rank 0 here\n"), ("worker", 0, "rank 1 here\nepoch 1 done")):
        name = f"{JOB}-{rtype}-{index}"
        api.pods[("default", name)] = {
            "metadata": {"labels": {f"{OP}job-name": JOB, f"{OP}replica-type": rtype, f"{OP}replica-index": str(index)}}
        }
        api.pod_logs[("default", name)] = text
    code, out, err = run(capsys, *k8s("logs", kubeconfig, "--rank", "1", JOB))
    assert (code, out, err) == (0, "rank 1 here\nepoch 1 done\n", "")
    all_ranks = "[rank 0] rank 0 here\n[rank 1] rank 1 here\n[rank 1] epoch 1 done\n"
    assert run(capsys, *k8s("logs", kubeconfig, JOB))[1] == all_ranks
    code, _, err = run(capsys, *k8s("logs", kubeconfig, "--rank", "5", JOB))
    assert code == 1 and "no pod with rank 5" in err


def test_the_installed_entry_point_in_a_subprocess(api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path) -> None:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONPATH": str(REPO)}
    spec = str(write_spec(tmp_path))

    def dj(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PYTHON, "-m", "dist_jobs", *argv], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=HUNG_S
        )

    ok = dj("submit", "--backend", "k8s", spec)  # $KUBECONFIG, as kubectl reads it
    assert (ok.returncode, ok.stdout) == (0, f"k8s://default/PyTorchJob/{JOB}\n"), ok.stderr
    again = dj("submit", "--backend", "k8s", spec)
    assert again.returncode == 1 and "409 AlreadyExists" in again.stderr
    assert "Traceback" not in again.stderr and again.stdout == ""


def test_a_trainjob_is_found_by_its_handle_everywhere_a_pytorchjob_is(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with FakeKubeAPI([crd_path("PyTorchJob"), crd_path("TrainJob")]) as server:
        config = write_kubeconfig(tmp_path / "kubeconfig", server.url)
        spec = write_spec(tmp_path, name="tj", k8s={"pvc": "ckpt", "api": "trainjob"})
        code, out, err = run(capsys, *k8s("submit", config, str(spec)))
        assert (code, out) == (0, "k8s://default/TrainJob/tj\n"), err
        handle = out.strip()
        # Before handles, `status tj` looked for a PyTorchJob: 404. The handle carries the kind.
        code, out, err = run(capsys, "status", "--kubeconfig", str(config), "-o", "json", handle)
        assert code == 0 and json.loads(out)["handle"] == handle, err
        assert json.loads(out)["state"] == "pending"
        code, out, _ = run(capsys, *k8s("list", config))
        assert code == 0 and out.splitlines()[1].split()[:3] == [handle, "tj", "pending"]
        assert run(capsys, "cancel", "--kubeconfig", str(config), handle)[:2] == (0, f"cancelled {handle}\n")
        assert ("trainjobs", "default", "tj") not in server.store


CONTAINER = {"image": "reg.example/train:1", "imageID": "", "ready": False, "restartCount": 0}  # required fields


def test_status_names_the_rank_that_failed_first_from_container_statuses(
    capsys: pytest.CaptureFixture[str], api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path
) -> None:
    run(capsys, *k8s("submit", kubeconfig, str(write_spec(tmp_path))))
    api.set_status(PLURAL, "default", JOB, {"conditions": [{"type": "Failed", "status": "True", "message": "x"}]})
    ends = {
        ("master", 0): {"terminated": {"exitCode": 143, "reason": "Error", "finishedAt": "2026-11-24T09:00:09Z"}},
        ("worker", 0): {"terminated": {"exitCode": 3, "reason": "Error", "finishedAt": "2026-11-24T09:00:05Z"}},
        ("worker", 1): {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-11-24T09:00:07Z"}},
    }
    for (rtype, index), state in ends.items():
        labels = {f"{OP}job-name": JOB, f"{OP}replica-type": rtype, f"{OP}replica-index": str(index)}
        api.pods[("default", f"{JOB}-{rtype}-{index}")] = {
            "metadata": {"labels": labels},
            "status": {"phase": "Failed", "containerStatuses": [{"name": "pytorch", "state": state, **CONTAINER}]},
        }
    code, out, err = run(capsys, *k8s("status", kubeconfig, "-o", "json", JOB))
    got = json.loads(out)
    assert code == 0 and got["state"] == "failed", err
    assert got["detail"] == "rank 1 failed first: exit 3; x"
    assert got["ranks"] == {
        "0": "killed by SIGTERM (exit 143)",
        "1": "exit 3",
        "2": "killed by SIGKILL (exit 137) (OOMKilled)",
    }


def test_an_https_server_that_is_no_apiserver_is_named_so_without_urllib3_warnings(tmp_path: Path) -> None:
    """An HTML 404 was reported as "the PyTorchJob CRD is not installed" quoting "404 page not found",
    which that server never sent; insecure-skip-tls-verify printed InsecureRequestWarning on stderr."""
    import http.server

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            page = b"<!DOCTYPE html><html><body><h1>Not Found</h1></body></html>"
            self.send_response(404)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: Any) -> None:
            pass

    with untrusted_https(tmp_path, NotFound) as url:
        config = write_kubeconfig(tmp_path / "kubeconfig", url)
        doc = yaml.safe_load(config.read_text())
        doc["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = True
        config.write_text(yaml.safe_dump(doc))
        proc = subprocess.run(
            [PYTHON, "-m", "dist_jobs", "status", "k8s://ml/TrainJob/tj", "--kubeconfig", str(config)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=HUNG_S,
        )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "answered HTTP 404 with an HTML page: it is not a Kubernetes apiserver" in proc.stderr, proc.stderr
    assert "CRD" not in proc.stderr and "404 page not found" not in proc.stderr
    assert "Warning" not in proc.stderr, proc.stderr

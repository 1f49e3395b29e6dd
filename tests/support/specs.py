"""Spec data the tests share, as plain dicts for `load_spec(data=...)` or a job YAML.

A test that needs a variation writes `{**K8S_SEED, "name": ...}` or passes fields to a builder;
nothing here is changed in place, so one test cannot change another's data.
"""

from __future__ import annotations

from typing import Any

# The seed example's job (resnet50-ddp: 2 nodes x 4 GPUs), as the render tests write it per backend.
SEED: dict[str, Any] = {"name": "resnet50-ddp", "nodes": 2, "gpus_per_node": 4, "cpus_per_task": 8, "memory": "256G"}
K8S_SEED: dict[str, Any] = {**SEED, "image": "reg.example/train:1", "k8s": {"pvc": "ckpt"}}
SLURM_SEED: dict[str, Any] = {**SEED, "time": "4:00:00", "slurm": {"partition": "gpu", "account": "ml"}}


def tiny_train(**fields: Any) -> dict[str, Any]:
    """`train:` for the tiny conv net of support/workloads.py on 16 px fake images: 32 samples,
    batch 4 per rank, one epoch, on CPU, a log line every step, no progress bar.

    `fields` change or add keys; a field given as None is left out (the trainer's default applies).
    """
    train = {
        "model": "support.workloads:tiny_net",
        "data": "fake",
        "image_size": 16,
        "fake_samples": 32,
        "batch_size": 4,
        "epochs": 1,
        "device": "cpu",
        "progress": False,
        "log_every": 1,
        **fields,
    }
    return {key: value for key, value in train.items() if value is not None}


# A run long enough to preempt and resume bit-identically: 128 samples, 3 epochs, deterministic,
# a checkpoint every 4 steps (with 4 ranks: 8 steps an epoch, 24 in all).
PREEMPTIBLE_TRAIN = tiny_train(
    fake_samples=128, epochs=3, lr=0.05, deterministic=True, seed=5, checkpoint_every_steps=4
)


# The pod tests' training (the operator harness and the real pods): the tests' own small model,
# which the pods import from this checkout's tests/ on their python path (the real-pods image mounts
# the checkout). What is under test is the pods' lifecycle; torchvision's resnet18 would cost every
# rank seconds of CPU to import and every step an all-reduce of 11 M parameters. 64 samples / (4
# ranks x 8) = 2 steps an epoch, a checkpoint every step.
POD_TRAIN: dict[str, Any] = {
    "model": "support.workloads:tiny_net",
    "image_size": 8,
    "fake_samples": 64,
    "epochs": 2,
    "batch_size": 8,
    "checkpoint_every_steps": 1,
}


def paced(data: dict[str, Any], steps: int, seconds: float) -> dict[str, Any]:
    """A pod test's `data` (POD_TRAIN) as a job of `steps` steps (2 ranks x 8 samples each), a
    checkpoint every 4, that is still running when the test acts on it: tiny_net sleeps `seconds`
    in each training forward (wall time, no CPU). One rank per pod: the faults these tests make
    are the pods'."""
    data["procs_per_node"] = 1
    data["train"].update(fake_samples=16 * steps, epochs=1, eval_every_epoch=False, checkpoint_every_steps=4)
    data["env"]["DJ_TEST_STEP_DELAY"] = str(seconds)
    return data


def direct_pods_spec(
    name: str, env: dict[str, str], args: list[str], ckpt: str, workdir: str, labels: dict, annotations: dict
) -> dict[str, Any]:
    """A 2-pod PyTorchJob, one python per pod (`launch: direct`) running `t.py ARGS`, from the
    values the property tests draw; checkpoint_dir and workdir are made absolute."""
    return {
        "name": name,
        "nodes": 2,
        "procs_per_node": 1,
        "image": "img:1",
        "env": env,
        "command": ["python3", "t.py", *args],
        "checkpoint_dir": "/" + ckpt,
        "workdir": "/" + workdir,  # a container's working directory is absolute (k8s_rules)
        "k8s": {"labels": labels, "annotations": annotations, "launch": "direct"},
    }

"""The built-in optimizers: fused kernels where torch has them, kept across a resume."""

from __future__ import annotations

import pytest
import torch

from dist_jobs.spec.train import TrainConfig
from dist_jobs.train import models
from dist_jobs.train.resume import _keeping_implementation


def _fused_on_cpu() -> bool:
    try:
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1, fused=True)
    except (TypeError, RuntimeError, ValueError):
        return False
    return True


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_built_in_optimizers_are_fused_where_torch_can(name: str) -> None:
    model = torch.nn.Linear(4, 2)
    optimizer = models.build_optimizer(TrainConfig(optimizer=name), model, world_size=1)
    assert optimizer.param_groups[0]["fused"] is (True if _fused_on_cpu() else None)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()  # and it steps


def test_a_checkpoint_of_another_implementation_resumes_in_this_one() -> None:
    if not _fused_on_cpu():
        pytest.skip("this torch has no fused CPU kernels")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    plain = torch.optim.AdamW(model.parameters(), lr=1e-2)  # what an older dist-jobs saved
    model(torch.randn(3, 4)).sum().backward()
    plain.step()
    saved = plain.state_dict()
    fused = models.build_optimizer(TrainConfig(optimizer="adamw", lr=1e-2), model, world_size=1)
    fused.load_state_dict(_keeping_implementation(fused, saved))
    assert fused.param_groups[0]["fused"] is True and saved["param_groups"][0].get("fused") is None
    model(torch.randn(3, 4)).sum().backward()
    fused.step()  # the loaded step count sits where the fused kernel wants it
    assert fused.state_dict()["state"][0]["step"].item() == 2

    # and the other way: a fused checkpoint resumed where this optimizer is the plain loop
    plain2 = torch.optim.AdamW(model.parameters(), lr=1e-2)
    plain2.load_state_dict(_keeping_implementation(plain2, fused.state_dict()))
    assert plain2.param_groups[0].get("fused") is None
    plain2.step()

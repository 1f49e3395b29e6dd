"""Metrics summed where they are computed, reduced across ranks only when someone reads them.

`Meter.add` never calls .item(): on a GPU that would wait for the step to finish and stall
the pipeline every step. `Meter.reduce` (at log intervals and epoch ends, on every rank: it is
a collective) does one all_reduce and returns the same numbers on every rank.
Only rank 0 reports: log lines, a tqdm bar, TensorBoard scalars.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from dist_jobs.errors import UsageError
from dist_jobs.train.batches import LossFn, batch_size, call_loss, to_device
from dist_jobs.train.distributed import all_reduce

log = logging.getLogger("dist_jobs.train")
# Metrics that are totals (and get a rate), not means per sample.
SUMMED = frozenset({"tokens"})


class Meter:
    """Running loss, metrics and throughput of one phase (an epoch, an evaluation).

    Metrics are means per sample (each batch weighted by its size), except `tokens`, a total.
    Every rank must report the same metric names: they are summed across ranks in one tensor.
    `reduce()` covers the whole phase (an epoch's summary); `interval()` covers what was added
    since the last `interval()` (a log row), so a row's loss is the loss of its own steps: the
    curve has no step at an epoch's start, and none where a resumed run begins again.
    """

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._names: list[str] = []
        self._sums: torch.Tensor | None = None
        self._count = 0
        self._start = time.perf_counter()
        self._mark: tuple[torch.Tensor | None, int, float] = (None, 0, self._start)  # the last interval's end

    @torch.no_grad()
    def add(self, samples: int, values: Mapping[str, torch.Tensor | float]) -> None:
        if self._sums is None:
            self._names = list(values)
            self._sums = torch.zeros(len(self._names), dtype=torch.float64, device=self._device)
        elif list(values) != self._names:
            raise UsageError(
                f"the loss function's metrics changed from {self._names} to {list(values)}",
                hint="return the same metric names for every batch",
            )
        weights = [1.0 if name in SUMMED else float(samples) for name in self._names]
        row = [
            torch.as_tensor(values[n], dtype=torch.float64, device=self._device).detach().reshape(()) * w
            for n, w in zip(self._names, weights)
        ]
        self._sums += torch.stack(row)
        self._count += samples

    def reduce(self) -> dict[str, float]:
        """Totals of the whole phase over all ranks; a collective, so every rank must call it at
        the same point."""
        return self._reduced(self._sums, self._count, time.perf_counter() - self._start)

    def interval(self) -> dict[str, float]:
        """Totals since the last interval() (or the start) over all ranks; a collective too."""
        now = time.perf_counter()
        sums, count, since = self._mark
        delta = self._sums if sums is None or self._sums is None else self._sums - sums
        self._mark = (None if self._sums is None else self._sums.clone(), self._count, now)
        return self._reduced(delta, self._count - count, now - since)

    def _reduced(self, sums: torch.Tensor | None, count: int, elapsed: float) -> dict[str, float]:
        if sums is None:
            sums = torch.zeros(0, dtype=torch.float64, device=self._device)
        extra = torch.tensor([count, elapsed], dtype=torch.float64, device=self._device)
        packed = torch.cat((sums, extra))
        all_reduce(packed)
        *totals, samples, elapsed_sum = packed.tolist()
        mean_elapsed = elapsed_sum / dist.get_world_size()
        result: dict[str, float] = {}
        for name, total in zip(self._names, totals):
            result[name] = total if name in SUMMED else total / max(samples, 1.0)
            if name in SUMMED:
                result[f"{name}_per_s"] = total / mean_elapsed if mean_elapsed > 0 else 0.0
        result["samples"] = samples
        result["samples_per_s"] = samples / mean_elapsed if mean_elapsed > 0 else 0.0
        return result


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Any,
    loss_fn: LossFn,
    device: torch.device,
    autocast: Callable[[], AbstractContextManager[Any]],
    on_batch: Callable[[], None] | None = None,
) -> dict[str, float]:
    """The loss function's loss and metrics over the held-out set, reduced over ranks (a collective).

    Pass the unwrapped model: DDP's forward would broadcast buffers and expect every rank to
    run the same number of batches, which an unpadded evaluation split does not promise.
    `on_batch` is called after each batch (the hang watchdog's touch: evaluating is progress).
    """
    model.eval()
    meter = Meter(device)
    for raw in loader:
        batch = to_device(raw, device)
        with autocast():
            loss, values = call_loss(loss_fn, model, batch)
        meter.add(batch_size(batch), {"loss": loss, **values})
        if on_batch is not None:
            on_batch()
    model.train()
    result = meter.reduce()
    return {f"eval_{k}": v for k, v in result.items() if k not in ("samples", "samples_per_s")}


class Reporter:
    """Rank 0's voice. On other ranks every method does nothing (cheaply)."""

    def __init__(
        self,
        *,
        enabled: bool,
        progress: bool,
        tensorboard_dir: Path | None,
        total_steps: int,
        holds: Callable[[str], bool] = lambda doing: True,
    ) -> None:
        self.enabled = enabled
        self._holds = holds  # the run directory's guard (runlock.Guard.holds): TensorBoard writes there
        self._progress = progress
        self._tensorboard_dir = tensorboard_dir
        self._total = total_steps
        self._bar: Any = None
        self._writer: Any = None
        self._stack = contextlib.ExitStack()

    def start(self, step: int) -> Reporter:
        """Open the bar (at `step`, where a resumed run begins) and TensorBoard: use with `with`."""
        if self.enabled:
            self._bar = _progress_bar(self._progress, self._total, step)
            self._writer = _tensorboard(self._tensorboard_dir) if self._tensorboard_dir else None
        return self

    def __enter__(self) -> Reporter:
        if self._bar is not None:
            from tqdm.contrib.logging import logging_redirect_tqdm  # a bar exists: tqdm is installed

            # Log lines go through tqdm.write, so the bar does not garble them.
            self._stack.enter_context(logging_redirect_tqdm())
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._stack.close()
        if self._bar is not None:
            self._bar.close()
        if self._writer is not None:
            self._writer.close()
        self._bar = self._writer = None

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.update()

    def report(self, step: int, section: str, values: dict[str, float], title: str) -> None:
        """One log line ('step 40/100 epoch 1 train: loss 2.3 ...'); scalars under `section/`."""
        if not self.enabled:
            return
        log.info("%s: %s", title, " ".join(f"{k} {v:.6g}" for k, v in values.items()))
        if self._bar is not None and "loss" in values:
            self._bar.set_postfix(loss=f"{values['loss']:.4g}", refresh=False)
        if self._writer is not None and self._holds("write TensorBoard scalars"):
            for key, value in values.items():
                self._writer.add_scalar(f"{section}/{key}", value, step)


def _progress_bar(wanted: bool, total: int, start: int) -> Any:
    # A terminal only: in a job log (a file, the local launcher's pipe) each redraw is a
    # carriage-return fragment that `dist-jobs logs` would show as a line of its own, between
    # the log lines; progress.json (`dist-jobs status`) tells the progress there.
    if not (wanted and sys.stderr.isatty()):
        return None
    try:
        from tqdm import tqdm  # optional: no bar without it
    except ImportError:
        return None
    return tqdm(total=total, initial=start, unit="step", dynamic_ncols=True, mininterval=0.1, file=sys.stderr)


def _tensorboard(directory: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter  # optional: needs the tensorboard package
    except ImportError:
        log.warning(
            "tensorboard: the tensorboard package is not installed, so no event files "
            "are written (pip install tensorboard)"
        )
        return None
    directory.mkdir(parents=True, exist_ok=True)
    return SummaryWriter(log_dir=str(directory))

"""What a worker runs for one cell (`run_cell`), whichever executor placed it, and what comes
back up its progress channel: progress reports, resume checkpoints (`ResumePoint`) and, for a
search's pruner, questions (`Evaluation`), which every executor keeps for the driver
(`ResumePoints`)."""

from __future__ import annotations

import io
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ablations.grid.cell import Cell
from ablations.grid.plugins import import_plugins
from ablations.results.store import error_summary
from ablations.run.devices import attempted_device
from ablations.run.provenance import entry_point_packages
from ablations.run.resume import ResumePlan, ResumePoint, loaded_record
from ablations.run.train import CellOutcome, environment, train_cell


class CellInterrupted(BaseException):
    """Raised in a training thread (by its progress report or a module call) when the run is
    stopping; not an Exception, so `run_cell` does not record it as the cell's failure."""


@dataclass(frozen=True)
class Evaluation:
    """A cell's question to the driver at an evaluation: should it stop here (pruned)?"""

    key: str
    step: int
    val_loss: float
    val_metric: float


def _saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def run_cell(
    cell: Cell,
    threads: int,
    progress=None,
    keep_state: bool = False,
    device: str | None = None,
    imports: Sequence[str] = (),
    resume: ResumePlan | None = None,
    ask=None,
) -> CellOutcome:
    """Train `cell` here with `threads` torch threads, on `device` (the GPU an executor placed
    it on; default: the cell's device resolved here), after importing the grid's plugins
    (`imports`, ablations.grid.plugins: once per process); never raises. With `ask`, the cell calls
    `ask(Evaluation(...))` at each evaluation after which it would train on, and stops there as
    `pruned` when it returns true (ablations.run.train.train_cell's `should_prune`).

    With `keep_state` (a grid that keeps checkpoints) the outcome carries the trained weights
    and, for a finished cell, the attention maps of the trained model
    (`ablations.run.train.attention_record`), and why recording them failed if it did.
    `progress.put((key, step, loss))` is called at each evaluation when a queue is given, and
    `progress.put(ResumePoint(...))` with each resume checkpoint `resume` asks for (and the
    cell starts from its checkpoint, if any, made from the code and plugins of the plan's
    `sources`, the driver's record: ablations.run.resume); best-effort: a put that fails
    ends the reporting, never the cell. `CellInterrupted` (not an Exception) passes through.
    The outcome's environment records, as "loaded_plugin_files", a digest of each file of the
    run's plugins (`_plugins`) by the cell's end: their code and data, helpers they import
    from other folders and modules loaded from theirs however they were imported
    (ablations.run.resume.loaded_record)."""
    torch.set_num_threads(threads)
    key = cell.key

    def send(item) -> None:
        nonlocal progress
        if progress is None:
            return
        try:
            progress.put(item)
        except Exception:  # the progress channel is gone (a dead Ray actor): train on without
            progress = None

    placed = {} if device is None else {"device": device}
    if ask is not None:
        placed["should_prune"] = lambda step, loss, metric: ask(Evaluation(key, step, loss, metric))
    try:
        import_plugins(imports)
        result = train_cell(
            cell,
            on_progress=lambda step, loss: send((key, step, loss)),
            keep_state=keep_state,
            keep_maps=keep_state,
            **placed,
            resume=resume,
            on_checkpoint=lambda step, data: send(ResumePoint(key, step, data)),
        )
        result.environment["loaded_plugin_files"] = loaded_record(_plugins(imports, resume))
    except Exception:
        setting = cell.training.device
        where = environment(attempted_device(setting, device))
        return CellOutcome("failed", where, error=traceback.format_exc())
    outcome = CellOutcome(result.status, result.environment, result.metrics, result.curve)
    outcome.notes = result.notes
    if result.state is not None:
        outcome.state = _saved(result.state)
    if result.maps is not None:
        outcome.maps = _saved(result.maps)
        if result.maps.get("error"):
            outcome.maps_error = error_summary(result.maps["error"])
    return outcome


def _plugins(imports: Sequence[str], resume: ResumePlan | None) -> list[str]:
    """The names of the plugins of a cell's run: those of the driver's record, where the
    resume plan holds it (`ResumePlan.sources`; a thread worker in the driver's process is
    given no `imports`), else `imports` and the installed entry-point plugins' packages."""
    if resume is not None and resume.sources is not None:
        return list(resume.sources["plugins"])
    return [*imports, *entry_point_packages()]


def run_cell_options(device: str | None, resume: ResumePlan | None, ask=None) -> dict:
    """The keyword arguments of run_cell that an executor gives only when set: a device when
    it placed the cell on a GPU, a resume plan when the driver gave one, `ask` when the cell
    asks whether to stop."""
    given = {} if device is None else {"device": device}
    given.update({k: v for k, v in (("resume", resume), ("ask", ask)) if v is not None})
    return given


class ResumePoints:
    """What an executor does with the resume checkpoints (`ResumePoint`) and questions
    (`Evaluation`) that come up its progress channel: keeps them for `resume_points` and
    `questions`."""

    points: list[ResumePoint]
    asked: list[Evaluation]

    def _progress_only(self, events: list) -> list:
        """`events` without its resume checkpoints and questions, which are kept."""
        self.points += [event for event in events if isinstance(event, ResumePoint)]
        self.asked += [event for event in events if isinstance(event, Evaluation)]
        return [event for event in events if not isinstance(event, ResumePoint | Evaluation)]

    def questions(self) -> list[Evaluation]:
        """The questions of cells that wait for `answer` (`drain` takes them in)."""
        asked, self.asked = self.asked, []
        return asked

    def resume_points(self) -> list[ResumePoint]:
        """The resume checkpoints that came up since the last call (`drain` takes them in)."""
        points, self.points = self.points, []
        return points

"""What a grid run shows while it trains: each finished cell, the cells done, failed and running,
each running cell's step and loss, and an ETA.

    progress = make_progress(todo, total=len(cells), slots=pool.slots, interval=10.0)
    progress.started(key, cell); progress.step(key, step, loss); progress.finished(key, outcome)
    progress.tick()      # in the driver loop: a status line every `interval` s, or a redraw
    progress.close()     # ends a live display (the lines printed so far stay)

On a terminal (`out` is a TTY that rich can draw on) it is `LiveProgress`: a rich live view
redrawn in place under the lines of the finished cells:

    done     same_pair/xs/std/seed0: test_acc 0.719 in 600 steps (13s)
    ━━━━━╺━━━━━━━━━━━━━━━━━━━━━━━━  1/6 finished · 2 running · 0 failed · 0 diverged · ETA 26s
    running cell             progress                  step    loss   time
    ──────────────────────────────────────────────────────────────────────
    same_pair/xs/std/seed1   ━━━━━━━━━━━━━━━━━━━╺   580/600   0.051    13s
    same_pair/xs/std/seed2   ╸━━━━━━━━━━━━━━━━━━━    20/600   0.890     0s

Elsewhere (a pipe, a file, CI logs, tests) it is `Progress`: plain lines, the finished cells'
and every `interval` seconds one status line,

    done     same_pair/xs/std/seed0: test_acc 0.719 in 600 steps (13s)
    [1/6 finished, 2 running, 0 failed, 0 diverged, ETA 26s] same_pair/xs/std/seed1 step 580
    loss 0.051; same_pair/xs/std/seed2 step 20 loss 0.890

(one line). Both end with that status line. The ETA sums each unfinished cell's expected time
(the mean of finished cells of its task, size and mechanism; else of its task; else of all),
less the running cells' time so far, over the worker slots.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from ablations.grid.cell import Cell
from ablations.labels import terminal_text
from ablations.results.store import error_summary
from ablations.run.train import CellOutcome
from ablations.steps import duration, is_terminal

if TYPE_CHECKING:
    from rich.console import Console

STYLES = {  # the first word of a printed line -> its style on a terminal
    "done": "green",
    "failed": "bold red",
    "diverged": "yellow",
    "pruned": "yellow",
    "released": "magenta",
    "skipped": "dim",
    "dropped": "magenta",
    "note:": "cyan",
    "interrupted": "bold",
}
COUNTED = ("done", "failed", "diverged")  # a run's counts always have these (results/store.py)
REDRAW = 0.25  # seconds between redraws of a live display
LIVE_COLUMNS = 52  # characters of the live table's other columns (bar, step, loss, time)


def cell_label(cell: Cell) -> str:
    """'task/size/mechanism/seed0', with its swept keys' values before the seed
    ('.../lr=0.003/seed0': the key's last part); labels and values as `terminal_text` shows
    them (escape sequences escaped, at most 60 characters each)."""
    swept = [f"{key.rsplit('.', 1)[-1]}={terminal_text(cell.setting(key))}/" for key in cell.swept]
    parts = (cell.task, cell.size["label"], cell.mechanism)  # a user's: shown safe and short
    task, size, mechanism = (terminal_text(part) for part in parts)
    return f"{task}/{size}/{mechanism}/{''.join(swept)}seed{cell.seed}"


def fit_label(label: str, width: int) -> str:
    """`label` ('task/size/mechanism/lr=0.003/seed0') in at most `width` characters: its
    leading parts give way first ('…/mechanism/lr=0.003/seed0'), so the parts that tell
    cells of one kind apart (mechanism, swept values, seed) stay readable."""
    if len(label) <= width:
        return label
    parts = label.split("/")
    for first in range(1, len(parts)):
        tail = "…/" + "/".join(parts[first:])
        if len(tail) <= width:
            return tail
    return "…" + label[-(max(width, 2) - 1) :]


def cell_kind(cell: Cell) -> tuple[str, str, str]:
    """(task, size, mechanism) labels: cells of one kind take about as long."""
    return (cell.task, cell.size["label"], cell.mechanism)


@dataclass
class Running:
    """A cell being trained: its label and kind, when it started, its steps (of `steps`) and
    the training loss at its last evaluation."""

    label: str
    kind: tuple[str, str, str]
    started: float
    steps: int
    step: int = 0
    loss: float = math.nan


class Progress:
    """Plain lines: each finished (or skipped, released) cell as it comes back, and every
    `interval` seconds a status line with the cells finished, running, failed and diverged,
    the ETA, and each running cell's step and loss. `counts` are this run's outcomes (done,
    failed, diverged; pruned once a cell is). `expect` adds cells to come (a search's next
    trials)."""

    def __init__(
        self, todo: list[Cell], total: int, slots: int, interval: float, out: TextIO | None = None
    ) -> None:
        self.total, self.already = total, total - len(todo)
        self.slots, self.interval = slots, interval
        self.out = sys.stdout if out is None else out  # (sys.stdout as it is now)
        self.pending = Counter(cell_kind(cell) for cell in todo)
        self.counts = dict.fromkeys(COUNTED, 0)
        self.running: dict[str, Running] = {}
        self.durations: dict[tuple, list[float]] = {}
        self.last = time.monotonic()

    # Events -------------------------------------------------------------------------------

    def print(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def expect(self, cells: list[Cell]) -> None:
        """`cells` more to train in this run."""
        self.total += len(cells)
        self.pending.update(cell_kind(cell) for cell in cells)

    def started(self, key: str, cell: Cell) -> None:
        self.pending[cell_kind(cell)] -= 1
        steps = cell.training.steps
        self.running[key] = Running(cell_label(cell), cell_kind(cell), time.monotonic(), steps)

    def step(self, key: str, step: int, loss: float) -> None:
        if key in self.running:
            self.running[key].step, self.running[key].loss = step, loss

    def finished(self, key: str, outcome: CellOutcome) -> None:
        """A cell recorded as done, failed, diverged or pruned: counted and printed."""
        cell = self.running.pop(key)
        seconds = time.monotonic() - cell.started
        self.durations.setdefault(cell.kind, []).append(seconds)
        status = outcome.status
        self.counts[status] = self.counts.get(status, 0) + 1
        metrics = outcome.metrics or {}
        if status == "done":
            what = f"test_acc {metrics['test_acc']:.3f} in {metrics['steps']} steps"
        elif status in ("diverged", "pruned"):
            what = f"at step {metrics[f'{status}_at']}"
        else:
            what = error_summary(outcome.error)
        self.print(f"{status:8s} {cell.label}: {what} ({duration(seconds)})")

    def skipped(self, cell: Cell) -> None:
        """A cell not claimed: finished meanwhile, or held by another live run."""
        self.pending[cell_kind(cell)] -= 1
        self.print(f"skipped  {cell_label(cell)}: finished or held by another run")

    def released(self, key: str, error: str | None) -> None:
        """A running cell lost by the executor (not its own error), given back unrecorded."""
        cell = self.running.pop(key)
        self.print(
            f"released {cell.label}: {error_summary(error)} "
            "(lost by the executor, not the cell's error; the next run trains it)"
        )

    def dropped(self, key: str, reason: object) -> None:
        """A running cell whose outcome could not be recorded (its claim was taken over)."""
        self.running.pop(key, None)
        self.print(f"dropped: {reason}")

    def note(self, text: str) -> None:
        self.print(f"note: {text}")

    # The status line and its ETA ----------------------------------------------------------

    def expected(self, kind: tuple) -> float | None:
        """Mean seconds of finished cells like `kind`: same kind, else same task, else any."""
        for like in (lambda k: k == kind, lambda k: k[0] == kind[0], lambda k: True):
            times = [t for k, ts in self.durations.items() if like(k) for t in ts]
            if times:
                return sum(times) / len(times)
        return None

    def eta(self) -> str:
        if not self.durations or not (self.running or sum(self.pending.values())):
            return "-"
        now = time.monotonic()
        left = sum(self.expected(kind) * n for kind, n in self.pending.items() if n)
        left += sum(
            max(0.0, self.expected(cell.kind) - (now - cell.started))
            for cell in self.running.values()
        )
        return duration(left / self.slots)

    def finished_count(self) -> int:
        """Cells of the grid finished: before this run, and by it."""
        return self.already + sum(self.counts.values())

    def status_line(self) -> str:
        running = "; ".join(
            f"{cell.label} step {cell.step} loss {cell.loss:.3f}"
            if cell.step
            else f"{cell.label} starting"
            for cell in self.running.values()
        )
        return (
            f"[{self.finished_count()}/{self.total} finished, {len(self.running)} running, "
            f"{self.counts['failed']} failed, {self.counts['diverged']} diverged, "
            f"ETA {self.eta()}] {running}"
        )

    def tick(self) -> None:
        """In the driver loop: the status line, once every `interval` seconds."""
        if time.monotonic() - self.last >= self.interval:
            self.last = time.monotonic()
            self.print(self.status_line())

    def close(self) -> None:
        """The run is over: nothing more is drawn in place (plain lines: nothing to do)."""

    def abandon(self) -> None:
        """From a signal handler, just before the process exits at once: leave the terminal
        usable (no buffered writes here: only os.write)."""


class LiveProgress(Progress):
    """`Progress` drawn with rich on a terminal: the printed lines scroll above a live view
    (an overall bar with the counts and ETA, and a table of the running cells: a bar of its
    steps, step, loss and time) redrawn in place at each `tick`, at most every `REDRAW` s;
    `interval` is not used. `close` takes the view away; the lines printed stay."""

    def __init__(
        self,
        todo: list[Cell],
        total: int,
        slots: int,
        interval: float,
        out: TextIO | None = None,
        console: Console | None = None,
    ) -> None:
        from rich.console import Console
        from rich.live import Live

        super().__init__(todo, total, slots, interval, out)
        self.console = console or Console(file=self.out)
        self.live = Live(console=self.console, auto_refresh=False, transient=True)
        self.live.start()
        self.drawn = 0.0

    def print(self, line: str) -> None:
        from rich.text import Text

        style = STYLES.get(line.split(" ", 1)[0], "")
        if self.live.is_started:  # the view redrawn under the line shows the change it reports
            self.live.update(self.view())
        self.console.print(Text(line, style=style), soft_wrap=True)

    def view(self):
        """The live view: the overall bar and counts, and the running cells' table."""
        from rich import box
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        counts = Text.assemble(
            f"{self.finished_count()}/{self.total} finished · {len(self.running)} running · ",
            (f"{self.counts['failed']} failed", "red" if self.counts["failed"] else ""),
            " · ",
            (f"{self.counts['diverged']} diverged", "yellow" if self.counts["diverged"] else ""),
            f" · ETA {self.eta()}",
        )
        head = Table.grid(padding=(0, 2))
        head.add_row(ProgressBar(self.total, self.finished_count(), width=30), counts)
        if not self.running:
            return head
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        table.add_column("running cell")
        table.add_column("progress")
        for column in ("step", "loss", "time"):
            table.add_column(column, justify="right")
        now = time.monotonic()
        width = max(24, self.console.width - LIVE_COLUMNS)  # what the other columns leave
        for cell in self.running.values():
            table.add_row(
                Text(fit_label(cell.label, width), no_wrap=True),
                ProgressBar(cell.steps, cell.step, width=20),
                Text(f"{cell.step}/{cell.steps}"),
                Text(f"{cell.loss:.3f}" if cell.step else "-"),
                Text(duration(now - cell.started)),
            )
        return Group(head, table)

    def tick(self) -> None:
        if time.monotonic() - self.drawn >= REDRAW:
            self.drawn = time.monotonic()
            self.live.update(self.view(), refresh=True)

    def close(self) -> None:
        self.live.stop()

    def abandon(self) -> None:
        with contextlib.suppress(Exception):
            os.write(self.console.file.fileno(), b"\x1b[?25h\n")  # show the cursor again


def make_progress(
    todo: list[Cell],
    total: int,
    slots: int,
    interval: float,
    out: TextIO | None = None,
    live: bool | None = None,
) -> Progress:
    """A `LiveProgress` when `out` (default: sys.stdout) is a terminal rich can draw on
    (`live=None`) or `live` is true, else plain `Progress` lines."""
    out = sys.stdout if out is None else out
    if live is None:
        live = is_terminal(out)
    if live:
        return LiveProgress(todo, total, slots, interval, out)
    return Progress(todo, total, slots, interval, out)

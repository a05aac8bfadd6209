"""Progress of a job counted in steps (the bench's measurements, a report's tables and plots):
a bar with the steps done of those expected and the time left, drawn with rich on stderr.

    with make_steps("softmax", "measurements") as steps:
        steps.expect(12)              # steps to come (the total may grow as work is known)
        steps.doing("N=512 fwd+bwd")  # what runs now
        steps.advance(3)              # steps done

On a terminal (stderr a TTY rich can draw on, or a `console` given) it is `LiveSteps`, one line
redrawn in place, in the grid runner's style (ablations.run.progress):

    softmax  ━━━━━━━━━━━━╺━━━━━━━━━━━━━━━━━  12/27 measurements · ETA 1m02s · N=512 memory: sdpa

which stays, ending "27/27 measurements · in 2m10s", when the job ends. Elsewhere (a pipe, a
file, CI logs, tests) it is `Steps`, which counts and prints nothing: stdout, and what the
job prints, are the same either way. The line is drawn only at these calls (no thread redraws
it), so a caller that calls them between measurements never disturbs a timing.
"""

from __future__ import annotations

import sys
from time import monotonic
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

BAR_WIDTH = 30  # characters, as the grid runner's overall bar


def duration(seconds: float) -> str:
    """'42s', or '3m05s' from a minute."""
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def is_terminal(out) -> bool:
    """Whether `out` is a TTY (not a pipe or file, whatever FORCE_COLOR says) that rich can
    move the cursor on (not TERM=dumb), with rich installed."""
    try:
        if not out.isatty():
            return False
        from rich.console import Console
    except (AttributeError, ValueError, ImportError):  # no isatty, a closed file, no rich
        return False
    console = Console(file=out)
    return console.is_terminal and not console.is_dumb_terminal


class Steps:
    """A job's steps: `total` expected, `done`, and the time left at the mean pace so far;
    draws nothing (see `LiveSteps`)."""

    def __init__(self, unit: str = "steps") -> None:
        self.unit, self.total, self.done, self.now = unit, 0, 0, ""
        self.started = monotonic()

    def expect(self, steps: int) -> None:
        """`steps` more steps to come."""
        self.total += steps

    def doing(self, what: str) -> None:
        """What the job does now (shown beside the bar)."""
        self.now = what

    def advance(self, steps: int = 1) -> None:
        """`steps` steps done."""
        self.done += steps

    def left(self) -> str:
        """The time left: the seconds so far per step done times the steps to come; '-'
        before a step is done."""
        if not self.done:
            return "-"
        spent = monotonic() - self.started
        return duration(spent / self.done * max(0, self.total - self.done))

    def status(self) -> str:
        """'12/27 measurements · ETA 1m02s · N=512 memory: sdpa'; when all are done,
        '27/27 measurements · in 2m10s'."""
        counts = f"{self.done}/{self.total} {self.unit}"
        if self.total and self.done >= self.total:
            return f"{counts} · in {duration(monotonic() - self.started)}"
        return f"{counts} · ETA {self.left()}" + (f" · {self.now}" if self.now else "")

    def close(self) -> None:
        """The job is over (or failed): nothing more is drawn."""

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LiveSteps(Steps):
    """`Steps` drawn on `console` as one line: `label`, a bar and the `status`, redrawn at
    each call (never by a thread); `close` leaves the line as it stands."""

    def __init__(self, label: str, unit: str, console: Console) -> None:
        from rich.progress import BarColumn, Progress, TextColumn

        super().__init__(unit)
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=BAR_WIDTH),
            TextColumn("{task.fields[status]}"),
            console=console,
            auto_refresh=False,  # drawn only when told: no thread runs while a job times
            redirect_stdout=False,  # what the job prints to stdout stays on stdout
        )
        self.task = self.progress.add_task(label, total=0, status=self.status())
        self.progress.start()

    def draw(self) -> None:
        self.progress.update(
            self.task, total=self.total, completed=self.done, status=self.status(), refresh=True
        )

    def expect(self, steps: int) -> None:
        super().expect(steps)
        self.draw()

    def doing(self, what: str) -> None:
        super().doing(what)
        self.draw()

    def advance(self, steps: int = 1) -> None:
        super().advance(steps)
        self.draw()

    def close(self) -> None:
        self.now = ""
        self.draw()
        self.progress.stop()


def make_steps(label: str, unit: str, console: Console | None = None) -> Steps:
    """`LiveSteps` on `console`, or without one on stderr when it is a terminal rich can draw
    on; else `Steps`, which prints nothing."""
    if console is None:
        if not is_terminal(sys.stderr):
            return Steps(unit)
        from rich.console import Console

        console = Console(file=sys.stderr)
    return LiveSteps(label, unit, console)

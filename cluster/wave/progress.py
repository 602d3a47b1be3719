"""The wave's progress line: a rich bar that fits the terminal (below NARROW_COLUMNS a short form keeps every
count), updated whenever a task or an attempt changes."""
from __future__ import annotations

from faults.base import APPLIED
from fleet.lifecycle import TASK_ENDED

NARROW_COLUMNS = 110  # below this the progress line takes its short form (every count kept)


def progress_bar(console=None):
    """A rich progress bar that fits the terminal: (Progress, narrow)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console(stderr=False)
    narrow = console.width < NARROW_COLUMNS
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(bar_width=12 if narrow else 40),
                    MofNCompleteColumn(), TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                    console=console, transient=False), narrow


def progress_info(narrow: bool, running: int, attempts: int, applied: int, ended: int) -> str:
    if narrow:
        return f"run {running} att {attempts} faults {applied}/{ended}"
    return f"running {running}  attempts {attempts}  faults applied {applied} of {ended} ended"


class WaveProgress:
    """The bar of one wave's tasks (`runs`: task id -> TaskRun) and the injector's receipts; `show=False`: none."""

    def __init__(self, wave_id: str, runs: dict, injector, show: bool):
        self.runs, self.injector = runs, injector
        self.progress, self.bar, self.narrow = None, None, False
        if show:
            self.progress, self.narrow = progress_bar()
            self.progress.start()
            self.bar = self.progress.add_task(f"wave …{wave_id[-4:]}" if self.narrow else f"wave {wave_id}",
                                              total=len(runs), info="")

    def on_change(self) -> None:
        if self.progress is None:
            return
        done = sum(1 for r in self.runs.values() if r.life.state in TASK_ENDED)
        running = sum(1 for r in self.runs.values() if r.current is not None)
        attempts = sum(r.attempts for r in self.runs.values())
        applied = sum(1 for r in self.injector.receipts if r.status == APPLIED)
        self.progress.update(self.bar, completed=done, info=progress_info(self.narrow, running, attempts, applied,
                                                                          len(self.injector.receipts)))

    def retotal(self) -> None:
        if self.progress is not None:
            self.progress.update(self.bar, total=len(self.runs))

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()

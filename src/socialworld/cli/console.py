"""The command line's console: its tables, how library text is printed, and where the libraries'
warnings and a run's own lines are logged."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table as RichTable

console = Console()


class Table(RichTable):
    """The command line's tables: light rules and one space between columns, cells never wrapped or
    cut (an id, a number). A column added with ``optional=True`` is left out, the rightmost first,
    where the terminal is too narrow for the whole table, and the caption says which: a metric table
    fits 80 columns, a wider terminal shows more, ``--json`` everything."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("box", box.SIMPLE_HEAD)
        kwargs.setdefault("padding", (0, 0))  # the rule's own blank separates columns
        kwargs.setdefault("show_edge", False)
        super().__init__(*args, **kwargs)
        self._optional: list[Any] = []

    def add_column(self, *args: Any, optional: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("no_wrap", True)
        super().add_column(*args, **kwargs)
        if optional:
            self._optional.append(self.columns[-1])

    def __rich_console__(self, console: Console, options: Any) -> Any:
        from rich.measure import Measurement

        columns, caption, optional = list(self.columns), self.caption, list(self._optional)
        hidden: list[str] = []
        while optional and Measurement.get(console, options.update_width(1 << 16), self).maximum > options.max_width:
            column = optional.pop()
            self.columns.remove(column)
            hidden.insert(0, str(column.header).replace("\n", " "))
        if hidden:
            self.caption = (f"{', '.join(hidden)} left out at {options.max_width} columns "
                            "(a wider terminal or --json shows them)")
        try:
            yield from super().__rich_console__(console, options)
        finally:  # this rendering's choice only: the table itself keeps every column
            self.columns, self.caption = columns, caption


def show(table: Table) -> None:
    """Print a table whose every column counts (the bench's closing tables) without cutting a cell:
    written to a file or a pipe, whole at its own width (a log has no width to fit; at the default 80
    columns the bench's arm names were cut to "or…"); in a terminal too narrow for it, in parts, each
    holding the first column (the arm, the tier) and as many of the next columns as fit."""
    from rich.measure import Measurement

    def width(t: Table) -> int:
        return Measurement.get(console, console.options.update_width(1 << 16), t).maximum

    natural = width(table)
    if not console.is_terminal:
        Console(file=console.file, width=max(console.width, natural), no_color=True).print(table)  # rich caps a print at its width
        return
    if natural <= console.width or len(table.columns) < 3:
        console.print(table)
        return
    rows = list(zip(*(col.cells for col in table.columns)))

    def part(cols: list[int], title: Any) -> Table:
        t = Table(title=title)
        for i in cols:
            c = table.columns[i]
            t.add_column(c.header, justify=c.justify)
        for r in rows:
            t.add_row(*(r[i] for i in cols))
        return t

    group: list[int] = []
    parts: list[list[int]] = []
    for i in range(1, len(table.columns)):
        if group and width(part([0, *group, i], None)) > console.width:
            parts.append(group)
            group = []
        group.append(i)
    parts.append(group)
    for k, g in enumerate(parts):
        console.print(part([0, *g], f"{table.title} ({k + 1}/{len(parts)})" if table.title else None))


LOG_FILE = "runs/socialworld.log"
"""where third-party warnings go (override with SOCIALWORLD_LOG); made only when one is written"""


def quiet_libraries() -> None:
    """The libraries' own progress bars off (weight loading, dataset maps: socialworld shows its
    own), transformers' log records below errors off, Python warnings (the libraries'
    FutureWarnings) to :data:`LOG_FILE` instead of the console. Environment variables the libraries
    read when imported (a variable the user set wins), so light commands import nothing."""
    import logging
    import os

    for var, value in (("HF_HUB_DISABLE_PROGRESS_BARS", "1"), ("HF_DATASETS_DISABLE_PROGRESS_BARS", "1"),
                       ("TRANSFORMERS_VERBOSITY", "error")):
        os.environ.setdefault(var, value)

    class _LogFile(logging.FileHandler):  # its folder made when the first line comes
        failed = False

        def _open(self):
            Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
            return super()._open()

        def handleError(self, record):  # a log file that cannot be written: said once, the command goes on
            if not self.failed:
                self.failed = True
                print(f"warning: cannot write the log file {self.baseFilename}: {sys.exc_info()[1]}", file=sys.stderr)

    log = _LogFile(os.environ.get("SOCIALWORLD_LOG", LOG_FILE), delay=True, encoding="utf-8")
    log.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.captureWarnings(True)
    warnings_log = logging.getLogger("py.warnings")
    for old in [h for h in warnings_log.handlers if type(h).__name__ == "_LogFile"]:  # one per process
        warnings_log.removeHandler(old)
        old.close()
    logging.getLogger("socialworld").handlers = []  # a previous command's run log (commands run in one process: tests)
    warnings_log.addHandler(log)
    warnings_log.propagate = False


def say(msg: str) -> None:
    """Print library text literally: never as rich markup ('[a-z0-9_]' is not a style tag), and
    unwrapped (the terminal wraps it: a path stays whole to copy); and into the run's log once the
    command has one (:func:`run_log`)."""
    import logging

    console.print(msg, markup=False, soft_wrap=True)
    logging.getLogger("socialworld").info(msg)


RUN_LOG = "socialworld.log"
"""the run's log inside its output folder: the command's own lines and the libraries' warnings"""


def run_log(out: str | Path) -> None:
    """From here on, the libraries' warnings and every line :func:`say` prints also go to
    ``<out>/socialworld.log`` (made when first written), unless ``SOCIALWORLD_LOG`` names a file."""
    import logging
    import os

    if os.environ.get("SOCIALWORLD_LOG"):
        return
    path = os.path.abspath(Path(out) / RUN_LOG)
    for h in logging.getLogger("py.warnings").handlers:
        if isinstance(h, logging.FileHandler) and type(h).__name__ == "_LogFile":
            h.acquire()
            try:
                if h.stream is not None:
                    h.stream.close()
                    h.stream = None  # type: ignore[assignment]
                h.baseFilename = path
            finally:
                h.release()
            own = logging.getLogger("socialworld")
            own.handlers = [h]
            own.setLevel(logging.INFO)
            own.propagate = False

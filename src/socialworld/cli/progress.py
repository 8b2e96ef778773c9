"""Progress for long commands: rich bars on a terminal, plain lines elsewhere."""

from __future__ import annotations

import time
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from socialworld.cli.console import console, say
from socialworld.cli.options import fail
from socialworld.world.spec import ScenarioError

PLAIN_EVERY_S = 5.0
"""progress written to a file or pipe: at most one line per this many seconds per bar"""


@contextmanager
def bars():
    """A progress factory ``progress(what, total) -> advance(_)``: rich bars with elapsed time and
    an ETA on a terminal; elsewhere (a log file, a pipe) plain lines with the same numbers, since
    rich draws nothing there until the end: one per finished item, at most one per
    ``PLAIN_EVERY_S`` seconds (the first and the last always)."""
    import logging

    if console.is_terminal:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("eta"), TimeRemainingColumn(), console=console) as bars:
            def progress(what: str, total: int):
                task, t0, done = bars.add_task(what, total=total), time.monotonic(), [0]

                def advance(_ep) -> None:
                    bars.advance(task)
                    done[0] += 1
                    if done[0] == total:  # the run's log gets the finished bar
                        logging.getLogger("socialworld").info(f"{what}: {total}/{total}, {time.monotonic() - t0:.0f} s")
                return advance

            try:
                yield progress
            finally:
                bars.stop()
        return

    def plain(what: str, total: int):
        t0, done, said, first = time.monotonic(), [0], [-PLAIN_EVERY_S], [0.0]

        def advance(_ep) -> None:
            done[0] += 1
            spent = time.monotonic() - t0
            if done[0] == 1:
                first[0] = spent  # it carries the start-up (loading a model, a first batch's prefill)
            if done[0] in (1, total) or spent - said[0] >= PLAIN_EVERY_S:
                said[0] = spent
                # the rate after the first item: the start-up would put the first estimates hours off
                eta = f", eta {(spent - first[0]) / (done[0] - 1) * (total - done[0]):.0f} s" if done[0] > 1 else ""
                say(f"{what}: {done[0]}/{total}, {spent:.0f} s{eta}")
        return advance

    yield plain


def with_bars(call):
    """Run ``call(progress)`` under :func:`bars` (the config built inside ``call`` too, so a bad
    option is one line); clear errors."""
    with bars() as progress:
        try:
            return call(progress)
        except (ScenarioError, ValueError, OSError, RuntimeError) as err:
            fail(str(err))

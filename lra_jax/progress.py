"""Progress bars (training steps, generated data), on a terminal and in a log.

On a terminal tqdm redraws one line in place about once a second. Written to a file (a sweep's log, a Slurm
job's output, `nohup`), the same redraws would pile up as carriage returns on one line tens of kilobytes long;
there a bar is written as whole lines instead: one each time its figures are set (the trainer sets them when
it logs, validates or saves) and otherwise about every half minute.
"""

from __future__ import annotations

import io
import sys
from typing import TextIO

from tqdm import tqdm

TERMINAL_INTERVAL, LOG_INTERVAL = 1.0, 30.0  # seconds between redraws


class _Lines(io.TextIOBase):
    """A text stream that turns tqdm's in-place redraws (a carriage return, the bar, spaces) into lines; a redraw
    identical to the line before it is not repeated. Closing adds the last line, at the whole run's rate."""

    def __init__(self, stream: TextIO):
        super().__init__()
        self.stream, self.last = stream, ""

    def write(self, text: str) -> int:
        line = text.replace("\r", "").rstrip()
        if line and line != self.last:
            self.stream.write(line + "\n")
            self.stream.flush()
            self.last = line
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def bar(total: int, desc: str, *, unit: str = "step", initial: int = 0, disable: bool = False) -> tqdm:
    """A progress bar on standard error: redrawn in place on a terminal, whole lines in a log."""
    stream = sys.stderr
    terminal = stream.isatty()
    return tqdm(total=total, initial=initial, unit=unit, desc=desc, disable=disable, dynamic_ncols=terminal,
                mininterval=TERMINAL_INTERVAL if terminal else LOG_INTERVAL, file=stream if terminal else _Lines(stream))

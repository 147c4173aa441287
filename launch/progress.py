"""A live progress line that suits where it goes.

In a terminal one line is redrawn in place (``\\r``) at most once a second.
Anywhere else (a file, a pipe, a CI log) a ``\\r`` never ends a line, so the
redraws would pile up into one line thousands of characters long: there each
update is its own line, at most one every ``plain_every_s``, each no longer
than ``max_chars``.

>>> import io
>>> out = io.StringIO()  # not a terminal
>>> p = ProgressWriter(out, plain_every_s=10.0, clock=iter([0.0, 4.0, 12.0]).__next__)
>>> for n in (1, 2, 3):
...     p.update(f"step {n}")
>>> p.end()
>>> out.getvalue()
'step 1\\nstep 3\\n'
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["ProgressWriter"]


class ProgressWriter:
    """Progress updates to ``stream``: redrawn in a terminal, plain bounded lines elsewhere."""

    def __init__(
        self,
        stream: TextIO,
        *,
        tty_every_s: float = 1.0,
        plain_every_s: float = 10.0,
        max_chars: int = 200,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        isatty = getattr(stream, "isatty", None)
        self.tty = bool(isatty and isatty())
        self.every_s = tty_every_s if self.tty else plain_every_s
        self.max_chars = max_chars
        self.clock = clock
        self._last_s: float | None = None
        self._drawn = False

    def due(self) -> bool:
        """Whether an update now would be shown (so a caller can skip building the line)."""
        return self._last_s is None or self.clock() - self._last_s >= self.every_s

    def update(self, line: str) -> None:
        now = self.clock()
        if self._last_s is not None and now - self._last_s < self.every_s:
            return
        self._last_s = now
        line = " ".join(line.split())[: self.max_chars]  # one line, whatever the caller built
        if self.tty:
            self.stream.write(f"\r {line} ")
            self._drawn = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def end(self) -> None:
        """Close the redrawn line (a terminal); nothing to do for plain lines."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

"""Progress of a long run: steps done / total, SPS, ETA and the mean of the latest episodic returns.

On a terminal it is a live bar redrawn in place (at most a few times a second). Anywhere else (a
batch job's log file, a pipe, CI) it prints one plain line every ``interval`` seconds, so logs stay
readable and grep-able::

    global_step=40960/10000000 (0%) SPS=812 ETA=3h24m mean_return(last 20)=1.6

``update`` is cheap enough to call every environment step: it reads the clock and returns unless a
redraw is due.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import TextIO


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class Progress:
    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        interval: float = 5.0,
        stream: TextIO | None = None,
        window: int = 20,
        enabled: bool = True,
        live: bool | None = None,
    ) -> None:
        self.total = total_steps
        self.start_step = start_step  # a resumed run measures its speed from where it resumed
        self.interval = interval
        self.stream = stream if stream is not None else sys.stdout
        self.returns: deque[float] = deque(maxlen=window)
        self.enabled = enabled
        isatty = getattr(self.stream, "isatty", None)
        self.live = live if live is not None else bool(isatty and isatty())
        self.start_time = time.time()
        self.last_draw = self.start_time
        self.step = start_step
        self._drew_live = False
        self._shown_step: int | None = None

    def episode(self, episodic_return: float) -> None:
        self.returns.append(float(episodic_return))

    def line(self, global_step: int) -> str:
        elapsed = max(time.time() - self.start_time, 1e-9)
        done = global_step - self.start_step
        sps = done / elapsed
        fraction = min(global_step / self.total, 1.0) if self.total > 0 else 1.0
        eta = format_duration((self.total - global_step) / sps) if sps > 0 else "?"
        text = f"global_step={global_step}/{self.total} ({fraction:.0%}) SPS={sps:.0f} ETA={eta}"
        if self.returns:
            text += f" mean_return(last {len(self.returns)})={sum(self.returns) / len(self.returns):.1f}"
        return text

    def bar(self, global_step: int, width: int = 24) -> str:
        filled = int(width * min(global_step / self.total, 1.0)) if self.total > 0 else width
        return "[" + "#" * filled + "." * (width - filled) + "] "

    def update(self, global_step: int, force: bool = False) -> None:
        self.step = global_step
        if not self.enabled:
            return
        now = time.time()
        if self.live:
            if force or now - self.last_draw >= 0.25:
                self.last_draw = now
                # \r and erase-to-end-of-line redraw the bar in place.
                self.stream.write("\r" + self.bar(global_step) + self.line(global_step) + "\x1b[K")
                self.stream.flush()
                self._drew_live = True
                self._shown_step = global_step
        elif force or now - self.last_draw >= self.interval:
            self.last_draw = now
            print(self.line(global_step), file=self.stream, flush=True)
            self._shown_step = global_step

    def close(self) -> None:
        """The final state, once, and the cursor on a fresh line."""
        if not self.enabled:
            return
        if self._shown_step != self.step:
            self.update(self.step, force=True)
        if self.live and self._drew_live:
            self.stream.write("\n")
            self.stream.flush()

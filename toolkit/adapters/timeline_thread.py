"""A side timeline: a background thread that samples something at its own rate on the probe's clock and streams
rows to `<name>.partial` (renamed by the caller when the run is over, like trace.csv).

The GPU loop must never wait on a slow server or a big /proc: each side timeline has its own thread, and one
that raises records the error and stops itself without touching the GPU trace. Standard library only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

Tick = Callable[[float], list[str]]  # t_s -> CSV lines to append


class TimelineThread:
    def __init__(self, path: Path, header: str, hz: float, tick: Tick, name: str) -> None:
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        self.header = header
        self.period_s = 1.0 / hz
        self.tick = tick
        self.name = name
        self.error: str | None = None
        self.ticks = 0
        self.cpu_s = 0.0  # this thread's CPU time inside tick(): the timeline's own cost
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._started = 0.0
        self.wall_s = 0.0
        self._f: IO[str] | None = None

    def start(self, t0: float) -> None:
        self._t0 = t0
        self._started = time.monotonic()
        self._f = self.partial.open("w", buffering=1)
        self._f.write(self.header)
        self._thread = threading.Thread(target=self._run, name=f"probe-{self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self._f is not None
        k = 0
        while not self._stop.is_set():
            now = time.monotonic() - self._t0
            target = k * self.period_s
            if target > now:
                if self._stop.wait(target - now):
                    break
            elif now - target > self.period_s:
                k = int(now / self.period_s)  # skip missed ticks rather than burst
            c0 = time.thread_time()
            try:
                lines = self.tick(time.monotonic() - self._t0)
            except Exception as err:  # a bug or an OS surprise: keep the rows so far, say why it stopped
                self.error = f"{type(err).__name__}: {err}"
                break
            finally:
                self.cpu_s += time.thread_time() - c0
            self._f.writelines(lines)
            self.ticks += 1
            k += 1

    def stop(self) -> None:
        """Stop, flush and rename `.partial` to the final name."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self.wall_s = time.monotonic() - self._started
        if self._f is not None:
            self._f.close()
            self._f = None
            self.partial.replace(self.path)

    def cost(self) -> dict[str, float | int | str | None]:
        """What the timeline cost the probe: its thread's CPU inside tick() against the wall time it ran."""
        return {"ticks": self.ticks, "cpu_s": round(self.cpu_s, 4), "wall_s": round(self.wall_s, 3),
                "cpu_share_of_one_core": round(self.cpu_s / self.wall_s, 5) if self.wall_s > 0 else None,
                "stopped_by_error": self.error}

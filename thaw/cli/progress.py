"""Push progress: a bar on a terminal, one JSON line per finished file otherwise."""

from __future__ import annotations

import json
import time
from typing import TextIO

from thaw.units import human_bytes
from weight_streaming.push import FileProgress


class ProgressBar:
    """``[#####.....]  45%  123.4 MiB / 300.0 MiB  45.6 MiB/s  ETA 4s`` redrawn in place."""

    def __init__(self, out: TextIO, width: int = 30, min_interval_s: float = 0.1) -> None:
        self.out = out
        self.width = width
        self.min_interval_s = min_interval_s
        self.start = time.monotonic()
        self._last_draw = 0.0
        self._drawn = False

    def __call__(self, event: FileProgress, sent: int, total: int) -> None:
        now = time.monotonic()
        if not event.done and now - self._last_draw < self.min_interval_s and sent < total:
            return
        self._last_draw = now
        frac = sent / total if total else 1.0
        elapsed = max(now - self.start, 1e-6)
        rate = sent / elapsed
        eta = (total - sent) / rate if rate > 0 else float("inf")
        filled = int(frac * self.width)
        eta_s = f"{eta:.0f}s" if eta != float("inf") else "?"
        line = (f"\r[{'#' * filled}{'.' * (self.width - filled)}] {frac * 100:5.1f}%  "
                f"{human_bytes(sent)} / {human_bytes(total)}  {human_bytes(rate)}/s  ETA {eta_s}  ")
        self.out.write(line)
        self.out.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.out.write("\n")
            self.out.flush()
            self._drawn = False


class JsonLinesProgress:
    """One JSON object per file uploaded and verified."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __call__(self, event: FileProgress, sent: int, total: int) -> None:
        if not event.done:
            return
        self.out.write(json.dumps({
            "event": "file_pushed", "path": event.path, "bytes": event.size,
            "seconds": round(event.seconds, 3),
            "mib_per_s": round(event.size / 2**20 / event.seconds, 1) if event.seconds > 0 else None,
            "total_sent": sent, "total_bytes": total,
        }) + "\n")
        self.out.flush()

    def close(self) -> None:
        pass

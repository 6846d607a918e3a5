"""A hang guard for GPU scripts: a hung kernel blocks forever in synchronize, which Python cannot interrupt, so a
thread ends the process (with a note in the log) once an armed step outlives its deadline, instead of letting it
burn the GPU's time. What the script saved before stays on disk."""
from __future__ import annotations

import os
import threading
import time


class Watchdog:
    """`arm(what, seconds)` before each step that may hang; the process exits with status 3 past the deadline."""

    def __init__(self, log):
        self.log, self.deadline, self.what = log, None, ""
        threading.Thread(target=self._run, daemon=True).start()

    def arm(self, what: str, seconds: float) -> None:
        self.what, self.deadline = what, time.time() + seconds

    def _run(self) -> None:
        while True:
            time.sleep(1)
            if self.deadline is not None and time.time() > self.deadline:
                self.log(f"HANG: {self.what} did not finish in time; exiting")
                os._exit(3)

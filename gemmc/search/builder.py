"""The Builder: compiles candidate schedules in parallel spawned worker processes.

Each job calls the injected compile function (default: `gemmc.compile(spec, schedule=s,
arch=...).build()`, which publishes the kernel into the disk cache the Runner then hits). At most
`workers` jobs run at once, so a job's clock starts when it is submitted; one that passes
`timeout_s` is recorded as a timeout, its pool is torn down (a hung compile cannot be cancelled
any other way) and the other in-flight jobs are resubmitted to a fresh pool. A job whose worker
process dies (a segfault or an out-of-memory kill in the compiler) breaks the whole pool, and the
pool cannot say which job did it: the jobs in flight are resubmitted to a fresh pool one at a time,
so the one that crashes again alone is recorded as crashed and the others build. Failures never stop
the batch: they come back as `BuildResult(ok=False, error=...)` and the search skips them (the tune
stores them, so a resumed run does not propose them again).
"""
from __future__ import annotations

import multiprocessing as mp
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ..errors import BuildError
from ..schedule import Schedule
from ..spec import GemmSpec

CRASHED = ("compile worker crashed: its process died while compiling this schedule, alone in the pool (a "
           "segfault, an out-of-memory kill or an exit in the compiler); the search skips it")


@dataclass(frozen=True)
class BuildResult:
    schedule: Schedule
    ok: bool
    compile_s: float
    error: Optional[str] = None
    artifact: object = None


def compile_and_build(spec: GemmSpec, schedule: Schedule, arch: str):
    """The default compile function (runs in a worker): the public API, built into the cache."""
    import gemmc
    artifact = gemmc.compile(spec, schedule=schedule, arch=arch).build()
    return str(artifact) if artifact is not None else None


def _warm_worker() -> None:
    """Pool initializer: pay the compiler's imports once per worker, outside every compile_s."""
    try:
        import cutlass.cute  # noqa: F401

        import gemmc.compiler  # noqa: F401
    except Exception:  # noqa: BLE001  a job will report the real error
        pass


def _job(compile_fn: Callable, spec: GemmSpec, schedule: Schedule, arch: str) -> tuple:
    """Worker side: never raises, so one bad schedule cannot poison the pool."""
    t0 = time.perf_counter()
    try:
        art = compile_fn(spec, schedule, arch)
        return True, time.perf_counter() - t0, None, art
    except BaseException as e:  # noqa: BLE001  (report, don't die)
        return False, time.perf_counter() - t0, f"compile: {type(e).__name__}: {e}"[:2000], None


class Builder:
    def __init__(self, compile_fn: Callable = compile_and_build, workers: int = 2, timeout_s: float = 600.0):
        self.compile_fn = compile_fn
        self.workers = max(1, workers)
        self.timeout_s = timeout_s
        self._pool: Optional[ProcessPoolExecutor] = None

    def _new_pool(self) -> ProcessPoolExecutor:
        warm = _warm_worker if self.compile_fn is compile_and_build else None
        return ProcessPoolExecutor(max_workers=self.workers, mp_context=mp.get_context("spawn"), initializer=warm)

    def _kill_pool(self) -> None:
        if self._pool is None:
            return
        # ProcessPoolExecutor has no per-task cancel: terminate its workers, then drop it
        for p in list(getattr(self._pool, "_processes", {}).values()):
            p.terminate()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def build(self, spec: GemmSpec, schedules: Sequence[Schedule], arch: str,
              on_result: Optional[Callable[[BuildResult], None]] = None) -> list[BuildResult]:
        """One BuildResult per schedule, in the order given; on_result(r) as each one finishes."""
        results: dict[int, BuildResult] = {}
        queue = list(range(len(schedules)))
        suspects: list[int] = []      # in flight when a worker crashed: they run one at a time until it is placed
        running: dict = {}            # future -> (index, submit time)
        if self._pool is None:
            self._pool = self._new_pool()

        def finish(i: int, r: BuildResult):
            results[i] = r
            if on_result:
                on_result(r)

        def crashed():
            """The pool broke: keep what finished, blame a job that ran alone, else isolate the jobs in flight."""
            now = time.perf_counter()
            lost = []
            for f, (i, t) in running.items():
                if f.done() and not f.cancelled() and f.exception() is None:
                    ok, secs, err, art = f.result()
                    finish(i, BuildResult(schedules[i], ok, secs, err, art))
                else:
                    lost.append((i, t))
            running.clear()
            self._kill_pool()
            self._pool = self._new_pool()
            if len(lost) == 1:
                i, t = lost[0]
                finish(i, BuildResult(schedules[i], False, now - t, CRASHED))
            else:
                suspects[:0] = [i for i, _ in lost]

        refused = 0                   # submits refused in a row by fresh pools: the host, not a worker, is failing
        while queue or suspects or running:
            broken = False
            # while suspects remain, one job at a time: the next crash then names its job
            while (not running and suspects) or (not suspects and queue and len(running) < self.workers):
                src = suspects or queue
                try:
                    fut = self._pool.submit(_job, self.compile_fn, spec, schedules[src[0]], arch)
                # a worker died since the last wait: the pool says so, or (racing its own shutdown) fails to
                # start a replacement process over its already-closed queue
                except (BrokenProcessPool, OSError) as e:
                    refused = refused + 1 if not running else 1
                    if refused > 3:
                        raise BuildError(f"the compile pool cannot start worker processes ({e}); check the host's "
                                         "process and open-file limits, or use fewer workers") from e
                    broken = True
                    break
                refused = 0
                running[fut] = (src.pop(0), time.perf_counter())
            if broken:
                crashed()
                continue
            now = time.perf_counter()
            next_deadline = min(t + self.timeout_s for _, t in running.values())
            done, _ = wait(list(running), timeout=max(0.0, next_deadline - now), return_when=FIRST_COMPLETED)
            if any(not f.cancelled() and isinstance(f.exception(), BrokenProcessPool) for f in done):
                crashed()
                continue
            for fut in done:
                i, t = running.pop(fut)
                try:
                    ok, secs, err, art = fut.result()
                except Exception as e:  # the result could not come back (e.g. an unpicklable artifact)
                    ok, secs, err, art = False, time.perf_counter() - t, f"compile worker failed: {e}", None
                finish(i, BuildResult(schedules[i], ok, secs, err, art))
            now = time.perf_counter()
            late = [(f, i, t) for f, (i, t) in running.items() if now - t >= self.timeout_s]
            if late:
                for f, i, t in late:
                    running.pop(f)
                    finish(i, BuildResult(schedules[i], False, now - t,
                                          f"compile timed out after {self.timeout_s:g} s"))
                # the others lose their progress and start again in a fresh pool
                queue = [i for i, _ in running.values()] + queue
                running.clear()
                self._kill_pool()
                self._pool = self._new_pool()
        return [results[i] for i in range(len(schedules))]

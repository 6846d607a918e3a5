"""Compile many kernels in parallel worker processes, within a deadline.

Each worker calls the public `gemmc.compile` and forces the build, which publishes the kernel into
the shared disk cache (GEMMC_CACHE_DIR). The parent later makes the same `gemmc.compile` call and
gets a cache hit. The sweep compiles each schedule once on the fully symbolic spec (M, N, K
named), so one kernel serves every shape; the bench prebuilds its shapes' kernels the same way. Workers are spawned (never forked from a process holding CUDA) and
terminated at the deadline; unfinished compiles are reported as such.
"""
from __future__ import annotations

import multiprocessing as mp
import time
from functools import partial
from typing import Callable, Iterable, Optional


def symbolic_spec(dtype: str = "bf16"):
    import gemmc
    return gemmc.GemmSpec(m="M", n="N", k="K", dtype=dtype)


def compile_job(job: dict, dtype: str = "bf16", arch: str = "sm_90a"):
    """Compile and build one job through the public API; returns the kernel. A job is either a
    Schedule dict (the sweep: on the symbolic spec) or {"m", "n", "k", "policy"} (the bench: one
    static shape with 'heuristic' / 'auto' / a Schedule dict)."""
    import gemmc
    if "policy" in job:
        spec = gemmc.GemmSpec(m=job["m"], n=job["n"], k=job["k"], dtype=dtype)
        policy = job["policy"]
        schedule = policy if isinstance(policy, str) else gemmc.Schedule.from_dict(policy)
    else:
        spec, schedule = symbolic_spec(dtype), gemmc.Schedule.from_dict(job)
    kernel = gemmc.compile(spec, schedule=schedule, arch=arch)
    if hasattr(type(kernel), "ptx"):
        kernel.ptx  # noqa: B018  forces the build (or the cache load) now, so it is timed here
    return kernel


def compile_schedule(sched: dict, dtype: str = "bf16", arch: str = "sm_90a"):
    return compile_job(sched, dtype, arch)


def compile_worker(job: dict, dtype: str = "bf16", arch: str = "sm_90a") -> dict:
    """Runs in a worker: {"job": job, "ok", "error", "compile_s"}; never raises."""
    t0 = time.perf_counter()
    try:
        compile_job(job, dtype, arch)
        return {"job": job, "ok": True, "error": None, "compile_s": time.perf_counter() - t0}
    except BaseException as e:  # noqa: BLE001  (a worker must report, not die)
        msg = f"{type(e).__name__}: {e}".strip()
        return {"job": job, "ok": False, "error": msg[:2000], "compile_s": time.perf_counter() - t0}


def warm_worker() -> None:
    """Pool initializer: pay the compiler's imports once per worker, outside any job's compile_s."""
    try:
        import gemmc.compiler  # noqa: F401
        import cutlass.cute  # noqa: F401
    except Exception:  # noqa: BLE001  a job will report the real error
        pass


def _key(sched: dict) -> str:
    import json
    return json.dumps(sched, sort_keys=True)


class CompilePool:
    """Submit everything at once; collect results until all are in or the deadline passes."""

    def __init__(self, jobs: Iterable[dict], workers: int, *, worker: Callable = compile_worker,
                 dtype: str = "bf16", arch: str = "sm_90a"):
        self.jobs = list(jobs)
        self.results: dict[str, dict] = {}
        self.started = time.perf_counter()
        self._pool = None
        self._it = None
        if not self.jobs:
            return
        ctx = mp.get_context("spawn")
        self._pool = ctx.Pool(max(1, min(workers, len(self.jobs))),
                              initializer=warm_worker if worker is compile_worker else None)
        self._it = self._pool.imap_unordered(partial(worker, dtype=dtype, arch=arch), self.jobs, chunksize=1)

    def collect(self, deadline: float, on_result: Optional[Callable[[dict], None]] = None) -> dict[str, dict]:
        """Results keyed by the schedule's canonical JSON; those not done by `deadline`
        (a time.perf_counter() value) get ok=False, error 'not compiled ...'."""
        try:
            while self._it is not None and len(self.results) < len(self.jobs):
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                try:
                    r = self._it.next(timeout=left)
                except mp.TimeoutError:
                    break
                except StopIteration:
                    break
                self.results[_key(r["job"])] = r
                if on_result:
                    on_result(r)
        finally:
            self.close()
        for s in self.jobs:
            self.results.setdefault(_key(s), {"job": s, "ok": False, "compile_s": None,
                                              "error": "not compiled within the compile budget"})
        return self.results

    @property
    def wall_s(self) -> float:
        return time.perf_counter() - self.started

    def close(self):
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None


def result_for(results: dict, job: dict) -> dict:
    return results[_key(job)]

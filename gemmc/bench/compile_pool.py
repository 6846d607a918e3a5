"""Compile many kernels in parallel worker processes, within a deadline.

Each worker calls the public `gemmc.compile` and forces the build, which publishes the kernel into
the shared disk cache (GEMMC_CACHE_DIR). The parent later makes the same `gemmc.compile` call and
gets a cache hit. The sweep compiles each schedule once on the fully symbolic spec (M, N, K
named), so one kernel serves every shape; the bench prebuilds its shapes' kernels the same way. Workers are spawned (never forked from a process holding CUDA) and
terminated at the deadline; unfinished compiles are reported as such. A worker that dies mid-job (a
segfault or an out-of-memory kill in the compiler) is noticed within a poll interval: its job is
reported as crashed, and the pool's replacement worker goes on with the rest.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from functools import partial
from typing import Callable, Iterable, Optional


def symbolic_spec(dtype: str = "bf16"):
    import gemmc
    from .fp8 import spec_kwargs
    return gemmc.GemmSpec(m="M", n="N", k="K", **spec_kwargs(dtype))


def compile_job(job: dict, dtype: str = "bf16", arch: str = "sm_90a"):
    """Compile and build one job through the public API; returns the kernel. A job is either a
    Schedule dict (the sweep: on the symbolic spec) or {"m", "n", "k", "policy"} (the bench: one
    static shape with 'heuristic' / 'auto' / a Schedule dict)."""
    import gemmc
    if "policy" in job:
        from .fp8 import spec_kwargs      # "fp8-<scaling>": an fp8 GEMM with that scaling
        spec = gemmc.GemmSpec(m=job["m"], n=job["n"], k=job["k"], **spec_kwargs(dtype))
        policy = job["policy"]
        # a recorded schedule is run on the bench's arch (compile refuses an arch that contradicts it)
        schedule = policy if isinstance(policy, str) else gemmc.Schedule.from_dict(policy).with_(arch=arch)
    else:
        spec, schedule = symbolic_spec(dtype), gemmc.Schedule.from_dict(job).with_(arch=arch)
    kernel = gemmc.compile(spec, schedule=schedule, arch=arch)
    if kernel.schedule is None:      # `auto` on a problem no kernel takes: torch.matmul, nothing to build
        return kernel
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


_started = None    # in a worker: the queue that tells the parent which job this process is on


def _init_worker(started, warm: bool) -> None:
    global _started
    _started = started
    if warm:
        warm_worker()


def _tracked(worker: Callable, job: dict, **kw) -> dict:
    """Runs `worker` on `job` in a pool process, telling the parent first (a SimpleQueue write is done when
    put returns, so the parent learns of the job even if the process dies the next instant)."""
    _started.put((os.getpid(), _key(job), time.time()))
    return worker(job, **kw)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)       # signal 0 only asks; fails once the pool has reaped the dead worker
    except ProcessLookupError:
        return False
    except PermissionError:   # the pid was reused by another user's process: ours is gone
        return False
    return True


POLL_S = 0.25     # how often collect looks for a dead worker while it waits


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
        self._started = ctx.SimpleQueue()
        self._on: dict[int, tuple[str, float]] = {}      # worker pid -> (its job's key, time.time() at its start)
        self._dead: dict[int, float] = {}                # worker pid -> time.time() when it was first seen dead
        self._pool = ctx.Pool(max(1, min(workers, len(self.jobs))), initializer=_init_worker,
                              initargs=(self._started, worker is compile_worker))
        self._it = self._pool.imap_unordered(partial(_tracked, worker, dtype=dtype, arch=arch), self.jobs,
                                             chunksize=1)

    def collect(self, deadline: float, on_result: Optional[Callable[[dict], None]] = None) -> dict[str, dict]:
        """Results keyed by the schedule's canonical JSON; those not done by `deadline`
        (a time.perf_counter() value) get ok=False, error 'not compiled ...'; a job whose worker
        died gets ok=False, error 'compile worker crashed ...' as soon as that is seen."""
        by_key = {_key(j): j for j in self.jobs}
        try:
            while self._it is not None and len(self.results) < len(by_key):
                left = deadline - time.perf_counter()
                if left <= 0:
                    break
                try:
                    self._add(self._it.next(timeout=min(left, POLL_S)), on_result)
                except mp.TimeoutError:
                    pass
                except StopIteration:
                    break
                # a dead worker's job never comes back through the pool (its replacement takes the next job)
                for r in self._crashed(by_key):
                    self._add(r, on_result)
        finally:
            self.close()
        for s in self.jobs:
            self.results.setdefault(_key(s), {"job": s, "ok": False, "compile_s": None,
                                              "error": "not compiled within the compile budget"})
        return self.results

    def _add(self, r: dict, on_result) -> None:
        if _key(r["job"]) in self.results:
            return
        self.results[_key(r["job"])] = r
        if on_result:
            on_result(r)

    def _crashed(self, by_key: dict) -> list[dict]:
        """Results for the jobs whose worker process has died before returning."""
        while not self._started.empty():
            pid, key, t0 = self._started.get()
            self._on[pid] = (key, t0)
        out = []
        now = time.time()
        for pid, (key, t0) in list(self._on.items()):
            if key in self.results:
                del self._on[pid]
            elif not _alive(pid):
                # a worker can die just after sending its result (killed while idle): give that result a
                # poll interval to come through the pool before the job counts as crashed
                if now - self._dead.setdefault(pid, now) < POLL_S:
                    continue
                del self._on[pid]
                out.append({"job": by_key[key], "ok": False, "compile_s": now - t0,
                            "error": f"compile worker crashed: its process ({pid}) died while compiling this job "
                                     f"(a segfault, an out-of-memory kill or an exit in the compiler)"})
        return out

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

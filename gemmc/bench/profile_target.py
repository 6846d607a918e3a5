"""The process `gemmc.bench.ncu.profile` runs under ncu (--profile-from-start off):

    python -m gemmc.bench.profile_target JOBS.json MANIFEST.json

JOBS.json: {"jobs": [{"m", "n", "k", "dtype", "schedule": a Schedule dict, or null for cuBLAS}], "calls": N,
"check": true}. Per job: build the kernel, make randn inputs, check one call against the fp32 reference
(relative Frobenius error under 1e-2, output NaN-filled first), run one untimed call; then, inside the profiler's
start/stop, launch the marker kernel (torch.cuda._sleep) and the job's N calls. MANIFEST.json, rewritten after
each job: per job {"marker": launched its marker, "ok": true} or {"error": why}.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

CHECK_TOLERANCE = 1e-2


def _prepare(job: dict, check: bool):
    """(call, a, b, out) of one job, built, checked and warmed up."""
    import torch

    from ..reference import rel_frobenius
    from ..schedule import Schedule
    from ..types import torch_dtype
    from .suites import Shape
    from .timing import compile_gemmc, cublas_matmul, reference

    dtype = torch_dtype(job.get("dtype", "bf16"))
    shape = Shape(job["m"], job["n"], job["k"])
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(shape.m, shape.k, dtype=dtype, device="cuda", generator=gen)
    b = torch.randn(shape.n, shape.k, dtype=dtype, device="cuda", generator=gen)
    out = torch.empty(shape.m, shape.n, dtype=dtype, device="cuda")
    if job.get("schedule") is None:
        fn = cublas_matmul
    else:
        fn = compile_gemmc(shape, Schedule.from_dict(job["schedule"]), str(job.get("dtype", "bf16")))
    if check:
        out.fill_(float("nan"))
        fn(a, b, out=out)
        err = rel_frobenius(out, reference(a, b))
        if not err < CHECK_TOLERANCE:
            raise RuntimeError(f"the output failed its check: relative error {err:.3g} against the fp32 reference "
                               f"(at most {CHECK_TOLERANCE})")
    fn(a, b, out=out)
    torch.cuda.synchronize()
    return fn, a, b, out


def main(argv=None) -> int:
    import torch

    job_file, manifest = argv if argv is not None else sys.argv[1:]
    cfg = json.loads(Path(job_file).read_text())
    calls, check = int(cfg.get("calls", 3)), bool(cfg.get("check", True))
    ran = []
    for job in cfg["jobs"]:
        entry = {"marker": False}
        try:
            fn, a, b, out = _prepare(job, check)
        except Exception as e:  # noqa: BLE001  the job's error, reported; the next job still runs
            entry["error"] = f"{type(e).__name__}: {e}"[:2000]
        else:
            torch.cuda.profiler.start()
            try:
                entry["marker"] = True
                torch.cuda._sleep(1)
                for _ in range(calls):
                    fn(a, b, out=out)
                torch.cuda.synchronize()
                entry["ok"] = True
            except Exception as e:  # noqa: BLE001
                entry["error"] = f"{type(e).__name__}: {e}"[:2000]
            finally:
                torch.cuda.profiler.stop()
        ran.append(entry)
        Path(manifest).write_text(json.dumps(ran))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

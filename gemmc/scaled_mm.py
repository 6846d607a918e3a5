"""`ScaledMmRoute`: torch._scaled_mm for an fp8 GEMM where `auto` found it faster than gemmc's kernel (the tuning
DB's paired verdict: gemmc.choose.auto), behind the kernel's own argument checks (a runtime.Launcher over the
kernel's params), so a call passes or fails alike on either route. Per-tensor and per-row scales only
(GemmSpec.plain_scaled): this torch's _scaled_mm takes no blockwise scales, and no epilogue. It accumulates as
gemmc's kernels do (use_fast_accum=True). `device_type="cpu"` is for the tests (torch._scaled_mm runs there)."""
from __future__ import annotations

from .errors import SpecError
from .spec import GemmSpec
from .types import torch_dtype


class ScaledMmRoute:
    def __init__(self, spec: GemmSpec, params, *, name: str = "gemm", signature=None, device_type: str = "cuda"):
        import torch
        from .runtime import Launcher
        if not spec.plain_scaled:
            raise SpecError(f"{spec.name}: torch._scaled_mm runs fp8 GEMMs with per-tensor or per-row scales and "
                            "no epilogue op; compile this one with a gemmc schedule")
        tensors = tuple(p for p in params if p.kind == "tensor")     # no split-K scratch: torch needs none
        roles = [p.role for p in tensors]
        if roles != ["a", "b", "scale", "scale", "out"]:
            raise SpecError(f"{spec.name}: the torch._scaled_mm route takes the params a, b, two scales, out in "
                            f"that order, got {roles}")
        out_dtype = torch_dtype(spec.out_dtype)
        row = spec.scaling.mode == "row"
        scaled_mm = torch._scaled_mm

        def run(a, b, sa, sb, out):
            if row:                 # (M, 1) and (1, N), as torch takes per-row scales
                sa, sb = sa.reshape(-1, 1), sb.reshape(1, -1)
            else:
                sa, sb = sa.reshape(()), sb.reshape(())
            return scaled_mm(a, b.t(), sa, sb, out_dtype=out_dtype, use_fast_accum=True, out=out)

        self.spec = spec
        self.launcher = Launcher(tensors, function=run, name=name, device_type=device_type, signature=signature,
                                 always_validate=True)

    def __call__(self, *args, out=None, **named):
        return self.launcher(*args, out=out, **named)

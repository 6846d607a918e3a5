"""The fp32 torch reference of a GemmSpec, random inputs for it, and the error measure.

Every correctness check (tests, bench, scripts) uses these: out = epilogue(A @ B) computed in fp32
from the upcast inputs; the error is the relative Frobenius norm, infinite when the output holds a
non-finite value (an unwritten NaN-poisoned element).
"""
from __future__ import annotations

from .spec import GemmSpec
from .types import torch_dtype


def make_inputs(spec: GemmSpec, m: int, n: int, k: int, batch: int = 1, device="cuda", generator=None):
    """randn A, B (storage shapes of the spec's layouts) and the epilogue inputs, in spec order
    (tensors get a leading batch dim when the spec is batched; scalars are Python floats)."""
    import torch
    lead = (batch,) if spec.batch is not None else ()
    dt = torch_dtype(spec.dtype)

    def randn(shape, dtype):
        return torch.randn(shape, device=device, dtype=torch.float32, generator=generator).to(dtype)

    a = randn(lead + ((m, k) if spec.a_layout == "mk" else (k, m)), dt)
    b = randn(lead + ((n, k) if spec.b_layout == "nk" else (k, n)), dt)
    extra = []
    for i, inp in enumerate(spec.inputs):
        if inp.kind == "scalar":
            extra.append(0.5 + 0.25 * i)
        else:
            shape = {"row": (n,), "col": (m,), "full": (m, n)}[inp.kind]
            vec_lead = lead if inp.kind == "full" else ()
            extra.append(randn(vec_lead + shape, torch_dtype(inp.dtype)))
    return a, b, extra


def reference(spec: GemmSpec, a, b, extra):
    """out = epilogue(A @ B) in fp32 from the upcast inputs, shaped (L?, M, N)."""
    import torch
    import torch.nn.functional as F

    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False   # a true fp32 reference
    try:
        a32 = a.float() if spec.a_layout == "mk" else a.float().transpose(-2, -1)   # (.., M, K)
        b32 = b.float().transpose(-2, -1) if spec.b_layout == "nk" else b.float()   # (.., K, N)
        acc = torch.matmul(a32, b32)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev

    values = {}
    for inp, x in zip(spec.inputs, extra):
        if inp.kind == "scalar":
            values[inp.name] = float(x)
        elif inp.kind == "row":                    # (N,) broadcast over rows
            values[inp.name] = x.float().unsqueeze(-2)
        elif inp.kind == "col":                    # (M,) broadcast over columns
            values[inp.name] = x.float().unsqueeze(-1)
        else:
            values[inp.name] = x.float()
    nodes = []

    def get(r):
        if r.kind == "acc":
            return acc
        if r.kind == "input":
            return values[r.value]
        if r.kind == "const":
            return float(r.value)
        return nodes[int(r.value)]

    unary = {
        "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "silu": F.silu,
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu_erf": lambda x: F.gelu(x),
    }
    for op in spec.epilogue:
        x = get(op.args[0])
        if op.op in ("add", "sub", "mul", "div"):
            y = get(op.args[1])
            r = {"add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y, "div": lambda: x / y}[op.op]()
            if not isinstance(r, torch.Tensor):
                r = torch.full_like(acc, r)
        elif op.op == "clamp":
            r = torch.clamp(x, min=op.attr("min"), max=op.attr("max"))
        elif op.op == "cast":
            r = x.to(torch_dtype(op.attr("dtype"))).float()
        else:
            r = unary[op.op](x)
        nodes.append(r)
    out = nodes[-1] if nodes else acc
    return out.expand_as(acc) if out.shape != acc.shape else out


def rel_frobenius(out, ref) -> float:
    """||out - ref||_F / ||ref||_F; inf when `out` holds a non-finite value (e.g. an unwritten NaN)."""
    import torch
    o = out.float()
    if not torch.isfinite(o).all():
        return float("inf")
    denom = torch.linalg.vector_norm(ref).item()
    num = torch.linalg.vector_norm(o - ref).item()
    return num / denom if denom else (0.0 if num == 0 else float("inf"))

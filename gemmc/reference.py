"""The fp32 torch reference of a GemmSpec, random inputs for it, and the error measures.

Every correctness check (tests, bench, scripts) uses these: out = epilogue(A @ B) computed in fp32
from the upcast inputs (TF32 off); the errors are the relative Frobenius norm, infinite when the output
holds a non-finite value (an unwritten NaN-poisoned element), and the elementwise error scaled by the
bound a correct kernel meets (`reference_and_bound`, `error_figures`).

The elementwise bound. A correct kernel accumulates the exact bf16/f16 products in its accumulator
type, applies the epilogue in f32 and rounds to the output type (round to nearest). Per element, with
S = |A| @ |B| (the sum of |a_k b_k|) and u_t the unit roundoff of type t (2^-8 bf16, 2^-11 f16, 2^-24 f32):
  accumulator  E = sqrt(K) (u_acc + u_f32) S   the kernel's accumulation and the fp32 reference's own.
               sqrt(K) is the probabilistic growth of rounding errors (the worst case is K); simulated
               accumulators that truncate instead of rounding, per MMA step or per aligned product,
               stay under a quarter of sqrt(K) u_f32 S, an eighth of E, on randn inputs
               (tests/test_bench_checks.py); cuBLAS on an H200 stays under half the whole bound.
  epilogue     first-order propagation op by op (`_propagate`): sums add errors, products scale them by
               the other operand, unary functions by their Lipschitz constant plus FN_EPS of libm-grade
               f32 math; a cast, the farthest its rounding of any value within the error
               lands from the reference's (one ulp near a rounding boundary, else 0).
  output       |fl(v) - ref| <= e + u_out (|ref| + e) for the propagated error e.
The bound is SAFETY x (that + half the output type's subnormal spacing).
A grouped GEMM's reference (`grouped_reference_and_bound`) is each group's, computed as a plain GEMM of its rows
and its weight; rows of no group are NaN, which an unwritten NaN-filled output matches and a written one fails.
A grouped fp8 GEMM's group is the plain fp8 reference of its rows with their scales and its weight with its own.

fp8 (a spec with a scaling): the reference multiplies the dequantized operands (`gemmc.quantize.dequantize`,
fp8 values times their f32 scales) in fp32, so the inputs' fp8 rounding is not an error of the kernel's: only
its accumulation and output rounding remain. The fp8 tensor cores add each MMA's K = 32 exact products into a
sum they keep at reduced precision (about 14 mantissa bits on Hopper, as DeepSeek-V3 reports; truncated),
promoted into f32 only by the kernel: the accumulator term counts those K / 32 roundings at
u = FP8_ACCUMULATION_U, sqrt(K / 32) (u + u_f32) S (tests/test_fp8_reference.py checks it against a simulated
kernel). `extra` holds A's and B's scales first, as the kernel takes them.
"""
from __future__ import annotations

import contextlib
import math

from .spec import GemmSpec
from .types import DType, torch_dtype

# the fp8 tensor cores' sum between promotions: its unit roundoff (about 14 bits kept, truncated: 2^-13), once
# per MMA of K = FP8_MMA_K products
FP8_ACCUMULATION_U = 2.0 ** -13
FP8_MMA_K = 32
SAFETY = 2.0            # x the whole bound: room for model slack (the accumulator term already has >= 5x)
FN_EPS = 2.0 ** -16     # per transcendental op, relative to |f(x)| + |x|: ~250 ulp of f32 for two libm calls,
                        # and |x| covers the cancellation in 0.5 x (1 + tanh/erf(.)) at large negative x
# sup |f'|: a kernel error e in the argument moves the result by at most L e (derivatives measured in the tests)
LIPSCHITZ = {"relu": 1.0, "clamp": 1.0, "tanh": 1.0, "sigmoid": 0.25, "silu": 1.1, "gelu_tanh": 1.13,
             "gelu_erf": 1.13}


def make_inputs(spec: GemmSpec, m: int, n: int, k: int, batch: int = 1, device="cuda", generator=None):
    """randn A, B (storage shapes of the spec's layouts) and the epilogue inputs, in spec order
    (tensors get a leading batch dim when the spec is batched; scalars are Python floats). fp8: A and B
    quantized from randn with their scaling's scales (gemmc.quantize), which lead `extra`."""
    import torch
    lead = (batch,) if spec.batch is not None else ()
    dt = torch_dtype(spec.dtype)

    def randn(shape, dtype):
        return torch.randn(shape, device=device, dtype=torch.float32, generator=generator).to(dtype)

    extra = []
    if spec.scaling is not None:
        a, b, scales = fp8_operands(spec, m, n, k, randn)
        extra += scales
    else:
        a = randn(lead + ((m, k) if spec.a_layout == "mk" else (k, m)), dt)
        b_rows = 2 * n if spec.gate is not None else n      # gated: [gate; up]
        b = randn(lead + ((b_rows, k) if spec.b_layout == "nk" else (k, n)), dt)
    for i, inp in enumerate(spec.inputs):
        if inp.kind == "scalar":
            extra.append(0.5 + 0.25 * i)
        else:
            shape = {"row": (n,), "col": (m,), "full": (m, n)}[inp.kind]
            vec_lead = lead if inp.kind == "full" else ()
            extra.append(randn(vec_lead + shape, torch_dtype(inp.dtype)))
    return a, b, extra


def group_rows(spec: GemmSpec, groups) -> list[tuple[int, int]]:
    """(first row, rows) of each group of a grouped GEMM, from its offsets (contiguous) or counts (masked)."""
    values = [int(v) for v in groups.detach().cpu().tolist()]
    if spec.group_layout == "masked":
        return [(0, v) for v in values]
    return [(values[g], values[g + 1] - values[g]) for g in range(len(values) - 1)]


def make_grouped_inputs(spec: GemmSpec, rows: list[int], n: int, k: int, m: int | None = None, device="cuda",
                        generator=None):
    """randn A and B of a grouped GEMM whose group g holds rows[g] rows, its offsets (contiguous: from 0, A of
    `m` rows, at least their sum) or counts (masked: A E x m x K, m at least the largest), and the epilogue
    inputs (scalars). fp8 (block scaling): A and B quantized as `fp8_operands` does, B per group (each expert's
    weight its own 128 x 128 blocks), and A's and B's scales lead `extra` (`grouped_call_args` orders a call)."""
    import itertools

    import torch
    dt = torch_dtype(spec.dtype)

    def randn(shape, dtype=dt):
        return torch.randn(shape, device=device, dtype=torch.float32, generator=generator).to(dtype)

    e = len(rows)
    masked = spec.group_layout == "masked"
    m = (max(rows + [1]) if masked else sum(rows)) if m is None else m
    a_shape = (e, m, k) if masked else (m, k)
    extra = []
    if spec.scaling is not None:
        a, b, scales = grouped_fp8_operands(spec, a_shape, e, n, k, randn)
        extra += scales
    else:
        b = randn((e, 2 * n if spec.gate is not None else n, k) if spec.b_layout == "nk" else (e, k, n))
        a = randn(a_shape)
    if masked:
        groups = torch.tensor(rows, dtype=torch.int32, device=device)
    else:
        groups = torch.tensor([0, *itertools.accumulate(rows)], dtype=torch.int32, device=device)
    extra += [0.5 + 0.25 * i for i, _ in enumerate(spec.inputs)]
    return a, b, groups, extra


def grouped_call_args(spec: GemmSpec, a, b, groups, extra) -> tuple:
    """The positional arguments of a grouped kernel's call on `make_grouped_inputs`' values: (a, b, A's and B's
    scales (fp8), the offsets or counts, the epilogue inputs)."""
    scales = 2 if spec.scaling is not None else 0
    return (a, b, *extra[:scales], groups, *extra[scales:])


def grouped_reference_and_bound(spec: GemmSpec, a, b, groups, extra):
    """(reference, bound) of a grouped GEMM: each group's rows as a plain GEMM of its weight, in fp32; rows of no
    group NaN (an unwritten NaN-filled output matches them; a written one fails `error_figures`). fp8: each
    group's rows dequantized with their rows of A's scales, its weight with its own B scales (`extra` leads
    with A's and B's scales, as make_grouped_inputs returns them)."""
    import dataclasses

    import torch
    shape = a.shape[:-1] + (spec.n,)
    ref = torch.full(shape, math.nan, dtype=torch.float32, device=a.device)
    bound = torch.full(shape, math.inf, dtype=torch.float32, device=a.device)
    for g, (row0, rows) in enumerate(group_rows(spec, groups)):
        if rows <= 0:
            continue
        plain = dataclasses.replace(spec, groups=None, group_layout=None, m=rows)
        at = (slice(row0, row0 + rows),) if spec.group_layout == "contiguous" else (g, slice(0, rows))
        extra_g = extra
        if spec.scaling is not None:    # the group's rows of A's scales, and its weight's
            extra_g = [extra[0][at], extra[1][g], *extra[2:]]
        r, e = _evaluate(plain, a[at], b[g], extra_g, with_bound=True)
        ref[at], bound[at] = r, e
    return ref, bound
def _spread(rows: int, cols: int, randn):
    """randn rows x cols (f32) with a spread of magnitudes: each row, and each 128-column block, times 2^[-4, 4)."""
    import torch
    x = randn((rows, cols), torch.float32)
    row = torch.exp2(torch.floor(8 * randn((rows, 1), torch.float32).sigmoid()) - 4)
    block = torch.exp2(torch.floor(8 * randn((1, -(-cols // 128)), torch.float32).sigmoid()) - 4)
    return x * row * block.repeat_interleave(128, dim=1)[:, :cols]


def _check_fp8_layouts(spec: GemmSpec) -> None:
    if (spec.a_layout, spec.b_layout) != ("mk", "nk"):
        raise ValueError(f"fp8 inputs are made for A [M, K] and B [N, K] (a_layout 'mk', b_layout 'nk'); got "
                         f"{spec.a_layout}, {spec.b_layout}")


def fp8_operands(spec: GemmSpec, m: int, n: int, k: int, randn):
    """(a, b, [sa, sb]) of an fp8 spec: randn rows with a spread of magnitudes (each row of A and B, and each
    128-column block of A, times 2^[-4, 4)), so that per-row and per-block scales differ, quantized per the
    spec's scaling. `randn(shape, dtype)` draws."""
    from .quantize import quantize
    _check_fp8_layouts(spec)
    a, sa = quantize(_spread(m, k, randn), spec.scaling.mode, spec.dtype)
    b, sb = quantize(_spread(n, k, randn), spec.scaling.mode, spec.b_dtype, weight=True)
    return a, b, [sa, sb]


def grouped_fp8_operands(spec: GemmSpec, a_shape: tuple, groups: int, n: int, k: int, randn):
    """(a, b, [sa, sb]) of a grouped fp8 spec (block scaling): A of `a_shape` ((M, K) or (E, M, K)), quantized
    per 1 x 128 block of each row (sa (M, Kb) or (E, M, Kb)); B (E, N, K), each group's weight quantized on its
    own (sb (E, Nb, Kb)); magnitudes spread as fp8_operands'."""
    import torch
    from .quantize import quantize
    _check_fp8_layouts(spec)
    rows = math.prod(a_shape[:-1])
    a, sa = quantize(_spread(rows, k, randn), spec.scaling.mode, spec.dtype)    # row-local: every group's rows
    weights = [quantize(_spread(n, k, randn), spec.scaling.mode, spec.b_dtype, weight=True) for _ in range(groups)]
    b = torch.stack([q for q, _ in weights]) if weights else torch.empty((0, n, k), dtype=a.dtype, device=a.device)
    sb = torch.stack([s for _, s in weights]) if weights else torch.empty((0, -(-n // 128), -(-k // 128)),
                                                                           device=a.device)
    return a.reshape(a_shape), b, [sa.reshape(a_shape[:-1] + sa.shape[-1:]), sb]


# ---- fp32 matmuls ---------------------------------------------------------------------------------

def _precision_switches():
    """(module, legacy flag) of every matmul backend that can trade fp32 for TF32/bf16."""
    import torch
    out = [(torch.backends.cuda.matmul, "allow_tf32")]
    mkl = getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)
    if mkl is not None:
        out.append((mkl, None))
    return out


@contextlib.contextmanager
def fp32_matmul():
    """Matmuls in true fp32 inside, the caller's settings restored after. Newer torch has per-backend
    `fp32_precision` and raises when `allow_tf32` is read in a process that used it, so that API is used
    wherever it exists; older torch only has `allow_tf32`."""
    saved = []
    try:
        for mod, legacy in _precision_switches():
            if hasattr(mod, "fp32_precision"):
                saved.append((mod, "fp32_precision", mod.fp32_precision))
                mod.fp32_precision = "ieee"
            elif legacy is not None:
                saved.append((mod, legacy, getattr(mod, legacy)))
                setattr(mod, legacy, False)
        yield
    finally:
        for mod, name, value in reversed(saved):
            setattr(mod, name, value)


# ---- the reference and its bound ------------------------------------------------------------------

def reference(spec: GemmSpec, a, b, extra):
    """out = epilogue(A @ B) in fp32 from the upcast inputs, shaped (L?, M, N)."""
    return _evaluate(spec, a, b, extra, with_bound=False)[0]


def reference_and_bound(spec: GemmSpec, a, b, extra):
    """(reference, elementwise bound): a correct kernel's output `out` has |out - reference| <= bound
    everywhere (`error_figures` measures it). Costs one more fp32 matmul, |A| @ |B|."""
    return _evaluate(spec, a, b, extra, with_bound=True)


def unit_roundoff(dtype) -> float:
    """u of round-to-nearest in `dtype` (a DType, name or torch dtype): |fl(x) - x| <= u |x| in its normal range."""
    import torch
    return torch.finfo(_torch_float(dtype)).eps / 2


def _torch_float(dtype):
    import torch
    if isinstance(dtype, torch.dtype):
        return dtype
    from .types import as_dtype
    return torch_dtype(as_dtype(dtype))


def _tiny(dtype) -> float:
    """Half the subnormal spacing of `dtype` (its rounding error below the normal range), at least the
    smallest normal f32 so that a bound is never 0."""
    import torch
    fi = torch.finfo(_torch_float(dtype))
    return max(fi.smallest_normal * fi.eps / 2, torch.finfo(torch.float32).smallest_normal)


def accumulation_bound(abs_product, k: int, acc_dtype=DType.f32, fp8: bool = False):
    """E = sqrt(K) (u_acc + u_f32) |A| @ |B|: the kernel's accumulation error plus the fp32 reference's own;
    `fp8`: sqrt(K / 32) (FP8_ACCUMULATION_U + u_f32) |A| @ |B|, the fp8 tensor cores' (module doc).
    Scales `abs_product` in place and returns it."""
    if fp8:
        return abs_product.mul_(math.sqrt(max(1, k / FP8_MMA_K)) * (FP8_ACCUMULATION_U + unit_roundoff(DType.f32)))
    return abs_product.mul_(math.sqrt(k) * (unit_roundoff(acc_dtype) + unit_roundoff(DType.f32)))


def output_bound(ref, err, out_dtype):
    """SAFETY (err + u_out (|ref| + err) + tiny): a value within `err` of `ref`, rounded to `out_dtype`.
    Computed in `err`'s storage (a tensor of ref's shape), which it returns."""
    u = unit_roundoff(out_dtype)
    return err.mul_(1 + u).add_(ref.abs(), alpha=u).add_(_tiny(out_dtype)).mul_(SAFETY)


def gemm_bound(ref, abs_product, k: int, out_dtype, acc_dtype=DType.f32, fp8: bool = False):
    """The elementwise bound of a plain GEMM (no epilogue) from its fp32 reference and |A| @ |B|
    (whose storage it takes); `fp8`: of dequantized fp8 operands (accumulation_bound)."""
    return output_bound(ref, accumulation_bound(abs_product, k, acc_dtype, fp8=fp8), out_dtype)


def _unary(name: str):
    """The torch function of a unary epilogue op."""
    import torch
    import torch.nn.functional as F
    return {"relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "silu": F.silu,
            "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "gelu_erf": lambda x: F.gelu(x)}[name]


def _evaluate(spec: GemmSpec, a, b, extra, with_bound: bool):
    import torch

    if spec.scaling is not None:    # the dequantized fp8 operands (module doc); the scales lead `extra`
        from .quantize import dequantize
        (sa, sb), extra = extra[:2], extra[2:]
        a, b = dequantize(a, sa), dequantize(b, sb)
    with fp32_matmul():   # a true fp32 reference
        a32 = a.float() if spec.a_layout == "mk" else a.float().transpose(-2, -1)   # (.., M, K)
        b32 = b.float().transpose(-2, -1) if spec.b_layout == "nk" else b.float()   # (.., K, N)
        acc = torch.matmul(a32, b32)
        err_acc = torch.matmul(a32.abs(), b32.abs()) if with_bound else None
    if with_bound:
        err_acc = accumulation_bound(err_acc, a32.shape[-1], spec.acc_dtype, fp8=spec.scaling is not None)
    del a32, b32
    if spec.gate is not None:     # gate(A @ B[:N].T) * (A @ B[N:].T), its error propagated as the ops' are
        acc, err_acc = _gated(spec.gate, acc, err_acc)

    values = {}
    for inp, x in zip(spec.inputs, extra):
        if inp.kind == "scalar":     # an f32 value, as the kernel holds it (a python float would run in f64)
            values[inp.name] = torch.tensor(float(x), dtype=torch.float32, device=acc.device)
        elif inp.kind == "row":                    # (N,) broadcast over rows
            values[inp.name] = x.float().unsqueeze(-2)
        elif inp.kind == "col":                    # (M,) broadcast over columns
            values[inp.name] = x.float().unsqueeze(-1)
        else:
            values[inp.name] = x.float()
    nodes, errs = [], []

    def get(r):
        if r.kind == "acc":
            return acc
        if r.kind == "input":
            return values[r.value]
        if r.kind == "const":
            return float(r.value)
        return nodes[int(r.value)]

    def err_of(r):   # inputs and constants are exact in f32
        return err_acc if r.kind == "acc" else errs[int(r.value)] if r.kind == "node" else 0.0

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
            r = _unary(op.op)(x)
        if with_bound:
            errs.append(_propagate(op, x, get(op.args[1]) if len(op.args) > 1 else None, r,
                                   [err_of(a) for a in op.args]))
        nodes.append(r)
    out = nodes[-1] if nodes else acc
    bound = None
    if with_bound:
        err = errs[-1] if errs else err_acc
        err = (err.expand_as(out).clone(memory_format=torch.contiguous_format) if isinstance(err, torch.Tensor)
               else torch.full_like(out, err))
        bound = output_bound(out, err, spec.out_dtype).nan_to_num_(nan=math.inf)   # NaN: no bound there
        bound = bound.expand_as(acc) if bound.shape != acc.shape else bound
    return (out.expand_as(acc) if out.shape != acc.shape else out), bound


def _gated(gate: str, acc, err_acc):
    """(gate(g) * u, its bound or None) from the [gate | up] accumulator columns and their bounds."""
    from .spec import EpilogueOp, Ref
    g, u = acc.chunk(2, dim=-1)
    act = _unary(gate)(g)
    out = act * u
    if err_acc is None:
        return out, None
    eg, eu = err_acc.chunk(2, dim=-1)
    e_act = _propagate(EpilogueOp(gate, (Ref.acc(),)), g, None, act, [eg])
    return out, _propagate(EpilogueOp("mul", (Ref.node(0), Ref.acc())), act, u, out, [e_act, eu])


def _propagate(op, x, y, r, in_errs):
    """First-order bound on |kernel - reference| after `op`, from its operands' reference values (x, y),
    its reference result r and its operands' bounds. f32 rounding of each side's own result: 2 u_f32."""
    import torch
    u32 = unit_roundoff(DType.f32)
    ex = in_errs[0]
    ar = r.abs()
    if op.op in ("add", "sub", "mul", "div"):
        ey = in_errs[1]
        ax, ay = abs(x), abs(y)
        if op.op in ("add", "sub"):
            e = ex + ey
        elif op.op == "mul":
            e = ay * ex + ax * ey + ex * ey
        else:   # x'/y' - x/y = (dx - r dy) / y': unbounded when y may cross 0
            den = ay - ey
            e = (ex + ar * ey) / den
            e = torch.where(torch.as_tensor(den > 0), torch.as_tensor(e), math.inf)
        return e + 2 * u32 * (ar + e)
    if op.op in ("relu", "clamp"):
        return ex + 0.0 * ar                      # exact ops (the broadcast keeps r's shape)
    if op.op == "cast":   # rounding is monotone: a value within ex of x rounds between the roundings of x -+ ex
        dt = torch_dtype(op.attr("dtype"))
        ex = ex + 2 * u32 * abs(x)               # x -+ ex are themselves rounded to f32
        return torch.maximum(((x + ex).to(dt).float() - r).abs(), ((x - ex).to(dt).float() - r).abs())
    return LIPSCHITZ[op.op] * ex + FN_EPS * (ar + abs(x))


# ---- error measures -------------------------------------------------------------------------------

def rel_frobenius(out, ref) -> float:
    """||out - ref||_F / ||ref||_F over the finite elements; inf when `out` is non-finite anywhere the
    reference is not, or differs from it there (an unwritten NaN, an inf of the wrong sign)."""
    import torch
    o = out.float()
    finite = torch.isfinite(o)
    if not finite.all():
        if not torch.equal(finite, torch.isfinite(ref)):
            return float("inf")
        o_nf, r_nf = o[~finite], ref[~finite]
        if not ((o_nf == r_nf) | (torch.isnan(o_nf) & torch.isnan(r_nf))).all():
            return float("inf")
        o, ref = o[finite], ref[finite]
    denom = torch.linalg.vector_norm(ref).item()
    num = torch.linalg.vector_norm(o - ref).item()
    return num / denom if denom else (0.0 if num == 0 else float("inf"))


def error_figures(out, ref, bound) -> tuple[float, float]:
    """(relative Frobenius error, max |out - ref| / bound) of `out` against the fp32 reference and its
    elementwise bound; the second is <= 1 for a correct kernel. Both are NaN when `out` holds NaN where
    the reference does not (an unwritten element). Values beyond the output type's range compare as its
    largest finite value (a kernel rounding a huge reference to inf is right)."""
    import torch
    big = torch.finfo(out.dtype).max
    d = out.to(torch.float32, copy=True).nan_to_num_(nan=math.nan, posinf=big, neginf=-big)
    both_nan = None
    if ref.isnan().any():                        # NaN where the reference is NaN is right
        both_nan = ref.isnan() & d.isnan()
    d.sub_(ref.clamp(-big, big) if big < torch.finfo(torch.float32).max else ref).abs_()
    if both_nan is not None:
        d.masked_fill_(both_nan, 0.0)
    denom = torch.linalg.vector_norm(torch.nan_to_num(ref)).item()
    num = torch.linalg.vector_norm(d).item()
    rel = num / denom if denom else (0.0 if num == 0 else math.inf)
    return rel, d.div_(bound).amax().item()


def checked_error(spec: GemmSpec, out, a, b, extra=()) -> float:
    """One figure for a GPU check of `out` (the kernel's output for inputs a, b, extra): its relative
    Frobenius error against the fp32 reference, or inf when any element is beyond its elementwise bound or
    unwritten (error_figures), so that `checked_error(...) < 1e-2` passes a correct kernel only. A dropped
    k-tile in one of many output tiles moves the Frobenius figure less than 1e-2; the bound catches it."""
    rel, elem = error_figures(out, *reference_and_bound(spec, a, b, extra))
    return rel if elem <= 1 else math.inf           # NaN (unwritten) fails too

"""Source emitters shared by the SM90 and SM80 backends.

- `epilogue_math_lines`: the plan's epilogue DAG as straight-line CuTe DSL scalar code (f32 math).
- `input_view_lines` / `input_value_expr`: how epilogue inputs are viewed on the host and read per element.
- `splitk_reduce`: the deterministic split-K reduction kernel that sums the f32 partials in split
  order, applies the epilogue and writes the output, with its host launch.
- `private_inputs` / `check_input_names`: epilogue inputs under private names inside the emitted module,
  and the user's names that its host entry cannot take.
- `grouped_raster_source`: `tile_coord`, the order in which work units visit output tiles (raster and
  swizzle), with a narrower last group rather than padding.

Everything here returns source text (lines without trailing newlines); the backends paste it into the
module they emit. Conventions of the emitted code: `import cutlass`, `import cutlass.cute as cute`;
the output view is (M, N, L); a workspace view is (M, N, SPLIT_K * L) with split `s` of batch `l` at
index `s * L + l`.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from typing import Sequence

from ..errors import BuildError
from ..schedule import SPLITK_REDUCE_COLUMNS
from ..spec import EpilogueInput, EpilogueOp, Ref
from ..types import DType

DSL_TYPE = {DType.bf16: "cutlass.BFloat16", DType.f16: "cutlass.Float16", DType.f32: "cutlass.Float32",
            DType.f8e4m3: "cutlass.Float8E4M3FN", DType.f8e5m2: "cutlass.Float8E5M2"}

_SQRT_2_OVER_PI = 0.7978845608028654
_INV_SQRT_2 = 0.7071067811865476


def private_inputs(inputs: Sequence[EpilogueInput], ops: Sequence[EpilogueOp]):
    """The epilogue inputs (and the ops reading them) renamed `ep{i}_{name}`: the emitted kernels have locals
    and module names of their own (`s`, `m`, `l`, `tiles`, `tma_c`, `c_smem` ...); an input of that name would
    read or clash with them. The host entry takes the user's names and rebinds them first thing."""
    names = {x.name: f"ep{i}_{x.name}" for i, x in enumerate(inputs)}
    renamed = tuple(replace(x, name=names[x.name]) for x in inputs)

    def ref(r: Ref) -> Ref:
        return Ref.input(names[r.value]) if r.kind == "input" else r
    return renamed, tuple(replace(op, args=tuple(ref(r) for r in op.args)) for op in ops)


def rebind_inputs(user_inputs: Sequence[EpilogueInput], inputs: Sequence[EpilogueInput]) -> list[str]:
    """The host entry's first line: one parallel assignment of the private names, before any local is bound."""
    if not inputs:
        return []
    return [f"{', '.join(x.name for x in inputs)} = {', '.join(u.name for u in user_inputs)}"]


def check_input_names(source: str, inputs: Sequence[EpilogueInput], params, backend: str) -> None:
    """The host entry takes the inputs under the user's names (identifiers, not keywords: GemmSpec checks):
    one that is another host parameter (`params`' a, b, out, workspace ..., and the stream) or a module-level
    name of the kernel module (cute, TILE_MNK, gemm_kernel ...) breaks the module."""
    if not inputs:          # nothing to clash: no parse of the module
        return
    module_names = {q.name for q in params if q.role not in ("input", "scalar", "scale")} | {"stream"}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            module_names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            module_names.add(node.name)
        elif isinstance(node, ast.Assign):
            module_names |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    for x in inputs:
        if x.name in module_names:
            raise BuildError(f"{backend} backend: epilogue input {x.name!r} has the name of the kernel module's "
                             f"{x.name!r} (a parameter or module-level name); rename the input")


def dsl_type(dtype: DType) -> str:
    return DSL_TYPE[DType(dtype)]


def _f32(x: float) -> str:
    return f"cutlass.Float32({float(x)!r})"


def epilogue_math_lines(ops: Sequence[EpilogueOp], acc: str, inputs: dict[str, str],
                        prefix: str = "v") -> tuple[list[str], str]:
    """Straight-line code for the epilogue DAG on one f32 value.

    acc: expression of the accumulator element (f32). inputs: input name -> f32 expression of that
    input at the same element. Returns (lines, name of the result); with no ops the result is `acc`.
    Each op becomes `{prefix}{i} = ...` in f32; `cast` rounds through its dtype and comes back to f32.
    """
    lines: list[str] = []

    def ref(r: Ref) -> str:
        if r.kind == "acc":
            return acc
        if r.kind == "input":
            return inputs[str(r.value)]
        if r.kind == "const":
            return _f32(r.value)
        return f"{prefix}{int(r.value)}"

    result = acc
    for i, op in enumerate(ops):
        out = f"{prefix}{i}"
        x = ref(op.args[0])
        if op.op in ("add", "sub", "mul", "div"):
            sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[op.op]
            expr = f"{x} {sym} {ref(op.args[1])}"
        elif op.op == "relu":
            expr = f"cute.arch.fmax({x}, {_f32(0.0)}, nan=True)"   # NaN stays NaN, as in torch.relu
        elif op.op == "gelu_tanh":
            lines.append(f"{out}_x = {x}")
            expr = (f"{_f32(0.5)} * {out}_x * ({_f32(1.0)} + cute.math.tanh({_f32(_SQRT_2_OVER_PI)} * "
                    f"({out}_x + {_f32(0.044715)} * {out}_x * {out}_x * {out}_x)))")
        elif op.op == "gelu_erf":
            lines.append(f"{out}_x = {x}")
            expr = f"{_f32(0.5)} * {out}_x * ({_f32(1.0)} + cute.math.erf({out}_x * {_f32(_INV_SQRT_2)}))"
        elif op.op == "silu":
            lines.append(f"{out}_x = {x}")
            expr = f"{out}_x / ({_f32(1.0)} + cute.math.exp(-{out}_x))"
        elif op.op == "sigmoid":
            expr = f"{_f32(1.0)} / ({_f32(1.0)} + cute.math.exp(-({x})))"
        elif op.op == "tanh":
            expr = f"cute.math.tanh({x})"
        elif op.op == "clamp":
            expr = x
            if op.attr("min") is not None:
                expr = f"cute.arch.fmax({expr}, {_f32(op.attr('min'))}, nan=True)"   # torch.clamp keeps NaN
            if op.attr("max") is not None:
                expr = f"cute.arch.fmin({expr}, {_f32(op.attr('max'))}, nan=True)"
        elif op.op == "cast":
            expr = f"cutlass.Float32(({x}).to({dsl_type(op.attr('dtype'))}))"
        else:
            raise ValueError(f"epilogue op {op.op!r} has no SM90/SM80 lowering")
        lines.append(f"{out} = cutlass.Float32({expr})")
        result = out
    return lines, result


# ---- epilogue inputs ---------------------------------------------------------------------------

def input_view_lines(inputs: Sequence[EpilogueInput], batched: bool, suffix: str = "_v") -> list[str]:
    """Host-side views of the epilogue inputs: row -> (N, L), col -> (M, L), full -> (M, N, L).

    The raw params are in storage shape: row (N,) / (L, N), col (M,) / (L, M), full (M, N) / (L, M, N).
    """
    lines = []
    for inp in inputs:
        if inp.kind == "scalar":
            continue
        src = inp.name
        if batched:
            order = "[1, 0]" if inp.kind in ("row", "col") else "[1, 2, 0]"
            lines.append(f"{src}{suffix} = cute.make_tensor({src}.iterator, cute.select({src}.layout, mode={order}))")
        else:
            lines.append(f"{src}{suffix} = cute.make_tensor({src}.iterator, "
                         f"cute.append({src}.layout, cute.make_layout(1, stride=0)))")
    return lines


def input_value_expr(inp: EpilogueInput, m: str, n: str, l: str, suffix: str = "_v") -> str:
    """f32 value of an epilogue input at element (m, n, l) of the output, given the views above."""
    if inp.kind == "scalar":
        return f"cutlass.Float32({inp.name})"
    v = inp.name + suffix
    if inp.kind == "one":       # a one-element tensor (an fp8 per-tensor scale)
        return f"cutlass.Float32({v}[0].to(cutlass.Float32))"
    idx = {"row": f"({n}, {l})", "col": f"({m}, {l})", "full": f"({m}, {n}, {l})"}[inp.kind]
    return f"cutlass.Float32({v}[{idx}].to(cutlass.Float32))"


def input_kernel_params(inputs: Sequence[EpilogueInput], suffix: str = "_v") -> list[str]:
    """Kernel parameter declarations for the epilogue inputs (views, or f32 scalars)."""
    return [f"{i.name}: cutlass.Float32" if i.kind == "scalar" else f"{i.name}{suffix}: cute.Tensor" for i in inputs]


def input_kernel_args(inputs: Sequence[EpilogueInput], suffix: str = "_v") -> list[str]:
    return [i.name if i.kind == "scalar" else i.name + suffix for i in inputs]


# ---- split-K reduction ------------------------------------------------------------------------

REDUCE_THREADS = SPLITK_REDUCE_COLUMNS     # the launch rule (gemmc/schedule/predicate.py) sizes its grid by this


@dataclass(frozen=True)
class SplitKReduce:
    """The reduce kernel's source and the host lines that launch it."""
    source: str
    launch_lines: tuple[str, ...]


def splitk_reduce(ops: Sequence[EpilogueOp], inputs: Sequence[EpilogueInput], split_k: int, out_dtype: DType,
                  ws: str, out: str, stream: str = "stream", name: str = "splitk_reduce_kernel",
                  pdl: bool = False) -> SplitKReduce:
    """The split-K reduction kernel and its launch (ws: (M, N, S*L) view, out: (M, N, L) view).

    Built together from one `pdl` (and one `inputs`) so the kernel's grid-dependency wait and the
    launch's use_pdl, and the kernel's params and the launch's args, cannot disagree.
    """
    return SplitKReduce(_reduce_kernel_source(ops, inputs, split_k, out_dtype, name, pdl),
                        tuple(_reduce_launch_lines(inputs, ws, out, stream, name, pdl)))


def _reduce_kernel_source(ops: Sequence[EpilogueOp], inputs: Sequence[EpilogueInput], split_k: int,
                          out_dtype: DType, name: str, pdl: bool) -> str:
    """A @cute.kernel: out[m, n, l] = epilogue(sum over s in order of ws[m, n, s * L + l]).

    Deterministic: every element is summed by one thread in split order. One CTA row of
    REDUCE_THREADS threads walks N (coalesced); the grid is (ceil(N / REDUCE_THREADS) * M, L).
    pdl (SM90+): launched as a programmatic dependent of the main kernel, so it waits on the
    grid dependency (the main kernel's completion and memory flush) before reading the partials.
    """
    pdl_lines = "    cute.arch.griddepcontrol_wait()   # PDL: the partials are complete and visible after this\n" if pdl else ""
    params = ", ".join(["ws: cute.Tensor", "out: cute.Tensor"] + input_kernel_params(inputs))
    vals = {i.name: input_value_expr(i, "m", "n", "l") for i in inputs}
    math_lines, result = epilogue_math_lines(ops, "acc", vals)
    body = "\n".join("        " + ln for ln in math_lines)
    return f'''
@cute.kernel
def {name}({params}):
    """split-K reduce kernel: sum the {split_k} f32 partials of each element in order, then the epilogue."""
{pdl_lines}    tidx, _, _ = cute.arch.thread_idx()
    bidx, bidy, _ = cute.arch.block_idx()
    num_m = cute.size(out, mode=[0])
    num_n = cute.size(out, mode=[1])
    num_l = cute.size(out, mode=[2])
    m = bidx % num_m
    n = (bidx // num_m) * {REDUCE_THREADS} + tidx
    l = bidy
    if n < num_n:
        acc = cutlass.Float32(0.0)
        for s in cutlass.range_constexpr({split_k}):
            acc = acc + ws[(m, n, s * num_l + l)]
{body}
        out[(m, n, l)] = ({result}).to({dsl_type(out_dtype)})
'''


def _reduce_launch_lines(inputs: Sequence[EpilogueInput], ws: str, out: str, stream: str, name: str,
                         pdl: bool) -> list[str]:
    """Host-side launch of the reduction kernel; pdl: a programmatic dependent launch."""
    args = ", ".join([ws, out] + input_kernel_args(inputs))
    return [
        f"reduce_m = cute.size({out}, mode=[0])",
        f"reduce_nb = (cute.size({out}, mode=[1]) + {REDUCE_THREADS - 1}) // {REDUCE_THREADS}",
        f"{name}({args}).launch(grid=[reduce_m * reduce_nb, cute.size({out}, mode=[2]), 1], "
        f"block=[{REDUCE_THREADS}, 1, 1], stream={stream}{', use_pdl=True' if pdl else ''})",
    ]


def grouped_raster_source(raster_m: str, group: str) -> str:
    """`tile_coord(idx, tiles_m, tiles_n) -> (m, n)`: work unit `idx` of a tiles_m x tiles_n grid under the
    grouped raster. `raster_m` and `group` name the emitted module's constants: the raster (True: M is
    walked, groups are side-by-side N columns) and the group width. Within a group the slow dim varies
    fastest; a last group narrower than `group` takes the remainder, so every index maps to a real
    tile (cutlass.utils' swizzled scheduler instead pads the grid to whole groups and runs the padding)."""
    return f'''
@cute.jit
def tile_coord(bidx, tiles_m, tiles_n):
    """Grouped raster: {group} tiles of the slow dim side by side, the fast dim walked down them."""
    fast_tiles, slow_tiles = (tiles_m, tiles_n) if {raster_m} else (tiles_n, tiles_m)
    group_tiles = {group} * fast_tiles
    group = bidx // group_tiles
    first = group * {group}
    width = slow_tiles - first
    if width > {group}:
        width = {group}
    local = bidx - group * group_tiles
    slow = first + local % width
    fast = local // width
    return (fast, slow) if {raster_m} else (slow, fast)
'''

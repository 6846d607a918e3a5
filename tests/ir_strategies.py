"""Hypothesis strategies for GEMM specs and schedules, shared by the IR/pass/compiler tests."""
from hypothesis import strategies as st

from gemmc import EpilogueInput, EpilogueOp, GemmSpec, Ref, Schedule
from gemmc.spec import EPILOGUE_OPS, INPUT_KINDS
from gemmc.types import DType

NAMES = st.sampled_from(["M", "N", "K", "L", "seq", "x", "f32"])   # "x"/"f32" must be quoted in types
floats = st.floats(allow_nan=False, allow_infinity=False, width=32)   # the kernel holds constants in f32 (GemmSpec refuses what overflows it)


def dims(static=st.integers(1, 1 << 16)):
    return st.one_of(static, NAMES)


@st.composite
def epilogues(draw, inputs):
    ops = []
    for idx in range(draw(st.integers(0, 5))):
        op = draw(st.sampled_from(EPILOGUE_OPS))
        refs = [st.just(Ref.acc()), floats.map(Ref.const)]
        if inputs:
            refs.append(st.sampled_from([Ref.input(i.name) for i in inputs]))
        if idx:
            refs.append(st.integers(0, idx - 1).map(Ref.node))
        arity = 2 if op in ("add", "sub", "mul", "div") else 1
        args = tuple(draw(st.one_of(*refs)) for _ in range(arity))
        attrs = ()
        if op == "cast":
            attrs = (("dtype", draw(st.sampled_from([DType.bf16, DType.f16, DType.f32]))),)
        elif op == "clamp":
            lo, hi = sorted([draw(floats), draw(floats)])
            attrs = draw(st.sampled_from([(("min", lo),), (("max", hi),), (("min", lo), ("max", hi))]))
        ops.append(EpilogueOp(op, args, attrs))
    # GemmSpec rejects an epilogue whose result never reads the accumulator: feed it in where it does not
    on_acc = []
    for op in ops:
        on_acc.append(any(r.kind == "acc" or (r.kind == "node" and on_acc[r.value]) for r in op.args))
    if ops and not on_acc[-1]:
        ops.append(EpilogueOp("add", (Ref.node(len(ops) - 1), Ref.acc())))
    return tuple(ops)


@st.composite
def specs(draw, static=st.integers(1, 1 << 16)):
    dtype = draw(st.sampled_from(["bf16", "f16"]))
    acc = draw(st.sampled_from(["f32", "f16"])) if dtype == "f16" else "f32"
    names = draw(st.lists(st.sampled_from(["bias", "res", "scale", "gate", "v"]), unique=True, max_size=3))
    inputs = tuple(EpilogueInput(n, draw(st.sampled_from(INPUT_KINDS)), draw(st.sampled_from(["f32", "bf16", "f16"])))
                   for n in names)
    return GemmSpec(m=draw(dims(static)), n=draw(dims(static)), k=draw(dims(static)), dtype=dtype,
                    out_dtype=draw(st.sampled_from(["bf16", "f16", "f32"])), acc_dtype=acc,
                    a_layout=draw(st.sampled_from(["mk", "km"])), b_layout=draw(st.sampled_from(["nk", "kn"])),
                    batch=draw(st.none() | dims(static)), inputs=inputs, epilogue=draw(epilogues(inputs)),
                    name=draw(st.sampled_from(["gemm", "linear_gelu", "k2"])))


def aligned_specs():
    """Specs whose static dims are multiples of 64: only the schedule decides validity."""
    return specs(static=st.integers(1, 128).map(lambda x: 64 * x))


ILLEGAL = {"tile": [(32, 128, 64), (128, 120, 64), (128, 128, 24), (256, 256, 128), (128, 512, 64)],
           "cluster": [(3, 1), (4, 8), (1, 16), (2, 2)], "stages": [1, 9, 12], "mode": ["pingpong", "split"],
           "raster": ["z"], "swizzle": [3, 16], "split_k": [32, 0]}


@st.composite
def schedules(draw, arch=None):
    """Mostly plausible schedules (from each arch's legal axes); one in three has a field set to an
    illegal value, so both sides of the predicate are exercised."""
    arch = arch or draw(st.sampled_from(["sm_90a", "sm_80"]))
    sm90 = arch == "sm_90a"
    mode = draw(st.sampled_from(["cooperative", "pingpong"])) if sm90 else "cooperative"
    bm = draw(st.sampled_from(([128, 256] if mode == "cooperative" else [64, 128]) if sm90 else [64, 128, 256]))
    bn = draw(st.sampled_from([64, 128, 192, 256] if sm90 else [64, 128, 256]))
    fields = dict(tile=(bm, bn, draw(st.sampled_from([32, 64]))),
                  cluster=draw(st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2)])) if sm90 else (1, 1),
                  stages=draw(st.sampled_from(["auto", 2, 3, 4, 6])), mode=mode,
                  raster=draw(st.sampled_from(["m", "n"])), swizzle=draw(st.sampled_from([1, 2, 4, 8])),
                  split_k=draw(st.sampled_from([1, 2, 4])), pdl=draw(st.booleans()))
    if draw(st.integers(0, 2)) == 0:
        bad = draw(st.sampled_from(sorted(ILLEGAL)))
        fields[bad] = draw(st.sampled_from(ILLEGAL[bad]))
    return Schedule(arch=arch, **fields)

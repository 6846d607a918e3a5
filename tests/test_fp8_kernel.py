"""fp8 SM90 kernels on the CPU: the emitted module's facts, params and scaled epilogue, the runtime's checks of
the scales, and sm_90a compiles whose PTX runs the fp8 WGMMA (e4m3/e5m2) with the scales read once per
distinct row and column. The GPU run (correctness against the dequantized fp32 reference, timing against
torch._scaled_mm) is tests/test_gpu_fp8.py and scripts/gpu_fp8.py."""
import re

import pytest
import torch

import gemmc
from gemmc import GemmSpec, LaunchError, Scaling, Schedule
from gemmc.backends.sm90 import emit
from gemmc.backends.sm90.kernel.facts import KernelFacts
from gemmc.errors import BuildError
from gemmc.runtime import Launcher
from gemmc.spec import EpilogueInput, EpilogueOp, Ref

from emit_support import compiled_ptx

BIAS = dict(inputs=(EpilogueInput("bias", "row", "bf16"),), epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))),))


def fp8(mode="row", m="M", n=1024, k=4096, b_dtype="f8e4m3", **kw) -> GemmSpec:
    return GemmSpec(m=m, n=n, k=k, dtype="f8e4m3", b_dtype=b_dtype, scaling=Scaling(mode, "sx", "sw"),
                    name=f"fp8_{mode}", **kw)


def emitted(spec, **sched):
    return gemmc.compile(spec, schedule=Schedule(**{"tile": (128, 128, 128), **sched})).emitted


def constants(source: str) -> dict:
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^([A-Z_]+) = (.+?)\s+#", source, re.M)}


def wgmma(ptx: str) -> set:
    return set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+\.f32\.\w+\.\w+)", ptx))


def global_loads(ptx: str, width: str) -> int:
    return len(re.findall(rf"^\s*ld\.global(?:\.nc)?(?:\.L\w+::\w+)*\.{width}\s", ptx, re.M))


# ---- emission --------------------------------------------------------------------------------------

def test_params_put_the_scales_after_b_with_the_scalings_shapes():
    shapes = {"tensor": ((1,), (1,)), "row": (("M",), (1024,)), "block": (("M", 32), (8, 32))}
    for mode, (sa, sb) in shapes.items():
        params = emitted(fp8(mode, b_dtype="f8e5m2", **BIAS)).params
        assert [(p.name, p.role) for p in params][:6] == [("a", "a"), ("b", "b"), ("sx", "scale"), ("sw", "scale"),
                                                          ("out", "out"), ("bias", "input")]
        assert [str(p.dtype) for p in params[:4]] == ["f8e4m3", "f8e5m2", "f32", "f32"]
        assert (params[2].shape, params[3].shape) == (sa, sb)


def test_row_and_tensor_scales_multiply_the_accumulator_before_the_users_epilogue():
    src = emitted(fp8("row", **BIAS)).source
    c = constants(src)
    assert (c["MMA_INST_K"], c["SCALING"], c["PROMOTE_K"]) == ("32", "'row'", "0")
    assert (c["A_DTYPE"], c["B_DTYPE"]) == ("cutlass.Float8E4M3FN", "cutlass.Float8E4M3FN")
    assert "EpilogueInput('ep0_sx', 'col', cutlass.Float32)" in src
    assert "EpilogueInput('ep1_sw', 'row', cutlass.Float32)" in src
    assert "EpilogueInput('ep2_bias', 'row', cutlass.BFloat16)" in src
    dag = src[src.index("def epilogue_dag"):src.index("\nKERNEL = ")]
    assert "v0 = cutlass.Float32(acc * cutlass.Float32(ep0_sx_v[(em, el)]" in dag
    assert "v1 = cutlass.Float32(v0 * cutlass.Float32(ep1_sw_v[(en, el)]" in dag
    assert "v2 = cutlass.Float32(v1 + cutlass.Float32(ep2_bias_v[(en, el)]" in dag
    assert "ep0_sx, ep1_sw, ep2_bias = sx, sw, bias" in src
    tensor = emitted(fp8("tensor")).source
    assert "EpilogueInput('ep0_sx', 'one', cutlass.Float32)" in tensor and "ep0_sx_v[0]" in tensor


def test_swapped_kernels_read_the_scales_at_the_problems_coordinates():
    src = emitted(fp8("row", m=16, b_dtype="f8e5m2"), tile=(64, 16, 128), mode="pingpong", swap_ab=True).source
    c = constants(src)
    assert (c["A_DTYPE"], c["B_DTYPE"]) == ("cutlass.Float8E5M2", "cutlass.Float8E4M3FN")   # the kernel's A is b
    assert "acc * cutlass.Float32(ep0_sx_v[(en, el)]" in src     # x's scale per row of the problem: kernel's n
    assert "v0 * cutlass.Float32(ep1_sw_v[(em, el)]" in src


def test_serial_split_k_scales_once_in_the_reduce_kernel():
    src = emitted(fp8("row", m=512), split_k=4).source
    c = constants(src)
    assert c["REDUCE_KERNEL"] == "True" and "def epilogue_dag" not in src
    reduce = src[src.index("def splitk_reduce_kernel"):]
    assert reduce.count("ep0_sx_v[") == 1 and reduce.count("ep1_sw_v[") == 1
    assert reduce.index("acc = acc + ws[") < reduce.index("ep0_sx_v[")      # after the sum


def test_bf16_modules_take_the_facts_defaults():
    src = emitted(GemmSpec(m="M", n=1024, k=4096), tile=(128, 128, 64)).source
    assert "MMA_INST_K" not in src and "SCALING" not in src
    ns = {k: None for k in ("A_DTYPE",)}
    with pytest.raises(NameError, match="lacks the facts"):
        KernelFacts.from_namespace(ns)


def test_emit_refuses_inconsistent_fp8_plans():
    from dataclasses import replace
    plan = gemmc.compile(fp8("row"), schedule=Schedule(tile=(128, 128, 128)), emit="ir").plan
    with pytest.raises(BuildError, match="MMA K is 16 for f8e4m3 operands; wgmma takes 32"):
        emit(replace(plan, mma=replace(plan.mma, inst_shape=(64, 128, 16))))
    with pytest.raises(BuildError, match="bf16 or f16 \\(fp8 with a scaling\\), got f8e4m3"):
        emit(replace(plan, scaling=None))


# ---- the runtime's checks of the scales ------------------------------------------------------------

class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, *values):
        self.calls.append(values)


def cpu_launcher(spec, **sched):
    rec = Recorder()
    return Launcher(emitted(spec, **sched).params, function=rec, device_type="cpu", always_validate=True), rec


def test_launcher_checks_fp8_operands_and_f32_scales():
    launcher, rec = cpu_launcher(fp8("row", n=256, k=512))
    x = torch.zeros(64, 512, dtype=torch.float8_e4m3fn)
    w = torch.zeros(256, 512, dtype=torch.float8_e4m3fn)
    sx, sw = torch.ones(64), torch.ones(256)
    out = launcher(x, w, sx, sw)
    assert out.shape == (64, 256) and out.dtype == torch.bfloat16 and len(rec.calls) == 1
    with pytest.raises(LaunchError, match="x must be f8e4m3, got torch.bfloat16|a must be f8e4m3"):
        launcher(x.to(torch.bfloat16), w, sx, sw)
    with pytest.raises(LaunchError, match="sx must be f32, got torch.bfloat16"):
        launcher(x, w, sx.bfloat16(), sw)
    with pytest.raises(LaunchError, match="sx.shape\\[0\\] gives M=63"):
        launcher(x, w, sx[:63], sw)
    # a scale is read one f32 at a time: a view at an odd (4-byte) offset is fine, an fp8 operand's is not
    launcher(x, w, torch.ones(65)[1:], sw)
    with pytest.raises(LaunchError, match="16-byte aligned"):
        launcher(torch.zeros(64 * 512 + 1, dtype=torch.float8_e4m3fn)[1:].view(64, 512), w, sx, sw)


def test_block_scales_need_no_16_byte_strides():
    """A's block scales (M, ceil(K/128)) of K = 896: rows of 7 f32, not a 16-byte multiple."""
    launcher, _ = cpu_launcher(fp8("block", n=256, k=896))
    x = torch.zeros(32, 896, dtype=torch.float8_e4m3fn)
    w = torch.zeros(256, 896, dtype=torch.float8_e4m3fn)
    assert launcher(x, w, torch.ones(32, 7), torch.ones(2, 7)).shape == (32, 256)
    with pytest.raises(LaunchError, match="sw.shape\\[0\\] must be 2"):
        launcher(x, w, torch.ones(32, 7), torch.ones(3, 7))


def test_a_0d_per_tensor_scale_reaches_the_kernel_as_its_1_element_view(monkeypatch):
    T, f8, f32 = gemmc.Tensor, gemmc.f8e4m3, gemmc.f32

    @gemmc.kernel
    def per_tensor(x: T[("M", 256), f8], w: T[(128, 256), f8], sx: T[(), f32], sw: T[(1,), f32]):
        return gemmc.scaled(x, sx) @ gemmc.scaled(w, sw).T
    k = gemmc.compile(per_tensor, schedule=Schedule(tile=(128, 128, 128)))
    launcher = Launcher(k.emitted.params, function=Recorder(), device_type="cpu", always_validate=True,
                        signature=per_tensor.call_signature)
    x, w = torch.zeros(8, 256, dtype=torch.float8_e4m3fn), torch.zeros(128, 256, dtype=torch.float8_e4m3fn)
    launcher(x, w, torch.tensor(2.0), torch.ones(1))
    (values,) = launcher._function.calls
    assert values[2].shape == (1,) and values[2].item() == 2.0
    with pytest.raises(LaunchError, match="sx must be 0-D with shape \\(\\)"):
        launcher(x, w, torch.ones(1), torch.ones(1))


# ---- PTX of CPU-built kernels ---------------------------------------------------------------------

@pytest.mark.parametrize("mode,b_dtype,sched,insts,loads", [
    # A's scales: 2 rows per thread; B's: 32 columns (2 per 8-column group of 128): one load each
    ("row", "f8e5m2", dict(), {"m64n128k32.f32.e4m3.e5m2"}, 34),
    ("tensor", "f8e4m3", dict(tile=(64, 256, 64), mode="pingpong", cluster=(1, 2)),
     {"m64n256k32.f32.e4m3.e4m3"}, None),
    ("row", "f8e4m3", dict(split_k=2, cluster=(2, 1)), {"m64n128k32.f32.e4m3.e4m3"}, None),
    ("row", "f8e5m2", dict(tile=(64, 16, 128), mode="pingpong", swap_ab=True), {"m64n16k32.f32.e5m2.e4m3"}, None),
    ("row", "f8e4m3", dict(stream_k=True), {"m64n128k32.f32.e4m3.e4m3"}, None),
])
def test_ptx_runs_the_fp8_wgmma_and_reads_each_scale_once(mode, b_dtype, sched, insts, loads):
    ptx = compiled_ptx(emitted(fp8(mode, b_dtype=b_dtype), **sched))
    assert wgmma(ptx) == insts
    if loads is not None:
        assert global_loads(ptx, "b32") == loads
    if mode == "tensor":
        assert global_loads(ptx, "b32") <= 4       # one sa and one sb per warpgroup's epilogue


def test_ptx_of_serial_split_k_reduces_then_scales():
    ptx = compiled_ptx(emitted(fp8("row", m=512), split_k=4))
    entries = re.findall(r"\.entry (\w+)", ptx)
    assert len(entries) == 2 and wgmma(ptx) == {"m64n128k32.f32.e4m3.e4m3"}


# ---- block scaling (DeepSeek-V3) ------------------------------------------------------------------

def test_block_scaled_kernels_promote_in_the_main_loop_not_the_epilogue():
    src = emitted(fp8("block", b_dtype="f8e5m2")).source
    c = constants(src)
    assert (c["SCALING"], c["PROMOTE_K"], c["MMA_INST_K"]) == ("'block'", "128", "32")
    assert "def epilogue_dag" not in src and "EPILOGUE_INPUTS = ()" in src     # no user epilogue, no scales there
    assert "KERNEL(a, b, out, (), None, None, None, stream, block_scales=(sx, sw))" in src   # no groups
    with_bias = emitted(fp8("block", **BIAS)).source
    dag = with_bias[with_bias.index("def epilogue_dag"):with_bias.index("\nKERNEL = ")]
    assert "sx" not in dag and "v0 = cutlass.Float32(acc + " in dag


@pytest.mark.parametrize("sched,k_blocks,loads", [
    (dict(), 4, 3),                                                 # 2 rows per thread + B's one scale
    (dict(tile=(64, 128, 128), mode="pingpong"), 4, 3),
    (dict(tile=(128, 64, 128), cluster=(2, 2)), 4, 3),
    (dict(tile=(256, 64, 128)), 8, 5),                              # 128 rows per warpgroup: 4 rows per thread
    (dict(split_k=2), 4, 3),
    (dict(stream_k=True), 4, 3),
])
def test_ptx_promotes_each_k_tile_times_its_block_scales(sched, k_blocks, loads):
    ptx = compiled_ptx(emitted(fp8("block", b_dtype="f8e5m2"), **sched))
    bn = sched.get("tile", (128, 128))[1]
    assert wgmma(ptx) == {f"m64n{bn}k32.f32.e4m3.e5m2"}
    assert ptx.count("wgmma.mma_async") == k_blocks            # one k-tile of 128: K / 32 WGMMAs per atom row
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+0;", ptx)  # each k-tile completes before its promotion
    assert global_loads(ptx, "b32") == loads                   # the scales, each distinct one once
    first_mma = ptx.index("wgmma.mma_async")
    assert global_loads(ptx[:first_mma], "b32") == loads        # read before the stage wait and the MMA
    rows, cols = sched.get("tile", (128, 128))[:2]
    per_thread = rows * cols // (128 if sched.get("mode") == "pingpong" else 256)
    promotion = ptx[first_mma:]
    assert len(re.findall(r"fma\.rn\.f32", promotion)) >= per_thread  # acc += tile_acc * factor, per element


def test_ptx_of_block_scaling_with_serial_split_k():
    ptx = compiled_ptx(emitted(fp8("block", m=512), split_k=4))
    assert len(re.findall(r"\.entry (\w+)", ptx)) == 2 and wgmma(ptx) == {"m64n128k32.f32.e4m3.e4m3"}


@pytest.mark.parametrize("mode,sched", [("block", dict()), ("block", dict(split_k=2)),
                                        ("row", dict(tile=(128, 256, 128)))])
def test_admitted_fp8_tiles_compile_without_spills(mode, sched):
    """The register model's budget (two accumulators under block scaling) holds: ptxas spills nothing."""
    from gemmc.build import ptxas_report
    reports = ptxas_report(emitted(fp8(mode), **sched))
    assert reports and not any(r.spills for r in reports)

"""SM80 backend on the CPU: plans lower to the right source and params, bad plans are refused, the
raster is a bijection, and two compiles (sm_80 and sm_90a) produce PTX with exactly the Ampere
instructions the plan asks for."""
from __future__ import annotations

import ast
import re
import types
from dataclasses import replace

import pytest
from hypothesis import given, strategies as st
from script_support import load_script

from gemmc.backends import emit as emit_any
from gemmc.backends.sm80 import emit
from gemmc.backends.sm80.emit import for_hopper
from gemmc.compiler import lower
from gemmc.errors import BuildError
from gemmc.schedule import Schedule
from gemmc.spec import EpilogueInput, EpilogueOp, GemmSpec, Ref

from emit_support import LAYOUTS, compiled_ptx, specs_with_inputs, storage_shapes

A, I, C, N = Ref.acc, Ref.input, Ref.const, Ref.node


def plan_of(spec: GemmSpec, **sched):
    _, plan = lower(spec, Schedule(arch="sm_80", **{"tile": (128, 128, 32), **sched}))
    return plan


def mma_count(plan) -> int:
    """mma.sync instructions in one k-tile of the main loop: each warp covers its share of the tile."""
    bm, bn, bk = plan.tile
    am, an, _ = plan.mma.atom_layout
    return (bm // am // 16) * (bn // an // 8) * (bk // 16)


# ---- emit (no compile) ----------------------------------------------------------------------------

@given(spec=specs_with_inputs(), split_k=st.sampled_from([1, 2, 4]))
def test_params_follow_storage_shapes(spec, split_k):
    k = emit(plan_of(spec, split_k=split_k))
    got = [(p.name, tuple(p.shape)) for p in k.params if p.kind != "workspace"]
    assert got == storage_shapes(spec)
    assert [p.kind for p in k.params if p.name.startswith("x")] == ["scalar" if x.kind == "scalar" else "tensor"
                                                                   for x in spec.inputs]
    ws = [p for p in k.params if p.kind == "workspace"]
    assert len(ws) == (split_k > 1)
    if ws:   # f32 partials: split_k x L x M x N
        elems = eval(ws[0].workspace_elems, {}, {"M": 100, "N": 24, "L": 3})
        assert elems == split_k * (3 if spec.batch else 1) * 100 * 24
        assert "splitk_reduce_kernel" in k.source
    # the host entry takes the params in order, then the stream
    sig = re.search(rf"def {k.entry}\((.*)\):", k.source).group(1)
    assert [a.split(":")[0].strip() for a in sig.split(",")] == [p.name for p in k.params] + ["stream"]


@given(layout=st.sampled_from(LAYOUTS), dtype=st.sampled_from(["bf16", "f16"]),
       out_dtype=st.sampled_from([None, "f32"]), data=st.data())
def test_every_valid_sm80_schedule_emits(layout, dtype, out_dtype, data):
    """The predicate and the backend agree: whatever schedule check_schedule accepts for sm_80, the
    passes lower and this backend emits (no plan it refuses)."""
    from gemmc.schedule import enumerate_schedules
    spec = GemmSpec(a_layout=layout[0], b_layout=layout[1], dtype=dtype, out_dtype=out_dtype)
    schedule = data.draw(st.sampled_from(enumerate_schedules(spec, "sm_80")))
    _, plan = lower(spec, schedule)
    k = emit(plan)
    assert f"STAGES = {plan.pipeline.stages} " in k.source and f"SPLIT_K = {schedule.split_k} " in k.source


def test_source_states_every_plan_fact():
    spec = GemmSpec(a_layout="km", b_layout="kn", dtype="f16", out_dtype="f32")
    plan = plan_of(spec, tile=(256, 128, 64), raster="n", swizzle=8, stages=3)
    src = emit(plan).source
    facts = {"TILE_M, TILE_N, TILE_K": "256, 128, 64", "STAGES": "3", "THREADS": str(plan.threads),
             "MMA_ATOMS": str(tuple(plan.mma.atom_layout)), "AB": "cutlass.Float16", "OUT": "cutlass.Float32",
             "A_K_MAJOR": "False", "B_K_MAJOR": "False", "RASTER_M": "False", "GROUP": "8", "SPLIT_K": "1",
             "A_VEC": str(plan.copy("a").vector_bytes // 2)}
    for name, value in facts.items():
        assert re.search(rf"^{re.escape(name)} = {re.escape(value)}\s", src, re.M), name
    assert plan.threads == 256 and plan.mma.atom_layout == (4, 2, 1)
    # no Hopper machinery in the source
    for word in ("wgmma", "tma", "setmaxnreg", "mbarrier", "PipelineTma", "cluster"):
        assert word not in src.lower().replace("plan.", ""), word


def test_compile_arch_defaults_to_sm80_and_can_target_hopper():
    plan = plan_of(GemmSpec())
    k = emit(plan)
    assert (k.arch, k.compile_arch) == ("sm_80", "sm_80")
    assert emit_any(plan).compile_arch == "sm_80"         # the backends' dispatcher picks this backend
    assert emit(plan, compile_arch="sm_90a").compile_arch == "sm_90a"
    h = for_hopper(k)
    assert (h.compile_arch, h.source) == ("sm_90a", k.source)
    with pytest.raises(BuildError, match="compile_arch"):
        emit(plan, compile_arch="sm_70")


def test_compile_arch_from_environment(monkeypatch):
    """GEMMC_SM80_COMPILE_ARCH=sm_90a lets gemmc.compile(..., arch="sm_80") build kernels an H200 can load. It is
    read when the kernel is lowered (pipeline-staging) and carried by the plan."""
    import gemmc
    from gemmc.build import key_material
    monkeypatch.setenv("GEMMC_SM80_COMPILE_ARCH", "sm_90a")
    k = gemmc.compile(GemmSpec(), schedule=Schedule(tile=(128, 128, 32), arch="sm_80"), arch="sm_80")
    assert k.plan.pipeline.compile_arch == "sm_90a" and k.emitted.compile_arch == "sm_90a"
    assert "compile_arch sm_90a" in k.ir(after="pipeline-staging")
    monkeypatch.delenv("GEMMC_SM80_COMPILE_ARCH")
    assert emit(k.plan).compile_arch == "sm_90a"                 # the plan's fact, whatever the environment says now
    plain = emit(plan_of(GemmSpec()))
    assert plain.compile_arch == "sm_80" and plain.source == k.emitted.source
    assert key_material(plain) != key_material(k.emitted)        # the two builds never share a cache entry
    monkeypatch.setenv("GEMMC_SM80_COMPILE_ARCH", "sm_70")
    with pytest.raises(BuildError, match="GEMMC_SM80_COMPILE_ARCH='sm_70'.*use one of"):
        plan_of(GemmSpec())


class _NoEnvironment(dict):
    """os.environ for a call that must read none of it."""
    def __getitem__(self, key):
        raise AssertionError(f"read os.environ[{key!r}]")

    def get(self, key, default=None):
        raise AssertionError(f"read os.environ[{key!r}]")

    def __contains__(self, key):
        raise AssertionError(f"looked up {key!r} in os.environ")


@pytest.mark.parametrize("compile_arch", ["sm_80", "sm_90a"])
def test_emit_reads_the_plan_not_the_environment(monkeypatch, compile_arch):
    import os
    monkeypatch.setenv("GEMMC_SM80_COMPILE_ARCH", compile_arch)
    plan = plan_of(GemmSpec(), tile=(128, 256, 64))
    want = emit(plan)
    monkeypatch.setattr(os, "environ", _NoEnvironment(GEMMC_SM80_COMPILE_ARCH="sm_86"))
    got = emit(plan)
    assert (got.compile_arch, got.source, got.params) == (compile_arch, want.source, want.params)


@pytest.mark.parametrize("change, match", [
    (lambda p: replace(p, arch="sm_90a"), "arch"),
    (lambda p: replace(p, mma=replace(p.mma, kind="wgmma", inst_shape=(64, 128, 16))), "mma.sync"),
    (lambda p: replace(p, cluster=(2, 1)), "cluster"),
    (lambda p: replace(p, scheduler=replace(p.scheduler, pdl=True)), "griddepcontrol"),
    (lambda p: replace(p, mma=replace(p.mma, atom_layout=(4, 2, 1))), "atom layout"),
    (lambda p: replace(p, pipeline=replace(p.pipeline, stages=1)), "stages"),
    (lambda p: replace(p, pipeline=replace(p.pipeline, ring_smem_bytes=0)), "ring_smem_bytes 0.*pipeline-staging"),
    (lambda p: replace(p, pipeline=replace(p.pipeline, compile_arch="")), "compile_arch ''.*pipeline-staging"),
    (lambda p: replace(p, pipeline=replace(p.pipeline, compile_arch="sm_70")), "compile_arch 'sm_70' cannot run"),
    (lambda p: replace(p, epilogue=replace(p.epilogue, store="tma")), "store"),
    (lambda p: replace(p, copies=(replace(p.copies[0], kind="tma"),) + p.copies[1:]), "cp_async"),
    (lambda p: replace(p, copies=(replace(p.copies[0], swizzle_bytes=128),) + p.copies[1:]), "swizzle"),
    (lambda p: replace(p, scheduler=replace(p.scheduler, split_k=2, split_k_mode="fixup")), "split_k_mode serial"),
])
def test_bad_plans_are_refused_with_a_fix(change, match):
    plan = plan_of(GemmSpec())            # 128x128x32: K tile is 64 bytes, so a 128 B swizzle is too wide
    with pytest.raises(BuildError, match=match):
        emit(change(plan))


def _tile_coord_fn(src: str, raster_m: bool, group: int):
    """The emitted raster function, run as plain Python on ints."""
    body = src[src.index("@cute.jit\ndef tile_coord"):]
    body = body[:body.index("\n\n\n")]
    ns = {"cute": types.SimpleNamespace(jit=lambda f: f), "RASTER_M": raster_m, "GROUP": group}
    exec(body, ns)
    return ns["tile_coord"]


@given(tiles_m=st.integers(1, 40), tiles_n=st.integers(1, 40), raster=st.sampled_from(["m", "n"]),
       group=st.sampled_from([1, 2, 4, 8]))
def test_raster_covers_every_tile_once_in_groups(tiles_m, tiles_n, raster, group):
    src = emit(plan_of(GemmSpec())).source
    coord = _tile_coord_fn(src, raster == "m", group)
    seq = [coord(i, tiles_m, tiles_n) for i in range(tiles_m * tiles_n)]
    assert sorted(seq) == [(m, n) for m in range(tiles_m) for n in range(tiles_n)]
    fast = [c[0] if raster == "m" else c[1] for c in seq]
    slow = [c[1] if raster == "m" else c[0] for c in seq]
    # consecutive CTAs stay inside one group of `group` slow-dim tiles
    assert all(s // group == slow[min(i + 1, len(seq) - 1)] // group or (i + 1) % (group * (tiles_m if raster == "m" else tiles_n)) == 0
               for i, s in enumerate(slow[:-1]))
    if group == 1:
        assert fast[: (tiles_m if raster == "m" else tiles_n)] == list(range(tiles_m if raster == "m" else tiles_n))


# ---- compile: PTX (two compiles in CI) -------------------------------------------------------------

def _assert_ampere_ptx(ptx: str, plan, target: str):
    assert re.search(rf"^\.target {target}\b", ptx, re.M), f"PTX target is not {target}"
    assert ptx.count("mma.sync.aligned.m16n8k16") >= mma_count(plan)
    assert "cp.async.cg.shared.global" in ptx           # 16-byte cp.async (cg needs exactly 16 B)
    assert "cp.async.commit_group" in ptx
    # the ring's depth, from the plan: wait until at most stages - 2 groups are in flight
    assert re.search(rf"cp\.async\.wait_group\s+{plan.pipeline.stages - 2};", ptx)
    assert "ldmatrix.sync.aligned" in ptx
    for forbidden in ("wgmma", "setmaxnreg", "cp.async.bulk.tensor", "mbarrier"):
        assert forbidden not in ptx, forbidden


def test_ptx_tn_bf16_sm80():
    """The issue's must-show path: gemmc.compile(spec, schedule=..., arch="sm_80") builds on this CPU."""
    import gemmc
    k = gemmc.compile(GemmSpec(), schedule=Schedule(tile=(128, 128, 32), arch="sm_80"), arch="sm_80")
    assert k.emitted.compile_arch == "sm_80"
    ptx = k.ptx
    _assert_ampere_ptx(ptx, k.plan, "sm_80")
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
    assert ".trans" not in ptx                                     # both operands K-major
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert ptx.count(".entry") == 1
    assert "st.global.b32" in ptx and ".local" not in ptx          # paired output stores, no spills


def test_ptx_nn_f16_batched_epilogue_splitk_for_hopper():
    """All the optional machinery in one compile: M-/N-major operands (ldmatrix.trans), f16, batch,
    row/full/scalar epilogue inputs with gelu, split-K with the shared reduction kernel; built for sm_90a."""
    spec = GemmSpec(dtype="f16", a_layout="km", b_layout="kn", batch="L",
                    inputs=(EpilogueInput("bias", "row", "f16"), EpilogueInput("res", "full", "f32"),
                            EpilogueInput("alpha", "scalar")),
                    epilogue=(EpilogueOp("mul", (A(), I("alpha"))), EpilogueOp("add", (N(0), I("bias"))),
                              EpilogueOp("gelu_tanh", (N(1),)), EpilogueOp("add", (N(2), I("res")))))
    plan = plan_of(spec, tile=(128, 128, 64), split_k=2)
    ptx = compiled_ptx(emit(plan, compile_arch="sm_90a"))
    _assert_ampere_ptx(ptx, plan, "sm_90a")
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    assert "f16.f16.f32" in ptx or "f32.f16.f16.f32" in ptx       # mma.sync f16 inputs, f32 accumulate
    assert ptx.count(".entry") == 2                                # GEMM + split-K reduction
    assert re.search(r"tanh|ex2\.approx", ptx)                    # gelu_tanh reached the device code


# ---- the GPU harness's CPU half: reference and check (what scripts/gpu_sm80.py relies on) -------------

def test_gpu_harness_reference_and_nan_check_on_cpu():
    import torch
    from gemmc.backends.sm80.gpucheck import CHECK_VARIANTS, make_inputs, run_checked, torch_reference
    spec = GemmSpec(**CHECK_VARIANTS["tt_splitk2_epi_batched"][0])      # kn layout, batch, row/full/scalar, gelu
    a, b, extra = make_inputs(spec, 9, 16, 24, 2, "cpu", torch.Generator().manual_seed(0))
    assert a.shape == (2, 9, 24) and b.shape == (2, 24, 16) and extra[0].shape == (16,) and extra[1].shape == (2, 9, 16)
    want = torch.nn.functional.gelu((a.float() @ b.float()) * extra[2] + extra[0].float(),
                                    approximate="tanh") + extra[1].float()
    assert torch.allclose(torch_reference(spec, a, b, extra), want, atol=1e-5)

    def exact(a, b, *extra, out):                       # a "kernel" that is the reference
        out.copy_(torch_reference(spec, a, b, list(extra)))

    def misses_last_row(a, b, *extra, out):             # leaves NaN where it did not write
        out[..., :-1, :] = torch_reference(spec, a, b, list(extra))[..., :-1, :]

    def off_by_2pct(a, b, *extra, out):
        out.copy_(1.02 * torch_reference(spec, a, b, list(extra)))

    dev = torch.device("cpu")
    assert run_checked(spec, exact, 9, 16, 24, 2, dev) < 1e-2            # bf16 output rounding only
    assert run_checked(spec, misses_last_row, 9, 16, 24, 2, dev) == float("inf")
    assert run_checked(spec, off_by_2pct, 9, 16, 24, 2, dev) > 1e-2


def _script():
    return load_script("gpu_sm80")


def test_gpu_script_phases_run_on_cpu_with_stand_in_kernels():
    """scripts/gpu_sm80.py's check and speed phases, driven on the CPU: torch stands in for the
    compiled kernels and a counting clock for CUDA events. A wrong kernel fails the check and is not timed."""
    import torch
    from gemmc.backends.sm80.gpucheck import torch_reference
    script = _script()
    logs = []

    def good(spec, sched):
        def run(a, b, *extra, out):
            out.copy_(torch_reference(spec, a, b, list(extra)))
        return run

    res = script.child_check(["tn_bf16", "nn_col_silu_batched"], [(9, 16, 24), (33, 8, 8)], logs.append,
                             device="cpu", make_launcher=good)
    assert [r["ok"] for r in res["check"]] == [True] * 4 and not res["errors"]
    assert res["check"][2]["m"] == 16 and res["check"][2]["batch"] == 3     # M rounded to 8 for A (K x M)

    class CountingClock:
        def prepare(self, calls):
            return lambda: [c() for c in calls]

        def time_ms(self, unit):
            unit()
            return 1.0

    def speed_kernel(spec, sched):
        if sched.tile == (256, 128, 32):             # a broken kernel: must be reported, not timed
            return lambda a, b, out=None: out.zero_()
        return lambda a, b, out=None: torch.matmul(a, b.T, out=out)

    res = script.child_speed(list(script.SPEED), [(16, 24, 32)], 2, logs.append, device="cpu",
                             clock=CountingClock(), make_launcher=speed_kernel, l2=4096)
    row = res["speed"][0]
    assert "error" not in row, row
    assert row["256x128x32_s4_rel_err"] > 0.5 and "256x128x32_s4_tflops" not in row
    assert row["128x128x32_s5_tflops"] == pytest.approx(row["torch_tflops"]) and row["ratio_vs_torch"] == pytest.approx(1.0)
    assert row["input_sets"] >= 2                     # rotated through >= 2x the (stand-in) L2


def test_sm90_only_schedule_on_sm80_is_a_clear_error():
    import gemmc
    from gemmc.errors import ScheduleError
    with pytest.raises(ScheduleError, match=r"(?s)SM90-only.*cluster=\(1, 1\)"):
        gemmc.compile(GemmSpec(), schedule=Schedule(tile=(128, 256, 64), cluster=(2, 1), mode="pingpong",
                                                    arch="sm_80"), emit="ir")
    with pytest.raises(ScheduleError, match="limit 166912 B on sm_80"):     # 163 KB of shared memory
        gemmc.compile(GemmSpec(), schedule=Schedule(tile=(128, 256, 64), stages=5, arch="sm_80"), arch="sm_80",
                      emit="ir")


# ---- epilogue input names and shared memory per compile arch -------------------------------------

def _scaled_spec(name: str, kind: str = "scalar") -> GemmSpec:
    return GemmSpec(batch="L", inputs=(EpilogueInput(name, kind),), epilogue=(EpilogueOp("mul", (A(), I(name))),))


def _name_uses(node):
    """(name, is_store) of every Name under `node`, in evaluation order: an assignment's value before its
    target, a loop's iterable before its variable."""
    if isinstance(node, ast.Name):
        yield node.id, isinstance(node.ctx, ast.Store)
        return
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        order = [node.value] + (node.targets if isinstance(node, ast.Assign) else [node.target])
    elif isinstance(node, ast.For):
        order = [node.iter, node.target] + node.body + node.orelse
    else:
        order = ast.iter_child_nodes(node)
    for child in order:
        if child is not None:
            yield from _name_uses(child)


# locals of the GEMM kernel (prologue loop, epilogue loop, batch index ...), of the reduce kernel, of the host
@pytest.mark.parametrize("name", ["s", "i", "v", "l", "m", "n", "kk", "split", "coord", "tiles", "num_m", "mA"])
@pytest.mark.parametrize("split_k", [1, 2])
def test_epilogue_input_named_like_an_emitted_local_is_not_shadowed(name, split_k):
    """An input named `s` was the prologue's `for s in range(1, STAGES - 1)`: the kernel scaled by
    STAGES - 2 instead of the caller's value (and `m`, `i`, `l` read the element's coordinates, `tiles`
    the host's tile count). The kernels never rebind a parameter; the host reads each input before it
    binds anything of that name."""
    for kind in ("scalar", "row"):
        src = emit(plan_of(_scaled_spec(name, kind), split_k=split_k)).source
        for fn in ast.parse(src).body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            kernel = any("kernel" in ast.unparse(d) for d in fn.decorator_list)
            for arg in fn.args.args:
                uses = [store for n, store in _name_uses(ast.Module(body=fn.body, type_ignores=[])) if n == arg.arg]
                if kernel:
                    assert not any(uses), f"{fn.name} rebinds its parameter {arg.arg}"
                elif arg.arg == name:
                    assert uses[:1] == [False], f"{fn.name} binds {name} before reading the input"


def test_scale_named_s_reaches_the_compiled_kernel():
    """The PTX reads the scalar's kernel parameter (it multiplied by the constant 3.0 = STAGES - 2)."""
    plan = plan_of(_scaled_spec("s"), stages=5)
    ptx = compiled_ptx(emit(plan))
    entry = re.search(r"\.entry\s+(\S+)\((.*?)\)", ptx, re.S)
    scalar = re.findall(r"\.param \.f32 (\S+?)\s*[,\n]", entry.group(2))
    assert len(scalar) == 1
    assert re.search(rf"ld\.param\.\w+\s+%\w+, \[{re.escape(scalar[0])}\]", ptx), "scalar parameter is never read"
    assert "0f40400000" not in ptx


@pytest.mark.parametrize("name, split_k", [("cute", 1), ("TILE_M", 1), ("gemm_kernel", 1), ("stream", 1),
                                           ("workspace", 2)])
def test_input_names_the_module_cannot_take_are_refused(name, split_k):
    with pytest.raises(BuildError, match=f"epilogue input '{name}'.*rename the input"):
        emit(plan_of(_scaled_spec(name), split_k=split_k))


def test_workspace_is_a_fine_input_name_without_split_k():
    assert "workspace: cutlass.Float32" in emit(plan_of(_scaled_spec("workspace"))).source


def test_ring_over_the_compile_arch_shared_memory_is_refused():
    """sm_86/sm_89 CTAs get 99 KB of shared memory, not the A100's 163 KB the predicate checks: a
    3-stage 128x256x64 ring (144 KB) compiled for them would only fail at launch."""
    big = plan_of(GemmSpec(), tile=(128, 256, 64))
    assert (big.pipeline.stages, big.pipeline.ring_smem_bytes) == (3, 3 * (128 + 256) * 64 * 2)
    for arch in ("sm_80", "sm_90a"):
        emit(big, compile_arch=arch)
    for arch in ("sm_86", "sm_89"):
        with pytest.raises(BuildError, match=f"147456 B of shared memory, over the 101376 B a CTA may use on {arch}"):
            emit(big, compile_arch=arch)
    emit(plan_of(GemmSpec(), stages=5), compile_arch="sm_86")       # 5 x 16 KB fits
    deeper = replace(big.pipeline, stages=4, ring_smem_bytes=4 * (128 + 256) * 64 * 2)
    with pytest.raises(BuildError, match="196608 B of shared memory, over the 166912 B a CTA may use on sm_80"):
        emit(replace(big, pipeline=deeper))                         # a plan past the A100's own limit

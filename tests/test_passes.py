"""Each pass's effect on small inputs (filecheck-style), pass ordering, and verify-resources:
one error per limit, and the property `is_valid(s, spec)` <=> verify-resources accepts the IR."""
import pytest
from hypothesis import given
from xdsl.utils.exceptions import DiagnosticException

from gemmc import EpilogueInput, EpilogueOp, GemmSpec, Ref, Schedule, ScheduleError
from gemmc.errors import BuildError
from gemmc.ir import make_context, parse_module, print_module
from gemmc.ir.build import spec_to_module
from gemmc.ir.extract import plan_from_module
from gemmc.passes import PASSES, PIPELINE, pass_pipeline
from gemmc.schedule import is_valid, resolve_stages, smem_bytes
from ir_strategies import aligned_specs, schedules, specs

SQUARE = GemmSpec(m=4096, n=4096, k=4096)


def run(spec, schedule, names=PIPELINE):
    module = spec_to_module(spec, schedule)
    pass_pipeline(names).apply(make_context(), module)
    return print_module(module)


def check(text: str, expected: str) -> None:
    """FileCheck's CHECK: every non-empty line of `expected` occurs in `text`, in order."""
    pos = 0
    for want in filter(None, (line.strip() for line in expected.splitlines())):
        found = text.find(want, pos)
        assert found >= 0, f"expected, after offset {pos}:\n  {want}\nin:\n{text}"
        pos = found + len(want)


def test_pipeline_order():
    assert PIPELINE == ("assign-warpgroup-roles", "tma-cluster-layout", "pipeline-staging", "map-groups",
                        "verify-resources")
    assert all(PASSES[n].name == n for n in PIPELINE)


# ---- assign-warpgroup-roles ------------------------------------------------------------------

def test_roles_sm90_cooperative():
    check(run(SQUARE, Schedule(tile=(128, 256, 64)), ["assign-warpgroup-roles"]), """
        %out = kernel.gemm @gemm(%a, %b) acc f32 -> !gemmc.tensor<4096 x 4096 x bf16, mn>
            arch sm_90a tile 128x256x64 mode cooperative threads 384
            schedule #gemmc.schedule<tile = 128x256x64, cluster = 1x1, stages = auto, mode = cooperative, raster = m, swizzle = 1, split_k = 1, arch = sm_90a> {
        kernel.warpgroup producer index 0 regs 40 warps 4
        kernel.warpgroup consumer index 1 regs 232 warps 4
        kernel.warpgroup consumer index 2 regs 232 warps 4
        kernel.mma wgmma inst 64x256x16 atoms 2x1x1
        kernel.epilogue {
          ^bb0(%acc: f32):
            gemm.yield %acc
    """)


def test_roles_sm90_pingpong_each_consumer_owns_a_tile():
    text = run(SQUARE, Schedule(tile=(64, 128, 64), mode="pingpong"), ["assign-warpgroup-roles"])
    check(text, """
        mode pingpong threads 384
        kernel.warpgroup producer index 0 regs 40 warps 4
        kernel.warpgroup consumer index 1 regs 232 warps 4
        kernel.warpgroup consumer index 2 regs 232 warps 4
        kernel.mma wgmma inst 64x128x16 atoms 1x1x1
    """)
    assert "gemm.matmul" not in text


@pytest.mark.parametrize("tile,warps,atoms", [((128, 128, 32), 4, "2x2x1"), ((256, 128, 32), 8, "4x2x1"),
                                              ((128, 256, 32), 8, "2x4x1")])
def test_roles_sm80_uniform_warps(tile, warps, atoms):
    text = run(SQUARE, Schedule(tile=tile, arch="sm_80"), ["assign-warpgroup-roles"])
    check(text, f"""
        arch sm_80 tile {tile[0]}x{tile[1]}x{tile[2]} mode multistage threads {32 * warps}
        kernel.warpgroup uniform index 0 regs 0 warps 4
        kernel.mma mma.sync inst 16x8x16 atoms {atoms}
    """)
    assert text.count("kernel.warpgroup uniform") == warps // 4
    assert "producer" not in text


# ---- tma-cluster-layout ----------------------------------------------------------------------

def test_cluster_2x1_multicasts_b_along_m():
    check(run(SQUARE, Schedule(tile=(128, 128, 64), cluster=(2, 1)), PIPELINE[:2]), """
        kernel.cluster 2x1
        kernel.copy a tma box 128x64 swizzle 128 l2 first_once
        kernel.copy b tma box 64x64 swizzle 128 multicast 2 along m l2 first_once
        kernel.copy out tma_store box 128x32 swizzle 64
        kernel.epilogue store tma {
    """)


def test_cluster_1x2_multicasts_a_along_n():
    text = run(SQUARE, Schedule(tile=(128, 128, 64), cluster=(1, 2)), PIPELINE[:2])
    check(text, """
        kernel.cluster 1x2
        kernel.copy a tma box 64x64 swizzle 128 multicast 2 along n l2 first_once
        kernel.copy b tma box 128x64 swizzle 128 l2 first_once
    """)


@pytest.mark.parametrize("bk,swizzle", [(64, 128), (32, 64), (128, 128)])
def test_swizzle_from_the_tiles_k_bytes(bk, swizzle):
    plan = plan_from_module(parse_module(run(SQUARE, Schedule(tile=(128, 128, bk)))))
    a = plan.copy("a")
    assert a.swizzle_bytes == swizzle
    assert a.box == (128, min(bk, swizzle // 2))   # a swizzled box spans at most one swizzle width


def test_mn_major_operands_and_f32_output():
    spec = GemmSpec(m=4096, n=4096, k=4096, a_layout="km", b_layout="kn", out_dtype="f32")
    plan = plan_from_module(parse_module(run(spec, Schedule(tile=(128, 128, 64), cluster=(1, 2)))))
    assert plan.copy("a").box == (64, 64) and plan.copy("a").multicast == 2   # K rows x (128/2) M, 128B swizzle
    assert plan.copy("b").box == (64, 64) and plan.copy("b").swizzle_bytes == 128
    assert plan.copy("out").swizzle_bytes == 128                                  # 32 f32 columns = 128 B


def test_epilogue_input_copies():
    spec = GemmSpec(m=4096, n=4096, k=4096, inputs=(EpilogueInput("bias", "row"), EpilogueInput("res", "full", "bf16"),
                                                    EpilogueInput("s", "scalar")),
                    epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))),
                              EpilogueOp("add", (Ref.node(0), Ref.input("res"))),
                              EpilogueOp("mul", (Ref.node(1), Ref.input("s")))))
    check(run(spec, Schedule(), PIPELINE[:2]), """
        kernel.copy bias ldg box 1x128 swizzle 0
        kernel.copy res tma box 128x32 swizzle 64
    """)
    sm80 = run(spec, Schedule(tile=(128, 128, 32), arch="sm_80"), PIPELINE[:2])
    check(sm80, """
        kernel.cluster 1x1
        kernel.copy a cp_async box 128x32 swizzle 64
        kernel.copy b cp_async box 128x32 swizzle 64
        kernel.copy bias ldg box 1x128 swizzle 0
        kernel.copy res ldg box 128x128 swizzle 0
        kernel.epilogue store direct {
    """)
    assert "kernel.copy s " not in sm80 and "kernel.copy out " not in sm80


# ---- pipeline-staging ------------------------------------------------------------------------

def test_pipeline_auto_stages_come_from_the_resource_model():
    s = Schedule(tile=(128, 256, 64), cluster=(2, 1))
    text = run(SQUARE, s, PIPELINE[:3])
    stages, nbytes = resolve_stages(s, SQUARE), smem_bytes(s, SQUARE)
    assert (stages, nbytes) == (4, 4 * (128 + 256) * 64 * 2 + 2 * 128 * 32 * 2 + 1024)
    check(text, f"""
        kernel.pipeline stages {stages} barriers [full, empty] epi_stages 2 epi_tile 128x32 smem {nbytes}
        kernel.tile_scheduler persistent true raster m swizzle 1 split_k 1 split_k_mode none pdl true
        kernel.epilogue store tma
    """)


def test_pipeline_given_stages_split_k_and_raster():
    s = Schedule(tile=(128, 128, 64), stages=3, raster="n", swizzle=8, split_k=2, mode="pingpong")
    check(run(SQUARE, s, PIPELINE[:3]), f"""
        kernel.pipeline stages 3 barriers [full, empty] epi_stages 2 epi_tile 64x32 smem {smem_bytes(s, SQUARE)}
        kernel.tile_scheduler persistent true raster n swizzle 8 split_k 2 split_k_mode fixup pdl true
    """)


def test_pipeline_tile_scheduler_launch_follows_the_schedules_pdl():
    s = Schedule(tile=(128, 128, 64), split_k=2, pdl=False)
    text = run(SQUARE, s, PIPELINE[:3])
    check(text, """
        kernel.tile_scheduler persistent true raster m swizzle 1 split_k 2 split_k_mode fixup
        kernel.epilogue store tma
    """)
    assert " pdl" not in text.split("kernel.tile_scheduler")[1].splitlines()[0]


def test_pipeline_sm80(monkeypatch):
    monkeypatch.delenv("GEMMC_SM80_COMPILE_ARCH", raising=False)
    s = Schedule(tile=(128, 128, 32), arch="sm_80")
    assert s.pdl    # the default; sm_80 has no griddepcontrol, so the lowering ignores it
    text = run(SQUARE, s, PIPELINE[:3])
    ring = 5 * (128 + 128) * 32 * 2          # each operand's 5 stages at a 1024 B boundary; no barrier reserve
    check(text, f"""
        kernel.pipeline stages 5 barriers [cp.async.group] epi_stages 0 epi_tile 128x128 smem {smem_bytes(s, SQUARE)}
        ring_smem {ring} compile_arch sm_80
        kernel.tile_scheduler persistent false raster m swizzle 1 split_k 1 split_k_mode none
    """)
    assert "pdl" not in text.split("kernel.tile_scheduler")[1].splitlines()[0]


def test_pipeline_staging_decides_the_sm80_compile_arch_from_the_environment(monkeypatch):
    s = Schedule(tile=(128, 128, 32), arch="sm_80")
    monkeypatch.setenv("GEMMC_SM80_COMPILE_ARCH", "sm_90a")
    assert " compile_arch sm_90a\n" in run(SQUARE, s, PIPELINE[:3])
    assert "compile_arch" not in run(SQUARE, Schedule(), PIPELINE[:3])       # sm_90a kernels build for sm_90a
    monkeypatch.setenv("GEMMC_SM80_COMPILE_ARCH", "sm_75")
    with pytest.raises(BuildError, match="GEMMC_SM80_COMPILE_ARCH='sm_75': compile_arch 'sm_75' cannot run"):
        run(SQUARE, s, PIPELINE[:3])


# ---- ordering, idempotence -------------------------------------------------------------------

@pytest.mark.parametrize("name", ["tma-cluster-layout", "pipeline-staging"])
def test_lowering_passes_need_roles_first(name):
    with pytest.raises(DiagnosticException, match="run assign-warpgroup-roles first"):
        run(SQUARE, Schedule(), [name])


def test_passes_need_a_schedule():
    with pytest.raises(DiagnosticException, match="has no #gemmc.schedule"):
        run(SQUARE, None, ["assign-warpgroup-roles"])


def test_running_the_pipeline_twice_changes_nothing():
    once = run(SQUARE, Schedule(cluster=(2, 2)))
    module = parse_module(once)
    pass_pipeline(PIPELINE[:3]).apply(make_context(), module)
    assert print_module(module) == once


# ---- verify-resources: one error per limit ---------------------------------------------------

@pytest.mark.parametrize("spec,schedule,limit,fix", [
    (SQUARE, Schedule(tile=(128, 256, 64), stages=7), "shared memory", "use stages<="),
    (SQUARE, Schedule(tile=(256, 256, 128)), "shared memory", "smaller tile"),
    (SQUARE, Schedule(tile=(128, 256, 64), mode="pingpong"), "registers", "mode='cooperative'"),
    (SQUARE, Schedule(cluster=(4, 8)), "cluster size", "at most 16"),
    (SQUARE, Schedule(cluster=(3, 1)), "cluster shape", "powers of two"),
    (SQUARE, Schedule(tile=(128, 120, 64)), "tile N", "multiple of 16"),
    (SQUARE, Schedule(tile=(64, 128, 64)), "tile M (cooperative)", "pingpong"),
    (SQUARE, Schedule(tile=(128, 128, 24)), "tile K", "32, 64 or 128"),
    (SQUARE, Schedule(tile=(64, 64, 64), cluster=(1, 16), mode="pingpong"), "multicast slice of A", "cluster N"),
    (GemmSpec(m=4096, n=4096, k=4100), Schedule(), "16-byte alignment of A's contiguous dim K", "multiple of 8"),
    (GemmSpec(m=4096, n=4094, k=4096, out_dtype="f32"), Schedule(), "16-byte alignment of the output's N", "pad"),
    (SQUARE, Schedule(tile=(128, 128, 32), cluster=(2, 1), arch="sm_80"), "cluster", "SM90-only"),
    (SQUARE, Schedule(tile=(128, 128, 32), mode="pingpong", arch="sm_80"), "mode", "SM90-only"),
    (SQUARE, Schedule(tile=(256, 256, 64), arch="sm_80"), "registers", "smaller tile"),
    (GemmSpec(m=64, n=64, k=64), Schedule(split_k=4), "split_k", "lower split_k"),
])
def test_verify_resources_names_limit_value_and_fix(spec, schedule, limit, fix):
    assert not is_valid(schedule, spec)
    with pytest.raises(ScheduleError) as err:
        run(spec, schedule, ["verify-resources"])
    assert any(v.limit == limit and fix in v.fix for v in err.value.violations), err.value
    assert limit in str(err.value) and "got" in str(err.value)


def test_verify_resources_checks_hand_edited_kernel_facts():
    text = run(SQUARE, Schedule(tile=(128, 256, 64)))
    edited = text.replace("smem 214016", "smem 300000").replace("regs 40", "regs 256")
    with pytest.raises(ScheduleError, match=r"shared memory \(kernel.pipeline\): got 300000 B") as err:
        run_text(edited, ["verify-resources"])
    assert "register file (kernel.warpgroup)" in str(err.value)


def test_verify_resources_recomputes_the_ring_from_the_written_stages():
    # 128x256x64 bf16: a stage is (128 + 256) x 64 x 2 = 49152 B, the epilogue 2 x 128x32 x 2 = 16384 B; 4 fit
    text = run(SQUARE, Schedule(tile=(128, 256, 64), cluster=(2, 1)))
    assert "kernel.pipeline stages 4 barriers [full, empty] epi_stages 2 epi_tile 128x32 smem 214016" in text
    with pytest.raises(ScheduleError) as err:     # the written smem still reads 214016: only the stages grew
        run_text(text.replace("stages 4 barriers", "stages 40 barriers"), ["verify-resources"])
    (v,) = err.value.violations
    assert v.limit == "shared memory (kernel.pipeline stages)"
    assert v.value == "1983488 B (40 stages x 49152 B + 16384 B epilogue)" and 40 * 49152 + 16384 + 1024 == 1983488
    assert "at most 4 stages fit" in v.fix
    # fewer stages fit, but the smem written no longer says what they take
    with pytest.raises(ScheduleError, match=r"shared memory \(kernel.pipeline\): got smem 214016 B for 3 stages, "
                                            r"which take 164864 B; write smem 164864"):
        run_text(text.replace("stages 4 barriers", "stages 3 barriers"), ["verify-resources"])
    run_text(text.replace("stages 4 barriers", "stages 3 barriers").replace("smem 214016", "smem 164864"),
             ["verify-resources"])


def test_verify_resources_checks_the_cluster_fact_against_the_schedule():
    text = run(SQUARE, Schedule(tile=(128, 256, 64), cluster=(2, 1)))
    # 4x1 is a legal cluster on its own, but the copies were laid out (and the grid sized) for 2x1
    with pytest.raises(ScheduleError) as err:
        run_text(text.replace("kernel.cluster 2x1", "kernel.cluster 4x1"), ["verify-resources"])
    assert [str(v) for v in err.value.violations] == [
        "cluster (kernel.cluster): got 4x1, but the schedule's is 2x1; write the schedule's cluster, or change the "
        "schedule's and rerun tma-cluster-layout"]


def run_text(text, names):
    module = parse_module(text)
    pass_pipeline(names).apply(make_context(), module)
    return print_module(module)


# ---- the predicate/verifier equivalence --------------------------------------------------------

def verify_resources_accepts(spec, schedule) -> bool:
    # through the text, so the schedule and the problem are read back from the IR
    text = print_module(spec_to_module(spec, schedule))
    try:
        run_text(text, ["verify-resources"])
        return True
    except ScheduleError:
        return False


@given(aligned_specs(), schedules())
def test_is_valid_iff_verify_resources_accepts(spec, schedule):
    assert is_valid(schedule, spec) == verify_resources_accepts(spec, schedule)


@given(specs(), schedules())
def test_is_valid_iff_verify_resources_accepts_any_problem(spec, schedule):
    assert is_valid(schedule, spec) == verify_resources_accepts(spec, schedule)


@given(aligned_specs(), schedules())
def test_valid_schedules_lower_to_kernels_that_pass_verify_resources(spec, schedule):
    if not is_valid(schedule, spec):
        return
    text = run(spec, schedule)            # the whole pipeline, verify-resources last
    plan = plan_from_module(parse_module(text))
    assert plan.pipeline.smem_bytes == smem_bytes(schedule, spec)
    assert plan.pipeline.stages == resolve_stages(schedule, spec)
    assert plan.cluster == schedule.cluster and plan.tile == schedule.tile
    assert plan.scheduler.pdl == (schedule.pdl and schedule.arch == "sm_90a")


# ---- tests/filecheck/*.mlir: `// RUN: passes`, then `// CHECK:` lines (in order, `// CHECK-NOT:` nowhere) ----
# ---- or `// ERROR:` lines ----

FILECHECK = sorted((__import__("pathlib").Path(__file__).parent / "filecheck").glob("*.mlir"))


@pytest.mark.parametrize("path", FILECHECK, ids=[p.stem for p in FILECHECK])
def test_filecheck(path, capsys):
    from gemmc import cli
    lines = path.read_text().splitlines()
    directive = lambda tag: [line.split(f"// {tag}:", 1)[1].strip() for line in lines if f"// {tag}:" in line]  # noqa: E731
    (passes,) = directive("RUN")
    rc = cli.main(["opt", str(path), "-p", passes])
    out, err = capsys.readouterr()
    if directive("ERROR"):
        assert rc == 1
        for want in directive("ERROR"):
            assert want in err
    else:
        assert rc == 0, err
        check(out, "\n".join(directive("CHECK")))
        for unwanted in directive("CHECK-NOT"):
            assert unwanted not in out, f"{unwanted!r} should not be in:\n{out}"


def test_split_k_sums_in_the_kernel_at_two_splits_on_sm90():
    from gemmc.passes.pipeline_staging import tile_scheduler
    from gemmc.schedule import FIXUP_MAX_SPLITS
    modes = {k: tile_scheduler(Schedule(split_k=k)).values()["split_k_mode"] for k in (1, 2, 3, 4, 8)}
    assert FIXUP_MAX_SPLITS == 2 and modes == {1: "none", 2: "fixup", 3: "serial", 4: "serial", 8: "serial"}
    assert tile_scheduler(Schedule(tile=(128, 128, 32), split_k=2, arch="sm_80")).values()["split_k_mode"] == "serial"

"""SM90 backend on the CPU: the emitted source carries every plan fact, params follow the storage
shapes, bad plans are refused, the shared epilogue math computes what the ops mean, and a handful of
sm_90a compiles produce PTX with exactly the Hopper instructions the plan asks for."""
from __future__ import annotations

import ast
import math
import re
import types
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import assume, given, strategies as st

from gemmc.backends import emit as emit_any
from gemmc.backends.common import epilogue_math_lines, grouped_raster_source, splitk_reduce
from gemmc.backends.sm90 import emit
from gemmc.compiler import lower
from gemmc.errors import BuildError
from gemmc.schedule import Schedule, check_schedule
from gemmc.spec import EpilogueInput, EpilogueOp, GemmSpec, Ref
from gemmc.types import DType

from emit_support import compiled_ptx, specs_with_inputs, storage_shapes
from sm90_kernel_support import plain_kernel as sm90_plain_kernel

A, I, C, N = Ref.acc, Ref.input, Ref.const, Ref.node


def plan_of(spec: GemmSpec, **sched):
    _, plan = lower(spec, Schedule(**{"tile": (128, 128, 64), **sched}))
    return plan


def constants(source: str) -> dict:
    """The module-level `NAME = value` facts of an emitted kernel."""
    out = {}
    for m in re.finditer(r"^([A-Z_]+) = (.+?)\s+#", source, re.M):
        out[m.group(1)] = m.group(2).strip()
    return out


# ---- emission (no compile) ------------------------------------------------------------------------

@given(tile=st.sampled_from([(128, 256, 64), (256, 128, 64), (128, 128, 64), (128, 64, 64)]),
       cluster=st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2)]), raster=st.sampled_from("mn"),
       swizzle=st.sampled_from([1, 2, 8]), split_k=st.sampled_from([1, 2, 4]))
def test_every_plan_fact_is_a_constant_of_the_source(tile, cluster, raster, swizzle, split_k):
    plan = plan_of(GemmSpec(), tile=tile, cluster=cluster, raster=raster, swizzle=swizzle, split_k=split_k)
    c = constants(emit(plan).source)
    assert c["TILE_MNK"] == str(plan.tile)
    assert c["CLUSTER_MN"] == str(plan.cluster)
    assert int(c["A_MULTICAST"]) == plan.copy("a").multicast == cluster[1]
    assert int(c["B_MULTICAST"]) == plan.copy("b").multicast == cluster[0]
    assert int(c["AB_STAGES"]) == plan.pipeline.stages
    assert int(c["EPI_STAGES"]) == plan.pipeline.epi_stages
    assert c["EPI_TILE"] == str(plan.pipeline.epi_tile)
    assert int(c["PRODUCER_REGS"]) == plan.role("producer")[0].regs
    assert int(c["CONSUMER_REGS"]) == plan.role("consumer")[0].regs
    assert int(c["THREADS"]) == plan.threads
    assert c["RASTER_ALONG_M"] == str(raster == "m")
    assert int(c["SWIZZLE"]) == swizzle
    assert int(c["SPLIT_K"]) == split_k
    assert c["MMA_INST_MN"] == str(tuple(plan.mma.inst_shape[:2]))
    assert c["MMA_ATOM_LAYOUT"] == str(tuple(plan.mma.atom_layout))
    assert c["PDL"] == "True" and plan.scheduler.pdl
    # the persistent grid never exceeds the clusters resident at once (a 31st 4-CTA cluster ran 1.7x slower)
    assert int(c["MAX_ACTIVE_CLUSTERS"]) == {1: 132, 2: 66, 4: 30}[cluster[0] * cluster[1]]
    sw = {128: "SW128", 64: "SW64", 32: "SW32"}
    assert c["A_SMEM_ATOM"].endswith("K_" + sw[plan.copy("a").swizzle_bytes])
    assert c["C_SMEM_ATOM"].endswith("_" + sw[plan.copy("out").swizzle_bytes])


def test_persistent_grid_fits_the_measured_cluster_occupancy():
    """H200: cudaOccupancyMaxActiveClusters is 132/66/30/15/7 for 1/2/4/8/16-CTA clusters; GPCs strand
    SMs, so a 132 // size grid (33 four-CTA clusters) would run its last clusters as a second wave."""
    from gemmc.schedule import ARCH_LIMITS
    lim = ARCH_LIMITS["sm_90a"]
    assert [lim.active_clusters(s) for s in (1, 2, 4, 8, 16)] == [132, 66, 30, 15, 7]
    assert all(lim.active_clusters(s) * s <= lim.num_sms for s in (1, 2, 4, 8, 16))
    for cluster, want in (((4, 2), 15), ((2, 4), 15), ((4, 1), 30), ((1, 4), 30)):
        c = constants(emit(plan_of(GemmSpec(), tile=(128, 128, 64), cluster=cluster, mode="pingpong")).source)
        assert int(c["MAX_ACTIVE_CLUSTERS"]) == want, cluster


def test_the_source_is_the_plans_facts_over_the_kernel_modules():
    """The generated module holds the facts and the epilogue; the kernel is the kernel package's modules, split
    by role, which the source names with the digest of their source (so the cache key follows them)."""
    from gemmc.backends.sm90 import kernel as kernel_package
    src = emit(plan_of(GemmSpec(), mode="pingpong")).source
    assert "PINGPONG = True " in src and "PINGPONG = False " in emit(plan_of(GemmSpec())).source
    assert f"source sha256 {kernel_package.source_digest()}" in src
    assert "from gemmc.backends.sm90.kernel import EpilogueInput, KernelFacts, Sm90Gemm" in src
    assert "KERNEL = Sm90Gemm(KernelFacts.from_namespace(globals()), None, None)" in src
    for role in ("scheduler", "producer", "consumer", "fixup", "epilogue"):
        assert role in src.split('"""')[1]                      # the docstring names each module
        assert (Path(kernel_package.__file__).parent / f"{role}.py").exists()
    assert "@cute.kernel" not in src and "const_expr" not in src   # no kernel code is generated
    compile(src, "<emitted>", "exec")   # valid Python
    # the kernel modules branch on the facts (ping-pong's ordered barriers exist once, under const_expr)
    consumer = (Path(kernel_package.__file__).parent / "consumer.py").read_text()
    assert "if cutlass.const_expr(self.PINGPONG):" in consumer and consumer.count("barrier_id=3 + consumer_wg") == 1


def test_the_kernel_modules_are_part_of_the_digest(tmp_path, monkeypatch):
    from gemmc.backends.sm90 import kernel as kernel_package
    before = kernel_package.source_digest()
    copy = tmp_path / "kernel"
    copy.mkdir()
    for path in Path(kernel_package.__file__).parent.glob("*.py"):
        (copy / path.name).write_text(path.read_text())
    monkeypatch.setattr(kernel_package, "_DIR", copy)
    assert kernel_package.source_digest() == before
    (copy / "epilogue.py").write_text((copy / "epilogue.py").read_text() + "\n# an edit\n")
    assert kernel_package.source_digest() != before
    assert kernel_package.source_digest() in emit(plan_of(GemmSpec())).source


def plain_kernel(monkeypatch, **facts):
    kernel, cta, _ = sm90_plain_kernel(monkeypatch, **facts)
    return kernel, cta


def emitted_functions(source: str, names: tuple[str, ...], **constants) -> types.SimpleNamespace:
    """Module-level functions of an emitted kernel, run as plain Python (cute.jit as the identity)."""
    tree = ast.parse(source)
    defs = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in names]
    assert sorted(d.name for d in defs) == sorted(names)
    scope = {"cute": types.SimpleNamespace(jit=lambda f: f), **constants}
    exec(compile(ast.Module(body=defs, type_ignores=[]), "<emitted>", "exec"), scope)
    return types.SimpleNamespace(**{n: scope[n] for n in names})


@given(tiles_m=st.integers(1, 40), tiles_n=st.integers(1, 40), group=st.integers(1, 16), raster_m=st.booleans())
def test_grouped_raster_visits_every_tile_once(tiles_m, tiles_n, group, raster_m):
    """tile_coord (SM80's emitted one, and the SM90 kernel's scheduler method): a bijection onto the grid;
    groups of `group` slow-dim lines walked down the fast dim, the slow dim varying fastest inside a group; on
    whole groups it is the order of cutlass.utils' swizzled scheduler (shape ((sw, S/sw)...) strides
    (1, sw*F)...), which pads the last group instead."""
    src = "import cutlass\nimport cutlass.cute as cute\n" + grouped_raster_source("RASTER", "GROUP")
    f = emitted_functions(src, ("tile_coord",), RASTER=raster_m, GROUP=group).tile_coord
    order = [f(i, tiles_m, tiles_n) for i in range(tiles_m * tiles_n)]
    with pytest.MonkeyPatch.context() as mp:
        sm90, _ = plain_kernel(mp, RASTER_ALONG_M=raster_m, SWIZZLE=group)
        assert [sm90.tile_coord(i, tiles_m, tiles_n) for i in range(tiles_m * tiles_n)] == order
    assert sorted(order) == [(m, n) for m in range(tiles_m) for n in range(tiles_n)]
    fast, slow = (tiles_m, tiles_n) if raster_m else (tiles_n, tiles_m)
    for i, (m, n) in enumerate(order[:(slow // group) * group * fast]):     # the whole groups
        f_i, s_i = (m, n) if raster_m else (n, m)
        assert (s_i, f_i) == ((i // (group * fast)) * group + i % group, (i // group) % fast)
    if group == 1:      # no swizzle: the raster dim is walked first
        assert order[:fast] == ([(m, 0) for m in range(fast)] if raster_m else [(0, n) for n in range(fast)])


@given(clusters_m=st.integers(1, 12), clusters_n=st.integers(1, 12), cluster=st.sampled_from([(1, 1), (2, 1), (1, 2),
       (2, 2)]), swizzle=st.sampled_from([2, 4, 8]), raster=st.sampled_from("mn"))
def test_swizzled_kernels_reorder_the_unswizzled_enumeration(clusters_m, clusters_n, cluster, swizzle, raster):
    """swizzle > 1: the scheduler enumerates clusters M-major with no swizzle (so no padded work units),
    and every work unit's tile goes through swizzled_tile, which keeps each CTA's place in its cluster
    and visits each tile once, in tile_coord's order of clusters."""
    with pytest.MonkeyPatch.context() as mp:
        fns, _ = plain_kernel(mp, RASTER_ALONG_M=raster == "m", SWIZZLE=swizzle, CLUSTER_MN=cluster)
        assert fns.UNITS_M_FASTEST and fns.REORDERS        # M fastest whatever the raster
        cm, cn = cluster
        seen = []
        for unit in range(clusters_m * clusters_n):    # work_tile's M-major, unswizzled unit -> cluster
            for i in range(cm):
                for j in range(cn):
                    tm, tn = fns.swizzled_tile((unit % clusters_m) * cm + i, (unit // clusters_m) * cn + j,
                                               clusters_m, clusters_n)
                    assert (tm % cm, tn % cn) == (i, j)
                    assert (tm // cm, tn // cn) == fns.tile_coord(unit, clusters_m, clusters_n)
                    seen.append((tm, tn))
        assert sorted(seen) == [(m, n) for m in range(clusters_m * cm) for n in range(clusters_n * cn)]
        plain, _ = plain_kernel(mp, RASTER_ALONG_M=raster == "m", CLUSTER_MN=cluster)
        assert plain.UNITS_M_FASTEST == (raster == "m") and not plain.REORDERS
    assert f"SWIZZLE = {swizzle} " in emit(plan_of(GemmSpec(), cluster=cluster, raster=raster, swizzle=swizzle)).source


def run_work_tile(monkeypatch, cluster, raster, units: int, grid_clusters: int, fast: int, slow: int):
    """Every CTA's tiles, in the order it takes them: the kernel's work_tile run as plain Python over a
    persistent grid of `grid_clusters` clusters, with the host's cluster counts as the divisors."""
    k, cta = plain_kernel(monkeypatch, CLUSTER_MN=cluster, RASTER_ALONG_M=raster == "m")
    walks = {}
    for z in range(grid_clusters):
        for i in range(cluster[0]):
            for j in range(cluster[1]):
                cta[:] = [i, j, z]
                walks[(i, j, z)] = [k.work_tile(u, fast, slow) for u in range(z, units, grid_clusters)]
    return walks


@given(clusters_m=st.integers(1, 9), clusters_n=st.integers(1, 9), layers=st.integers(1, 4),
       cluster=st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2)]), raster=st.sampled_from("mn"),
       split_k=st.sampled_from([1, 2, 3]), grid_clusters=st.integers(1, 40))
def test_the_static_scheduler_gives_each_tile_to_one_cta(clusters_m, clusters_n, layers, cluster, raster, split_k,
                                                         grid_clusters):
    """work_tile (gemmc's persistent scheduler): over the grid, every (tile, split * L) of the cluster-padded
    tile grid goes to exactly one CTA; a CTA keeps its place in its cluster; cluster z takes units z, z + G,
    ...; consecutive units step along the raster's extent, then the other, then split * L."""
    fast, slow = (clusters_m, clusters_n) if raster == "m" else (clusters_n, clusters_m)
    units = clusters_m * clusters_n * layers * split_k
    with pytest.MonkeyPatch.context() as mp:
        walks = run_work_tile(mp, cluster, raster, units, grid_clusters, fast, slow)
    tiles = [t for w in walks.values() for t in w]
    cm, cn = cluster
    assert sorted(tiles) == [(m, n, l) for m in range(clusters_m * cm) for n in range(clusters_n * cn)
                             for l in range(layers * split_k)]
    for (i, j, z), walk in walks.items():
        assert all((m % cm, n % cn) == (i, j) for m, n, _ in walk)
        for u, (m, n, l) in zip(range(z, units, grid_clusters), walk):
            f, s = (m // cm, n // cn) if raster == "m" else (n // cn, m // cm)
            assert (f, s, l) == (u % fast, u // fast % slow, u // (fast * slow))
    # the host launches at most MAX_ACTIVE_CLUSTERS clusters (the plan's), and never more than there are units
    from gemmc.backends.sm90.kernel import scheduler
    host = ast.get_source_segment(src := Path(scheduler.__file__).read_text(), next(
        n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef) and n.name == "static_grid"))
    assert "cutlass.min(work_units, self.MAX_ACTIVE_CLUSTERS)" in host


@pytest.mark.parametrize("sched", [dict(cluster=(2, 1), swizzle=8, split_k=2),
                                   dict(mode="pingpong", raster="n", split_k=6),
                                   dict(tile=(128, 16, 64), mode="pingpong", swap_ab=True),
                                   dict(stream_k=True)], ids=["coop-sw8-fixup", "pp-serial", "swap", "stream"])
def test_sm90_kernels_compile_without_deprecated_cutlass_apis(sched, tmp_path, monkeypatch):
    """The wheel's deprecated persistent scheduler (cutlass.utils.StaticPersistentTileScheduler) is due to
    leave nvidia-cutlass-dsl: no kernel may lean on it, or on any other API that warns it is going."""
    import warnings
    import gemmc
    monkeypatch.setenv("GEMMC_CACHE_DIR", str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel = gemmc.compile(GemmSpec(m="M", n=4096, k=4096), Schedule(**{"tile": (128, 128, 64), **sched}))
        assert "cp.async.bulk.tensor" in kernel.ptx
    assert [str(w.message) for w in caught if issubclass(w.category, (DeprecationWarning, FutureWarning))] == []


@given(spec=specs_with_inputs(), split_k=st.sampled_from([1, 2, 4]))
def test_params_follow_storage_shapes(spec, split_k):
    k = emit_any(plan_of(spec, split_k=split_k))
    assert k.arch == "sm_90a" and k.compile_arch == "sm_90a"
    scratch = [p for p in k.params if p.kind in ("workspace", "semaphore")]
    assert [(p.name, tuple(p.shape)) for p in k.params if p not in scratch] == storage_shapes(spec)
    env = {"M": 7, "N": 16, "K": 64, "L": 3}
    if split_k == 1:
        assert not scratch
    elif split_k == 2:
        # the in-kernel fix-up: f32 partials of every (cluster-padded) tile and split, one i32 counter per tile
        ws, sem = scratch
        assert (ws.dtype, sem.dtype) == (DType.f32, DType.i32) and [ws, sem] == list(k.params[-2:])
        tiles = 3 if spec.batch else 1        # 7 x 16 fits one 128 x 128 tile of a 1x1 cluster
        assert eval(ws.workspace_elems, {}, env) == split_k * 128 * 128 * tiles
        assert eval(sem.workspace_elems, {}, env) == tiles
    else:
        # the reduce kernel: (M, N, SPLIT_K * L) f32 partials
        assert len(scratch) == 1 and scratch[0].dtype == DType.f32 and scratch[0] is k.params[-1]
        assert eval(scratch[0].workspace_elems, {}, env) == split_k * (3 if spec.batch else 1) * 7 * 16
    assert re.search(rf"def {k.entry}\(" + ", ".join(
        f"{p.name}: {'cutlass.Float32' if p.kind == 'scalar' else 'cute.Tensor'}" for p in k.params) + ", stream\\)",
        k.source)


def test_full_input_copy_kind_follows_the_plan():
    spec = GemmSpec(inputs=(EpilogueInput("res", "full", "bf16"), EpilogueInput("bias", "row")),
                    epilogue=(EpilogueOp("add", (A(), I("res"))), EpilogueOp("add", (N(0), I("bias")))))
    plan = plan_of(spec)
    assert plan.copy("res").kind == "tma" and plan.copy("bias").kind == "ldg"
    staged = emit(plan).source            # inside the module the inputs are ep0_res and ep1_bias
    assert "EpilogueInput('ep0_res', 'full', cutlass.BFloat16, EP0_RES_SMEM_ATOM)," in staged
    assert "s_ep0_res[(lm, ln, 0)]" in staged and "ep0_res_v[" not in staged
    assert "ep1_bias_v[(en, el)]" in staged                 # row input: plain loads, as the plan says
    copies = tuple(replace(c, kind="ldg") if c.operand == "res" else c for c in plan.copies)
    direct = emit(replace(plan, copies=copies)).source
    assert "EpilogueInput('ep0_res', 'full', cutlass.BFloat16)," in direct
    assert "SMEM_ATOM)," not in direct and "ep0_res_v[(em, en, el)]" in direct


def _one_input(name, kind="full", dtype="f32"):
    inp = EpilogueInput(name, kind, dtype) if kind != "scalar" else EpilogueInput(name, kind)
    return GemmSpec(m="M", n=1024, k=512, inputs=(inp,),
                    epilogue=(EpilogueOp("add" if kind == "full" else "mul", (A(), I(name))),))


def test_an_input_named_c_is_not_the_store():
    """`a @ b.T + c`: the plan's store copy is `out`, so a full input named c has a copy of its own (an f32 c
    swizzles 128 bytes, the bf16 store 64), and the module names it ep0_c, apart from the store's tma_c and
    c_smem (before, the module's host entry had two parameters named tma_c)."""
    plan = plan_of(_one_input("c"), tile=(128, 128, 64), mode="pingpong")
    assert plan.copy("out").kind == "tma_store" and plan.copy("c").kind == "tma"
    assert (plan.copy("out").swizzle_bytes, plan.copy("c").swizzle_bytes) == (64, 128)
    k = emit(plan)
    tree = ast.parse(k.source)          # it parses: no parameter twice
    host = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == k.entry)
    assert [a.arg for a in host.args.args] == ["a", "b", "out", "c", "stream"]
    assert ast.unparse(host.body[0]) == "ep0_c = c"        # rebound before any local
    assert re.search(r"^C_SMEM_ATOM = \S+_SW64 ", k.source, re.M)
    assert re.search(r"^EP0_C_SMEM_ATOM = \S+_SW128 ", k.source, re.M)


@pytest.mark.parametrize("name", ["cute", "stream", "KERNEL", "TILE_MNK", "Sm90Gemm", "epilogue_dag"])
def test_input_names_the_module_cannot_take_are_refused(name):
    with pytest.raises(BuildError, match=f"SM90 backend: epilogue input '{name}' .*rename the input"):
        emit(plan_of(_one_input(name, "scalar")))


def test_inputs_named_like_kernel_locals_compile():
    """Scalars named like the kernel's own locals (ei, tile_l, m; m also in the serial split-K reduce kernel)
    and a full f32 input named c compile: before, they failed in cute.compile or read the local instead."""
    from gemmc.build import compile_with_ptx
    for spec, sched in [(_one_input("c"), {}), (_one_input("ei", "scalar"), {}),
                        (_one_input("tile_l", "scalar"), dict(mode="pingpong", tile=(64, 128, 64))),
                        (_one_input("m", "scalar"), dict(split_k=3, pdl=False))]:
        k = emit(plan_of(spec, **sched))
        ptx = compile_with_ptx(k)[1]
        assert "wgmma.mma_async" in ptx, spec.inputs[0].name


def test_static_dims_stay_numbers():
    k = emit(plan_of(GemmSpec(m="M", n=4096, k=1024)))
    assert [p.shape for p in k.params] == [("M", 1024), (4096, 1024), ("M", 4096)]


@pytest.mark.parametrize("split_k", [1, 2, 3])
def test_pdl_follows_the_plans_tile_scheduler(split_k):
    spec = GemmSpec(m="M", n=4096, k=1024)
    on, off = emit(plan_of(spec, split_k=split_k)).source, emit(plan_of(spec, split_k=split_k, pdl=False)).source
    assert constants(on)["PDL"] == "True" and constants(off)["PDL"] == "False"
    # the reduce kernel (from 3 splits; 2 sum in the kernel) waits and launches as a dependent only under PDL
    reduce = split_k > 2
    assert on.count("griddepcontrol_wait()") == reduce and off.count("griddepcontrol_wait()") == 0
    assert ("use_pdl=True" in on) == reduce and "use_pdl=True" not in off
    from gemmc.backends.sm90.kernel import gemm
    assert "use_pdl=self.PDL" in Path(gemm.__file__).read_text()     # the main launch reads the fact
    assert (constants(on)["PDL_EARLY_CTAS"], constants(on)["PDL_FULL_CTAS"]) == ("82", "118")
    assert (constants(off)["PDL_EARLY_CTAS"], constants(off)["PDL_FULL_CTAS"]) == ("0", "0")
    assert (constants(on)["PDL_PREFETCH_K_TILES"], constants(off)["PDL_PREFETCH_K_TILES"]) == ("2", "0")
    on = on.replace("PDL_EARLY_CTAS = 82", "PDL_EARLY_CTAS = 0").replace("PDL_FULL_CTAS = 118", "PDL_FULL_CTAS = 0")
    on = on.replace("PDL_PREFETCH_K_TILES = 2", "PDL_PREFETCH_K_TILES = 0")
    on, off = (re.sub(r"^(\w+ = .*?) +#", r"\1 #", t, flags=re.M) for t in (on, off))   # the constants' comments line up
    assert on.replace("PDL = True", "PDL = False").replace(
        "    cute.arch.griddepcontrol_wait()   # PDL: the partials are complete and visible after this\n", "").replace(
        ", use_pdl=True", "") == off



@pytest.mark.parametrize("pdl", [True, False])
def test_splitk_reduce_kernel_and_launch_come_from_one_pdl(pdl):
    inputs = (EpilogueInput("bias", "row"), EpilogueInput("alpha", "scalar"))
    ops = (EpilogueOp("mul", (A(), I("alpha"))), EpilogueOp("add", (N(0), I("bias"))))
    r = splitk_reduce(ops, inputs, 2, DType.bf16, "ws_mnl", "out_mnl", pdl=pdl)
    assert ("griddepcontrol_wait()" in r.source) == pdl
    assert ("use_pdl=True" in r.launch_lines[-1]) == pdl
    # the launch passes exactly the kernel's params, in order
    params = re.search(r"def splitk_reduce_kernel\((.*)\):", r.source).group(1)
    args = re.search(r"splitk_reduce_kernel\((.*?)\)\.launch", r.launch_lines[-1]).group(1)
    assert [q.split(":")[0] for q in params.split(", ")] == ["ws", "out", "bias_v", "alpha"]
    assert args.split(", ") == ["ws_mnl", "out_mnl", "bias_v", "alpha"]

def test_bad_plans_are_refused():
    plan = plan_of(GemmSpec())
    with pytest.raises(BuildError, match="sm_80"):
        emit(replace(plan, arch="sm_80"))
    with pytest.raises(BuildError, match="multicast"):
        emit(replace(plan, cluster=(2, 1)))        # copies still say no multicast
    with pytest.raises(BuildError, match="warpgroup"):
        emit(replace(plan, warpgroups=plan.warpgroups[:2], threads=256))
    with pytest.raises(BuildError, match="wgmma"):
        emit(replace(plan, mma=replace(plan.mma, kind="mma.sync")))


# ---- the shared epilogue math, evaluated in Python with float stand-ins -----------------------------

class _F(float):
    def to(self, dtype):
        import torch
        return _F(torch.tensor(float(self), dtype=dtype).float().item())


def _namespace():
    import torch
    ns = types.SimpleNamespace
    cutlass = ns(Float32=_F, BFloat16=torch.bfloat16, Float16=torch.float16)
    # fmax/fmin with nan=True are IEEE maximum/minimum (NaN in, NaN out); without it, the non-NaN operand
    def fmax(a, b, nan=False):
        return _F(math.nan) if nan and (math.isnan(a) or math.isnan(b)) else _F(b if math.isnan(a) else max(a, b))

    def fmin(a, b, nan=False):
        return _F(math.nan) if nan and (math.isnan(a) or math.isnan(b)) else _F(b if math.isnan(a) else min(a, b))

    cute = ns(arch=ns(fmax=fmax, fmin=fmin),
              math=ns(tanh=lambda x: _F(math.tanh(x)), erf=lambda x: _F(math.erf(x)),
                      exp=lambda x: _F(math.exp(min(x, 700.0)))))
    return {"cutlass": cutlass, "cute": cute}


def _reference(op: str, x: float, y: float, attrs: dict) -> float:
    import torch
    t = torch.tensor(x, dtype=torch.float64)
    return {
        "add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y, "div": lambda: x / y,
        "relu": lambda: max(x, 0.0),
        "gelu_tanh": lambda: torch.nn.functional.gelu(t, approximate="tanh").item(),
        "gelu_erf": lambda: torch.nn.functional.gelu(t).item(),
        "silu": lambda: torch.nn.functional.silu(t).item(), "sigmoid": lambda: torch.sigmoid(t).item(),
        "tanh": lambda: math.tanh(x), "clamp": lambda: min(max(x, attrs["min"]), attrs["max"]),
        "cast": lambda: torch.tensor(x).to(torch.bfloat16).float().item(),
    }[op]()


@given(op=st.sampled_from(["add", "sub", "mul", "div", "relu", "gelu_tanh", "gelu_erf", "silu", "sigmoid",
                           "tanh", "clamp", "cast"]),
       x=st.floats(-30, 30, allow_nan=False), y=st.floats(0.25, 4))
def test_epilogue_math_matches_the_op(op, x, y):
    attrs = {"min": -1.5, "max": 2.0} if op == "clamp" else ({"dtype": DType.bf16} if op == "cast" else {})
    args = (A(), I("y")) if op in ("add", "sub", "mul", "div") else (A(),)
    lines, result = epilogue_math_lines([EpilogueOp(op, args, tuple(attrs.items()))], "acc", {"y": "y_in"})
    env = {**_namespace(), "acc": _F(x), "y_in": _F(y)}
    exec("\n".join(lines), env)
    assert env[result] == pytest.approx(_reference(op, x, y, attrs), rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("op,attrs", [("relu", {}), ("clamp", {"min": -1.5, "max": 2.0}), ("clamp", {"min": 0.0}),
                                       ("clamp", {"max": 1.0})])
def test_epilogue_min_max_keep_nan_like_torch(op, attrs):
    # an overflowed or NaN accumulator must not come out as 0 or a clamp bound: torch.relu/clamp keep NaN
    import torch
    lines, result = epilogue_math_lines([EpilogueOp(op, (A(),), tuple(attrs.items()))], "acc", {})
    env = {**_namespace(), "acc": _F(math.nan)}
    exec("\n".join(lines), env)
    want = torch.relu(torch.tensor(math.nan)) if op == "relu" else torch.clamp(torch.tensor(math.nan), **attrs)
    assert math.isnan(env[result]) and math.isnan(want.item())
    assert all("nan=True" in line for line in lines if "fmax" in line or "fmin" in line)


def test_epilogue_math_chains_nodes_and_constants():
    ops = [EpilogueOp("mul", (A(), C(2.0))), EpilogueOp("add", (N(0), I("b"))), EpilogueOp("relu", (N(1),))]
    lines, result = epilogue_math_lines(ops, "acc", {"b": "bias"})
    env = {**_namespace(), "acc": _F(-1.0), "bias": _F(3.0)}
    exec("\n".join(lines), env)
    assert result == "v2" and env["v2"] == 1.0
    assert epilogue_math_lines([], "acc", {}) == ([], "acc")


# ---- compile for sm_90a and read the PTX (a handful of compiles, cached per session) -----------------

COMPILES = {
    "coop_1x1": (GemmSpec(), dict(tile=(128, 256, 64))),
    "coop_2x1_nn_epi": (GemmSpec(a_layout="km", b_layout="kn",
                                 inputs=(EpilogueInput("bias", "row"), EpilogueInput("res", "full", "bf16")),
                                 epilogue=(EpilogueOp("add", (A(), I("bias"))), EpilogueOp("silu", (N(0),)),
                                           EpilogueOp("add", (N(1), I("res"))))),
                        dict(cluster=(2, 1))),
    "pingpong_1x2": (GemmSpec(batch="L"), dict(cluster=(1, 2), mode="pingpong")),
    "splitk_1x1_static_nk": (GemmSpec(m="M", n=4096, k=1024), dict(split_k=3)),
    "splitk_1x1_nopdl": (GemmSpec(m="M", n=4096, k=1024), dict(split_k=3, pdl=False)),
    # a static extent of 1 must not collapse a TMA copy to 1-D (it faulted on the H200)
    "pingpong_static_m1": (GemmSpec(m=1, n=6144, k=4096), dict(tile=(64, 192, 64), mode="pingpong", split_k=4)),
    # wave-balancing N tiles of the standard space (not powers of two)
    "pingpong_64x224_1x2": (GemmSpec(), dict(tile=(64, 224, 64), cluster=(1, 2), mode="pingpong")),
    "coop_128x160_2x1_nn": (GemmSpec(a_layout="km", b_layout="kn"), dict(tile=(128, 160, 64), cluster=(2, 1))),
    "pingpong_64x96_splitk2": (GemmSpec(), dict(tile=(64, 96, 64), mode="pingpong", split_k=2)),
    # swizzled order over an unswizzled enumeration (swizzled_tile)
    "pingpong_1x2_sw4_splitk2": (GemmSpec(), dict(cluster=(1, 2), mode="pingpong", swizzle=4, split_k=2)),
    # 192 rows: the consumer warpgroups split the columns, so each WGMMA is 64 x BN/2
    "coop_192x192_1x2": (GemmSpec(), dict(tile=(192, 192, 64), cluster=(1, 2), swizzle=8)),
    # 16-column epilogue sub-tiles: a tile N that 32 does not divide, with a TMA-loaded full input
    "pingpong_64x80x128_epi": (GemmSpec(inputs=(EpilogueInput("res", "full", "bf16"),),
                                       epilogue=(EpilogueOp("add", (A(), I("res"))),)),
                               dict(tile=(64, 80, 128), mode="pingpong")),
    # relu and clamp keep a NaN accumulator NaN (FMNMX.NaN), as torch does
    "pingpong_relu_clamp": (GemmSpec(epilogue=(EpilogueOp("relu", (A(),)),
                                               EpilogueOp("clamp", (N(0),), (("min", -1.0), ("max", 6.0))))),
                            dict(tile=(64, 128, 64), mode="pingpong")),
}


@pytest.fixture(scope="session")
def ptx_of():
    cache = {}

    def get(name):
        if name not in cache:
            spec, sched = COMPILES[name]
            plan = plan_of(spec, **sched)
            cache[name] = (plan, compiled_ptx(emit(plan)))
        return cache[name]
    return get


@pytest.mark.parametrize("name", list(COMPILES))
def test_ptx_has_the_hopper_instructions_the_plan_asks_for(ptx_of, name):
    plan, ptx = ptx_of(name)
    for inst in ("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier", "setmaxnreg"):
        assert inst in ptx, inst
    regs = set(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+);", ptx))
    assert regs == {("dec", str(plan.role("producer")[0].regs)), ("inc", str(plan.role("consumer")[0].regs))}
    multicast = plan.cluster[0] * plan.cluster[1] > 1
    assert (".multicast::cluster" in ptx) == multicast
    # the TMA store of the epilogue
    assert re.search(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta", ptx)
    # ping-pong: ordered named barriers between the two consumer warpgroups (256 threads)
    assert bool(re.search(r"bar\.arrive\s+%r\d+, 256;", ptx)) == (plan.mode == "pingpong")
    assert "cp.async.bulk.tensor.1d" not in ptx
    kernels = re.findall(r"^\.visible \.entry|^\.entry", ptx, re.M)
    fixup = plan.scheduler.split_k_mode == "fixup"
    # split-K adds the reduce kernel, unless the kernel sums the partials itself (the fix-up)
    assert len(kernels) == (2 if plan.scheduler.split_k > 1 and not fixup else 1)
    if fixup:
        # float4 partial stores, one counted arrival (acquire-release) per tile and split, and float4 loads
        # of the SPLIT_K partials by the last split
        frag = plan.tile[0] * plan.tile[1] // (128 if plan.mode == "pingpong" else 256)
        assert ptx.count("atom.global.acq_rel.add.u32") == 1
        assert ptx.count("st.global.v4.b32") == frag // 4
        assert ptx.count("ld.global.v4.b32") == plan.scheduler.split_k * frag // 4
    else:
        assert "atom.global" not in ptx and "st.global.v4" not in ptx
    # PDL (the plan's tile scheduler says so): each kernel waits on the grid dependency, and the main
    # kernel does so before its first TMA; a plain plan has no griddepcontrol at all
    bodies = re.split(r"^\.visible \.entry|^\.entry", ptx, flags=re.M)[1:]
    main = next(body for body in bodies if "wgmma.mma_async" in body)
    if not plan.scheduler.pdl:
        assert "griddepcontrol" not in ptx and "cp.async.bulk.prefetch.tensor" not in ptx
        return
    assert all("griddepcontrol.wait;" in body for body in bodies)
    assert main.index("griddepcontrol.wait;") < main.index("cp.async.bulk.tensor")
    # each operand's TMA loads take an L2 policy picked per call: evict-first (the word 0x12F0000000000000)
    # when the grid loads each of its tiles once, else the default (0); symbolic M and N: one test each
    # (ptxas may rematerialize the select beside each load rather than hold 64 bits in the producer's 40
    # registers, but every copy tests the same extent against the same bound)
    selects = re.findall(r"setp\.lt\.s32\s+(%p\d+), (%r\d+), (\d+);\s+selp\.b64\s+%rd\d+, 1364590687093260288, 0, \1;",
                         main)
    assert "1364590687093260288" in main and main.count("1364590687093260288") == len(selects)
    conditions = {(extent, bound) for _, extent, bound in selects}
    assert len(conditions) <= 2
    if isinstance(plan.problem.m, str) and isinstance(plan.problem.n, str):
        assert len(conditions) == 2
    # before it waits, the main kernel prefetches its first k-tiles of A and B into L2 (one elected thread)
    prefetches = re.findall(r"cp\.async\.bulk\.prefetch\.tensor\.\dd\.L2\.global\.tile\S* \[%rd(\d+),", main)
    assert len(set(prefetches)) == 2, prefetches      # two tensor maps: A's and B's
    assert main.index("cp.async.bulk.prefetch.tensor") < main.index("griddepcontrol.wait;")
    # a split-K kernel lets its dependent (the reduce) launch at once; the others let the next kernel
    # launch from the producer, after the loads: once the last is issued (small grids) or has been used
    trigger = main.count("griddepcontrol.launch_dependents;")
    if plan.scheduler.split_k > 1 and not fixup:
        assert trigger == 1 and main.index("griddepcontrol.launch_dependents;") < main.index("cp.async.bulk.tensor")
    else:
        assert trigger == 2 and main.index("griddepcontrol.launch_dependents;") > main.index("cp.async.bulk.tensor")


def test_ptx_relu_and_clamp_propagate_nan(ptx_of):
    _, ptx = ptx_of("pingpong_relu_clamp")
    assert re.search(r"max\.NaN\.f32", ptx) and re.search(r"min\.NaN\.f32", ptx)
    assert not re.search(r"\b(max|min)\.f32", ptx)       # no NaN-dropping max/min left in the epilogue


@given(m=st.integers(1, 3000), n8=st.integers(1, 700), batch=st.integers(1, 4),
       tile=st.sampled_from([(128, 128, 64), (64, 96, 64), (64, 160, 64), (128, 256, 64), (256, 128, 64)]),
       cluster=st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2)]), mode=st.sampled_from(["cooperative", "pingpong"]))
def test_fixup_scratch_covers_every_index_the_kernel_writes(m, n8, batch, tile, cluster, mode):
    """The host sizes the fix-up's partials and semaphores from the same cluster-padded tile grid that the
    kernel indexes: the largest float4 offset of the last tile's last split ends exactly at the workspace's
    end, and the last tile id is the last semaphore."""
    # no such plan: a ping-pong tile's accumulators past the register budget, or a 64-row cooperative tile
    assume(not (mode == "pingpong" and tile[0] * tile[1] > 128 * 128 or mode == "cooperative" and tile[0] < 128))
    n = 8 * n8
    plan = plan_of(GemmSpec(m="M", n="N", k="K", batch="L"), tile=tile, cluster=cluster, mode=mode, split_k=2)
    k = emit(plan)
    ws, sem = [p for p in k.params if p.kind in ("workspace", "semaphore")]
    env = {"M": m, "N": n, "K": 64, "L": batch}
    with pytest.MonkeyPatch.context() as mp:
        kernel, _ = plain_kernel(mp, TILE_MNK=tile, CLUSTER_MN=cluster, SPLIT_K=2, SPLIT_K_MODE="fixup")
        tiles_m, tiles_n = kernel.padded_tiles(m, n)
        last_tile = kernel.tile_index(types.SimpleNamespace(tile_l=batch - 1, tile_n=tiles_n - 1, tile_m=tiles_m - 1),
                                      types.SimpleNamespace(tiles_m=tiles_m, tiles_n=tiles_n))
    threads = 128 if mode == "pingpong" else 256
    chunks = tile[0] * tile[1] // threads // 4
    last_float = (((last_tile * 2 + 1) * chunks + chunks - 1) * threads + threads - 1) * 4 + 3
    assert eval(ws.workspace_elems, {}, env) == last_float + 1
    assert eval(sem.workspace_elems, {}, env) == last_tile + 1


@pytest.mark.parametrize("bn, sw", [(192, 64), (128, 128), (160, 32)])
def test_192_row_tiles_split_columns_between_the_consumer_warpgroups(bn, sw):
    """192 rows are three 64-row WGMMAs, which two warpgroups cannot halve by rows: each takes BN/2 columns of
    all 192 rows, and an epilogue sub-tile spans both halves (64 x BN), whose smem swizzle tiles each half."""
    plan = plan_of(GemmSpec(), tile=(192, bn, 64), cluster=(1, 2))
    assert tuple(plan.mma.atom_layout) == (1, 2, 1) and tuple(plan.mma.inst_shape) == (64, bn // 2, 16)
    assert plan.pipeline.epi_tile == (64, bn)
    c = plan.copy("out")
    assert c.box == (64, bn) and c.swizzle_bytes == sw and (bn // 2 * 2) % sw == 0
    # 128/256-row cooperative tiles keep the split by rows and 32-column sub-tiles
    plan = plan_of(GemmSpec(), tile=(256, 128, 64), cluster=(1, 2))
    assert tuple(plan.mma.atom_layout) == (2, 1, 1) and tuple(plan.mma.inst_shape) == (64, 128, 16)
    assert plan.pipeline.epi_tile == (128, 32)


def test_192_row_tiles_refuse_what_they_do_not_support():
    def limits(spec, **kw):
        return {v.limit for v in check_schedule(Schedule(**{"tile": (192, 192, 64), "mode": "cooperative", **kw}),
                                                spec)}
    assert limits(GemmSpec()) == set()
    assert "tile M 192" in limits(GemmSpec(), split_k=2)
    assert "tile M 192" in limits(GemmSpec(), swap_ab=True)
    assert "layouts (192-row tile)" in limits(GemmSpec(a_layout="km"))
    assert "tile N (192-row tile)" in {v.limit for v in check_schedule(Schedule((192, 176, 64)), GemmSpec())}
    assert "tile M (pingpong)" in limits(GemmSpec(), mode="pingpong")


def test_192_row_tile_ptx_issues_half_width_wgmmas(ptx_of):
    _, ptx = ptx_of("coop_192x192_1x2")
    assert set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx)) == {"m64n96k16"}


@pytest.mark.parametrize("bn, en, sw", [(48, 16, 32), (80, 16, 32), (112, 16, 32), (96, 32, 64), (160, 32, 64), (16, 16, 32)])
def test_tiles_that_32_does_not_divide_store_16_column_sub_tiles(bn, en, sw):
    """N tiles of 48, 80, 112 ... split N into about one wave (6144 / 48 = 128 tiles, 10240 / 80 = 128 on
    132 SMs); their epilogue stores 16-column sub-tiles, as a 16-wide tile's does, and TMA-loads full inputs
    in the same boxes. 32-column multiples keep 32-column sub-tiles."""
    spec = GemmSpec(inputs=(EpilogueInput("res", "full", "bf16"),), epilogue=(EpilogueOp("add", (A(), I("res"))),))
    for sched in (dict(tile=(64, bn, 128), mode="pingpong"), dict(tile=(128, bn, 64))):
        assert check_schedule(Schedule(**sched), spec) == []
        plan = plan_of(spec, **sched)
        assert plan.pipeline.epi_tile == (sched["tile"][0] if sched.get("mode") == "pingpong" else 128, en)
        assert plan.copy("out").box == (plan.pipeline.epi_tile[0], en) and plan.copy("out").swizzle_bytes == sw
        assert plan.copy("res").box == plan.copy("out").box
    assert "tile N" in {v.limit for v in check_schedule(Schedule((64, 40, 64), mode="pingpong"), spec)}

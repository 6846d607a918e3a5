"""Grouped GEMMs' SM90 kernel on the CPU: the emitted facts and params, the launcher's checks of the offsets and
counts (no GPU: CPU tensors and a recording function), the fp32 reference, and sm_90a compiles whose PTX walks the
groups with warp shuffles and stores from registers."""
import math
import re

import pytest
import torch

import gemmc
from gemmc.backends import group_param, offsets_dim
from gemmc.compiler import lower
from gemmc.errors import BuildError, LaunchError
from gemmc.reference import error_figures, grouped_reference_and_bound, make_grouped_inputs
from gemmc.runtime import Launcher, check_groups
from gemmc.schedule import Schedule
from gemmc.spec import EpilogueInput, EpilogueOp, GemmSpec, Ref
from gemmc.types import DType

from emit_support import compiled_ptx

UP = GemmSpec(m="M", n=2048, k=7168, groups="E", group_layout="contiguous", gate="silu", name="up")
DOWN = GemmSpec(m="M", n=7168, k=2048, groups=256, group_layout="contiguous", name="down")
DECODE = GemmSpec(m="M", n=1536, k=4096, groups="E", group_layout="masked", name="decode",
                  inputs=(EpilogueInput("alpha", "scalar"),),
                  epilogue=(EpilogueOp("mul", (Ref.acc(), Ref.input("alpha"))),))


def emitted(spec, **sched):
    k = gemmc.compile(spec, Schedule(**{"tile": (128, 128, 64), **sched}))
    return k, k.emitted


def constants(source: str) -> dict:
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^([A-Z_]+) = (.+?)\s+#", source, re.M)}


# ---- emission -------------------------------------------------------------------------------------

def test_the_grouped_facts_are_constants_of_the_source():
    pingpong_n = dict(tile=(64, 128, 64), mode="pingpong", raster="n")
    for spec, sched, want in ((DOWN, {}, ("True", "False", "True")), (DECODE, pingpong_n, ("True", "True", "False"))):
        _, e = emitted(spec, **sched)
        c = constants(e.source)
        assert (c["GROUPED"], c["GROUP_MASKED"], c["GROUP_ORDER_M"]) == want
        assert c["STORE_FROM_REGISTERS"] == "True" and c["PDL_PREFETCH_K_TILES"] == "0"
    plain = constants(emitted(GemmSpec(m="M", n=256, k=128))[1].source)
    assert (plain["GROUPED"], plain["STORE_FROM_REGISTERS"]) == ("False", "False")
    swapped = constants(emitted(GemmSpec(m="M", n=256, k=128), tile=(64, 16, 128), mode="pingpong",
                                swap_ab=True)[1].source)
    assert (swapped["GROUPED"], swapped["STORE_FROM_REGISTERS"]) == ("False", "True")


def test_params_take_the_offsets_or_counts_after_b():
    _, e = emitted(UP)
    assert [(p.name, p.shape, p.role, p.dtype) for p in e.params] == [
        ("a", ("M", 7168), "a", DType.bf16), ("b", ("E", 4096, 7168), "b", DType.bf16),
        ("offsets", ("E_plus_1",), "group_offsets", DType.i32), ("out", ("M", 2048), "out", DType.bf16)]
    assert "KERNEL(a, b, out, (), None, None, offsets, stream)" in e.source
    _, e = emitted(DECODE)
    assert [(p.name, p.shape, p.role) for p in e.params] == [
        ("a", ("E", "M", 4096), "a"), ("b", ("E", 1536, 4096), "b"), ("counts", ("E",), "group_counts"),
        ("out", ("E", "M", 1536), "out"), ("alpha", (), "scalar")]
    assert offsets_dim(256) == 257 and group_param("contiguous", 8).shape == (9,)
    assert group_param("masked", "G").shape == ("G",) and group_param("masked", "G").role == "group_counts"


def test_bad_grouped_plans_are_refused():
    from dataclasses import replace
    from gemmc.backends.sm90 import emit
    _, plan = lower(DOWN, Schedule())
    with pytest.raises(BuildError, match="run map-groups"):
        emit(replace(plan, groups=None))
    with pytest.raises(BuildError, match="swizzle 1"):
        emit(replace(plan, scheduler=replace(plan.scheduler, swizzle=8)))
    with pytest.raises(BuildError, match="expected 'st_global'"):
        emit(replace(plan, copies=tuple(replace(c, kind="tma_store") if c.operand == "out" else c
                                        for c in plan.copies)))


# ---- the launcher -----------------------------------------------------------------------------------

class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, *values):
        self.calls.append(values)


def grouped_launcher(spec, always_validate=False, **sched):
    _, e = emitted(spec, **sched)
    rec = Recorder()
    return Launcher(e.params, function=rec, device_type="cpu", name=e.entry, always_validate=always_validate), rec


def test_the_launcher_passes_the_offsets_after_b_and_sizes_the_output_by_m():
    k, rec = grouped_launcher(DOWN)
    a, b = torch.zeros(40, 2048, dtype=torch.bfloat16), torch.zeros(256, 7168, 2048, dtype=torch.bfloat16)
    offsets = torch.arange(257, dtype=torch.int32) // 8
    out = k(a, b, offsets)
    (call,) = rec.calls
    assert call[0] is a and call[1] is b and call[2] is offsets and call[3] is out and out.shape == (40, 7168)


@pytest.mark.parametrize("make, needle", [
    (lambda: torch.zeros(257, dtype=torch.int64), "must be i32"),
    (lambda: torch.zeros(256, dtype=torch.int32), "shape[0] must be 257"),
    (lambda: torch.zeros(1, 257, dtype=torch.int32), "must be 1-D"),
    (lambda: torch.zeros(514, dtype=torch.int32)[::2], "stride(-1) must be 1"),
])
def test_the_launcher_refuses_malformed_offsets_before_launch(make, needle):
    k, rec = grouped_launcher(DOWN)
    a, b = torch.zeros(40, 2048, dtype=torch.bfloat16), torch.zeros(256, 7168, 2048, dtype=torch.bfloat16)
    with pytest.raises(LaunchError) as e:
        k.validate(a, b, make())
    assert needle in str(e.value) and not rec.calls


def test_a_symbolic_group_count_checks_the_offsets_against_b_on_every_call():
    k, rec = grouped_launcher(UP)
    a, b = torch.zeros(24, 7168, dtype=torch.bfloat16), torch.zeros(8, 4096, 7168, dtype=torch.bfloat16)
    with pytest.raises(LaunchError, match=r"offsets has 8 entries but b holds E = 8 groups' weights: pass E \+ 1 = 9"):
        k(a, b, torch.zeros(8, dtype=torch.int32))
    assert not rec.calls
    k(a, b, torch.zeros(9, dtype=torch.int32))
    k(a, b, torch.zeros(10, dtype=torch.int32)[1:])     # a 4-byte aligned view will do: the kernel reads int32s
    assert len(rec.calls) == 2 and k._lean is None


def test_masked_counts_share_e_with_b_and_a():
    k, rec = grouped_launcher(DECODE)
    a, b = torch.zeros(8, 16, 4096, dtype=torch.bfloat16), torch.zeros(8, 1536, 4096, dtype=torch.bfloat16)
    with pytest.raises(LaunchError, match="the arguments disagree on E"):
        k.validate(a, b, torch.zeros(7, dtype=torch.int32), 1.0)
    out = k(a, b, torch.zeros(8, dtype=torch.int32), 2.0)
    assert out.shape == (8, 16, 1536) and rec.calls[0][2].shape == (8,) and rec.calls[0][4] == 2.0


def test_the_debug_check_reads_the_offsets_back_and_names_the_first_bad_one():
    k, rec = grouped_launcher(DOWN, always_validate=True)
    a, b = torch.zeros(40, 2048, dtype=torch.bfloat16), torch.zeros(256, 7168, 2048, dtype=torch.bfloat16)
    offsets = torch.arange(257, dtype=torch.int32) // 8
    k(a, b, offsets)
    bad = offsets.clone()
    bad[100] = 3
    with pytest.raises(LaunchError, match=r"offsets\[100\] = 3 is before the previous offset \(unsorted\)"):
        k(a, b, bad)
    past = offsets.clone()
    past[256] = 41
    with pytest.raises(LaunchError, match=r"offsets\[256\] = 41 is past M = 40"):
        k(a, b, past)
    with pytest.raises(LaunchError, match=r"counts\[1\] = 17 rows: a masked group holds 0 to M = 16"):
        check_groups(torch.tensor([3, 17], dtype=torch.int32), 16, "masked", "counts")
    with pytest.raises(LaunchError, match=r"offsets\[0\] = -1"):
        check_groups(torch.tensor([-1, 2], dtype=torch.int32), 16, "contiguous")
    assert len(rec.calls) == 1


def test_empty_problems_do_not_launch():
    k, rec = grouped_launcher(UP)
    out = k(torch.zeros(0, 7168, dtype=torch.bfloat16), torch.zeros(4, 4096, 7168, dtype=torch.bfloat16),
            torch.zeros(5, dtype=torch.int32))
    assert out.shape == (0, 2048)
    out = k(torch.zeros(3, 7168, dtype=torch.bfloat16), torch.zeros(0, 4096, 7168, dtype=torch.bfloat16),
            torch.zeros(1, dtype=torch.int32))
    assert out.shape == (3, 2048) and not rec.calls


# ---- the reference ------------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [UP, DECODE], ids=["contiguous-gated", "masked-scalar"])
def test_the_reference_is_each_groups_product_and_leaves_other_rows_nan(spec):
    small = spec.with_dims(n=48, k=64)
    rows = [5, 0, 9, 2]
    a, b, groups, extra = make_grouped_inputs(small, rows, 48, 64, m=20 if spec is UP else 12, device="cpu",
                                              generator=torch.Generator().manual_seed(1))
    ref, bound = grouped_reference_and_bound(small, a, b, groups, extra)
    out = torch.full(ref.shape, math.nan, dtype=torch.bfloat16)
    starts = [0, 5, 5, 14]
    for g, r in enumerate(rows):
        a_g = a[starts[g]:starts[g] + r] if spec is UP else a[g, :r]
        y = a_g.double() @ b[g].double().T
        if spec.gate is not None:
            gate, up = y.chunk(2, dim=-1)
            y = torch.nn.functional.silu(gate) * up
        else:
            y = y * extra[0]
        if spec is UP:
            out[starts[g]:starts[g] + r] = y.to(torch.bfloat16)
        else:
            out[g, :r] = y.to(torch.bfloat16)
    rel, elem = error_figures(out, ref, bound)
    assert rel < 1e-2 and elem <= 1
    unwritten = ref.isnan().all(dim=-1)
    assert unwritten.sum() == (20 - 16 if spec is UP else 4 * 12 - 16)
    written = out.clone()
    written[unwritten] = 0          # a kernel that writes a row of no group fails
    assert math.isnan(error_figures(written, ref, bound)[1])


# ---- PTX (sm_90a compiles on this CPU) --------------------------------------------------------------

@pytest.mark.parametrize("spec, sched", [
    (DOWN, dict(cluster=(2, 1))),
    (DECODE, dict(tile=(64, 128, 64), mode="pingpong", raster="n")),
    (UP, dict(cluster=(1, 2))),
], ids=["contiguous-coop-2x1", "masked-pingpong", "contiguous-gated-1x2"])
def test_ptx_walks_the_groups_on_the_device_and_stores_from_registers(spec, sched):
    _, e = emitted(spec, **sched)
    ptx = compiled_ptx(e)
    assert "shfl.sync.up.b32" in ptx and "vote.sync.ballot.b32" in ptx and "popc.b32" in ptx
    assert "cp.async.bulk.tensor" in ptx and "griddepcontrol.wait" in ptx
    # no TMA store (shared -> global): every output element from registers, each behind its row's predicate
    assert not re.search(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared", ptx)
    lines = ptx.splitlines()
    stores = [i for i, line in enumerate(lines) if "st.global.b16" in line]
    tile_elems, threads = (64 * 128, 128) if sched.get("mode") == "pingpong" else (128 * 128, 256)
    assert len(stores) == tile_elems // threads
    assert all(any(re.search(r"@%p\d+ bra", lines[j]) for j in range(i - 6, i)) for i in stores)
    wgmmas = ptx.count("wgmma.mma_async")
    assert wgmmas == 4 * (2 if spec.gate else 1)      # a 64-wide k-tile: 4 k-blocks per chain

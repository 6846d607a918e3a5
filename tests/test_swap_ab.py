"""swap_ab (SM90): the kernel computes out^T = b @ a^T. The knob through the stack on the CPU: the
schedule predicate and its spellings, the IR text, the copies the tma-cluster-layout pass records,
the emitted host views and store, and the PTX. (GPU checks: tests/test_gpu_sm90.py.)"""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from gemmc import check_schedule
from gemmc.backends.sm90 import emit
from gemmc.bench.policy import parse_schedule
from gemmc.compiler import lower
from gemmc.errors import BuildError
from gemmc.ir import make_context
from gemmc.ir.attrs import ScheduleAttr
from gemmc.schedule import Schedule
from gemmc.spec import EpilogueInput, EpilogueOp, GemmSpec, Ref

from emit_support import compiled_ptx

SWAP = Schedule(tile=(128, 16, 64), mode="pingpong", stages=12, swap_ab=True)
EPI = GemmSpec(m="M", n="N", k="K", inputs=(EpilogueInput("bias", "row"), EpilogueInput("res", "full", "bf16")),
               epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))),
                         EpilogueOp("add", (Ref.node(0), Ref.input("res")))))


def test_the_schedule_spells_and_checks_the_swap():
    assert SWAP.short().endswith("_k1_swap") and SWAP.to_dict()["swap_ab"] is True
    assert "swap_ab" not in SWAP.with_(swap_ab=False).to_dict()     # old dicts and DB keys stay the same
    assert Schedule.from_dict(SWAP.to_dict()) == SWAP
    assert parse_schedule("128x16x64_pp_s12_swap") == SWAP
    spec = GemmSpec(m=16, n=4096, k=4096)
    assert not check_schedule(SWAP, spec)
    assert not check_schedule(SWAP.with_(split_k=4), spec)
    assert [v.limit for v in check_schedule(SWAP.with_(split_k=5), spec)] == ["swap_ab with split_k"]
    sm80 = check_schedule(Schedule(tile=(128, 128, 32), arch="sm_80", swap_ab=True), spec)
    assert [v.limit for v in sm80] == ["swap_ab"] and "SM90-only" in str(sm80[0])
    # an 8-wide N tile: swapped kernels store from registers, so WGMMA's N = 8 is theirs alone
    assert not check_schedule(SWAP.with_(tile=(64, 8, 128), cluster=(1, 2), stages=10), spec)
    assert [v.limit for v in check_schedule(SWAP.with_(tile=(64, 24, 128), stages="auto"), spec)] == ["tile N"]
    assert [v.limit for v in check_schedule(SWAP.with_(tile=(64, 8, 128), stages="auto", swap_ab=False), spec)] == ["tile N"]


@given(swap=st.booleans(), pdl=st.booleans())
@settings(max_examples=8, deadline=None)
def test_the_schedule_attribute_prints_and_parses_back(swap, pdl):
    from xdsl.parser import Parser
    attr = ScheduleAttr.from_schedule(SWAP.with_(swap_ab=swap, pdl=pdl))
    text = str(attr)
    assert ("swap_ab = true" in text) == swap and ("pdl = false" in text) == (not pdl)
    back = Parser(make_context(), text).parse_attribute()
    assert back == attr and back.to_schedule() == SWAP.with_(swap_ab=swap, pdl=pdl)


def test_the_pass_gives_b_the_kernels_a_role_and_stores_from_registers():
    texts, plan = lower(EPI, SWAP.with_(cluster=(1, 2), tile=(128, 32, 64), stages="auto"))
    assert plan.swap_ab
    a, b, c = plan.copy("a"), plan.copy("b"), plan.copy("out")
    assert b.box[0] == 128 // 2 and b.multicast == 2 and b.multicast_along == "n"   # b: the kernel's A
    assert a.box[0] == 32 and a.multicast == 1                                       # a: the kernel's B
    assert c.kind == "st_global" and plan.epilogue.store == "direct"
    assert plan.copy("res").kind == "ldg" and plan.copy("bias").kind == "ldg"
    assert "swap_ab = true" in texts["tma-cluster-layout"] and "st_global" in texts["tma-cluster-layout"]


def test_the_emitted_host_swaps_the_operands_and_views_out_transposed():
    _, plan = lower(EPI, SWAP)
    src = emit(plan).source
    # the entry hands the kernel b as its A and a as its B; the kernel views out transposed (SWAP_AB)
    assert "KERNEL(b, a, out, (ep0_bias, ep1_res, ), None, None, None, stream)" in src
    assert re.search(r"^SWAP_AB = True ", src, re.M)
    from gemmc.backends.sm90.kernel import epilogue, gemm
    host = Path(gemm.__file__).read_text()
    assert "out_mnl = self.view(out, self.SWAP_AB, rows_batched)" in host
    assert "cute.append(cute.select(t.layout, mode=[1, 0])" in host        # (C, R, L) when transposed
    assert "out_mnl[(tCcS[si][0], tCcS[si][1], work.tile_l)] = " in Path(epilogue.__file__).read_text()
    # the problem's n is the kernel's m: a row input is read at the kernel's m coordinate
    assert "ep0_bias_v[(em, el)]" in src and "ep1_res_v[(en, em, el)]" in src
    # the user's argument order and shapes are unchanged
    assert [(p.name, p.shape) for p in emit(plan).params] == [
        ("a", ("M", "K")), ("b", ("N", "K")), ("out", ("M", "N")), ("bias", ("N",)), ("res", ("M", "N"))]
    plain = emit(lower(EPI, SWAP.with_(swap_ab=False, stages="auto"))[1]).source
    assert re.search(r"^SWAP_AB = False ", plain, re.M) and "KERNEL(a, b, out, " in plain


def test_swapped_split_k_sums_in_the_kernel_over_the_transposed_tiles():
    """Swapped, every split count takes the in-kernel fix-up (the reduce kernel stages its partials through
    smem, which a swapped kernel does not use), and the workspace and semaphores count out^T's tiles."""
    from gemmc.schedule import split_k_mode
    for sk in (2, 3, 4):
        assert split_k_mode(SWAP.with_(split_k=sk)) == "fixup"
        assert split_k_mode(SWAP.with_(split_k=sk, swap_ab=False, stages="auto")) == ("fixup" if sk == 2 else "serial")
    _, plan = lower(GemmSpec(m=72, n=8, k=4096), SWAP.with_(tile=(64, 8, 128), stages=10, split_k=3))
    params = {p.name: p for p in emit(plan).params}
    # the kernel's M is n = 8 (one 64-row tile), its N is m = 72 (nine 8-wide tiles): 9 tiles, not 2 x 1
    assert eval(params["semaphores"].workspace_elems) == 9
    assert eval(params["workspace"].workspace_elems) == 3 * 64 * 8 * 9
    bad = replace(plan, scheduler=replace(plan.scheduler, split_k_mode="serial"))
    with pytest.raises(BuildError, match="fixup"):
        emit(bad)


@pytest.mark.parametrize("sched", [SWAP, SWAP.with_(tile=(128, 64, 64), mode="cooperative", stages="auto",
                                                    cluster=(2, 1)),
                                   SWAP.with_(tile=(64, 32, 128), cluster=(1, 2), stages=9),
                                   SWAP.with_(tile=(64, 8, 128), cluster=(1, 2), stages=10),
                                   SWAP.with_(tile=(64, 8, 128), stages=10, split_k=2)],
                         ids=["pp_128x16", "coop_128x64_c2x1", "pp_64x32x128_c1x2_s9", "pp_64x8x128_c1x2_s10",
                              "pp_64x8x128_s10_k2"])
def test_ptx_loads_with_tma_and_stores_from_registers(sched):
    _, plan = lower(GemmSpec(m="M", n="N", k="K"), sched)
    ptx = compiled_ptx(emit(plan))
    for inst in ("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier", "setmaxnreg", "st.global"):
        assert inst in ptx, inst
    # split: the fix-up counts arrivals with a gpu-scope atomic add
    assert (re.search(r"atom(\.\w+)*\.add", ptx) is not None) == (sched.split_k > 1)
    assert not re.search(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta", ptx)   # no TMA store
    assert (".multicast::cluster" in ptx) == (sched.cluster != (1, 1))
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{sched.tile[1]}k16", ptx)


@pytest.mark.parametrize("a_layout, b_layout", [("mk", "kn"), ("km", "nk")])
def test_mixed_majors_follow_the_operand_each_kernel_side_reads(a_layout, b_layout):
    """Swapped, the kernel's A is b: its major mode and smem atom come from b's layout, and B's from a's."""
    spec = GemmSpec(m="M", n="N", k="K", a_layout=a_layout, b_layout=b_layout)
    _, plan = lower(spec, SWAP.with_(stages="auto"))
    src = emit(plan).source
    facts = {ln.split("=")[0].strip(): ln.split("=", 1)[1].split("#")[0].strip()
             for ln in src.splitlines() if re.match(r"^[A-Z_]+ = ", ln)}
    b_k, a_k = b_layout == "nk", a_layout == "mk"
    assert facts["A_MAJOR"].endswith(".K" if b_k else ".MN") and facts["B_MAJOR"].endswith(".K" if a_k else ".MN")
    assert (".K_" in facts["A_SMEM_ATOM"]) == b_k and (".K_" in facts["B_SMEM_ATOM"]) == a_k
    assert (facts["A_MAJOR_IS_K"], facts["B_MAJOR_IS_K"]) == (str(b_k), str(a_k))   # smem layouts likewise
    assert "wgmma.mma_async" in compiled_ptx(emit(plan))

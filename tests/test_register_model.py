"""The predicate's register model against ptxas: every tile of a representative set that `check_schedule` admits
compiles (on the CPU) without spills at the setmaxnreg budgets assign-warpgroup-roles gives it, and every
tile it refuses for registers is refused with the spill message and, compiled anyway at the largest consumer
budget, does spill."""
from __future__ import annotations

import pytest

import gemmc.schedule.resources as schedule_resources  # where the register model reads its constants
from gemmc.backends import emit
from gemmc.build import PtxasReport, parse_ptxas_log, ptxas_report
from gemmc.compiler import lower
from gemmc.schedule import (CONSUMER_REGS_MAX, Schedule, accumulator_regs, check_schedule, consumer_regs_needed,
                            register_budgets, register_pool)
from gemmc.spec import EpilogueInput, EpilogueOp, GemmSpec, Ref

PLAIN = GemmSpec(m="M", n="N", k="K", dtype="bf16")
BIAS_GELU = GemmSpec(m="M", n="N", k="K", dtype="bf16", inputs=(EpilogueInput("bias", "row", "bf16"),),
                     epilogue=(EpilogueOp("add", (Ref.acc(), Ref.input("bias"))),
                               EpilogueOp("gelu_tanh", (Ref.node(0),))))
SPECS = {"plain": PLAIN, "bias_gelu": BIAS_GELU}

# cooperative 256xN and ping-pong 128xN (N accumulator registers a thread either way), with and without an
# epilogue; then the large tiles with the clusters, split-K fix-up and stream-K the search pairs them with
CASES = ([(Schedule((256, n, 64)), e) for n in (128, 160, 192, 208, 224, 256) for e in SPECS]
         + [(Schedule((128, n, 64), mode="pingpong"), e) for n in (128, 160, 192, 208, 224, 256) for e in SPECS]
         + [(Schedule((192, 256, 64)), e) for e in SPECS]
         + [(Schedule((256, 192, 64), cluster=(1, 2)), "plain"), (Schedule((256, 208, 64), cluster=(2, 1)), "plain"),
            (Schedule((256, 208, 64), cluster=(1, 2), stream_k=True), "plain"),
            (Schedule((256, 160, 64), split_k=2), "bias_gelu"), (Schedule((256, 192, 64), split_k=2), "plain"),
            (Schedule((256, 160, 64), stream_k=True), "bias_gelu"), (Schedule((256, 128, 64), split_k=2), "bias_gelu"),
            (Schedule((128, 160, 64), mode="pingpong", split_k=2), "bias_gelu"),
            (Schedule((128, 128, 64), mode="pingpong", split_k=2), "bias_gelu"),
            (Schedule((128, 96, 64), mode="pingpong", split_k=2), "bias_gelu")])

# what the model admits of CASES (the rest it refuses for registers): pinned, so a change to it is seen here
ADMITTED = {
    ("256x128x64_c1x1_coop_sauto_rm_sw1_k1", "plain"), ("256x128x64_c1x1_coop_sauto_rm_sw1_k1", "bias_gelu"),
    ("256x160x64_c1x1_coop_sauto_rm_sw1_k1", "plain"), ("256x160x64_c1x1_coop_sauto_rm_sw1_k1", "bias_gelu"),
    ("256x192x64_c1x1_coop_sauto_rm_sw1_k1", "plain"), ("256x208x64_c1x1_coop_sauto_rm_sw1_k1", "plain"),
    ("128x128x64_c1x1_pp_sauto_rm_sw1_k1", "plain"), ("128x128x64_c1x1_pp_sauto_rm_sw1_k1", "bias_gelu"),
    ("128x160x64_c1x1_pp_sauto_rm_sw1_k1", "plain"), ("128x160x64_c1x1_pp_sauto_rm_sw1_k1", "bias_gelu"),
    ("128x192x64_c1x1_pp_sauto_rm_sw1_k1", "plain"), ("128x208x64_c1x1_pp_sauto_rm_sw1_k1", "plain"),
    ("192x256x64_c1x1_coop_sauto_rm_sw1_k1", "plain"),
    ("256x192x64_c1x2_coop_sauto_rm_sw1_k1", "plain"), ("256x208x64_c2x1_coop_sauto_rm_sw1_k1", "plain"),
    ("256x208x64_c1x2_coop_sauto_rm_sw1_k1_streamk", "plain"), ("256x128x64_c1x1_coop_sauto_rm_sw1_k2", "bias_gelu"),
    ("128x96x64_c1x1_pp_sauto_rm_sw1_k2", "bias_gelu"), ("256x160x64_c1x1_coop_sauto_rm_sw1_k1_streamk", "bias_gelu"),
}


def _id(case) -> str:
    s, e = case
    return f"{s.short()}-{e}"


def register_violations(s: Schedule, spec: GemmSpec):
    return [v for v in check_schedule(s, spec) if v.limit == "registers"]


def test_the_model_admits_the_pinned_tiles():
    admitted = {(s.short(), e) for s, e in CASES if not check_schedule(s, SPECS[e])}
    assert admitted == ADMITTED
    for s, e in CASES:
        problems = check_schedule(s, SPECS[e])
        assert problems == register_violations(s, SPECS[e]), problems     # registers are the only rule at stake


def test_budgets_share_out_the_ctas_launch_registers():
    """ptxas launches the 384-thread CTA at 168 registers a thread; setmaxnreg only redistributes them."""
    assert register_pool("sm_90a", 384) == 384 * 168
    for s, e in CASES:
        producer, consumer = register_budgets(s, SPECS[e])
        assert 128 * producer + 256 * consumer <= register_pool("sm_90a", 384)
        assert producer % 8 == 0 and consumer % 8 == 0 and 24 <= producer <= consumer <= 256
        # the larger consumer budget only where the smaller one would not hold the tile
        assert (consumer > 232) == (consumer_regs_needed(s, SPECS[e]) > 232)


def test_refusals_name_the_budget_the_value_and_a_fix():
    (v,) = register_violations(Schedule((256, 224, 64)), PLAIN)
    assert str(v) == ("registers: got 224 accumulator regs per MMA thread + 32 others (addresses, pipeline and "
                      "scheduler state) = 256 > 240, the consumers' setmaxnreg budget: ptxas spills past it; use a "
                      "smaller tile (M x N)")
    (v,) = register_violations(Schedule((128, 192, 64), mode="pingpong"), BIAS_GELU)
    assert "192 accumulator regs per ping-pong warpgroup + 64 others (the epilogue's or split-K partial sums' " \
           "included) = 256 > 240" in str(v)
    assert "mode='cooperative'" in v.fix


def test_ptxas_log_parses_per_entry():
    log = ("ptxas info    : 0 bytes gmem\nptxas info    : Compiling entry function ''k_main'' for ''sm_90a''\n"
           "ptxas info    : Function properties for k_main\n"
           "ptxas         .     184 bytes stack frame, 184 bytes spill stores, 180 bytes spill loads\n"
           "ptxas info    : Used 168 registers, used 2 barriers\n"
           "ptxas info    : Compiling entry function 'k_reduce' for 'sm_90a'\n"
           "ptxas info    : Function properties for k_reduce\n"
           "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 30 registers\n")
    assert parse_ptxas_log(log) == [PtxasReport("k_main", 168, 184, 184, 180), PtxasReport("k_reduce", 30, 0, 0, 0)]
    assert [r.spills for r in parse_ptxas_log(log)] == [True, False]


def _reports(s: Schedule, spec: GemmSpec) -> list[PtxasReport]:
    _, plan = lower(spec, s)
    return ptxas_report(emit(plan))


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_ptxas_agrees(case, monkeypatch):
    s, e = case
    spec = SPECS[e]
    refused = register_violations(s, spec)
    if not refused:
        _, plan = lower(spec, s)
        assert (plan.role("producer")[0].regs, plan.role("consumer")[0].regs) == register_budgets(s, spec)
        reports = ptxas_report(emit(plan))
        assert not [r for r in reports if r.spills], reports
        return
    (v,) = refused
    assert "ptxas spills past it" in str(v)
    if accumulator_regs(s, spec) > CONSUMER_REGS_MAX:
        return          # the accumulators alone overflow the largest budget: nothing to compile
    # compiled anyway at the largest budget (the model's overheads off), it spills: the refusal is not too strict
    monkeypatch.setattr(schedule_resources, "CONSUMER_REG_OVERHEAD", 0)
    monkeypatch.setattr(schedule_resources, "CONSUMER_REG_OVERHEAD_EPILOGUE", 0)
    monkeypatch.setattr(schedule_resources, "CONSUMER_REG_OVERHEAD_EPILOGUE_SUMS", 0)
    monkeypatch.setattr(schedule_resources, "CONSUMER_REG_OVERHEAD_EPILOGUE_SUMS_PINGPONG", 0)
    monkeypatch.setattr(schedule_resources, "CONSUMER_REGS", 0)       # every tile takes the 24/240 split
    assert register_budgets(s, spec) == (24, CONSUMER_REGS_MAX)
    reports = _reports(s, spec)
    assert any(r.spills for r in reports), reports

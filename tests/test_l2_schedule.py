"""The L2 schedule fields (l2_a, l2_b, l2_out, l2_prefetch) on the CPU: their serialisation, the predicate's rules,
where the search space offers them, the IR facts tma-cluster-layout and pipeline-staging write for them, the
kernel constants, the features, and in the PTX of sm_90a compiles the cache-policy words and the prefetches."""
from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import given, strategies as st

from gemmc.bench.policy import PolicyError, parse_schedule
from gemmc.choose.features import FeatureSpec, effective_l2, gp_features, policy_features
from gemmc.choose.measurement import schedule_key
from gemmc.compiler import lower
from gemmc.ir import parse_module, print_module
from gemmc.schedule import (L2_FIELDS, L2_POLICIES, SWAP_DECODE_MAX_M, Schedule, ScheduleSpace, check_schedule,
                            enumerate_schedules)
from gemmc.schedule.space import DECODE_L2, L2_AUTO
from gemmc.spec import GemmSpec

DECODE = GemmSpec(m=16, n=4096, k=4096)
SWAPPED = Schedule((128, 16, 64), mode="pingpong", swap_ab=True)
PLAIN = Schedule((128, 128, 64), (2, 1))
# the policy words TMA's cache hints take (evict-first, evict-normal, evict-last; fraction 1.0)
WORDS = {"first": 0x12F0000000000000, "normal": 0x1000000000000000, "last": 0x14F0000000000000}


# ---- the fields -----------------------------------------------------------------------------------

def test_auto_l2_fields_stay_out_of_the_dict_so_old_records_still_match():
    s = Schedule()
    assert all(getattr(s, f) == "auto" for f in L2_FIELDS)
    assert not set(s.to_dict()) & set(L2_FIELDS)
    assert schedule_key(s) == json.dumps({"arch": "sm_90a", "cluster": [1, 1], "mode": "cooperative", "raster": "m",
                                          "split_k": 1, "stages": "auto", "swizzle": 1,
                                          "tile": [128, 128, 64]}, separators=(",", ":"))
    hinted = s.with_(l2_b="last", l2_prefetch=8)
    assert hinted.to_dict()["l2_b"] == "last" and hinted.to_dict()["l2_prefetch"] == 8
    assert "l2_a" not in hinted.to_dict() and "l2_out" not in hinted.to_dict()
    assert Schedule.from_dict(json.loads(json.dumps(hinted.to_dict()))) == hinted
    assert Schedule(l2_prefetch="8") == Schedule(l2_prefetch=8)      # the IR and the CLI write it as text


@given(a=st.sampled_from(L2_POLICIES), b=st.sampled_from(L2_POLICIES), out=st.sampled_from(L2_POLICIES),
       pf=st.sampled_from(["auto", 0, 4, 16]))
def test_short_names_the_l2_fields_and_parses_back(a, b, out, pf):
    s = SWAPPED.with_(l2_a=a, l2_b=b, l2_out=out, l2_prefetch=pf)
    name = s.short()
    assert name.startswith(SWAPPED.short())
    for f, tok in (("l2_a", "_l2a-"), ("l2_b", "_l2b-"), ("l2_out", "_l2o-")):
        assert (tok + getattr(s, f) in name) == (getattr(s, f) != "auto")
    assert ("_pf" in name) == (pf != "auto")
    assert parse_schedule(name) == s


def test_a_bad_l2_token_names_the_tokens():
    with pytest.raises(PolicyError, match="l2a-P"):
        parse_schedule("128x128x64_l2x-last")


# ---- the predicate -----------------------------------------------------------------------------------

L2_LIMITS = {"l2_a", "l2_b", "l2_out", "l2_prefetch", "L2 fields (sm_80)", "l2_prefetch without pdl",
             "l2_out with swap_ab", "l2_out with split_k"}


def expected_l2_limits(s: Schedule) -> set:
    """The rules, written out again: bad words first; then SM80 has no hints; the prefetch needs PDL; the store's
    hint needs the kernel's own TMA store (not a swapped kernel's register store, not a reduce kernel's)."""
    bad = {f for f in ("l2_a", "l2_b", "l2_out") if getattr(s, f) not in L2_POLICIES}
    if not (s.l2_prefetch == "auto" or (type(s.l2_prefetch) is int and 0 <= s.l2_prefetch <= 32)):
        bad.add("l2_prefetch")
    if bad or all(getattr(s, f) == "auto" for f in L2_FIELDS):
        return bad
    if s.arch == "sm_80":
        return {"L2 fields (sm_80)"}
    out = set()
    if s.l2_prefetch != "auto" and not s.pdl:
        out.add("l2_prefetch without pdl")
    if s.l2_out != "auto":
        if s.swap_ab:
            out.add("l2_out with swap_ab")
        elif s.split_k > 2:      # serial split-K: the reduce kernel stores out
            out.add("l2_out with split_k")
    return out


@given(a=st.sampled_from([*L2_POLICIES, "early"]), b=st.sampled_from(L2_POLICIES),
       out=st.sampled_from([*L2_POLICIES, "keep"]), pf=st.sampled_from(["auto", 0, 2, 8, 32, 33, -1, "deep", True]),
       swap=st.booleans(), pdl=st.booleans(), split_k=st.sampled_from([1, 2, 4]), sm80=st.booleans())
def test_the_predicate_names_exactly_the_l2_rules_broken(a, b, out, pf, swap, pdl, split_k, sm80):
    if sm80:
        base = Schedule((128, 128, 32), arch="sm_80", split_k=split_k, pdl=pdl)
    else:
        base = (SWAPPED.with_(split_k=min(split_k, 2)) if swap else PLAIN.with_(split_k=split_k)).with_(pdl=pdl)
    s = base.with_(l2_a=a, l2_b=b, l2_out=out, l2_prefetch=pf)
    got = {v.limit for v in check_schedule(s, DECODE)}
    assert got & L2_LIMITS == expected_l2_limits(s)
    assert got - L2_LIMITS == {v.limit for v in check_schedule(base, DECODE)}    # the L2 fields break nothing else


def test_l2_violations_say_how_to_fix_them():
    msgs = {v.limit: v.fix for v in check_schedule(SWAPPED.with_(l2_out="last", l2_prefetch=4, pdl=False), DECODE)}
    assert "use pdl=True, or l2_prefetch='auto'" in msgs["l2_prefetch without pdl"]
    assert "stores from registers" in msgs["l2_out with swap_ab"]
    msgs = {v.limit: v.fix for v in check_schedule(Schedule(l2_a="early", l2_prefetch=40), DECODE)}
    assert "'first', 'normal', 'last'" in msgs["l2_a"] and "from 0 to 32" in msgs["l2_prefetch"]


# ---- the search space ------------------------------------------------------------------------------

def test_only_decode_problems_get_the_l2_presets_and_the_rules_come_first():
    assert ScheduleSpace().l2 == (L2_AUTO,) and ScheduleSpace.swapped_batch().l2 == (L2_AUTO,)
    assert ScheduleSpace.swapped_decode().l2 == DECODE_L2 and DECODE_L2[0] == L2_AUTO and len(DECODE_L2) == 3
    decode = enumerate_schedules(DECODE)
    swapped = [s for s in decode if s.swap_ab]
    plain = [s for s in swapped if all(getattr(s, f) == "auto" for f in L2_FIELDS)]
    # each swapped decode schedule comes in its 3 presets (the store is never hinted: it is a register store)
    assert len(swapped) == 3 * len(plain) == 192 and len(decode) == 1344 + 128
    assert {(s.l2_a, s.l2_b, s.l2_out, s.l2_prefetch) for s in swapped} == set(DECODE_L2)
    assert all(s.swap_ab for s in decode if s.l2_prefetch != "auto" or s.l2_a != "auto")
    for i, s in enumerate(decode):    # the preset axis varies fastest: the rules' schedule precedes its variants
        if s.l2_prefetch != "auto" or s.l2_a != "auto":
            assert decode[i - 1].tile == s.tile and decode[i - 1].stages == s.stages
    for m in (SWAP_DECODE_MAX_M + 1, 4096, "M"):
        assert all(all(getattr(s, f) == "auto" for f in L2_FIELDS)
                   for s in enumerate_schedules(GemmSpec(m=m, n=4096, k=4096)))
    assert all(s.l2_prefetch == "auto" for s in enumerate_schedules(DECODE, "sm_80"))


# ---- features -----------------------------------------------------------------------------------------

def test_features_tell_the_l2_variants_apart():
    variants = [s for s in enumerate_schedules(DECODE) if s.swap_ab and s.tile == (128, 16, 64)
                and s.stages == "auto" and s.cluster == (1, 1) and s.mode == "pingpong"]
    assert len(variants) == 3
    assert len({tuple(policy_features(s, DECODE)) for s in variants}) == 3
    assert len({tuple(gp_features(s, DECODE)) for s in variants}) == 3
    assert all(len(policy_features(s, DECODE)) == FeatureSpec().dim for s in variants)
    assert FeatureSpec().version == 5


def test_effective_l2_resolves_the_rules_per_shape():
    # (a priority, b priority, store priority, log2(1 + prefetched k-tiles)); first -1, no hint 0, last 1
    big = GemmSpec(m=4096, n=4096, k=4096)
    assert effective_l2(PLAIN, big) == [0.0, 0.0, 0.0, pytest.approx(1.585, abs=1e-3)]   # 132 CTAs: a band, 2 k-tiles
    tall = GemmSpec(m=128, n=4096, k=4096)          # one 128-row tile: b (the weights) loads once
    assert effective_l2(Schedule((128, 128, 64)), tall)[:2] == [0.0, -1.0]
    assert effective_l2(SWAPPED, DECODE)[:2] == [0.0, -1.0]        # swapped: b is the kernel's A, loaded once
    assert effective_l2(SWAPPED.with_(l2_a="last", l2_b="normal", l2_prefetch=8), DECODE) == \
        [1.0, 0.0, 0.0, pytest.approx(math.log2(9))]
    assert effective_l2(PLAIN.with_(l2_out="last", l2_prefetch=0), big)[2:] == [1.0, 0.0]


# ---- the IR ---------------------------------------------------------------------------------------------

def test_the_passes_write_the_l2_facts_and_the_text_round_trips():
    texts, plan = lower(DECODE, SWAPPED.with_(l2_a="last", l2_b="normal", l2_prefetch=8))
    text = texts["verify-resources"]
    assert "l2_a = last, l2_b = normal, l2_prefetch = 8>" in text
    assert "kernel.copy b tma box 128x64 swizzle 128 l2 normal\n" in text
    assert "kernel.copy a tma box 16x64 swizzle 128 l2 last\n" in text
    assert "pdl_prefetch_k_tiles 8 pdl_prefetch_of b pdl_prefetch_banded false" in text
    assert print_module(parse_module(text)) == text
    assert (plan.copy("a").l2_policy, plan.copy("b").l2_policy) == ("last", "normal")
    assert (plan.scheduler.pdl_prefetch_k_tiles, plan.scheduler.pdl_prefetch_of,
            plan.scheduler.pdl_prefetch_banded) == (8, "b", False)
    # the rules print as before, apart from the copies' word: first_once on the loads, nothing on the store
    texts, plan = lower(GemmSpec(), PLAIN)
    text = texts["verify-resources"]
    assert "l2_" not in text.split("{")[0] and "pdl_prefetch_k_tiles 2 max_active_clusters" in text
    assert [c.l2_policy for c in plan.copies] == ["first_once", "first_once", ""]
    _, plan = lower(GemmSpec(), PLAIN.with_(l2_out="last", l2_prefetch=0))
    assert plan.copy("out").l2_policy == "last" and plan.scheduler.pdl_prefetch_k_tiles == 0


# ---- the kernel constants and the PTX ---------------------------------------------------------------------

def kernel_constants(spec, s) -> dict:
    from gemmc.backends.sm90 import emit
    source = emit(lower(spec, s)[1]).source
    return {m[1]: m[2].strip() for m in re.finditer(r"^([A-Z_0-9]+) = (.+?)\s+#", source, re.M)}


def test_the_constants_name_the_kernels_operands():
    c = kernel_constants(DECODE, SWAPPED.with_(l2_a="last", l2_b="normal", l2_prefetch=8))
    # swapped: the kernel's A is b (the weights), its B is a
    assert (c["A_L2_POLICY"], c["B_L2_POLICY"], c["C_L2_POLICY"]) == ("'normal'", "'last'", "''")
    assert (c["PDL_PREFETCH_A"], c["PDL_PREFETCH_B"], c["PDL_PREFETCH_BANDED"]) == ("True", "False", "False")
    c = kernel_constants(GemmSpec(), PLAIN.with_(l2_out="first", l2_prefetch=4))
    assert (c["A_L2_POLICY"], c["B_L2_POLICY"], c["C_L2_POLICY"]) == ("'first_once'", "'first_once'", "'first'")
    assert (c["PDL_PREFETCH_K_TILES"], c["PDL_PREFETCH_A"], c["PDL_PREFETCH_B"]) == ("4", "False", "True")
    c = kernel_constants(GemmSpec(), PLAIN)
    assert (c["PDL_PREFETCH_K_TILES"], c["PDL_PREFETCH_A"], c["PDL_PREFETCH_B"], c["PDL_PREFETCH_BANDED"]) == \
        ("2", "True", "True", "True")


def ptx_main(spec, s) -> str:
    from gemmc.backends.sm90 import emit
    from gemmc.build import compile_with_ptx
    ptx = compile_with_ptx(emit(lower(spec, s)[1]))[1]
    bodies = re.split(r"^\.visible \.entry|^\.entry", ptx, flags=re.M)[1:]
    return next(b for b in bodies if "wgmma.mma_async" in b)


def policy_of(ptx: str, line: str) -> int:
    """The cache-policy word a `...L2::cache_hint [...], %rdN;` instruction takes (the last mov.b64 into %rdN)."""
    reg = re.search(r"(%rd\d+);\s*$", line)[1]
    before = ptx[:ptx.index(line)]
    return int(re.findall(rf"mov\.b64\s+{re.escape(reg)}, (\d+);", before)[-1])


@pytest.mark.slow
def test_ptx_swapped_decode_hints_each_operand_and_prefetches_the_weights_deep():
    main = ptx_main(DECODE, SWAPPED.with_(l2_a="last", l2_b="normal", l2_prefetch=8))
    lines = re.findall(r"^\s*cp\.async\.bulk\.tensor\.2d\.shared::cta\.global\S*L2::cache_hint[^\n]*$", main, re.M)
    # each load's smem ring (its offset: the kernel's A ring, then its B ring) and policy word
    by_ring: dict = {}
    for ln in lines:
        ring = int(re.search(r"cache_hint \[%r\d+\+(\d+)\]", ln)[1])
        by_ring.setdefault(ring, set()).add(policy_of(main, ln))
    assert len(by_ring) == 2
    a_ring, b_ring = sorted(by_ring)
    # swapped: the kernel's A is b (evict-normal), its B is a (evict-last); no per-call select
    assert (by_ring[a_ring], by_ring[b_ring]) == ({WORDS["normal"]}, {WORDS["last"]})
    assert "selp.b64" not in main
    # 8 k-tiles of one tensor map (the weights), before the wait, whatever the grid (no band test around them)
    prefetches = re.findall(r"cp\.async\.bulk\.prefetch\.tensor\.2d\.L2\.global\.tile\S* \[(%rd\d+), \{(%r\d+)",
                            main)
    assert len(prefetches) == 8 and len({t for t, _ in prefetches}) == 1 and len({k for _, k in prefetches}) == 8
    assert main.rindex("cp.async.bulk.prefetch.tensor") < main.index("griddepcontrol.wait;")


@pytest.mark.slow
def test_ptx_store_hint_and_an_explicit_b_policy_beside_the_rule_on_a():
    main = ptx_main(GemmSpec(m="M", n="N", k=4096), PLAIN.with_(l2_b="first", l2_out="last", l2_prefetch=0))
    stores = re.findall(r"^\s*cp\.async\.bulk\.tensor\.2d\.global\.shared::cta\S*[^\n]*$", main, re.M)
    assert stores and all("L2::cache_hint" in ln and policy_of(main, ln) == WORDS["last"] for ln in stores)
    # a keeps the rule (evict-first when the grid loads each of its tiles once: a per-call select), b is
    # evict-first on every load
    assert re.search(r"selp\.b64\s+%rd\d+, 1364590687093260288, 0, %p\d+;", main)
    assert re.search(r"mov\.b64\s+%rd\d+, 1364590687093260288;", main)
    assert "cp.async.bulk.prefetch.tensor" not in main      # l2_prefetch 0: none, under PDL
    assert "griddepcontrol.wait;" in main


@pytest.mark.slow
def test_ptx_of_the_rules_stores_without_a_policy():
    main = ptx_main(GemmSpec(m="M", n=4096, k=4096), PLAIN)
    stores = re.findall(r"^\s*cp\.async\.bulk\.tensor\.2d\.global\.shared::cta\S*[^\n]*$", main, re.M)
    assert stores and not any(str(w) in main for w in (WORDS["last"], WORDS["normal"]))
    prefetches = re.findall(r"cp\.async\.bulk\.prefetch\.tensor\.2d\.L2\.global\.tile\S* \[(%rd\d+),", main)
    assert len(prefetches) == 4 and len(set(prefetches)) == 2       # 2 k-tiles of A and of B


# ---- the command line -------------------------------------------------------------------------------------

def test_gemmc_compile_takes_the_l2_flags_and_prints_the_facts(capsys, shipped_only):
    from gemmc import cli
    rc = cli.main(["compile", "--m", "16", "--n", "4096", "--k", "4096", "--tile", "128x16x64", "--cluster", "1x1",
                   "--mode", "pingpong", "--stages", "auto", "--swap-ab", "--l2-a", "last", "--l2-prefetch", "8"])
    out, _ = capsys.readouterr()
    assert rc == 0 and out.startswith("// schedule: 128x16x64_c1x1_pp_sauto_rm_sw1_k1_swap_l2a-last_pf8 (sm_90a)\n")
    assert "kernel.copy a tma box 16x64 swizzle 128 l2 last\n" in out
    assert "pdl_prefetch_k_tiles 8 pdl_prefetch_of b pdl_prefetch_banded false" in out
    rc = cli.main(["compile", "--m", "16", "--n", "4096", "--k", "4096", "--tile", "128x16x64", "--mode", "pingpong",
                   "--swap-ab", "--l2-out", "last"])
    _, err = capsys.readouterr()
    assert rc == 1 and "l2_out with swap_ab" in err and len(err.strip().splitlines()) <= 3

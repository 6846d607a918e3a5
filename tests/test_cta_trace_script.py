"""scripts/cta_trace.py: its stamps go into the SM90 kernel modules and every kernel form builds with them,
the timeline arithmetic, and (GPU) the traced kernel computes the same product and records one stamp set per
CTA and launch."""
import numpy as np
import pytest
from script_support import load_script

import gemmc
from gemmc.bench.policy import parse_schedule

cta_trace = load_script("cta_trace")

FORMS = ["128x256x64_c2x1_coop_sauto_rm_sw1_k1", "64x128x64_c2x1_pp_sauto_rm_sw1_k2",
         "128x128x64_c1x1_pp_sauto_rm_sw1_k4", "64x8x128_c1x2_pp_s10_rm_sw1_k1_swap",
         "128x16x64_c1x1_coop_sauto_rm_sw1_k1_swap"]


def _kernel(name, **kw):
    return gemmc.compile(gemmc.GemmSpec(m="M", n="N", k="K"), schedule=parse_schedule(name).with_(**kw))


def _k_loops(src):
    """The bodies of the k-loops (`for kt in range(...)`): the lines indented under them."""
    lines, out = src.splitlines(), []
    for i, ln in enumerate(lines):
        if ln.strip().startswith("for kt in range("):
            depth, body = len(ln) - len(ln.lstrip()), []
            for nxt in lines[i + 1:]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= depth:
                    break
                body.append(nxt)
            out.append(body)
    return out


def test_the_stamps_leave_the_k_loops_and_the_tma_issuer_alone():
    src = cta_trace.kernel_sources()
    out = cta_trace.edit_modules(0x7F0000001000)
    assert {n for n in src if out[n] != src[n]} == {"gemm", "consumer"}
    edited = out["gemm"] + out["consumer"]
    assert f"TRACE_ADDR = {0x7F0000001000}" in out["gemm"] and f"TRACE_ADDR = {0x7F0000001000}" in out["consumer"]
    for field in cta_trace.FIELDS:
        assert cta_trace._slot(field) in edited or cta_trace._slot(field, n="_tr[_bid]") in edited
    # every added line is a stamp; the k-loops are byte-identical
    for name in ("producer", "consumer"):
        assert _k_loops(out[name]) == _k_loops(src[name]) and _k_loops(src[name])
    added = [ln for n in ("gemm", "consumer") for ln in out[n].splitlines() if ln not in set(src[n].splitlines())]
    assert all(("_tr" in ln or "_n" in ln or "_b" in ln or "_g" in ln or "_t_launch" in ln or "TRACE" in ln
                or "_tidx" in ln or ln.strip().startswith("if ") or not ln.strip()) for ln in added), added
    assert "if tidx == 0:" not in "\n".join(added)       # warp 0 issues the TMA loads: never stalled
    for module, text in out.items():
        compile(text, module, "exec")


@pytest.mark.parametrize("name", FORMS)
def test_every_kernel_form_builds_traced(name):
    k = _kernel(name)
    traced = cta_trace.traced(k, 0x7F0000001000)
    assert "from gemmc_kernel_edit_" in traced.source
    traced.build()          # the DSL compiles the stamped modules (CPU: to PTX and a .so)


def test_edit_modules_refuses_a_kernel_it_cannot_key():
    with pytest.raises(ValueError, match="pdl on"):
        cta_trace.traced(_kernel(FORMS[0], pdl=False), 1 << 40)
    sources = cta_trace.kernel_sources()
    sources["gemm"] = sources["gemm"].replace("griddepcontrol_wait()", "pass")
    with pytest.raises(ValueError, match="grid-dependency wait"):
        cta_trace.edit_modules(1 << 40, sources)


def test_the_timeline_of_two_recorded_launches():
    f = {n: i for i, n in enumerate(cta_trace.FIELDS)}

    def launch(t0, ends):
        a = np.zeros((len(ends), len(cta_trace.FIELDS)))
        a[:, f["launch"]] = t0 - 500
        a[:, f["go"]] = t0
        a[:, f["end"]] = [t0 + e for e in ends]
        a[:, f["end1"]] = a[:, f["end"]] - 300          # the second warpgroup finished first here
        a[:, f["mma"]] = a[:, f["end"]] - 200
        return a

    prev, cur = launch(0, [9000, 10000]), launch(10600, [8000, 12000])
    t = cta_trace.timeline([prev, cur])
    assert t["period"] == 10.6 and t["gap"] == 0.6 and t["span"] == 12.0 and t["tail"] == 0.2
    assert (t["dur_min"], t["dur_median"], t["dur_max"]) == (8.0, 10.0, 12.0)
    assert t["dur_harmonic"] == 9.6 and t["ctas"] == 2 and t["pairs"] == 1
    assert cta_trace.timeline([prev]) == {}
    cur[1, f["end1"]] = 10600 + 12500                   # ...but not on the last CTA: it ends with its second
    assert cta_trace.timeline([prev, cur])["span"] == 12.5


@pytest.mark.gpu
def test_traced_kernel_is_correct_and_stamps_every_cta():
    import torch
    m, n, k = 16, 4096, 2048
    kk = gemmc.compile(gemmc.GemmSpec(m=m, n=n, k=k), schedule=parse_schedule("64x16x128_c1x1_pp_s10_rm_sw1_k1_swap"))
    buf = torch.zeros(cta_trace.TRACE_LEN, dtype=torch.int64, device="cuda")
    traced = cta_trace.traced(kk, buf.data_ptr())
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        traced(a, b, out=out)
    torch.cuda.synchronize()
    ref = a.float() @ b.float().T
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2
    launches = cta_trace.launches_of(buf)
    assert len(launches) == 3 and all(x.shape[0] == n // 64 for x in launches)   # one CTA per 64-row tile
    f = {name: i for i, name in enumerate(cta_trace.FIELDS)}
    for x in launches:
        assert (x[:, f["launch"]] <= x[:, f["go"]]).all() and (x[:, f["go"]] <= x[:, f["mma"]]).all()
        assert (x[:, f["mma"]] <= x[:, f["end"]]).all() and (x[:, f["smid"]] < 132).all()
        assert (x[:, f["end1"]] >= x[:, f["go"]]).all()
    t = cta_trace.timeline(launches)
    assert t["pairs"] == 2 and 0 < t["dur_min"] <= t["dur_harmonic"] <= t["dur_max"] <= t["span"]

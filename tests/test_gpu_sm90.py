"""SM90 kernels on the GPU (`-m gpu`, H200): every layout, dtype, mode, cluster shape up to 2x2,
split-K on and off and each epilogue op, against an fp32 torch reference of the upcast inputs with
the output NaN-poisoned first; relative Frobenius error < 1e-2 and every element within its bound
(gemmc.reference.checked_error)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from script_support import load_script

import gemmc   # module-level: the DSL evaluates a kernel's (string) annotations in this module's globals

script = load_script("gpu_sm90")

pytestmark = pytest.mark.gpu

_KERNELS: dict = {}


def kernel(name: str):
    """(spec, launcher) of a named variant of scripts/gpu_sm90.py, compiled once per session."""
    if name not in _KERNELS:
        from gemmc import build
        spec, emitted = script.emitted_for(name)
        _KERNELS[name] = (spec, build.jit_callable(emitted))
    return _KERNELS[name]


def run_check(name: str, shapes):
    import torch
    spec, fn = kernel(name)
    res = script.check(name, fn, spec, shapes, torch.device("cuda"), lambda s: None)
    bad = [r for r in res if not r["ok"]]
    assert not bad, bad


@pytest.mark.parametrize("name", list(script.VARIANTS))
def test_variant_matches_fp32_reference(name):
    run_check(name, script.CHECK_SHAPES)


# families the hypothesis test draws from: layouts x modes x clusters x split-K
DRAWN = ["coop_tn_c1x1", "coop_tn_c2x1", "coop_tn_c1x2", "coop_tn_c2x2_sw8n", "coop_nn_256x128", "coop_tt",
         "coop_nt", "pp_tn_c2x1", "pp_nn_64x256", "splitk2_tn", "splitk4_epi", "pp_tn_64x224_c1x2",
         "coop_nn_128x160_c2x1", "splitk2_pp_64x160", "pp_tn_c2x1_sw4m_batched", "splitk2_c1x2_sw8m",
         "streamk_tn_128x64_c1x2", "streamk_swap_128x32_c2x1", "splitk2_swap_pp_64x8x128"]


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(DRAWN), m=st.one_of(st.integers(1, 8192), st.integers(1, 300).map(lambda x: 2 * x + 1)),
       n8=st.integers(1, 2048), k8=st.integers(1, 2048))
def test_drawn_shapes(name, m, n8, k8):
    n, k = 8 * n8, 8 * k8
    if m * n * k > 2**36:      # keep one example under ~0.1 s of GPU time
        k = max(8, (2**36 // (m * n)) // 8 * 8)
    run_check(name, [(m, n, k)])


@pytest.mark.parametrize("m", [1, 2, 16, 100])
@pytest.mark.parametrize("sched", [dict(tile=(64, 192, 64), mode="pingpong", split_k=4),
                                   dict(tile=(128, 128, 64), cluster=(2, 1))])
def test_static_m_smaller_than_the_tile(m, sched):
    """A static M below the tile (M=1 once collapsed A's TMA copy to 1-D and faulted)."""
    import torch
    import gemmc
    from gemmc.reference import checked_error
    spec = gemmc.GemmSpec(m=m, n=6144, k=4096)
    k = gemmc.compile(spec, schedule=gemmc.Schedule(**sched))
    a = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(6144, 4096, device="cuda", dtype=torch.bfloat16)
    out = torch.full((m, 6144), float("nan"), device="cuda", dtype=torch.bfloat16)
    k(a, b, out=out)
    torch.cuda.synchronize()
    assert checked_error(spec, out, a, b) < 1e-2


def test_auto_with_symbolic_m_routes_each_call_by_m():
    """One symbolic-M `auto` callable: every M bucket's choice (a kernel or torch.matmul) is correct."""
    import torch
    import gemmc
    from gemmc.reference import checked_error
    # (28672, 4096): the shipped H200 table mixes torch.matmul and several schedules across M
    spec = gemmc.GemmSpec("M", 28672, 4096)
    k = gemmc.compile(spec, schedule="auto")
    b = torch.randn(28672, 4096, device="cuda", dtype=torch.bfloat16)
    routes = set()
    for m in (1, 16, 64, 100, 300, 1024, 4096):
        a = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        out = torch.full((m, 28672), float("nan"), device="cuda", dtype=torch.bfloat16)
        k(a, b, out=out)
        torch.cuda.synchronize()
        assert checked_error(spec, out, a, b) < 1e-2, m
        decision, kernel = k.for_m(m)
        routes.add("cublas" if kernel is None else kernel.schedule.short())
    assert len(routes) >= 2          # the buckets do not all make one choice


@pytest.mark.parametrize("sched", [dict(tile=(128, 128, 64), mode="cooperative"),
                                   dict(tile=(64, 16, 128), mode="pingpong", stages=10, swap_ab=True),
                                   dict(tile=(128, 64, 64), mode="pingpong", cluster=(2, 1)),
                                   dict(tile=(128, 128, 64), split_k=2)],
                         ids=["coop", "swapped", "cluster", "splitk"])
def test_pdl_chain_reads_the_previous_calls_output(sched):
    """Back-to-back programmatic-dependent calls where each call's A and B are the previous call's output.
    The next kernel prefetches its first k-tiles into L2 and is let in before the previous grid ends; its
    loads into shared memory still wait for that grid, so every output matches its inputs' reference."""
    import torch
    from gemmc.reference import checked_error
    n = 512                                   # 16-32 CTAs: the grids that let in early and prefetch
    spec = gemmc.GemmSpec("M", "N", "K")
    k = gemmc.compile(spec, schedule=gemmc.Schedule(**sched))
    assert k.plan.scheduler.pdl and k.plan.scheduler.pdl_prefetch_k_tiles > 0
    x = [torch.randn(n, n, device="cuda", dtype=torch.bfloat16) / 8]
    for _ in range(4):                        # magnitudes grow ~ n x^2 per call: four stay finite in bf16
        x.append(torch.full((n, n), float("nan"), device="cuda", dtype=torch.bfloat16))
    for i in range(1, len(x)):                # queued back to back: nothing synchronizes in between
        k(x[i - 1], x[i - 1], out=x[i])
    torch.cuda.synchronize()
    for i in range(1, len(x)):
        assert torch.isfinite(x[i]).all() and checked_error(spec, x[i], x[i - 1], x[i - 1]) < 1e-2, i


@gemmc.kernel
def silu_res(x: gemmc.Tensor[("M", "K"), gemmc.bf16], w: gemmc.Tensor[("N", "K"), gemmc.bf16],
             bias: gemmc.Tensor[("N",), gemmc.bf16], res: gemmc.Tensor[("M", "N"), gemmc.bf16]):
    return gemmc.silu(x @ w.T + bias) + res


SWAPPED = [dict(tile=(128, 16, 64), mode="pingpong", stages=12, swap_ab=True),
           dict(tile=(64, 16, 128), mode="pingpong", stages=10, swap_ab=True),
           dict(tile=(128, 64, 64), mode="cooperative", swap_ab=True),
           dict(tile=(64, 32, 64), mode="pingpong", cluster=(1, 2), swap_ab=True),
           dict(tile=(128, 128, 64), mode="cooperative", cluster=(2, 1), swap_ab=True),
           # the swapped batch space (M 33-128): a weight tile multicast to the 1x2 cluster's two activation
           # tiles, rings filled to what fits
           dict(tile=(64, 32, 128), mode="pingpong", cluster=(1, 2), stages=9, swap_ab=True),
           dict(tile=(64, 64, 128), mode="pingpong", cluster=(1, 2), swap_ab=True),
           dict(tile=(128, 32, 128), mode="cooperative", cluster=(1, 2), swap_ab=True),
           # 8-wide activation tiles (WGMMA N = 8; swapped kernels only), paired
           dict(tile=(64, 8, 128), mode="pingpong", cluster=(1, 2), stages=10, swap_ab=True),
           # split K, summed in the kernel: twice the CTAs where out^T has few tiles
           dict(tile=(64, 8, 128), mode="pingpong", stages=10, split_k=2, swap_ab=True),
           dict(tile=(128, 16, 64), mode="cooperative", cluster=(1, 2), split_k=3, swap_ab=True)]


@pytest.mark.parametrize("sched", SWAPPED, ids=lambda s: gemmc.Schedule(**s).short())
@pytest.mark.parametrize("case", ["plain", "layouts_km_kn", "layouts_mk_kn", "layouts_km_nk", "batched", "epilogue"])
def test_swapped_ab_matches_fp32_reference(sched, case):
    """swap_ab kernels (out^T = b @ a^T, stored from registers at transposed coordinates): M from 1 to
    odd sizes past the N tile, all four storage layouts, a batch, and an epilogue with row and full inputs."""
    import torch
    from gemmc.reference import checked_error
    s = gemmc.Schedule(**sched)
    torch.manual_seed(0)
    dev = "cuda"
    for m, n, k in ((1, 4096, 1024), (5, 1000, 520), (16, 6144, 2048), (100, 2048, 1024), (128, 1024, 4096)):
        if case == "epilogue":
            spec = silu_res.spec
            kern = gemmc.compile(silu_res, schedule=s)
            a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            b = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
            bias = torch.randn(n, device=dev, dtype=torch.bfloat16)
            res = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
            args, extra = (a, b, bias, res), (bias, res)
            out = torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16)
        elif case.startswith("layouts_"):
            a_layout, b_layout = case.split("_")[1:]
            if a_layout == "km" and m % 8:       # a "km" A needs M in 16-byte multiples
                continue
            spec = gemmc.GemmSpec("M", "N", "K", a_layout=a_layout, b_layout=b_layout)
            kern = gemmc.compile(spec, schedule=s)
            a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            b = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
            # the stored tensors: "km" / "kn" hold the transpose, contiguous
            args = (a.T.contiguous() if a_layout == "km" else a, b.T.contiguous() if b_layout == "kn" else b)
            extra = ()
            out = torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16)
        else:
            batch = 3 if case == "batched" else None
            spec = gemmc.GemmSpec("M", "N", "K", batch="L" if batch else None)
            kern = gemmc.compile(spec, schedule=s)
            lead = (batch,) if batch else ()
            a = torch.randn(*lead, m, k, device=dev, dtype=torch.bfloat16)
            b = torch.randn(*lead, n, k, device=dev, dtype=torch.bfloat16)
            args, extra = (a, b), ()
            out = torch.full((*lead, m, n), float("nan"), device=dev, dtype=torch.bfloat16)
        kern(*args, out=out)
        again = torch.full_like(out, float("nan"))
        kern(*args, out=again)
        torch.cuda.synchronize()
        assert not out.isnan().any(), (m, n, k)
        assert checked_error(spec, out, args[0], args[1], extra) < 1e-2, (m, n, k)
        assert torch.equal(out, again)


FIXUP_SCHEDULES = [dict(tile=(128, 128, 64), split_k=2),
                   dict(tile=(128, 128, 64), mode="pingpong", cluster=(2, 1), split_k=2),
                   dict(tile=(64, 128, 64), mode="pingpong", cluster=(1, 2), swizzle=4, split_k=2)]


@pytest.mark.parametrize("sched", FIXUP_SCHEDULES)
def test_split_k_fixup_is_deterministic_and_leaves_its_semaphores_zero(sched):
    """The last split of each tile sums the partials in split order: the same bits whichever split finishes
    last; every counter is back at zero after each call. Ragged tiles, partial clusters, and K too short
    for every split to get a k-tile (those splits arrive with zeros)."""
    import torch
    from gemmc.reference import checked_error
    from gemmc.runtime import SEMAPHORES
    spec = gemmc.GemmSpec(m="M", n="N", k="K")
    k = gemmc.compile(spec, schedule=gemmc.Schedule(**sched))
    for m, n, kk in [(257, 1000, 4104), (1000, 3000, 5000), (64, 256, 48), (3, 136, 2056)]:
        a = torch.randn(m, kk, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, kk, device="cuda", dtype=torch.bfloat16)
        outs = [torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        for o in outs:
            k(a, b, out=o)
        torch.cuda.synchronize()
        assert checked_error(spec, outs[0], a, b) < 1e-2, (m, n, kk)
        assert all(torch.equal(outs[0], o) for o in outs[1:]), (m, n, kk)
        assert not any(buf.any() for buf in SEMAPHORES.buffers.values()), (m, n, kk)


def test_split_k_fixup_replays_in_a_cuda_graph():
    """Three split-K calls captured in one graph and replayed twice into NaN-filled outputs: each replay
    is right, and the capture zeroed one set of counters, once (not one per call)."""
    import torch
    from gemmc.reference import checked_error
    from gemmc.runtime.scratch import SEMAPHORES, _capture_id
    spec = gemmc.GemmSpec(m="M", n=4096, k=8192)
    k = gemmc.compile(spec, schedule=gemmc.Schedule(tile=(128, 128, 64), split_k=2))
    a = [torch.randn(m, 8192, device="cuda", dtype=torch.bfloat16) for m in (128, 300, 128)]
    b = torch.randn(4096, 8192, device="cuda", dtype=torch.bfloat16)
    outs = [torch.empty(x.shape[0], 4096, device="cuda", dtype=torch.bfloat16) for x in a]
    k(a[0], b, out=outs[0])                  # load and warm outside the capture
    torch.cuda.synchronize()
    before = set(SEMAPHORES.captured)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        readable = _capture_id(torch.cuda.current_stream().cuda_stream) is not None
        for x, o in zip(a, outs):
            k(x, b, out=o)
    for _ in range(2):
        for o in outs:
            o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for x, o in zip(a, outs):
            assert checked_error(spec, o, x, b) < 1e-2
    new = [key for key in SEMAPHORES.captured if key not in before]
    assert readable and len(new) == 1 and len(SEMAPHORES.captured[new[0]]) == 1


@pytest.mark.parametrize("mode", ["cooperative", "pingpong"])
def test_split_k_fixup_runs_the_fused_epilogue_once_per_tile(mode):
    """Under the fix-up only the last split of a tile runs the epilogue: alpha * acc + bias, GELU, + a full
    residual that TMA stages through shared memory; batched, ragged M and N."""
    import torch
    from gemmc.reference import checked_error, make_inputs
    spec = gemmc.GemmSpec(m="M", n="N", k="K", batch="L", inputs=(
        gemmc.EpilogueInput("alpha", "scalar"), gemmc.EpilogueInput("bias", "row", "bf16"),
        gemmc.EpilogueInput("res", "full", "bf16")), epilogue=(
        gemmc.EpilogueOp("mul", (gemmc.spec.Ref("acc"), gemmc.spec.Ref("input", "alpha"))),
        gemmc.EpilogueOp("add", (gemmc.spec.Ref("node", 0), gemmc.spec.Ref("input", "bias"))),
        gemmc.EpilogueOp("gelu_tanh", (gemmc.spec.Ref("node", 1),)),
        gemmc.EpilogueOp("add", (gemmc.spec.Ref("node", 2), gemmc.spec.Ref("input", "res")))))
    k = gemmc.compile(spec, schedule=gemmc.Schedule(tile=(128, 128, 64), mode=mode, split_k=2))
    assert "SPLIT_K_MODE = 'fixup'" in k.source
    a, b, extra = make_inputs(spec, 300, 392, 3000, batch=3)
    out = torch.full((3, 300, 392), float("nan"), device="cuda", dtype=torch.bfloat16)
    k(a, b, *extra, out=out)
    torch.cuda.synchronize()
    assert checked_error(spec, out, a, b, extra) < 1e-2


@pytest.mark.parametrize("sched", [dict(tile=(128, 128, 64)), dict(tile=(128, 64, 64), cluster=(1, 2)),
                                   dict(tile=(128, 32, 64), cluster=(2, 1), swap_ab=True),
                                   dict(tile=(128, 256, 64), cluster=(2, 1), raster="n", swizzle=8)],
                         ids=["128x128", "128x64_c1x2", "swap_128x32_c2x1", "128x256_c2x1_sw8n"])
@pytest.mark.parametrize("m, n, k", [(128, 256, 8192), (128, 6144, 4096), (64, 10240, 8192), (1, 4096, 4096),
                                     (300, 1000, 520), (4096, 4096, 4096), (2100, 3000, 1000)])
def test_stream_k_matches_reference_and_repeats_bit_for_bit(sched, m, n, k):
    """Stream-K runs whole waves data-parallel and cuts the rest between clusters at any k-tile, down to
    dozens of pieces per tile (128x256x8192: two to four tiles of 128 k-tiles over 66-132 clusters). The
    last piece to arrive sums the partials in cluster order, so a second launch, with other arrival orders,
    gives the same bits."""
    import torch
    from gemmc.reference import checked_error
    spec = gemmc.GemmSpec("M", "N", "K")
    kern = gemmc.compile(spec, schedule=gemmc.Schedule(stream_k=True, **sched))
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    outs = []
    for _ in range(2):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        kern(a, b, out=out)
        torch.cuda.synchronize()
        outs.append(out)
    assert checked_error(spec, outs[0], a, b) < 1e-2
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("mode", ["cooperative", "pingpong"])
def test_relu_and_clamp_keep_a_nan_row_nan_like_torch(mode):
    """A NaN in A makes its output row NaN: relu and clamp must pass it on (torch does), not turn it into 0
    or a clamp bound that would hide the overflow."""
    import torch
    R = gemmc.spec.Ref
    spec = gemmc.GemmSpec(m="M", n="N", k="K", epilogue=(
        gemmc.EpilogueOp("relu", (R("acc"),)),
        gemmc.EpilogueOp("clamp", (R("node", 0),), (("min", 0.5), ("max", 6.0)))))
    tile = (128, 128, 64) if mode == "cooperative" else (64, 128, 64)
    k = gemmc.compile(spec, schedule=gemmc.Schedule(tile=tile, mode=mode))
    torch.manual_seed(0)
    a = torch.randn(300, 512, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(392, 512, device="cuda", dtype=torch.bfloat16)
    a[7, 100] = float("nan")
    out = torch.full((300, 392), float("nan"), device="cuda", dtype=torch.bfloat16)
    k(a, b, out=out)
    torch.cuda.synchronize()
    ref = torch.clamp(torch.relu(a.float() @ b.float().T), 0.5, 6.0)
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and torch.isnan(out[7]).all()
    rows = torch.arange(300, device="cuda") != 7
    torch.testing.assert_close(out[rows].float(), ref[rows], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("sched", [dict(tile=(128, 128, 64)), dict(tile=(64, 128, 64), mode="pingpong"),
                                   dict(tile=(128, 128, 64), split_k=2), dict(tile=(128, 128, 64), split_k=3, pdl=False),
                                   dict(tile=(128, 32, 64), swap_ab=True)],
                         ids=["coop", "pingpong", "fixup", "serial", "swap"])
def test_inputs_named_like_the_modules_own_names(sched):
    """`+ c` (a full f32 input named like the store's c_smem / tma_c), a scale `s`, a column `m` and a row `l`
    (names of kernel and reduce-kernel locals): the module takes them under private names."""
    import torch
    from gemmc.reference import checked_error, make_inputs
    R = gemmc.spec.Ref
    spec = gemmc.GemmSpec("M", "N", "K", batch="L", inputs=(
        gemmc.EpilogueInput("s", "scalar"), gemmc.EpilogueInput("m", "col", "f32"),
        gemmc.EpilogueInput("l", "row", "bf16"), gemmc.EpilogueInput("c", "full", "f32")), epilogue=(
        gemmc.EpilogueOp("mul", (R("acc"), R("input", "s"))), gemmc.EpilogueOp("add", (R("node", 0), R("input", "m"))),
        gemmc.EpilogueOp("add", (R("node", 1), R("input", "l"))), gemmc.EpilogueOp("add", (R("node", 2), R("input", "c")))))
    k = gemmc.compile(spec, schedule=gemmc.Schedule(**sched))
    for m, n, kk in [(200, 136, 1000), (64, 520, 256)]:
        a, b, extra = make_inputs(spec, m, n, kk, batch=2)
        out = torch.full((2, m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        k(a, b, *extra, out=out)
        torch.cuda.synchronize()
        assert checked_error(spec, out, a, b, extra) < 1e-2, (m, n, kk)


@pytest.mark.parametrize("sched", [dict(tile=(128, 256, 64)), dict(tile=(64, 128, 64), mode="pingpong"),
                                   dict(tile=(64, 16, 128), mode="pingpong", swap_ab=True),
                                   dict(tile=(128, 128, 64), split_k=2), dict(tile=(128, 128, 32), arch="sm_80")],
                         ids=["coop", "pingpong", "swap", "fixup", "sm80"])
def test_outputs_past_2_31_elements(sched, monkeypatch):
    """65536 x 32800 outputs (2^31 + 2.4M elements, 4.3 GB): offsets past int32 land where they belong. The
    rows checked are the first and last 128 (the last ones lie past element 2^31). Split-K's f32 scratch (two
    splits: 4.3 G elements) is refused before the launch, with what to change."""
    import torch
    from gemmc.errors import LaunchError
    monkeypatch.setenv("GEMMC_SM80_COMPILE_ARCH", "sm_90a")
    m, n, k = 65536, 32800, 128
    kern = gemmc.compile(gemmc.GemmSpec("M", "N", "K"), schedule=gemmc.Schedule(**sched))
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    if sched.get("split_k", 1) > 1:
        with pytest.raises(LaunchError, match="past the kernels' 32-bit index .* use fewer splits"):
            kern(a, b, out=out)
        assert out.isnan().all()
        return
    kern(a, b, out=out)
    torch.cuda.synchronize()
    for rows in (slice(0, 128), slice(m - 128, m)):
        ref = a[rows].float() @ b.float().T
        err = (out[rows].float() - ref).abs().max().item()
        assert err < 0.5, (rows, err)        # bf16 rounding of |x| < 64 is at most 0.25
    assert not out.isnan().any()
    del out
    torch.cuda.empty_cache()


@pytest.mark.parametrize("sched", [dict(tile=(128, 128, 64)), dict(tile=(128, 128, 64), split_k=3, pdl=False),
                                   dict(tile=(128, 128, 32), arch="sm_80")], ids=["persistent", "serial", "sm80"])
def test_batches_past_the_grid_dims_limit(sched, monkeypatch):
    """70000 batches of 8x8x64: more than a grid's y or z extent (65535) takes. The persistent SM90 grid runs
    them; kernels whose grid carries the batch (SM80, SM90's serial split-K reduce kernel) refuse before
    launching, with what to do (they failed in the launch: CUDA_LAUNCH_INVALID_CONFIG)."""
    import torch
    from gemmc.errors import LaunchError
    from gemmc.reference import checked_error
    monkeypatch.setenv("GEMMC_SM80_COMPILE_ARCH", "sm_90a")
    spec = gemmc.GemmSpec("M", "N", "K", batch="L")
    kern = gemmc.compile(spec, schedule=gemmc.Schedule(**sched))
    a = torch.randn(70000, 8, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(70000, 8, 64, device="cuda", dtype=torch.bfloat16)
    out = torch.full((70000, 8, 8), float("nan"), device="cuda", dtype=torch.bfloat16)
    if sched.get("arch") == "sm_80" or sched.get("split_k", 1) > 1:
        with pytest.raises(LaunchError, match="70000 is more than the 65535 blocks .* split the call"):
            kern(a, b, out=out)
        got = kern(a[:65535], b[:65535])
        torch.cuda.synchronize()
        assert checked_error(spec, got, a[:65535], b[:65535]) < 1e-2
        return
    kern(a, b, out=out)
    torch.cuda.synchronize()
    assert checked_error(spec, out, a, b) < 1e-2

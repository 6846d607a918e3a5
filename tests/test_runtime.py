"""Runtime validation, allocation and argument marshalling, on CPU tensors with a recording function.

`device_type="cpu"` lets the checks after the device check run here; the device check itself is tested
with the default ("cuda") launcher. No test here launches anything.
"""
import subprocess
import sys

import pytest
import torch
from hypothesis import given, strategies as st

from gemmc.backends import Param
from gemmc.errors import LaunchError
from gemmc.runtime import Launcher, launcher_from_artifact, load_function, param_from_dict
from gemmc.types import DType
from toy_kernel import toy_params


class Recorder:
    """Stands in for the compiled function: records what it was called with."""

    def __init__(self, reject=None):
        self.calls = []
        self.reject = reject

    def __call__(self, *values):
        if self.reject is not None:
            raise self.reject
        self.calls.append(values)


def cpu_launcher(params=None, always_validate=True, **kw):
    rec = Recorder(kw.pop("reject", None))
    k = Launcher(params or toy_params(), function=rec, device_type="cpu", name="toy",
                 always_validate=always_validate, **kw)
    return k, rec


def xy(m=64, n=128, dtype=torch.bfloat16):
    return torch.randn(m, n).to(dtype), torch.randn(m, n).to(dtype)


GEMM_PARAMS = (
    Param("a", "tensor", DType.bf16, ("M", "K"), -1, role="a"),
    Param("b", "tensor", DType.bf16, ("N", "K"), -1, role="b"),
    Param("bias", "tensor", DType.f32, ("N",), -1, role="input"),
    Param("c", "tensor", DType.bf16, ("M", "N"), -1, role="out"),
    Param("ws", "workspace", DType.f32, ("W",), 0, role="workspace", workspace_elems="2 * M * N"),
    Param("alpha", "scalar", DType.f32, (), role="scalar"),
)


# -- marshalling --------------------------------------------------------------------------------

def test_values_reach_the_function_in_param_order():
    k, rec = cpu_launcher()
    x, y = xy()
    out = k(x, y, 2)
    (values,) = rec.calls
    assert values[0] is x and values[1] is y and values[2] is out
    assert values[3].dtype == torch.float32 and values[3].numel() == 64 * 128     # workspace M*N
    assert values[4] == 2.0 and isinstance(values[4], float)                       # scalar as float
    assert out.shape == (64, 128) and out.dtype == torch.bfloat16


def test_named_arguments_and_out():
    k, rec = cpu_launcher()
    x, y = xy()
    o = torch.empty_like(x)
    assert k(alpha=1.5, y=y, x=x, out=o) is o
    assert rec.calls[0][2] is o and rec.calls[0][1] is y


def test_gemm_shaped_params_allocate_and_size_workspace():
    k, rec = cpu_launcher(GEMM_PARAMS)
    a = torch.randn(33, 64).bfloat16()
    b = torch.randn(48, 64).bfloat16()
    bias = torch.randn(48)
    c = k(a, b, bias, 1.0)
    assert c.shape == (33, 48) and c.dtype == torch.bfloat16 and c.stride() == (48, 1)
    assert rec.calls[0][4].numel() == 2 * 33 * 48


def test_column_major_output_is_allocated_column_major():
    params = (Param("x", "tensor", DType.f16, ("M", "N"), -1, role="a"),
              Param("z", "tensor", DType.f16, ("M", "N"), 0, role="out"))
    k, _ = cpu_launcher(params)
    z = k(torch.randn(16, 24).half())
    assert z.shape == (16, 24) and z.stride() == (1, 16)


def test_batched_output():
    params = (Param("a", "tensor", DType.bf16, ("L", "M", "K"), -1, role="a"),
              Param("c", "tensor", DType.bf16, ("L", "M", 64), -1, role="out"))
    k, _ = cpu_launcher(params)
    c = k(torch.randn(3, 5, 32).bfloat16())
    assert c.shape == (3, 5, 64)


def test_workspace_is_cached_and_grows():
    k, rec = cpu_launcher()
    x, y = xy(64, 128)
    k(x, y, 1.0)
    k(x, y, 1.0)
    w1, w2 = rec.calls[0][3], rec.calls[1][3]
    assert w1.data_ptr() == w2.data_ptr()          # no allocation per call
    assert float(w1.abs().sum()) == 0.0            # zero-initialised
    x2, y2 = xy(32, 128)
    k(x2, y2, 1.0)                                 # smaller: a view of the same buffer
    assert rec.calls[2][3].numel() == 32 * 128 and rec.calls[2][3].data_ptr() == w1.data_ptr()
    x3, y3 = xy(256, 128)
    k(x3, y3, 1.0)                                 # larger: a new buffer
    assert rec.calls[3][3].numel() == 256 * 128


# -- every error message ------------------------------------------------------------------------

def check(k, *args, match, **kw):
    with pytest.raises(LaunchError, match=match):
        k(*args, **kw)


def test_device_must_be_cuda():
    k = Launcher(toy_params(), function=Recorder(), name="toy", always_validate=True)
    x, y = xy()
    check(k, x, y, 1.0, match=r"x must be on a cuda device, got cpu: pass x.to\('cuda'\)")


def test_dtype_message_says_how_to_convert():
    k, rec = cpu_launcher()
    x, y = xy()
    check(k, x, y.half(), 1.0, match=r"y must be bf16, got torch.float16: pass y.to\(torch.bfloat16\)")
    check(k, x.float(), y, 1.0, match=r"x must be bf16, got torch.float32: pass x.to\(torch.bfloat16\)")
    assert rec.calls == []                         # nothing launched


def test_rank():
    k, _ = cpu_launcher()
    x, y = xy()
    check(k, x[None], y, 1.0, match=r"x must be 2-D with shape \(M, N\), got 3-D shape \(1, 64, 128\)")


def test_named_dims_must_agree():
    k, _ = cpu_launcher()
    x, _ = xy(64)
    _, y = xy(65)
    check(k, x, y, 1.0, match=r"y.shape\[0\] gives M=65 but x.shape\[0\] gives M=64: the arguments disagree on M")


def test_static_dims_must_match():
    k, _ = cpu_launcher(toy_params(n=128))
    x, y = xy(8, 136)
    check(k, x, y, 1.0, match=r"x.shape\[1\] must be 128 \(the kernel was compiled for a static \(M, 128\)\)")


def test_contiguous_dim_needs_stride_one():
    k, _ = cpu_launcher()
    x, y = xy(64, 128)
    xt = torch.randn(128, 64).bfloat16().t()        # (64, 128) but column-major
    check(k, xt, y, 1.0, match=r"x.stride\(-1\) must be 1 .*pass x.contiguous\(\)")


def test_leading_stride_must_be_16_byte_multiple():
    k, _ = cpu_launcher()
    _, y = xy(64, 128)
    padded = torch.randn(64, 130).bfloat16()[:, :128]
    check(k, padded, y, 1.0, match=r"x.stride\(0\) = 130 is not a multiple of 8 elements \(16 bytes\)")


def test_padded_leading_dim_that_is_aligned_is_accepted():
    k, rec = cpu_launcher()
    _, y = xy(64, 128)
    padded = torch.randn(64, 136).bfloat16()[:, :128]
    k(padded, y, 1.0)
    assert rec.calls[0][0] is padded


def test_contiguous_extent_must_be_16_byte_multiple():
    k, _ = cpu_launcher()
    x, y = xy(64, 100)
    check(k, x, y, 1.0, match=r"x.shape\[1\] = 100 must be a multiple of 8 \(16 bytes of bf16\)")


def test_f32_alignment_is_4_elements():
    params = (Param("x", "tensor", DType.f32, ("M", "N"), -1, role="a"),
              Param("z", "tensor", DType.f32, ("M", "N"), -1, role="out"))
    k, rec = cpu_launcher(params)
    k(torch.randn(3, 12))
    check(k, torch.randn(3, 10), match=r"must be a multiple of 4 \(16 bytes of f32\)")


def test_data_pointer_alignment():
    k, _ = cpu_launcher()
    _, y = xy(64, 128)
    base = torch.randn(64 * 128 + 8).bfloat16()
    x = base[1:1 + 64 * 128].view(64, 128)
    check(k, x, y, 1.0, match=r"x.data_ptr\(\) is not 16-byte aligned .*pass x.clone\(\)")


def test_out_is_validated():
    k, _ = cpu_launcher()
    x, y = xy()
    check(k, x, y, 1.0, out=torch.empty(64, 128, dtype=torch.float16),
          match=r"z must be bf16, got torch.float16")
    check(k, x, y, 1.0, out=torch.empty(64, 64, dtype=torch.bfloat16),
          match=r"z.shape\[1\] gives N=64 but x.shape\[1\] gives N=128")


def test_argument_binding_errors():
    k, _ = cpu_launcher()
    x, y = xy()
    check(k, x, y, 1.0, 2.0, match=r"toy takes 3 arguments \(x, y, alpha\), got 4 positional")
    check(k, x, y, match=r"missing argument 'alpha'; call it as toy\(x, y, alpha\)")
    check(k, x, y, 1.0, beta=2.0, match=r"toy has no argument 'beta'")
    check(k, x, y, 1.0, x=x, match=r"argument 'x' given twice")
    check(k, x, "y", 1.0, match=r"y must be a torch.Tensor, got str")
    check(k, x, y, torch.tensor(1.0), match=r"alpha must be a Python number \(float\), got Tensor")


def test_output_dims_must_be_known():
    params = (Param("x", "tensor", DType.bf16, ("M", "K"), -1, role="a"),
              Param("z", "tensor", DType.bf16, ("M", "N"), -1, role="out"))
    k, _ = cpu_launcher(params)
    check(k, torch.randn(8, 16).bfloat16(), match=r"dims \['N'\] appear only in z; pass out=")
    z = k(torch.randn(8, 16).bfloat16(), out=torch.empty(8, 24, dtype=torch.bfloat16))
    assert z.shape == (8, 24)


def test_launcher_needs_exactly_one_output():
    with pytest.raises(LaunchError, match="exactly one tensor param with role 'out'"):
        Launcher(toy_params()[:2], function=Recorder())


# -- the fast path: the compiled prologue checks, the validator explains -------------------------

def test_fast_path_passes_the_same_values():
    k, rec = cpu_launcher(always_validate=False)
    x, y = xy()
    out = k(x, y, 3.0)
    assert rec.calls[0][:3] == (x, y, out) and rec.calls[0][4] == 3.0


def test_prologue_rejection_is_explained_by_the_validator():
    k, rec = cpu_launcher(always_validate=False,
                          reject=ValueError("Mismatched Tensor on argument #1, expected dtype=bfloat16"))
    x, y = xy()
    check(k, x, y.half(), 1.0, match=r"y must be bf16, got torch.float16: pass y.to\(torch.bfloat16\)")


def test_prologue_rejection_the_validator_cannot_explain_is_still_a_launch_error():
    k, _ = cpu_launcher(always_validate=False, reject=TypeError("Mismatched type on argument #4"))
    x, y = xy()
    with pytest.raises(LaunchError, match="the kernel rejected its arguments: Mismatched type"):
        k(x, y, 1.0)


class FakePrologue(Recorder):
    """Rejects non-tensors where tensors go, as the compiled TVM-FFI prologue does."""

    def __call__(self, *values):
        for i in range(4):
            if not isinstance(values[i], torch.Tensor):
                raise TypeError(f"Mismatched type on argument #{i}, expected Tensor")
        super().__call__(*values)


def test_malformed_arguments_on_the_fast_path_get_the_validator_message():
    rec = FakePrologue()
    k = Launcher(toy_params(), function=rec, device_type="cpu", name="toy", always_validate=False)
    x, y = xy()
    check(k, x, 5, 1.0, match=r"y must be a torch.Tensor, got int")   # rejected by the prologue
    check(k, x[0], y, 1.0, match=r"x must be 2-D")                    # fails while sizing the output
    assert rec.calls == []


def test_validate_env_switch(monkeypatch):
    monkeypatch.setenv("GEMMC_VALIDATE", "1")
    k = Launcher(toy_params(), function=Recorder(), device_type="cpu")
    assert k.always_validate
    monkeypatch.setenv("GEMMC_VALIDATE", "0")
    assert not Launcher(toy_params(), function=Recorder(), device_type="cpu").always_validate


@given(m=st.integers(1, 300), n8=st.integers(1, 40), ok=st.booleans(), pad=st.integers(0, 3))
def test_hypothesis_shapes(m, n8, ok, pad):
    """Aligned N with any leading padding of whole 16-B units is accepted; N off by 1..7 is refused."""
    k, rec = cpu_launcher()
    n = 8 * n8 if ok else 8 * n8 + 1 + (n8 % 7)
    x = torch.zeros(m, n + 8 * pad, dtype=torch.bfloat16)[:, :n]
    y = torch.zeros(m, n, dtype=torch.bfloat16)
    if ok:
        out = k(x, y, 1.0)
        assert out.shape == (m, n) and rec.calls[-1][3].numel() == m * n
    else:
        with pytest.raises(LaunchError, match="multiple of 8"):
            k(x, y, 1.0)


# -- loading ------------------------------------------------------------------------------------

def test_param_json_round_trip():
    from gemmc.build import param_to_dict
    for p in GEMM_PARAMS + toy_params():
        assert param_from_dict(param_to_dict(p)) == p


def test_unloadable_so_goes_to_the_load_error_hook(tmp_path):
    bad = tmp_path / "kernel.so"
    bad.write_bytes(b"not an elf")
    rec = Recorder()
    seen = []

    def on_error(e):
        seen.append(e)
        return rec

    k = Launcher(toy_params(), so_path=str(bad), function_name="f", device_type="cpu",
                 on_load_error=on_error)
    x, y = xy()
    k(x, y, 1.0)
    assert len(seen) == 1 and len(rec.calls) == 1


def test_so_failing_its_hash_is_never_loaded(tmp_path):
    so = tmp_path / "kernel.so"
    so.write_bytes(b"\x7fELF corrupted")
    with pytest.raises(LaunchError, match="does not match its cache manifest"):
        load_function(str(so), "f", sha256="0" * 64)


def test_runtime_modules_do_not_import_cutlass():
    code = ("import sys, gemmc, gemmc.runtime, gemmc.cache, gemmc.compiled, gemmc.build; "
            "import gemmc.runtime.launcher, gemmc.runtime.checks, gemmc.runtime.signature; "
            "import gemmc.runtime.scratch, gemmc.runtime.load, gemmc.runtime.gpu; "
            "import torch, tvm_ffi; "
            "bad = [m for m in sys.modules if m == 'cutlass' or m.startswith('cutlass.')]; "
            "assert not bad, bad")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_launcher_from_artifact_reads_only_meta(tmp_path):
    from gemmc.build import param_to_dict
    from gemmc.cache import Artifact
    art = Artifact(key="k", so_path=str(tmp_path / "kernel.so"), ptx_path=None, source_path=None,
                   meta={"function": "gemmc_k", "entry": "toy_axpy", "runtime_flavor": "cu13",
                         "params": [param_to_dict(p) for p in toy_params()]})
    k = launcher_from_artifact(art)
    assert k.params == toy_params() and k.name == "toy_axpy"
    assert k._function is None                    # nothing loaded until the first call


BATCHED_PARAMS = (
    Param("a", "tensor", DType.bf16, ("L", "M", "K"), -1, role="a"),
    Param("b", "tensor", DType.bf16, ("L", "N", "K"), -1, role="b"),
    Param("out", "tensor", DType.bf16, ("L", "M", "N"), -1, role="out"),
    Param("bias", "tensor", DType.bf16, ("L", "N"), -1, role="input"),
)


@pytest.mark.parametrize("always_validate", [True, False])
def test_batched_kernel_shares_an_unbatched_vector_without_copying(always_validate):
    k, rec = cpu_launcher(BATCHED_PARAMS, always_validate=always_validate)
    a = torch.randn(3, 16, 32).bfloat16()
    b = torch.randn(3, 8, 32).bfloat16()
    bias = torch.randn(8).bfloat16()
    out = k(a, b, bias)
    assert out.shape == (3, 16, 8)
    passed = rec.calls[-1][3]
    assert passed.shape == (3, 8) and passed.stride() == (0, 1)
    assert passed.data_ptr() == bias.data_ptr()
    per_batch = torch.randn(3, 8).bfloat16()       # a per-batch vector passes through untouched
    k(a, b, per_batch)
    assert rec.calls[-1][3] is per_batch


def test_workspace_pool_keeps_a_bounded_number_of_streams(monkeypatch):
    import gemmc.runtime.launcher as launcher
    import gemmc.runtime.scratch as scratch
    k, _ = cpu_launcher(GEMM_PARAMS)
    pool = scratch.WorkspacePool()
    monkeypatch.setattr(launcher, "WORKSPACES", pool)
    streams = iter(range(100))
    monkeypatch.setattr(scratch, "_current_raw_stream", lambda device: next(streams))
    monkeypatch.setattr(scratch, "_WORKSPACE_STREAMS_KEPT", 3)
    dev = torch.device("cpu")
    bufs = [k.workspace(4, 64, dev) for _ in range(10)]
    assert len(pool.buffers) == 3                     # one new stream per call: only 3 kept
    assert all(b.shape == (64,) for b in bufs)


def test_workspace_pool_is_shared_by_launchers_and_grows_geometrically(monkeypatch):
    import gemmc.runtime.launcher as launcher
    import gemmc.runtime.scratch as scratch
    pool = scratch.WorkspacePool()
    monkeypatch.setattr(launcher, "WORKSPACES", pool)
    monkeypatch.setattr(scratch, "_current_raw_stream", lambda device: 7)
    dev = torch.device("cpu")
    k1, _ = cpu_launcher(GEMM_PARAMS)
    k2, _ = cpu_launcher(GEMM_PARAMS)
    w1 = k1.workspace(4, 100, dev)
    w2 = k2.workspace(4, 60, dev)
    assert w2.data_ptr() == w1.data_ptr() and w2.shape == (60,)      # one buffer for both launchers
    w3 = k2.workspace(4, 150, dev)                                   # outgrown: doubles, the old one is kept
    assert w3.shape == (150,) and pool.buffers[(dev, 7, DType.f32)].numel() == 200
    assert pool.nbytes() == (200 + 100) * 4
    assert k1.workspace(4, 120, dev).data_ptr() == w3.data_ptr()

def test_workspace_pool_reuses_views_and_bounds_them(monkeypatch):
    import gemmc.runtime.scratch as scratch
    pool = scratch.WorkspacePool()
    monkeypatch.setattr(scratch, "_current_raw_stream", lambda device: 7)
    monkeypatch.setattr(scratch, "_WORKSPACE_VIEWS_KEPT", 4)
    dev = torch.device("cpu")
    first = pool.get(DType.f32, 1000, dev)
    assert pool.get(DType.f32, 1000, dev) is first            # the hot path returns the cached view
    for elems in range(10, 20):                                # a new size per call (a serving loop's M)
        assert pool.get(DType.f32, elems, dev).shape == (elems,)
    assert len(pool._views) <= 4


def test_workspace_pool_gives_a_graph_capture_its_own_scratch(monkeypatch):
    import gemmc.runtime.scratch as scratch
    pool = scratch.WorkspacePool()
    monkeypatch.setattr(scratch, "_current_raw_stream", lambda device: 7)
    monkeypatch.setattr(scratch, "_WORKSPACE_STREAMS_KEPT", 1)
    dev = torch.device("cpu")
    eager = pool.get(DType.f32, 100, dev)
    monkeypatch.setattr(scratch, "_capturing", lambda device: True)
    # no zero-fill under capture: it would put a memset of the whole workspace into every replay
    monkeypatch.setattr(scratch, "_zeros", lambda *a: pytest.fail("zero-filled a workspace under capture"))
    captured = pool.get(DType.f32, 100, dev)       # a cached view of the pooled buffer exists for this size
    assert captured.shape == (100,) and captured.data_ptr() != eager.data_ptr()
    assert pool.get(DType.f32, 50, dev).data_ptr() != eager.data_ptr()
    assert list(pool.buffers) == [(dev, 7, DType.f32)] and pool.nbytes() == 100 * 4   # the pool is untouched
    monkeypatch.setattr(scratch, "_capturing", lambda device: False)
    assert pool.get(DType.f32, 100, dev) is eager


def test_workspace_pool_grows_safely_from_many_threads(monkeypatch):
    import sys
    import threading
    import gemmc.runtime.scratch as scratch
    pool = scratch.WorkspacePool()
    local = threading.local()
    monkeypatch.setattr(scratch, "_current_raw_stream", lambda device: local.stream)
    monkeypatch.setattr(scratch, "_WORKSPACE_STREAMS_KEPT", 2)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)                         # switch threads often: let the race show
    dev = torch.device("cpu")
    errors = []

    def work(t):
        try:
            for i in range(3000):
                local.stream = t * 1000 + i % 7           # a few streams per thread: buffers come and go
                n = 1 + (i * 37 + t) % 500
                assert pool.get(DType.f32, n, dev).shape == (n,)
        except Exception as e:                          # noqa: BLE001
            errors.append(e)

    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]


def test_sm90_grid_sized_for_another_sm_count_warns_once_per_device(monkeypatch):
    """SM90 kernels bake a persistent grid sized for 132 SMs (H100 SXM / H200). On a 114-SM part some
    clusters would wait for a second wave: loading one says so, once per device, and never for sm_80."""
    import types
    import warnings

    import gemmc.runtime.gpu as gpu
    from gemmc.errors import PerformanceWarning
    sms = {0: 114, 1: 132}
    monkeypatch.setattr(gpu, "_GRID_CHECKED", set())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(name=f"gpu{i}", multi_processor_count=sms[i]))
    assert gpu.check_persistent_grid("sm_80", 0) is None
    with pytest.warns(PerformanceWarning, match="132-SM H100 SXM / H200; gpu0 .* has 114 SMs"):
        assert "second wave" in gpu.check_persistent_grid("sm_90a", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gpu.check_persistent_grid("sm_90a", 0) is None        # once per device
        assert gpu.check_persistent_grid("sm_90a", 1) is None        # the part the grid was sized for


SPLITK_PARAMS = GEMM_PARAMS[:4] + (
    Param("ws", "workspace", DType.f32, ("W",), 0, role="workspace", workspace_elems="2 * M * N"),
    Param("sem", "semaphore", DType.i32, ("T",), 0, role="semaphore", workspace_elems="(M + 127) // 128"),
    GEMM_PARAMS[5])


def test_semaphores_come_zeroed_from_a_per_stream_pool(monkeypatch):
    import gemmc.runtime.launcher as launcher
    import gemmc.runtime.scratch as scratch
    pool = scratch.SemaphorePool()
    monkeypatch.setattr(launcher, "SEMAPHORES", pool)
    stream = {"s": 7}
    monkeypatch.setattr(scratch, "_current_raw_stream", lambda device: stream["s"])
    k, rec = cpu_launcher(SPLITK_PARAMS)
    a, b, bias = torch.randn(300, 64).bfloat16(), torch.randn(32, 64).bfloat16(), torch.randn(32)
    k(a, b, bias, 1.0)
    sem = rec.calls[-1][5]
    assert sem.dtype == torch.int32 and sem.numel() >= 3 and not sem.any()       # ceil(300 / 128) counters
    k(a, b, bias, 1.0)
    assert rec.calls[-1][5] is sem                                              # one buffer per stream
    big = pool.get(5000, torch.device("cpu"))
    assert big.numel() >= 5000 and not big.any() and pool.get(10, torch.device("cpu")) is big   # grown, then reused
    stream["s"] = 8
    assert pool.get(10, torch.device("cpu")).data_ptr() != big.data_ptr()      # never shared between streams
    assert pool.nbytes() == (big.numel() + 1024) * 4


def test_semaphores_under_capture_are_zeroed_once_per_capture(monkeypatch):
    import gemmc.runtime.scratch as scratch
    pool = scratch.SemaphorePool()
    dev = torch.device("cpu")
    monkeypatch.setattr(scratch, "_current_raw_stream", lambda device: 7)
    eager = pool.get(10, dev)
    monkeypatch.setattr(scratch, "_capturing", lambda device: True)
    capture = {"id": 1}
    monkeypatch.setattr(scratch, "_capture_id", lambda stream: capture["id"])
    first = pool.get(10, dev)
    assert first.data_ptr() != eager.data_ptr() and not first.any()    # the graph's own, never the eager pool's
    assert pool.get(200, dev) is first                                  # one zeroing per capture
    grown = pool.get(5000, dev)
    assert grown.numel() >= 5000 and list(pool.captured) == [(dev, 7, 1)]
    assert pool.captured[(dev, 7, 1)] == [first, grown]                 # both held until the capture is old
    capture["id"] = 2
    assert pool.get(10, dev) is not grown                               # a new capture zeroes its own
    monkeypatch.setattr(scratch, "_CAPTURES_KEPT", 1)
    capture["id"] = 3
    pool.get(10, dev)
    assert list(pool.captured) == [(dev, 7, 3)]
    capture["id"] = None                       # the capture id cannot be read: fresh counters for every launch
    assert pool.get(10, dev) is not pool.get(10, dev)
    monkeypatch.setattr(scratch, "_capturing", lambda device: False)
    assert pool.get(10, dev) is eager


def test_capture_id_is_none_without_a_driver_or_a_capture():
    import gemmc.runtime.scratch as scratch
    assert scratch._capture_id(0) is None        # CPU CI: no libcuda; a GPU host: stream 0 is not capturing


def test_split_k_scratch_past_a_32_bit_index_is_refused_before_launch(monkeypatch):
    import gemmc.runtime.launcher as launcher
    monkeypatch.setattr(launcher, "_MAX_SCRATCH_ELEMS", 1000)
    k, rec = cpu_launcher(SPLITK_PARAMS)
    a, b, bias = torch.randn(40, 64).bfloat16(), torch.randn(16, 64).bfloat16(), torch.randn(16)
    with pytest.raises(LaunchError, match="needs 1280 elements.*fewer splits"):
        k(a, b, bias, 1.0)                       # 2 * M * N = 1280 partials
    calls = len(rec.calls)
    k(a[:20], b, bias, 1.0)                      # 640: fits
    assert len(rec.calls) == calls + 1


# -- the Python prologue (the cuBLAS route's checks) agrees with the validator ---------------------

PROLOGUE_PARAMS = (
    Param("a", "tensor", DType.bf16, ("M", "K"), -1, role="a"),
    Param("b", "tensor", DType.bf16, (24, "K"), -1, role="b"),
    Param("out", "tensor", DType.bf16, ("M", 24), -1, role="out"),
    Param("bias", "tensor", DType.f32, ("M",), -1, role="input"),
)


@given(m=st.integers(1, 20), k=st.sampled_from([8, 12, 16]), n=st.sampled_from([24, 16]),
       a_dtype=st.sampled_from([torch.bfloat16, torch.float16]), a_pad=st.sampled_from([0, 3, 8]),
       b_transposed=st.booleans(), bias_len=st.sampled_from([0, 1]), offset=st.sampled_from([0, 1]),
       with_out=st.booleans())
def test_python_prologue_rejects_exactly_what_the_validator_rejects(m, k, n, a_dtype, a_pad, b_transposed,
                                                                    bias_len, offset, with_out):
    from gemmc.runtime import python_prologue
    prologue = python_prologue(PROLOGUE_PARAMS, "cpu")
    validator = Launcher(PROLOGUE_PARAMS, function=Recorder(), device_type="cpu", always_validate=True)
    a = torch.zeros(m * (k + a_pad) + offset, dtype=a_dtype)[offset:].view(m, k + a_pad)[:, :k]
    b = torch.zeros(k, 24).bfloat16().T if b_transposed else torch.zeros(n, k).bfloat16()
    bias = torch.zeros(m + bias_len)
    out = torch.empty(m, 24).bfloat16() if with_out else None
    try:
        validator.validate(a, b, bias, out=out)
        valid = True
    except LaunchError:
        valid = False
    try:
        prologue(a, b, out, bias)
        accepted = True
    except (TypeError, ValueError):
        accepted = False
    assert accepted == valid


# -- which load failures rebuild ------------------------------------------------------------------

def _so_with_hash(tmp_path):
    from gemmc.file_hash import sha256_file
    so = tmp_path / "kernel.so"
    so.write_bytes(b"\x7fELF as built")
    return so, sha256_file(so)


def _hooked_launcher(so, sha):
    seen = []

    def on_error(e):
        seen.append(e)
        return Recorder()

    k = Launcher(toy_params(), so_path=str(so), function_name="f", so_sha256=sha, device_type="cpu",
                 on_load_error=on_error)
    return k, seen


def test_a_so_failing_its_hash_goes_to_the_load_error_hook(tmp_path):
    from gemmc.runtime import DamagedKernelError
    so, sha = _so_with_hash(tmp_path)
    so.write_bytes(b"\x7fELF modified")
    k, seen = _hooked_launcher(so, sha)
    k.function
    assert len(seen) == 1 and isinstance(seen[0], DamagedKernelError)


def test_a_missing_runtime_library_is_named_and_nothing_is_rebuilt(tmp_path, monkeypatch):
    from gemmc.runtime import KernelLoadError
    so, sha = _so_with_hash(tmp_path)
    monkeypatch.setenv("GEMMC_CUTE_RUNTIME_LIB", "/opt/wrong/libcute_dsl_runtime.so")
    k, seen = _hooked_launcher(so, sha)
    with pytest.raises(KernelLoadError) as e:
        k.function
    assert seen == []                       # the entry is intact: no rebuild, no invalidation
    msg = str(e.value)
    assert str(so) in msg and "GEMMC_CUTE_RUNTIME_LIB=/opt/wrong/libcute_dsl_runtime.so does not exist" in msg


def test_a_runtime_library_that_does_not_load_is_named(tmp_path, monkeypatch):
    from gemmc.runtime import KernelLoadError
    so, sha = _so_with_hash(tmp_path)
    lib = tmp_path / "libcute_dsl_runtime.so"
    lib.write_text("not a library")
    monkeypatch.setenv("GEMMC_CUTE_RUNTIME_LIB", str(lib))
    k, seen = _hooked_launcher(so, sha)
    with pytest.raises(KernelLoadError, match=rf"loading {so} needs the CuTe DSL runtime library, and {lib} "
                                              r"\(from GEMMC_CUTE_RUNTIME_LIB\) does not load") as e:
        k.function
    assert seen == [] and isinstance(e.value.__cause__, OSError)


def test_missing_tvm_ffi_is_named(tmp_path, monkeypatch):
    from gemmc.runtime import KernelLoadError, find_cute_runtime_library
    find_cute_runtime_library()             # this host has the runtime library: only tvm_ffi is missing
    so, sha = _so_with_hash(tmp_path)
    monkeypatch.setitem(sys.modules, "tvm_ffi", None)
    k, seen = _hooked_launcher(so, sha)
    with pytest.raises(KernelLoadError, match=rf"loading {so} needs apache-tvm-ffi"):
        k.function
    assert seen == []


def test_an_intact_so_that_does_not_load_is_not_rebuilt(tmp_path):
    """The hash matches, so the file is what the build wrote: the host is at fault, not the entry."""
    from gemmc.runtime import KernelLoadError
    so, sha = _so_with_hash(tmp_path)
    k, seen = _hooked_launcher(so, sha)
    with pytest.raises(KernelLoadError, match="does not load on this host"):
        k.function
    assert seen == []


# -- empty problems -------------------------------------------------------------------------------

@pytest.mark.parametrize("always_validate", [True, False])
@pytest.mark.parametrize("m,n", [(0, 48), (33, 0), (0, 0)])
def test_an_empty_output_returns_without_launching(m, n, always_validate):
    """M or N of 0: the kernels' host code divides by the tile counts (SIGFPE on the H200: the process died),
    so nothing launches and the empty output comes back, allocated or the caller's."""
    k, rec = cpu_launcher(GEMM_PARAMS, always_validate=always_validate)
    a, b, bias = torch.randn(m, 64).bfloat16(), torch.randn(n, 64).bfloat16(), torch.randn(n)
    c = k(a, b, bias, 1.0)
    assert c.shape == (m, n) and rec.calls == []
    mine = torch.empty(m, n, dtype=torch.bfloat16)
    assert k(a, b, bias, 1.0, out=mine) is mine and rec.calls == []


def test_an_empty_batch_returns_without_launching():
    params = (Param("a", "tensor", DType.bf16, ("L", "M", "K"), -1, role="a"),
              Param("b", "tensor", DType.bf16, ("L", "N", "K"), -1, role="b"),
              Param("c", "tensor", DType.bf16, ("L", "M", "N"), -1, role="out"))
    k, rec = cpu_launcher(params, always_validate=False)
    c = k(torch.randn(0, 5, 32).bfloat16(), torch.randn(0, 8, 32).bfloat16())
    assert c.shape == (0, 5, 8) and rec.calls == []


@pytest.mark.parametrize("always_validate", [True, False])
def test_k_of_zero_writes_the_epilogue_of_a_zero_accumulator(always_validate):
    """K = 0: no launch; `zero_k` gets a, b, the epilogue inputs in param order and the output. Empty tensors'
    strides are arbitrary ((M, 0) is (1, 1) in torch): they pass the alignment checks."""
    seen = []

    def zero_k(a, b, inputs, out):
        seen.append((a.shape, b.shape, len(inputs)))
        out.copy_(inputs[0].to(out.dtype).expand_as(out) * inputs[1])

    k, rec = cpu_launcher(GEMM_PARAMS, always_validate=always_validate, zero_k=zero_k)
    a, b, bias = torch.empty(33, 0).bfloat16(), torch.empty(48, 0).bfloat16(), torch.randn(48)
    assert a.stride() == (1, 1)
    c = k(a, b, bias, 2.0)
    assert rec.calls == [] and seen == [((33, 0), (48, 0), 2)]
    assert torch.equal(c, (bias.bfloat16() * 2.0).expand(33, 48))
    bare, _ = cpu_launcher(GEMM_PARAMS, always_validate=always_validate)
    with pytest.raises(LaunchError, match="K = 0 .* no spec to evaluate the epilogue"):
        bare(a, b, bias, 2.0)


def test_compiled_kernels_answer_k_of_zero_with_the_epilogue_of_zero():
    """What gemmc.compile's kernels pass as zero_k: relu(0 * alpha + bias), as torch gives it."""
    import gemmc
    from gemmc.compiled import CompiledKernel
    R = gemmc.spec.Ref
    spec = gemmc.GemmSpec("M", "N", "K", inputs=(gemmc.EpilogueInput("alpha", "scalar"),
                                                 gemmc.EpilogueInput("bias", "row", "bf16")),
                          epilogue=(gemmc.EpilogueOp("mul", (R("acc"), R("input", "alpha"))),
                                    gemmc.EpilogueOp("add", (R("node", 0), R("input", "bias"))),
                                    gemmc.EpilogueOp("relu", (R("node", 1),))))
    k = gemmc.compile(spec, gemmc.Schedule())
    a, b = torch.empty(5, 0).bfloat16(), torch.empty(7, 0).bfloat16()
    bias = torch.randn(7).bfloat16()
    out = torch.full((5, 7), float("nan")).bfloat16()
    CompiledKernel(k.emitted, spec=spec)._zero_k(a, b, [3.0, bias], out)
    assert torch.equal(out, torch.relu(bias.float()).bfloat16().expand(5, 7))


@pytest.mark.parametrize("always_validate", [True, False])
def test_a_batch_past_the_grid_limit_is_refused_before_launching(always_validate):
    params = (Param("a", "tensor", DType.bf16, ("L", "M", "K"), -1, role="a"),
              Param("b", "tensor", DType.bf16, ("L", "N", "K"), -1, role="b"),
              Param("c", "tensor", DType.bf16, ("L", "M", "N"), -1, role="out", limits=((0, 4),)))
    k, rec = cpu_launcher(params, always_validate=always_validate)
    assert k(torch.randn(4, 5, 32).bfloat16(), torch.randn(4, 8, 32).bfloat16()).shape == (4, 5, 8)
    with pytest.raises(LaunchError, match=r"c.shape\[0\] \(L\) = 5 is more than the 4 blocks .* split the call"):
        k(torch.randn(5, 5, 32).bfloat16(), torch.randn(5, 8, 32).bfloat16())
    assert len(rec.calls) == 1


def test_kernels_whose_grid_carries_the_batch_say_so():
    """SM80 grids put the batch on z, SM90's serial split-K reduce kernel on y (<= 65535 blocks); SM90's
    persistent grid has no such limit. The limit travels with the params into the artifact's meta."""
    import gemmc
    from gemmc.build import param_to_dict
    spec = gemmc.GemmSpec("M", "N", "K", batch="L")
    out_limits = lambda s: next(p for p in gemmc.compile(spec, s).emitted.params if p.role == "out").limits  # noqa: E731
    assert out_limits(gemmc.Schedule(tile=(128, 128, 32), arch="sm_80")) == ((0, 65535),)
    assert out_limits(gemmc.Schedule(split_k=3, pdl=False)) == ((0, 65535),)
    assert out_limits(gemmc.Schedule()) == () and out_limits(gemmc.Schedule(split_k=2)) == ()
    p = next(p for p in gemmc.compile(spec, gemmc.Schedule(split_k=3, pdl=False)).emitted.params if p.role == "out")
    assert param_from_dict(param_to_dict(p)) == p
    assert "limits" not in param_to_dict(next(iter(gemmc.compile(spec, gemmc.Schedule()).emitted.params)))

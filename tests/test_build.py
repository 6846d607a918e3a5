"""Build path on this CPU: the toy emitted kernel compiles to a TVM-FFI .so with its PTX, in the cache."""
import re
import json
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gemmc.build as gb
from gemmc.backends import EmittedKernel
from gemmc.cache import KernelCache
from gemmc.file_hash import sha256_file
from gemmc.compiled import CompiledKernel
from gemmc.errors import BuildError
from toy_kernel import toy_emitted, toy_params


@pytest.fixture(scope="module")
def toy_artifact(tmp_path_factory):
    return gb.build(toy_emitted(), KernelCache(tmp_path_factory.mktemp("toycache")))


def test_toy_builds_a_shared_object(toy_artifact):
    so = Path(toy_artifact.so_path)
    assert so.read_bytes()[:4] == b"\x7fELF"
    syms = subprocess.run(["nm", "-D", "--defined-only", str(so)], capture_output=True, text=True).stdout
    assert f"__tvm_ffi_{toy_artifact.meta['function']}" in syms
    meta = toy_artifact.meta
    assert meta["entry"] == "toy_axpy" and meta["arch"] == "sm_90a" and meta["compile_arch"] == "sm_90a"
    assert meta["runtime_flavor"] in ("cu12", "cu13")
    assert [p["name"] for p in meta["params"]] == ["x", "y", "z", "w", "alpha"]
    assert Path(toy_artifact.source_path).read_text() == toy_emitted().source
    manifest = json.loads((so.parent / "manifest.json").read_text())
    assert manifest["files"]["kernel.so"]["sha256"] == sha256_file(so) == toy_artifact.so_sha256


def test_toy_ptx_is_the_kernel(toy_artifact):
    ptx = toy_artifact.ptx
    assert ".target sm_90a" in ptx
    assert ".visible .entry kernel_cutlass_toy_axpy_kernel" in ptx
    # bf16 loads of x and y, the f32 workspace store and reload, the bf16 store of z
    assert ptx.count("ld.global.b16") >= 2
    assert "st.global.f32" in ptx or "st.global.b32" in ptx
    assert "st.global.b16" in ptx
    assert "wgmma" not in ptx


def test_sm80_arch_is_honoured(tmp_path):
    art = gb.build(toy_emitted(arch="sm_80"), KernelCache(tmp_path))
    assert ".target sm_80" in art.ptx
    assert art.meta["arch"] == "sm_80"


def test_second_build_does_not_compile(tmp_path, count_compiles):
    cache = KernelCache(tmp_path)
    a1 = gb.build(toy_emitted(tag="hit"), cache)
    a2 = gb.build(toy_emitted(tag="hit"), cache)
    a3 = gb.build(toy_emitted(tag="hit"), KernelCache(tmp_path))     # fresh process view: disk hit
    assert count_compiles == ["toy_axpy"]
    assert a1 == a2 == a3


def test_key_follows_source_params_arch_and_material():
    base = gb.emitted_key(toy_emitted())
    assert base == gb.emitted_key(toy_emitted())
    assert gb.emitted_key(toy_emitted(tag="x")) != base
    assert gb.emitted_key(toy_emitted(n=128)) != base
    assert gb.emitted_key(toy_emitted(arch="sm_80")) != base
    assert gb.emitted_key(toy_emitted(), material="lowered ir") != base
    # the same IR with a changed backend output is a different kernel
    assert gb.emitted_key(toy_emitted(tag="v2"), material="lowered ir") != gb.emitted_key(
        toy_emitted(), material="lowered ir")


def test_corrupt_so_is_rebuilt(tmp_path, count_compiles):
    cache = KernelCache(tmp_path)
    art = gb.build(toy_emitted(tag="corrupt"), cache)
    so = Path(art.so_path)
    so.write_bytes(so.read_bytes()[:1000])               # truncated
    art2 = gb.build(toy_emitted(tag="corrupt"), KernelCache(tmp_path))
    assert len(count_compiles) == 2
    assert sha256_file(art2.so_path) == art2.so_sha256 and Path(art2.so_path).stat().st_size > 1000


def test_fake_arguments_share_named_dims():
    fakes = gb.fake_arguments(toy_emitted())
    assert len(fakes) == len(toy_params()) + 1          # + the env stream
    x, y, z, w, alpha, stream = fakes
    assert x.shape[0] is y.shape[0] is z.shape[0]        # one sym_int per name
    assert x.shape[1] is y.shape[1]
    assert x.shape[1].divisibility == 8                  # N is contiguous: 16 B of bf16
    assert x.shape[0].divisibility == 1                  # M is not
    assert x.stride[1] == 1 and x.stride[0].divisibility == 8
    static = gb.fake_arguments(toy_emitted(n=128))[0]
    assert static.shape[1] == 128


def test_dim_divisibility_takes_the_widest_hint():
    assert gb.dim_divisibility(toy_params()) == {"M": 1, "N": 8}


def test_load_module_writes_source_by_hash(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMC_CACHE_DIR", str(tmp_path))
    em = toy_emitted(tag="module")
    mod = gb.load_module(em)
    assert callable(getattr(mod, "toy_axpy"))
    path = tmp_path / "sources" / f"{gb.source_digest(em)}.py"
    assert path.read_text() == em.source
    assert gb.load_module(em) is mod


def test_bad_sources_are_build_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMC_CACHE_DIR", str(tmp_path))
    broken = EmittedKernel("sm_90a", "def f(:\n", "f", toy_params())
    with pytest.raises(BuildError, match="does not import"):
        gb.load_module(broken)
    no_entry = EmittedKernel("sm_90a", "x = 1\n", "toy_axpy", toy_params())
    with pytest.raises(BuildError, match="has no function 'toy_axpy'"):
        gb.load_module(no_entry)
    bad_trace = EmittedKernel("sm_90a", "import cutlass.cute as cute\n@cute.jit\ndef f(x, stream):\n"
                              "    undefined_name(x)\n", "f", toy_params()[:1])
    with pytest.raises(BuildError, match="cute.compile failed for 'f'"):
        gb.compile_emitted(bad_trace)


def test_jit_callable_is_a_launcher_around_the_compiled_function():
    from gemmc.runtime import Launcher
    k = gb.jit_callable(toy_emitted(tag="jit"))
    assert isinstance(k, Launcher) and k._function is not None and k.params == toy_params()
    # (calling it needs a GPU: the in-process function is only initialised where the arch's GPU is)


def test_cached_so_loads_without_cutlass_and_checks_before_launch(toy_artifact):
    """A runtime-only process: loads the .so through tvm_ffi, and its prologue rejects CPU tensors."""
    code = f"""
import sys, torch
from gemmc.cache import KernelCache
from gemmc.runtime import launcher_from_artifact
from gemmc.errors import LaunchError
art = KernelCache({str(Path(toy_artifact.directory).parents[2])!r}).lookup({toy_artifact.key!r})
k = launcher_from_artifact(art)
fn = k.function
x = torch.zeros(8, 16, dtype=torch.bfloat16)
try:
    fn(x, x, x, torch.zeros(128), 1.0)
except ValueError as e:
    assert "device_type=cuda" in str(e), e
else:
    raise SystemExit("the prologue accepted CPU tensors")
try:
    k(x, x, 1.0)
except LaunchError as e:
    assert "x must be on a cuda device" in str(e), e
bad = [m for m in sys.modules if m == "cutlass" or m.startswith("cutlass.")]
assert not bad, bad
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_compiled_kernel_api(tmp_path):
    ck = CompiledKernel(toy_emitted(tag="api"), cache=KernelCache(tmp_path), material="ir text")
    assert "def toy_axpy" in ck.source
    assert ".target sm_90a" in ck.ptx
    art = ck.build()
    assert art.key == ck.key == gb.emitted_key(toy_emitted(tag="api"), "ir text")
    assert ck.launcher.params == toy_params()
    assert "toy_axpy" in repr(ck)


def _build_in_child(root, q):
    try:
        art = gb.build(toy_emitted(tag="concurrent"), KernelCache(root))
        q.put((art.key, sha256_file(art.so_path)))
    except Exception as e:      # report, don't hang the parent
        q.put(("error", repr(e)))


@pytest.mark.slow
def test_two_processes_build_the_same_kernel(tmp_path):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_build_in_child, args=(str(tmp_path), q)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert results[0] == results[1] and results[0][0] != "error"
    key = results[0][0]
    entries = list((tmp_path / "kernels" / key[:2]).iterdir())
    assert [e.name for e in entries] == [key]
    assert KernelCache(tmp_path).lookup(key) is not None


# -- gemmc build (the AOT CLI) on a real GEMM -----------------------------------------------------

GEMM_ARGS = ["--m", "M", "--n", "256", "--k", "256", "--dtype", "bf16", "--arch", "sm_90a",
             "--tile", "128x128x64", "--cluster", "1x1"]


@pytest.mark.slow
def test_gemmc_build_fills_the_cache_and_a_runtime_process_loads_it(tmp_path, monkeypatch, capsys,
                                                                    count_compiles):
    from gemmc.cli import main
    cache_dir = tmp_path / "aot"
    ptx_file = tmp_path / "k.ptx"
    assert main(["build", *GEMM_ARGS, "--cache-dir", str(cache_dir), "--ptx", str(ptx_file)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    key, schedule, _arch, entry = lines[0].split()     # the flags edited the --schedule (auto) pick
    assert lines[-1] == f"cache: {cache_dir}"
    assert Path(entry) == cache_dir / "kernels" / key[:2] / key
    assert (Path(entry) / "kernel.so").exists()
    assert schedule.startswith("128x128x64_c1x1_")
    ptx = ptx_file.read_text()
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx and ".target sm_90a" in ptx
    assert len(count_compiles) == 1
    # again: a cache hit, nothing compiled
    assert main(["build", *GEMM_ARGS, "--cache-dir", str(cache_dir)]) == 0
    assert len(count_compiles) == 1
    # a fresh process resolves the same problem to the same entry without importing cutlass
    code = f"""
import sys, gemmc
from gemmc.compiler import compile
from gemmc.bench.policy import parse_schedule
k = compile(gemmc.GemmSpec(m="M", n=256, k=256, dtype="bf16"), schedule=parse_schedule({schedule!r}))
art = k.artifact
assert art.key == {key!r}, art.key
launcher = k.launcher
bad = [m for m in sys.modules if m == "cutlass" or m.startswith("cutlass.")]
assert not bad, bad
print("ok")
"""
    env = {**os.environ, "GEMMC_CACHE_DIR": str(cache_dir)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_gemmc_build_of_a_symbolic_m_auto_kernel_builds_every_m_bucket(tmp_path, monkeypatch, capsys, shipped_only):
    from types import SimpleNamespace

    from gemmc.cli import main
    built = []

    def fake_build(self):
        built.append(self.schedule)
        return SimpleNamespace(key=f"key-{self.schedule.short()}", directory=str(tmp_path), ptx="")
    monkeypatch.setattr("gemmc.compiled.CompiledKernel.build", fake_build)
    assert main(["build", "--m", "M", "--n", "4096", "--k", "4096", "--cache-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    buckets = [ln for ln in lines if ln.startswith("  M ")]
    assert buckets[0].startswith("  M 1..") and buckets[-1].startswith("  M ") and re.match(r"  M \d+\.\.: ", buckets[-1])
    assert any("torch.matmul (pretuned: cuBLAS faster), nothing to build" in ln for ln in buckets)
    kernels = {ln.split()[3] for ln in buckets if "nothing to build" not in ln}
    assert kernels and kernels <= {s.short() for s in built}          # each bucket's kernel was built
    assert all(ln.split()[2] == f"key-{ln.split()[3]}" for ln in buckets if "nothing to build" not in ln)


@pytest.fixture
def fake_kernel_build(monkeypatch, tmp_path):
    """CompiledKernel.build without the CuTe DSL: records each build, returns a stand-in artifact."""
    from types import SimpleNamespace
    built = []

    def fake_build(self):
        built.append(self.schedule)
        return SimpleNamespace(key="key-1", directory=str(tmp_path / "kernel"), ptx_path=str(tmp_path / "k.ptx"),
                               ptx="// PTX of the kernel\n.version 8.0\n")
    monkeypatch.setattr("gemmc.compiled.CompiledKernel.build", fake_build)
    return built


def test_gemmc_build_ptx_to_stdout_is_the_ptx_alone(tmp_path, capsys, fake_kernel_build):
    from gemmc.cli import main
    assert main(["build", *GEMM_ARGS, "--cache-dir", str(tmp_path / "aot"), "--ptx", "-"]) == 0
    out, err = capsys.readouterr()
    assert out == "// PTX of the kernel\n.version 8.0\n"
    assert err.splitlines()[0].startswith("key-1  ") and err.splitlines()[-1] == f"cache: {tmp_path / 'aot'}"


def test_gemmc_build_checks_the_ptx_destination_before_building(tmp_path, capsys, fake_kernel_build):
    from gemmc.cli import main
    (tmp_path / "file").write_text("")
    for dest, needle in ((tmp_path / "file" / "x.ptx", "is a file, not a folder"), (tmp_path, "is a folder")):
        assert main(["build", *GEMM_ARGS, "--cache-dir", str(tmp_path / "aot"), "--ptx", str(dest)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"gemmc build: error: --ptx {dest}: ") and needle in err
    assert fake_kernel_build == []                                    # refused before anything was built
    # missing folders are made, as for every file a gemmc command writes (gemmc/output_file.py)
    dest = tmp_path / "new" / "k.ptx"
    assert main(["build", *GEMM_ARGS, "--cache-dir", str(tmp_path / "aot"), "--ptx", str(dest)]) == 0
    assert dest.read_text() == "// PTX of the kernel\n.version 8.0\n"
    assert capsys.readouterr().out.splitlines()[-1] == f"cache: {tmp_path / 'aot'}"   # status on stdout then

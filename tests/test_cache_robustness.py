"""The kernel cache on hosts other than the one that built it: runtime-only hosts (no `cutlass`, maybe no
package metadata), damaged entries, broken runtime environments, unusable cache folders.

A host without the compiler is a child process with sys.modules["cutlass"] = None. One toy kernel is
built (on this CPU) and its cache copied for each scenario.
"""
import errno
import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import gemmc.build as gb
from gemmc.cache import KernelCache
from gemmc.compiled import CompiledKernel
from gemmc.errors import BuildError
from toy_kernel import toy_emitted

TESTS = Path(__file__).resolve().parent

NO_CUTLASS = 'import sys; sys.modules["cutlass"] = None\n'

# The runtime bundle of shared/gpu/stage.sh: the runtime library and apache-tvm-ffi, no cutlass metadata at all.
NO_DSL_METADATA = '''
import importlib.metadata as md
_real = md.version
def _version(name):
    if name.startswith("nvidia-cutlass-dsl"):
        raise md.PackageNotFoundError(name)
    return _real(name)
md.version = _version
'''


def run_child(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(TESTS),
                          env={**os.environ, **env})


@pytest.fixture(scope="module")
def toy_cache(tmp_path_factory):
    """A cache holding the toy kernel, as a build host leaves it; copy it before changing it."""
    root = tmp_path_factory.mktemp("built") / "cache"
    art = gb.build(toy_emitted(), KernelCache(root))
    return root, art.key


@pytest.fixture
def cache_copy(toy_cache, tmp_path):
    root, key = toy_cache
    copy = tmp_path / "cache"
    shutil.copytree(root, copy)
    return copy, key, KernelCache(copy).entry_dir(key)


def test_a_runtime_only_host_computes_the_build_hosts_key_and_loads(cache_copy):
    root, key, _ = cache_copy
    code = NO_CUTLASS + NO_DSL_METADATA + f"""
from gemmc.cache import KernelCache, dsl_version_from_metadata
from gemmc.compiled import CompiledKernel
from toy_kernel import toy_emitted
assert dsl_version_from_metadata() is None
ck = CompiledKernel(toy_emitted(), cache=KernelCache({str(root)!r}))
assert ck.key == {key!r}, (ck.key, ck.cache.versions())
print(ck.launcher.function)
"""
    out = run_child(code)
    assert out.returncode == 0, out.stderr


def test_a_wrong_runtime_library_is_reported_and_the_entry_kept(cache_copy):
    root, key, entry = cache_copy
    code = NO_CUTLASS + f"""
from gemmc.cache import KernelCache
from gemmc.compiled import CompiledKernel
from gemmc.runtime import KernelLoadError
from toy_kernel import toy_emitted
ck = CompiledKernel(toy_emitted(), cache=KernelCache({str(root)!r}))
try:
    ck.launcher.function
except KernelLoadError as e:
    print(e)
else:
    raise SystemExit("loaded?")
"""
    out = run_child(code, GEMMC_CUTE_RUNTIME_LIB="/opt/wrong/libcute_dsl_runtime.so")
    assert out.returncode == 0, out.stderr
    assert str(entry / "kernel.so") in out.stdout
    assert "GEMMC_CUTE_RUNTIME_LIB=/opt/wrong/libcute_dsl_runtime.so does not exist" in out.stdout
    assert KernelCache(root).lookup(key) is not None            # a valid entry is never deleted for this


# What a host without the compiler says for each way an entry can be unusable.
UNUSABLE = {
    "missing": (lambda entry: shutil.rmtree(entry), "no such entry"),
    "truncated-so": (lambda entry: os.truncate(entry / "kernel.so", 100), "kernel.so fails its sha256"),
    "no-manifest": (lambda entry: (entry / "manifest.json").unlink(), "manifest.json is missing"),
    "garbage-manifest": (lambda entry: (entry / "manifest.json").write_text("{"), "manifest.json is damaged"),
}


@pytest.mark.parametrize("how", sorted(UNUSABLE))
def test_an_unusable_entry_on_a_host_without_the_compiler_says_which_why_and_what_to_do(cache_copy, how):
    root, key, entry = cache_copy
    harm, why = UNUSABLE[how]
    harm(entry)
    code = NO_CUTLASS + f"""
from gemmc.cache import KernelCache
from gemmc.compiled import CompiledKernel
from gemmc.errors import BuildError
from toy_kernel import toy_emitted
try:
    CompiledKernel(toy_emitted(), cache=KernelCache({str(root)!r})).launcher
except BuildError as e:
    print(e)
else:
    raise SystemExit("served?")
"""
    out = run_child(code)
    assert out.returncode == 0, out.stderr
    msg = out.stdout
    assert f"toy_axpy (sm_90a) is not in the kernel cache {root}" in msg
    assert f"\n  {entry}: {why}" in msg
    assert "`gemmc build`" in msg and "nvidia-cutlass-dsl" in msg and "GEMMC_CACHE_DIR" in msg


def test_an_entry_of_other_versions_is_named(cache_copy):
    root, key, entry = cache_copy
    code = NO_CUTLASS + f"""
import gemmc
gemmc.__version__ = "9.9.9"
from gemmc.cache import KernelCache
from gemmc.compiled import CompiledKernel
from gemmc.errors import BuildError
from toy_kernel import toy_emitted
try:
    CompiledKernel(toy_emitted(), cache=KernelCache({str(root)!r})).build()
except BuildError as e:
    print(e)
"""
    out = run_child(code)
    assert out.returncode == 0, out.stderr
    assert f"{entry} holds this kernel built with other versions: gemmc {gb.versions()['gemmc']} (here 9.9.9)" \
        in out.stdout


def test_missing_ptx_and_source_do_not_stop_a_runtime_host(cache_copy):
    root, key, entry = cache_copy
    (entry / "kernel.ptx").unlink()
    (entry / "kernel.py").unlink()
    code = NO_CUTLASS + f"""
from gemmc.cache import KernelCache
from gemmc.compiled import CompiledKernel
from gemmc.errors import BuildError
from toy_kernel import toy_emitted
ck = CompiledKernel(toy_emitted(), cache=KernelCache({str(root)!r}))
print(ck.launcher.function)
try:
    ck.ptx
except BuildError as e:
    print("PTX:", e)
"""
    out = run_child(code)
    assert out.returncode == 0, out.stderr
    assert f"PTX: no PTX for toy_axpy: in the cache entry {entry}, kernel.ptx is missing" in out.stdout
    assert KernelCache(root).lookup(key) is not None


def test_a_so_damaged_after_its_lookup_is_reported_not_deleted_on_a_runtime_host(cache_copy):
    root, key, entry = cache_copy
    code = NO_CUTLASS + f"""
import os
from gemmc.cache import KernelCache
from gemmc.compiled import CompiledKernel
from gemmc.errors import BuildError
from toy_kernel import toy_emitted
ck = CompiledKernel(toy_emitted(), cache=KernelCache({str(root)!r}))
ck.build()
os.truncate(ck.so_path, 1000)
try:
    ck.launcher.function
except BuildError as e:
    print(e)
"""
    out = run_child(code)
    assert out.returncode == 0, out.stderr
    assert f"the cached kernel {entry / 'kernel.so'} is damaged" in out.stdout
    assert "this host cannot rebuild it" in out.stdout and "`gemmc build`" in out.stdout
    assert (entry / "manifest.json").exists()           # left for a build host to replace


def test_a_damaged_so_is_rebuilt_where_the_compiler_is(tmp_path):
    ck = CompiledKernel(toy_emitted(tag="damaged-at-load"), cache=KernelCache(tmp_path))
    art = ck.build()
    good = Path(art.so_path).read_bytes()
    Path(art.so_path).write_bytes(good[:1000])          # damaged after the lookup verified it
    fn = ck.launcher.function
    assert fn is not None and Path(ck.build().so_path).read_bytes()[:4] == b"\x7fELF"
    assert KernelCache(tmp_path).lookup(art.key).so_sha256 == ck.build().so_sha256


# -- unusable cache folders --------------------------------------------------------------------------

def test_gemmc_build_into_a_path_under_a_file_says_to_set_the_cache_dir(tmp_path, capsys, shipped_only):
    from gemmc.cli import main
    (tmp_path / "plain").write_text("")
    bad = tmp_path / "plain" / "cache"
    assert main(["build", "--m", "256", "--n", "256", "--k", "256", "--dtype", "bf16", "--arch", "sm_90a",
                 "--schedule", "heuristic", "--cache-dir", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"gemmc build: error: cannot write the kernel cache {bad} (needed to build " in err
    assert f"{tmp_path / 'plain'} is a file, not a folder" in err
    assert "GEMMC_CACHE_DIR" in err and "--cache-dir" in err


def test_a_full_disk_while_writing_the_source_is_a_build_error_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMC_CACHE_DIR", str(tmp_path))

    class Full(io.StringIO):
        def write(self, s):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    real = os.fdopen
    monkeypatch.setattr(gb.os, "fdopen", lambda fd, *a, **kw: (os.close(fd), Full())[1])
    with pytest.raises(BuildError, match=rf"into the kernel cache {tmp_path} failed .*No space left on device"):
        gb.load_module(toy_emitted(tag="disk-full"))
    monkeypatch.setattr(gb.os, "fdopen", real)
    assert os.listdir(tmp_path / "sources") == []


def test_stale_temp_sources_are_swept_and_sources_are_shared(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMC_CACHE_DIR", str(tmp_path))
    src = tmp_path / "sources"
    src.mkdir()
    stale, recent = src / ".0123456789ab-killed.py", src / ".0123456789ab-writing.py"
    for p in (stale, recent):
        p.write_text("partial")
    hours_ago = time.time() - 2 * 3600
    os.utime(stale, (hours_ago, hours_ago))
    old = os.umask(0o022)
    try:
        em = toy_emitted(tag="sweep")
        gb.load_module(em)
    finally:
        os.umask(old)
    written = src / f"{gb.source_digest(em)}.py"
    assert sorted(os.listdir(src)) == sorted([recent.name, written.name])
    assert written.stat().st_mode & 0o777 == 0o644           # not mkstemp's 0600


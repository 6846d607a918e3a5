"""Kernel cache: hits, concurrent writers, corruption, keys. No compiler needed: builders write bytes."""
import json
import multiprocessing as mp
import os
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from gemmc.cache import Artifact, KernelCache, cache_key, default_cache, default_cache_dir, versions

SO_BYTES = b"\x7fELF" + bytes(range(256)) * 40


class CountingBuilder:
    def __init__(self, payload=SO_BYTES):
        self.calls = 0
        self.payload = payload

    def __call__(self, staging: Path) -> dict:
        self.calls += 1
        (staging / "kernel.so").write_bytes(self.payload)
        (staging / "kernel.ptx").write_text(".version 8.0\n.target sm_90a\n")
        (staging / "kernel.py").write_text("# source\n")
        return {"function": "f", "params": []}


def test_miss_then_hit_in_memory_and_on_disk(tmp_path):
    cache = KernelCache(tmp_path)
    build = CountingBuilder()
    a1 = cache.get_or_build("k" * 64, build)
    a2 = cache.get_or_build("k" * 64, build)
    assert build.calls == 1
    assert a1 == a2
    assert Path(a1.so_path).read_bytes() == SO_BYTES
    assert a1.ptx.startswith(".version")
    assert a1.meta == {"function": "f", "params": []}
    # a second process (fresh in-memory map) hits on disk
    other = KernelCache(tmp_path)
    a3 = other.get_or_build("k" * 64, build)
    assert build.calls == 1
    assert a3.so_path == a1.so_path and a3.so_sha256 == a1.so_sha256
    manifest = json.loads((Path(a1.directory) / "manifest.json").read_text())
    assert set(manifest["files"]) == {"kernel.so", "kernel.ptx", "kernel.py"}
    assert manifest["files"]["kernel.so"]["size"] == len(SO_BYTES)


def test_entry_layout_and_no_leftovers(tmp_path):
    cache = KernelCache(tmp_path)
    key = "ab" + "0" * 62
    art = cache.get_or_build(key, CountingBuilder())
    assert Path(art.so_path) == tmp_path / "kernels" / "ab" / key / "kernel.so"
    assert list((tmp_path / "tmp").iterdir()) == []     # staging dirs are removed


def test_builder_failure_leaves_no_entry(tmp_path):
    cache = KernelCache(tmp_path)

    def broken(staging):
        (staging / "kernel.so").write_bytes(b"half")
        raise RuntimeError("compiler crashed")

    with pytest.raises(RuntimeError, match="compiler crashed"):
        cache.get_or_build("c" * 64, broken)
    assert cache.lookup("c" * 64) is None
    assert not cache.entry_dir("c" * 64).exists()
    assert list((tmp_path / "tmp").iterdir()) == []
    build = CountingBuilder()
    cache.get_or_build("c" * 64, build)
    assert build.calls == 1


def test_builder_must_write_a_so(tmp_path):
    with pytest.raises(RuntimeError, match="no kernel.so"):
        KernelCache(tmp_path).get_or_build("d" * 64, lambda staging: {})


def _truncate(p):
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])


def _flip(p):
    data = bytearray(p.read_bytes())
    data[len(data) // 3] ^= 0x01
    p.write_bytes(bytes(data))


CORRUPTIONS = {
    "truncate-so": lambda d: _truncate(d / "kernel.so"),
    "flip-byte-so": lambda d: _flip(d / "kernel.so"),
    "delete-so": lambda d: (d / "kernel.so").unlink(),
    "delete-manifest": lambda d: (d / "manifest.json").unlink(),
    "garbage-manifest": lambda d: (d / "manifest.json").write_text("{not json"),
    "empty-so": lambda d: (d / "kernel.so").write_bytes(b""),
}


@pytest.mark.parametrize("corrupt", sorted(CORRUPTIONS))
def test_corrupt_entry_is_rebuilt_never_loaded(tmp_path, corrupt):
    key = "e" * 64
    build = CountingBuilder()
    art = KernelCache(tmp_path).get_or_build(key, build)
    CORRUPTIONS[corrupt](Path(art.directory))
    fresh = KernelCache(tmp_path)              # a new process: nothing in memory
    assert fresh.lookup(key) is None           # detected: never handed out
    art2 = fresh.get_or_build(key, build)
    assert build.calls == 2                    # rebuilt
    assert Path(art2.so_path).read_bytes() == SO_BYTES
    assert KernelCache(tmp_path).lookup(key) is not None


def test_manifest_for_another_key_is_rejected(tmp_path):
    cache = KernelCache(tmp_path)
    art = cache.get_or_build("f" * 64, CountingBuilder())
    other = cache.entry_dir("0" * 64)
    other.parent.mkdir(parents=True)
    os.rename(art.directory, other)             # an entry moved under the wrong key
    assert KernelCache(tmp_path).lookup("0" * 64) is None


def test_invalidate_forces_a_rebuild(tmp_path):
    cache = KernelCache(tmp_path)
    build = CountingBuilder()
    cache.get_or_build("1" * 64, build)
    cache.invalidate("1" * 64)
    assert cache.lookup("1" * 64) is None
    cache.get_or_build("1" * 64, build)
    assert build.calls == 2


# -- concurrent writers -------------------------------------------------------------------------

def _slow_writer(root, key, counter_dir, barrier):
    def builder(staging):
        # record that this process compiled, then take a while, as a real compile does
        (Path(counter_dir) / f"{os.getpid()}").write_text("built")
        for i in range(20):
            (staging / "kernel.so").write_bytes(SO_BYTES[: (i + 1) * len(SO_BYTES) // 20])
            time.sleep(0.01)
        (staging / "kernel.ptx").write_text(".target sm_90a\n")
        return {"pid": os.getpid()}
    barrier.wait()
    art = KernelCache(root).get_or_build(key, builder)
    assert Path(art.so_path).read_bytes() == SO_BYTES


def test_two_processes_build_the_same_key(tmp_path):
    key = "2" * 64
    counters = tmp_path / "counters"
    counters.mkdir()
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_slow_writer, args=(str(tmp_path / "c"), key, str(counters), barrier))
             for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    # the file lock serialises the builders: the second finds the first's entry
    assert len(list(counters.iterdir())) == 1
    cache = KernelCache(tmp_path / "c")
    art = cache.lookup(key)
    assert art is not None and Path(art.so_path).read_bytes() == SO_BYTES
    assert [p.name for p in (tmp_path / "c" / "kernels" / key[:2]).iterdir()] == [key]
    assert list((tmp_path / "c" / "tmp").iterdir()) == []


def test_reader_never_sees_a_partial_entry(tmp_path):
    """While another process writes, a reader gets either nothing or a verified entry."""
    key = "3" * 64
    root = str(tmp_path / "c")
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(2)
    counters = tmp_path / "n"
    counters.mkdir()
    writer = ctx.Process(target=_slow_writer, args=(root, key, str(counters), barrier))
    writer.start()
    barrier.wait()
    seen = []
    deadline = time.time() + 30
    while writer.is_alive() and time.time() < deadline:
        art = KernelCache(root).lookup(key)
        if art is not None:
            seen.append(Path(art.so_path).read_bytes() == SO_BYTES)
        time.sleep(0.002)
    writer.join(30)
    assert writer.exitcode == 0
    assert all(seen)
    assert KernelCache(root).lookup(key) is not None


# -- keys -----------------------------------------------------------------------------------------

def test_key_depends_on_material_arch_and_every_version():
    v = {"gemmc": "0.1.0", "nvidia-cutlass-dsl": "4.8.1", "apache-tvm-ffi": "0.1.15", "format": "1"}
    base = cache_key("ir", "sm_90a", v)
    assert base == cache_key("ir", "sm_90a", dict(v))
    assert len(base) == 64 and int(base, 16) >= 0
    assert cache_key("ir2", "sm_90a", v) != base
    assert cache_key("ir", "sm_80", v) != base
    for name in v:
        assert cache_key("ir", "sm_90a", {**v, name: v[name] + ".post1"}) != base, name


@given(st.text(max_size=50), st.text(max_size=50))
def test_key_is_injective_on_material(a, b):
    v = {"gemmc": "x"}
    assert (cache_key(a, "sm_90a", v) == cache_key(b, "sm_90a", v)) == (a == b)


def test_versions_are_read_without_importing_cutlass():
    import subprocess
    import sys
    code = ("import sys, gemmc.cache as c; v = c.versions(); "
            "assert 'cutlass' not in sys.modules, 'cutlass imported'; print(v)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    v = eval(out.stdout)
    import gemmc
    assert v["gemmc"] == gemmc.__version__
    assert v["nvidia-cutlass-dsl"] == "4.8.1"
    assert v["apache-tvm-ffi"].startswith("0.1.15")


def test_missing_metadata_is_tolerated(monkeypatch, tmp_path):
    from importlib import metadata

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    v = versions(tmp_path)          # a cache with no runtime-library records either
    assert v["nvidia-cutlass-dsl"] == "unknown" and v["apache-tvm-ffi"] == "unknown"
    assert v["gemmc"]


def test_cache_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMC_CACHE_DIR", str(tmp_path / "here"))
    assert default_cache_dir() == tmp_path / "here"
    assert default_cache().root == tmp_path / "here"
    monkeypatch.delenv("GEMMC_CACHE_DIR")
    assert default_cache_dir() == Path("~/.cache/gemmc").expanduser()


def test_artifact_without_ptx():
    art = Artifact(key="k", so_path="/x/kernel.so", ptx_path=None, source_path=None)
    assert art.ptx is None and art.directory == "/x"


# -- files not needed to run ----------------------------------------------------------------------

OPTIONAL_DAMAGE = {
    "delete-ptx": (lambda d: (d / "kernel.ptx").unlink(), "kernel.ptx is missing"),
    "flip-byte-ptx": (lambda d: _flip(d / "kernel.ptx"), "kernel.ptx fails its sha256"),
    "delete-py": (lambda d: (d / "kernel.py").unlink(), "kernel.py is missing"),
}


@pytest.mark.parametrize("damage", sorted(OPTIONAL_DAMAGE))
def test_damaged_ptx_or_source_leaves_the_entry_runnable(tmp_path, damage):
    key = "e" * 64
    build = CountingBuilder()
    art = KernelCache(tmp_path).get_or_build(key, build)
    harm, why = OPTIONAL_DAMAGE[damage]
    harm(Path(art.directory))
    runnable = KernelCache(tmp_path).lookup(key)
    assert runnable is not None and runnable.so_path == art.so_path and runnable.so_sha256 == art.so_sha256
    assert len(runnable.defects) == 1 and runnable.defects[0].startswith(why)
    damaged_file = "kernel.ptx" if "ptx" in damage else "kernel.py"
    assert (runnable.ptx_path if damaged_file == "kernel.ptx" else runnable.source_path) is None
    complete = KernelCache(tmp_path).get_or_build(key, build)      # a host that can build restores it
    assert build.calls == 2 and complete.defects == () and complete.ptx.startswith(".version")


def test_inspect_says_why_an_entry_is_rejected(tmp_path):
    cache = KernelCache(tmp_path)
    assert cache.inspect("0" * 64) == (None, "no such entry")
    art = cache.get_or_build("a" * 64, CountingBuilder())
    _truncate(Path(art.so_path))
    assert "kernel.so fails its sha256" in cache.inspect("a" * 64)[1]
    (Path(art.directory) / "manifest.json").unlink()
    assert "manifest.json is missing" in cache.inspect("a" * 64)[1]


# -- sharing a cache between accounts -------------------------------------------------------------

@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_published_entries_follow_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        art = KernelCache(tmp_path).get_or_build("4" * 64, CountingBuilder())
    finally:
        os.umask(old)
    d = Path(art.directory)
    assert d.stat().st_mode & 0o777 == 0o777 & ~mask           # not mkdtemp's 0700
    for name in ("kernel.so", "kernel.ptx", "kernel.py", "manifest.json"):
        assert (d / name).stat().st_mode & 0o777 == 0o666 & ~mask, name


def test_a_hit_takes_no_lock(tmp_path, monkeypatch):
    key = "5" * 64
    KernelCache(tmp_path).get_or_build(key, CountingBuilder())

    def no_lock(self, key, timeout=-1):
        raise AssertionError("a hit must not lock: the reader may not be able to write the cache")

    monkeypatch.setattr(KernelCache, "_lock", no_lock)
    fresh = KernelCache(tmp_path)
    assert fresh.get_or_build(key, CountingBuilder()) == fresh.lookup(key) is not None


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root (and setpriv) to act as another account")
def test_another_account_reads_a_cache_without_writing_it(tmp_path):
    """Built by this account with the usual umask; read by uid 65534, who can write nothing in it."""
    import subprocess
    import sys
    import tempfile
    root = Path(tempfile.mkdtemp(prefix="gemmc-shared-"))
    try:
        os.chmod(root.parent / root.name, 0o755)
        old = os.umask(0o022)
        try:
            key = "6" * 64
            KernelCache(root / "c").get_or_build(key, CountingBuilder())
        finally:
            os.umask(old)
        import gemmc
        repo = str(Path(gemmc.__file__).resolve().parents[1])
        code = (f"import sys; sys.path.insert(0, {repo!r}); from gemmc.cache import KernelCache; "
                f"c = KernelCache({str(root / 'c')!r}); a = c.lookup({key!r}); "
                f"assert a is not None, c.inspect({key!r}); print(open(a.so_path, 'rb').read(4))")
        out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                              "-c", code], capture_output=True, text=True, cwd="/")
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == repr(SO_BYTES[:4])
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- cache folders that cannot be used ------------------------------------------------------------

def test_relative_cache_dir_is_resolved_once(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    rel = f"rel-{tmp_path.name}"
    monkeypatch.setenv("GEMMC_CACHE_DIR", rel)
    first = default_cache_dir()
    assert first == tmp_path / rel and first.is_absolute()
    os.chdir("sub")
    assert default_cache_dir() == first and default_cache().root == first
    assert KernelCache("here").root == tmp_path / "sub" / "here"


def test_cache_under_a_file_is_a_build_error(tmp_path):
    from gemmc.errors import BuildError
    (tmp_path / "plain").write_text("")
    root = tmp_path / "plain" / "cache"
    with pytest.raises(BuildError) as e:
        KernelCache(root).get_or_build("7" * 64, CountingBuilder())
    msg = str(e.value)
    assert msg.startswith(f"cannot write the kernel cache {root} (needed to build {'7' * 64}: no such entry): "
                          f"{tmp_path / 'plain'} is a file, not a folder")
    assert "GEMMC_CACHE_DIR" in msg and "--cache-dir" in msg


def test_unwritable_cache_is_a_build_error(tmp_path, monkeypatch):
    """What filelock raises in a read-only cache folder (simulated: root ignores permissions)."""
    import errno

    import filelock
    from gemmc.errors import BuildError

    def denied(self, *a, **kw):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), self.lock_file)

    monkeypatch.setattr(filelock.FileLock, "acquire", denied)
    with pytest.raises(BuildError, match=rf"cannot write the kernel cache {tmp_path} \(needed to build 8+: no such "
                                         r"entry\): Permission denied .*Set GEMMC_CACHE_DIR"):
        KernelCache(tmp_path).get_or_build("8" * 64, CountingBuilder())


def test_disk_full_while_building_is_a_build_error_naming_the_cache(tmp_path):
    import errno
    from gemmc.errors import BuildError

    stagings = []

    def full(staging):
        stagings.append(str(staging))
        (staging / "kernel.so").write_bytes(SO_BYTES)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(staging / "kernel.ptx"))

    with pytest.raises(BuildError, match=rf"writing the kernel cache {tmp_path} failed while writing kernel.ptx: "
                                         "No space left on device") as e:
        KernelCache(tmp_path).get_or_build("9" * 64, full)
    assert stagings[0] not in str(e.value) and "GEMMC_CACHE_DIR" in str(e.value)   # it is deleted by now
    assert list((tmp_path / "tmp").iterdir()) == []


def test_stale_staging_leftovers_are_swept(tmp_path):
    cache = KernelCache(tmp_path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    hour_ago = time.time() - 2 * 3600
    killed, busy, fresh = (tmp / f"{c * 64}-x" for c in "abc")
    old_style = tmp / "dddddddddddd-x"            # named after key[:12], as before
    for d in (killed, busy, fresh, old_style):
        d.mkdir()
        (d / "kernel.so").write_bytes(b"partial")
    for d in (killed, busy, old_style):
        os.utime(d, (hour_ago, hour_ago))
    with cache._lock("b" * 64):          # a builder still at work on that key
        cache.get_or_build("e" * 64, CountingBuilder())
    assert sorted(p.name for p in tmp.iterdir()) == sorted([busy.name, fresh.name])


# -- the compiler's version on a runtime-only host ------------------------------------------------

@pytest.fixture
def runtime_only_host(tmp_path, monkeypatch):
    """No nvidia-cutlass-dsl metadata (the README's runtime bundle), and one runtime library (a stand-in)."""
    from importlib import metadata
    real = metadata.version

    def version(name):
        if name.startswith("nvidia-cutlass-dsl"):
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", version)
    lib = tmp_path / "lib" / "libcute_dsl_runtime.so"
    lib.parent.mkdir()
    lib.write_bytes(b"\x7fELF runtime 4.8.1")
    monkeypatch.setenv("GEMMC_CUTE_RUNTIME_LIB", str(lib))
    return lib


def test_a_runtime_only_host_reads_the_compiler_version_the_build_recorded(tmp_path, runtime_only_host):
    root = tmp_path / "c"
    assert versions(root)["nvidia-cutlass-dsl"] == "unknown"
    KernelCache(root).record_runtime_libraries("4.8.1")        # what a build host with that library writes
    v = versions(root)
    assert v["nvidia-cutlass-dsl"] == "4.8.1"
    assert cache_key("ir", "sm_90a", v) == cache_key("ir", "sm_90a", {**v, "nvidia-cutlass-dsl": "4.8.1"})
    runtime_only_host.write_bytes(b"\x7fELF runtime 4.9.0")     # another release's library: not served
    assert versions(root)["nvidia-cutlass-dsl"] == "unknown"


def test_dsl_version_falls_back_to_the_runtime_distributions(monkeypatch, tmp_path):
    """A pip install of nvidia-cutlass-dsl-libs-* without the (file-less) meta-distribution."""
    from importlib import metadata
    real = metadata.version

    def version(name):
        if name == "nvidia-cutlass-dsl":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", version)
    assert versions(tmp_path)["nvidia-cutlass-dsl"] == real("nvidia-cutlass-dsl-libs-base")

"""Kernel cache: hits, concurrent writers, corruption, keys. No compiler needed: builders write bytes."""
import json
import multiprocessing as mp
import os
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
    "flip-byte-ptx": lambda d: _flip(d / "kernel.ptx"),
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


def test_missing_metadata_is_tolerated(monkeypatch):
    from importlib import metadata

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    v = versions()
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

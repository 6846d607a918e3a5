"""The AOT build path on bad input and odd hosts: the C compiler, the cache a build writes into, keys and
manifests that say which host and arch a .so is for, read-only caches, and `gemmc build --ptx`."""
import dataclasses
import shutil
import subprocess
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

import gemmc.build as gb
from gemmc.cache import KernelCache
from gemmc.compiled import CompiledKernel
from gemmc.errors import BuildError
from toy_kernel import toy_emitted

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


# -- the C compiler ----------------------------------------------------------------------------------

def test_a_cc_that_is_not_there_is_named_before_anything_compiles(tmp_path, monkeypatch, count_compiles):
    monkeypatch.setenv("CC", "/nonexistent/bin/cc")
    with pytest.raises(BuildError) as e:
        gb.build(toy_emitted(tag="no-cc"), KernelCache(tmp_path))
    msg = str(e.value)
    assert msg.startswith("CC='/nonexistent/bin/cc': '/nonexistent/bin/cc' is not an executable on PATH")
    assert "set CC to a C compiler" in msg and "Free space" not in msg     # not blamed on the cache's disk
    assert count_compiles == []                                                  # refused before the DSL compile
    assert not (tmp_path / "kernels").exists()


def test_no_c_compiler_on_path_is_refused_before_the_compile(tmp_path, monkeypatch, count_compiles):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(BuildError, match=r"no C compiler to link the kernel .so \(neither gcc nor cc is on PATH\)"):
        gb.build(toy_emitted(tag="no-gcc"), KernelCache(tmp_path / "cache"))
    assert count_compiles == []


@needs_gcc
def test_cc_with_flags_is_split_like_a_shell_would(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "gcc -O0 -g0")
    assert gb.c_compiler() == ["gcc", "-O0", "-g0"]
    art = gb.build(toy_emitted(tag="cc-flags"), KernelCache(tmp_path))
    assert Path(art.so_path).read_bytes()[:4] == b"\x7fELF"


@needs_gcc
def test_a_failing_link_says_the_exit_status_even_when_the_linker_is_silent(tmp_path):
    obj = tmp_path / "x.o"
    (tmp_path / "x.c").write_text("int x;\n")
    subprocess.run(["gcc", "-c", "-fPIC", "-o", str(obj), str(tmp_path / "x.c")], check=True)
    with pytest.raises(BuildError) as e:
        gb.link_shared(str(obj), str(tmp_path / "x.so"), [], cc=["false"])
    assert str(e.value).startswith("linking the kernel .so failed: false exited with status 1:\n(it printed nothing)")
    assert "set CC to another one" in str(e.value)
    gb.link_shared(str(obj), str(tmp_path / "x.so"), [], cc=["gcc"])         # and the same link with gcc works
    assert (tmp_path / "x.so").read_bytes()[:4] == b"\x7fELF"


# -- where a build writes, and what its key and manifest say --------------------------------------------

def test_a_build_into_an_explicit_cache_writes_nothing_under_gemmc_cache_dir(tmp_path, monkeypatch):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("GEMMC_CACHE_DIR points at a file\n")
    monkeypatch.setenv("GEMMC_CACHE_DIR", str(blocked))
    em = toy_emitted(tag="explicit-root")
    art = gb.build(em, KernelCache(tmp_path / "mine"))
    assert (tmp_path / "mine" / "sources" / f"{gb.source_digest(em)}.py").read_text() == em.source
    assert Path(art.so_path).is_relative_to(tmp_path / "mine")
    assert art.meta["host"] == gb.host_platform() and gb.host_platform().count("-") >= 1
    assert blocked.read_text() == "GEMMC_CACHE_DIR points at a file\n"


def test_the_key_names_the_host_the_so_is_native_code_for(monkeypatch):
    here = gb.emitted_key(toy_emitted(), "ir")
    monkeypatch.setattr(gb.platform, "machine", lambda: "aarch64" if gb.platform.uname().machine != "aarch64"
                        else "x86_64")
    assert gb.emitted_key(toy_emitted(), "ir") != here                     # an x86-64 .so never serves a GH200
    assert gb.emitted_key(toy_emitted()) != gb.emitted_key(toy_emitted(), "ir")


def test_a_miss_on_a_host_without_the_compiler_names_the_compile_arch_and_host_it_differs_in(tmp_path,
                                                                                           monkeypatch):
    cache = KernelCache(tmp_path)
    sm80 = toy_emitted(arch="sm_80", tag="explain")
    gb.build(sm80, cache)
    monkeypatch.setattr(gb, "compiler_available", lambda: False)
    with pytest.raises(BuildError) as e:          # GEMMC_SM80_COMPILE_ARCH=sm_90a here, not on the build host
        gb.build(dataclasses.replace(sm80, compile_arch="sm_90a"), KernelCache(tmp_path))
    assert "holds this kernel built for sm_80 (here sm_90a: GEMMC_SM80_COMPILE_ARCH must be the same" in str(e.value)
    assert "unknown" not in str(e.value)
    built_on = gb.host_platform()
    monkeypatch.setattr(gb, "host_platform", lambda: "linux-elsewhere")
    with pytest.raises(BuildError) as e:
        gb.build(sm80, KernelCache(tmp_path))
    assert f"holds this kernel built on a {built_on} host (a .so is native code: build on a linux-elsewhere host)" \
        in str(e.value)


# -- an entry that runs but lacks its PTX, in a cache this host cannot write ------------------------

def test_a_runnable_entry_a_read_only_cache_cannot_repair_is_served(tmp_path, count_compiles):
    art = gb.build(toy_emitted(tag="read-only"), KernelCache(tmp_path))
    Path(art.ptx_path).unlink()
    shutil.rmtree(tmp_path / "locks")
    (tmp_path / "locks").write_text("")           # as root cannot be kept out of a folder: no lock can be taken
    with pytest.warns(UserWarning, match=r"runs, but kernel.ptx is missing, and rebuilding it failed"):
        served = gb.build(toy_emitted(tag="read-only"), KernelCache(tmp_path))
    assert served.so_path == art.so_path and served.so_sha256 == art.so_sha256 and served.ptx_path is None
    assert count_compiles == ["toy_axpy"]                # the first build only: the lock failed before compiling
    ck = CompiledKernel(toy_emitted(tag="read-only"), cache=KernelCache(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(BuildError, match=r"no PTX for toy_axpy: .* kernel.ptx is missing. The kernel still runs"):
            ck.ptx


# -- gemmc build --ptx -----------------------------------------------------------------------------------

GEMM_ARGS = ["--m", "M", "--n", "256", "--k", "256", "--tile", "128x128x64", "--cluster", "1x1"]


def test_ptx_of_a_problem_no_kernel_takes_is_an_error_not_a_missing_file(tmp_path, capsys):
    from gemmc.cli import main
    dest = tmp_path / "k.ptx"
    assert main(["build", "--m", "256", "--n", "256", "--k", "4095", "--cache-dir", str(tmp_path / "c"),
                 "--ptx", str(dest)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"gemmc build: error: --ptx {dest}: there is no kernel, so no PTX: no gemmc kernel takes")
    assert "pad it to a multiple of 8" in err and not dest.exists()
    assert main(["build", "--m", "256", "--n", "256", "--k", "4095", "--cache-dir", str(tmp_path / "c")]) == 0
    assert capsys.readouterr().out.startswith("nothing to build: no gemmc kernel takes this problem")


def test_ptx_of_an_entry_served_without_its_ptx_says_how_to_restore_it(tmp_path, capsys, monkeypatch):
    from gemmc.cli import main
    entry = tmp_path / "entry"
    monkeypatch.setattr("gemmc.compiled.CompiledKernel.build", lambda self: SimpleNamespace(
        key="key-1", directory=str(entry), ptx_path=None, ptx=None, defects=("kernel.ptx is missing",)))
    assert main(["build", *GEMM_ARGS, "--cache-dir", str(tmp_path / "c"), "--ptx", "-"]) == 1
    out, err = capsys.readouterr()
    assert out == ""                                   # no partial PTX and no traceback
    assert f"gemmc build: error: no PTX for gemm_sm90: in the cache entry {entry}, kernel.ptx is missing. The " \
        "kernel still runs; to restore its PTX, build it again" in err


def test_the_line_of_an_sm80_kernel_built_for_hopper_says_so(tmp_path, capsys, monkeypatch):
    from gemmc.cli import main
    monkeypatch.setattr("gemmc.compiled.CompiledKernel.build", lambda self: SimpleNamespace(
        key="key-1", directory=str(tmp_path / "entry"), ptx_path=None, ptx=None, defects=()))
    monkeypatch.setenv("GEMMC_SM80_COMPILE_ARCH", "sm_90a")
    assert main(["build", *GEMM_ARGS, "--arch", "sm_80", "--cache-dir", str(tmp_path / "c")]) == 0
    assert "(sm_80, compiled for sm_90a)" in capsys.readouterr().out.splitlines()[0]
    monkeypatch.delenv("GEMMC_SM80_COMPILE_ARCH")
    assert main(["build", *GEMM_ARGS, "--arch", "sm_80", "--cache-dir", str(tmp_path / "c")]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[2] == "(sm_80)"

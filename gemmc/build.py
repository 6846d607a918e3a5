"""Compile an `EmittedKernel` (CuTe DSL source) into a TVM-FFI shared object, with its PTX.

    load_module(emitted)    the emitted source as an imported module (CuTe DSL reads its AST from the file)
    fake_arguments(emitted) one fake per Param (symbolic dims, 16-B alignment) + the env-stream placeholder
    compile_emitted(...)    cute.compile(..., options="--enable-tvm-ffi --gpu-arch <arch>") -> compiled object
    jit_callable(emitted)   compile in this process -> a runtime.Launcher (validates, allocates, launches)
    ptxas_report(emitted)   compile and read ptxas's -v report per kernel entry (registers, spill bytes)
    build(emitted, cache)   export_to_c + `$CC -shared` -> Artifact(.so, .ptx, .py) in the kernel cache

A built .so is native code of the build host's OS and CPU: the key names them (`host_platform`), so a cache
built on x86-64 never serves an aarch64 host (GH200) a .so it cannot load.

Everything that imports `cutlass` is inside a function: importing this module stays cheap and
GPU hosts without the DSL compiler never reach those paths (they load artifacts through gemmc.runtime).

PTX: the DSL writes it when compiled with `--keep-ptx --dump-dir <dir>` and exposes the text as the
compiled object's `__ptx__`; we compile into a private temp dir and store the text beside the .so.
The arch is passed as `--gpu-arch`: `CUTE_DSL_ARCH` is read once when cutlass is first imported, so
setting it later has no effect (we still set it for the duration of the compile, for code that reads it).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .alignment import alignment_elems, param_align_bytes
from .backends import GROUP_ROLES, EmittedKernel, Param
from .cache import (STALE_S, Artifact, KernelCache, cache_key, default_cache, default_cache_dir,
                    dsl_version_from_metadata, share, unwritable_cache_error, versions)
from .errors import BuildError
from .runtime import is_batched
from .types import DType

_MODULES: dict[str, object] = {}
_COMPILE_LOCK = threading.Lock()     # the DSL's compiler state is process-global


# -- the emitted source as a module ------------------------------------------------------------------

def source_digest(emitted: EmittedKernel) -> str:
    return hashlib.sha256(emitted.source.encode()).hexdigest()


def _sweep_sources(src_dir: Path) -> None:
    """Remove temp sources (`.<digest>-*.py`) that a killed or failed write left, once they are STALE_S old."""
    now = time.time()
    for p in src_dir.glob(".*.py"):
        try:
            if now - p.stat().st_mtime >= STALE_S:
                p.unlink()
        except OSError:
            continue


def _write_source(src_dir: Path, path: Path, digest: str, source: str) -> None:
    cache_root = src_dir.parent
    try:
        src_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{digest[:12]}-", suffix=".py", dir=src_dir)
    except OSError as e:
        raise unwritable_cache_error(cache_root, e) from e
    try:
        with os.fdopen(fd, "w") as f:
            f.write(source)
        share(tmp)                  # mkstemp makes it 0600; other accounts build from this cache too
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise BuildError(f"writing the emitted source into the kernel cache {cache_root} failed ({path.name}): "
                         f"{e.strerror or e}. Free space there, or set GEMMC_CACHE_DIR (`gemmc build "
                         "--cache-dir DIR`) to another folder") from e
    _sweep_sources(src_dir)


def load_module(emitted: EmittedKernel, cache_root: Optional[Path] = None):
    """Write `emitted.source` to `<cache_root>/sources/<sha256>.py` and import it (once per process).
    `cache_root`: the cache being built into (default: GEMMC_CACHE_DIR's), so a build into an explicit
    KernelCache writes nothing anywhere else."""
    digest = source_digest(emitted)
    mod = _MODULES.get(digest)
    if mod is not None:
        return mod
    src_dir = Path(cache_root if cache_root is not None else default_cache_dir()) / "sources"
    path = src_dir / f"{digest}.py"
    try:
        current = path.read_text()
    except OSError:
        current = None
    if current != emitted.source:
        _write_source(src_dir, path, digest, emitted.source)
    name = f"gemmc_emitted_{digest[:16]}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod           # inspect/getsource and dataclasses look the module up by name
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        sys.modules.pop(name, None)
        raise BuildError(f"the emitted source for {emitted.entry!r} does not import ({path}): "
                         f"{type(e).__name__}: {e}") from e
    if not hasattr(mod, emitted.entry):
        raise BuildError(f"the emitted source {path} has no function {emitted.entry!r} (EmittedKernel.entry)")
    _MODULES[digest] = mod
    return mod


# -- fake arguments ---------------------------------------------------------------------------------

def _cutlass_dtype(dtype: DType):
    import cutlass
    return {
        DType.bf16: cutlass.BFloat16, DType.f16: cutlass.Float16, DType.f32: cutlass.Float32,
        DType.f8e4m3: cutlass.Float8E4M3FN, DType.f8e5m2: cutlass.Float8E5M2, DType.i32: cutlass.Int32,
    }[dtype]


def contiguous_index(p: Param) -> int:
    return p.contiguous % len(p.shape) if p.shape else 0


def dim_divisibility(params) -> dict[str, int]:
    """Each named dim's divisibility hint: 16 B worth of elements if it is the contiguous dim of a matrix.
    Epilogue vectors ((N,), (M,), or in a batched kernel (L, N) / (L, M), whatever its batch dim is called
    or however big) set none: a column vector must not force M to a multiple of 4 or 8."""
    batched = is_batched(params)
    div: dict[str, int] = {}
    for p in params:
        if p.kind != "tensor" or p.role == "scale":    # fp8 scales are read one f32 at a time
            continue
        if p.role in GROUP_ROLES:      # a grouped GEMM's offsets or counts: any length
            div.update({d: div.get(d, 1) for d in p.shape if isinstance(d, str)})
            continue
        if p.role == "input" and (len(p.shape) == 1 or (batched and len(p.shape) == 2)):
            continue
        for i, d in enumerate(p.shape):
            if isinstance(d, str):
                hint = alignment_elems(p.dtype) if i == contiguous_index(p) else 1
                div[d] = max(div.get(d, 1), hint)
    return div


# Bumped whenever fake_arguments changes what it hands `cute.compile`: the .so changes with it.
# 3: batched kernels' vectors set no divisibility hint whatever the batch dim is called (was: only "L").
FAKE_ARGUMENTS_REVISION = 3


def _fake_extent(d, syms):
    """A named dim's shared symbol, or a static extent. A static extent of 1 is compiled as a fresh symbol:
    CuTe coalesces a static size-1 mode away, so the TMA copy drops to 1-D under a 2-D swizzled box, and
    the kernel dies with an illegal instruction. The prologue then cannot check it, so the launcher's fast
    path does (runtime.Launcher._unit_dims) before every launch."""
    import cutlass.cute as cute

    if isinstance(d, str):
        return syms[d]
    return cute.sym_int() if int(d) == 1 else int(d)


def fake_arguments(emitted: EmittedKernel) -> list:
    """One fake per Param, then a fake stream bound to TVM-FFI's env stream (torch's current stream).

    Tensors get stride 1 on the contiguous dim and a symbolic 64-bit stride (divisible by 16 B) on every
    other dim, so padded leading dimensions and batch strides work; named dims share one `sym_int` each.
    """
    import cutlass
    import cutlass.cute as cute

    syms = {name: cute.sym_int(divisibility=div, symbol=name)
            for name, div in dim_divisibility(emitted.params).items()}
    fakes = []
    for p in emitted.params:
        if p.kind == "tensor":
            if not p.shape:
                raise BuildError(f"tensor param {p.name!r} has no shape")
            c = contiguous_index(p)
            shape = tuple(_fake_extent(d, syms) for d in p.shape)
            align = param_align_bytes(p.role)
            stride = tuple(1 if i == c else cute.sym_int64(divisibility=max(1, align // p.dtype.bytes))
                           for i in range(len(shape)))
            # fp8 scales and a grouped GEMM's offsets or counts are read 4 bytes at a time (param_align_bytes)
            fakes.append(cute.runtime.make_fake_tensor(_cutlass_dtype(p.dtype), shape, stride,
                                                       assumed_align=align))
        elif p.kind in ("workspace", "semaphore"):
            fakes.append(cute.runtime.make_fake_compact_tensor(
                _cutlass_dtype(p.dtype), (cute.sym_int(divisibility=4 if p.kind == "workspace" else 1),),
                assumed_align=16 if p.kind == "workspace" else 4))
        elif p.kind == "scalar":
            fakes.append(cutlass.Float32(0.0))
        else:
            raise BuildError(f"param {p.name!r} has unknown kind {p.kind!r}; use tensor, scalar, workspace or semaphore")
    fakes.append(cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True))
    return fakes


# -- compile ----------------------------------------------------------------------------------------

@contextlib.contextmanager
def _arch_env(arch: str):
    old = os.environ.get("CUTE_DSL_ARCH")
    os.environ["CUTE_DSL_ARCH"] = arch
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CUTE_DSL_ARCH", None)
        else:
            os.environ["CUTE_DSL_ARCH"] = old


def compile_arch(emitted: EmittedKernel) -> str:
    return emitted.compile_arch or emitted.arch


def compile_emitted(emitted: EmittedKernel, *, ptx_dir: Optional[str] = None, cache_root: Optional[Path] = None,
                    ptxas_log: Optional[str] = None):
    """`cute.compile` the entry with fake arguments; with `ptx_dir`, the PTX is kept (see `obj.__ptx__`).
    `cache_root`: where the source is written (see `load_module`). `ptxas_log`: a file the DSL writes its
    ptxas's `-v` report into (as a YAML remark; see `ptxas_report`)."""
    import cutlass.cute as cute

    fn = getattr(load_module(emitted, cache_root), emitted.entry)
    arch = compile_arch(emitted)
    options = f"--enable-tvm-ffi --gpu-arch {arch}"
    if ptx_dir is not None:
        options += f" --keep-ptx --dump-dir {ptx_dir}"
    if ptxas_log is not None:
        options += f" remarks{{ptx}} --remark-output {ptxas_log}"
    with _COMPILE_LOCK, _arch_env(arch):
        try:
            return cute.compile(fn, *fake_arguments(emitted), options=options)
        except BuildError:
            raise
        except Exception as e:
            raise BuildError(f"cute.compile failed for {emitted.entry!r} ({arch}): "
                             f"{type(e).__name__}: {e}") from e


def compile_with_ptx(emitted: EmittedKernel, cache_root: Optional[Path] = None):
    """(compiled object, PTX text)."""
    with tempfile.TemporaryDirectory(prefix="gemmc-ptx-") as d:
        obj = compile_emitted(emitted, ptx_dir=d, cache_root=cache_root)
        ptx = obj.__ptx__
    if not ptx or not ptx.lstrip().startswith(("//", ".version")):
        raise BuildError(f"the DSL produced no PTX for {emitted.entry!r} (got {str(ptx)[:80]!r})")
    return obj, ptx


@dataclass(frozen=True)
class PtxasReport:
    """What ptxas reports for one kernel entry of a compile (`ptxas -v`)."""
    entry: str
    registers: int          # per thread at launch; setmaxnreg redistributes them between warpgroups
    stack_bytes: int
    spill_stores: int       # bytes
    spill_loads: int

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


_PTXAS_ENTRY = re.compile(r"Compiling entry function '+([^']+)'+")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


def parse_ptxas_log(text: str) -> list[PtxasReport]:
    """The per-entry reports in a ptxas `-v` log (or the DSL's remark file holding one)."""
    reports = []
    starts = list(_PTXAS_ENTRY.finditer(text))
    for i, m in enumerate(starts):
        block = text[m.end():starts[i + 1].start() if i + 1 < len(starts) else len(text)]
        frame, regs = _PTXAS_FRAME.search(block), _PTXAS_REGS.search(block)
        if frame is None or regs is None:
            raise BuildError(f"the ptxas report of {m.group(1)!r} names no register count or spill bytes: "
                             f"{block.strip()[:200]!r}")
        reports.append(PtxasReport(m.group(1), int(regs.group(1)), *map(int, frame.groups())))
    return reports


def ptxas_report(emitted: EmittedKernel, cache_root: Optional[Path] = None) -> list[PtxasReport]:
    """Compile `emitted` on this machine (no GPU needed) and return what the DSL's own ptxas reported for
    each kernel entry: the registers and spills of the cubin it ships, not of another ptxas's build."""
    with tempfile.TemporaryDirectory(prefix="gemmc-ptxas-") as d:
        log = os.path.join(d, "ptxas.yaml")
        compile_emitted(emitted, cache_root=cache_root, ptxas_log=log)
        try:
            text = Path(log).read_text()
        except OSError as e:
            raise BuildError(f"the DSL wrote no ptxas report for {emitted.entry!r} ({e}): does this "
                             "nvidia-cutlass-dsl support the remarks{ptx} compile option?") from e
    reports = parse_ptxas_log(text)
    if not reports:
        raise BuildError(f"the ptxas report for {emitted.entry!r} names no kernel entry: {text[:200]!r}")
    return reports


def jit_callable(emitted: EmittedKernel):
    """Compile in this process (needs a GPU host to launch) and wrap it in a validating Launcher."""
    from .runtime import Launcher
    compiled = compile_emitted(emitted)
    # The compiled object wraps the C function in a Python kwargs shim; positional calls can skip it.
    function = getattr(compiled, "_tvm_ffi_function", None) or compiled
    launcher = Launcher(emitted.params, function=function, name=emitted.entry)
    launcher.compiled = compiled          # keeps the JIT engine (and its PTX) alive with the launcher
    return launcher


# -- AOT build --------------------------------------------------------------------------------------

def host_platform() -> str:
    """The OS and CPU the linked .so is native code for, e.g. "linux-x86_64"."""
    return f"{sys.platform}-{platform.machine()}"


def key_material(emitted: EmittedKernel) -> str:
    """What identifies a compiled kernel: its source, entry, params, compile arch and the host it links for."""
    params = [param_to_dict(p) for p in emitted.params]
    return json.dumps({"source": emitted.source, "entry": emitted.entry, "params": params,
                       "compile_arch": compile_arch(emitted), "fakes": FAKE_ARGUMENTS_REVISION,
                       "host": host_platform()}, sort_keys=True)


def emitted_key(emitted: EmittedKernel, material: Optional[str] = None,
                cache: Optional[KernelCache] = None) -> str:
    """Cache key. With `material` (the lowered IR text) the emitted source's digest is still mixed in:
    while a backend is being changed gemmc's version stays put, and a stale .so must not be served.
    `cache`: the cache it is looked up in (a host without nvidia-cutlass-dsl metadata reads the
    compiler's version from it; see gemmc.cache.dsl_version)."""
    version_info = cache.versions() if cache is not None else versions()
    if material is None:
        return cache_key(key_material(emitted), emitted.arch, version_info)
    return cache_key(json.dumps({"ir": material, "emitted": hashlib.sha256(key_material(emitted).encode())
                                 .hexdigest()}, sort_keys=True), emitted.arch, version_info)


def param_to_dict(p: Param) -> dict:
    d = {"name": p.name, "kind": p.kind, "dtype": str(p.dtype), "shape": list(p.shape),
         "contiguous": p.contiguous, "role": p.role, "workspace_elems": p.workspace_elems}
    if p.limits:        # only where set: every other kernel keeps its cache key
        d["limits"] = [list(x) for x in p.limits]
    return d


def _runtime_flavor(libs: list[str]) -> str:
    """"cu13" / "cu12": which CUDA build of libcute_dsl_runtime the .so was linked against."""
    for lib in libs:
        if lib.endswith("libcute_dsl_runtime.so"):
            return Path(lib).parent.parent.name
    return ""


def c_compiler() -> list[str]:
    """The command that links kernel .so files: $CC (split as a shell would, e.g. "ccache gcc"), else gcc, else
    cc. Checked before a compile, so a host that cannot link fails in a moment, not after the DSL's compile."""
    cc = os.environ.get("CC", "").strip()
    if not cc:
        found = shutil.which("gcc") or shutil.which("cc")
        if found is None:
            raise BuildError("no C compiler to link the kernel .so (neither gcc nor cc is on PATH): install gcc, "
                             "or set CC to a C compiler")
        return [found]
    try:
        cmd = shlex.split(cc)
    except ValueError as e:
        raise BuildError(f"CC={cc!r} is not a command line ({e}); set CC to a C compiler, e.g. CC=gcc") from None
    if not cmd or shutil.which(cmd[0]) is None:
        raise BuildError(f"CC={cc!r}: {(cmd or [cc])[0]!r} is not an executable on PATH; set CC to a C "
                         "compiler (e.g. CC=gcc), or unset it to use gcc")
    return cmd


def link_shared(obj_path: str, so_path: str, libs: list[str], cc: Optional[list[str]] = None) -> None:
    cc = cc or c_compiler()
    cmd = [*cc, "-shared", "-o", so_path, obj_path, *libs]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:        # not a cache write: keep cache._build from blaming the disk
        raise BuildError(f"running the C compiler {cmd[0]!r} to link the kernel .so failed: {e.strerror or e}; "
                         "set CC to a working C compiler") from e
    if proc.returncode != 0:
        out = (proc.stderr.strip() or proc.stdout.strip() or "(it printed nothing)")
        raise BuildError(f"linking the kernel .so failed: {cmd[0]} exited with status {proc.returncode}:\n{out}\n"
                         f"  command: {shlex.join(cmd)}\n  Fix that compiler, or set CC to another one")


def compiler_available() -> bool:
    """Whether this host has the CuTe DSL compiler (`cutlass`), without importing it."""
    try:
        return importlib.util.find_spec("cutlass") is not None
    except (ImportError, ValueError):       # e.g. sys.modules["cutlass"] = None
        return False


def _record_runtime_libraries(cache: KernelCache) -> None:
    dsl = dsl_version_from_metadata()
    if dsl is not None:
        cache.record_runtime_libraries(dsl)


def _version_text(v: dict) -> str:
    return ", ".join(f"{name} {v.get(name, '?')}" for name in ("gemmc", "nvidia-cutlass-dsl", "apache-tvm-ffi"))


def _how_built_otherwise(emitted: EmittedKernel, meta: dict, here: dict) -> str:
    """How an entry holding the same kernel source was built differently from what this host asks for."""
    built = meta.get("versions", {})
    diff = [f"{n} {built.get(n, '?')} (here {here[n]})" for n in here if built.get(n) != here[n]]
    how = [f"with other versions: {', '.join(diff)}"] if diff else []
    if meta.get("compile_arch", compile_arch(emitted)) != compile_arch(emitted):
        how.append(f"for {meta['compile_arch']} (here {compile_arch(emitted)}: GEMMC_SM80_COMPILE_ARCH must "
                   "be the same on both hosts)")
    if meta.get("host", host_platform()) != host_platform():
        how.append(f"on a {meta['host']} host (a .so is native code: build on a {host_platform()} host)")
    return "; ".join(how) or "with other params or kernel IR (another gemmc checkout of the same version?)"


def explain_unbuildable(emitted: EmittedKernel, cache: KernelCache, key: str, why: str) -> str:
    """Why the cache cannot serve `emitted` on a host that cannot compile it, and how to fix that."""
    here = cache.versions()
    lines = [f"{emitted.entry} ({emitted.arch}) is not in the kernel cache {cache.root} in a form this host can "
             "run, and this host cannot build it: it has no CuTe DSL compiler (`import cutlass`, from "
             "nvidia-cutlass-dsl).",
             f"  {cache.entry_dir(key)}: {why}"]
    digest = hashlib.sha256(emitted.source.encode()).hexdigest()
    others = [(d, m) for d, m in cache.entries() if d.name != key
              and m.get("meta", {}).get("arch") == emitted.arch
              and m.get("files", {}).get("kernel.py", {}).get("sha256") == digest]
    for d, m in others[:3]:
        lines.append(f"  {d} holds this kernel built {_how_built_otherwise(emitted, m.get('meta', {}), here)}")
    if here["nvidia-cutlass-dsl"] == "unknown":
        from .cache import RUNTIME_LIBS, runtime_library_fingerprints
        libs = ", ".join(p for p, _ in runtime_library_fingerprints()) or "none found"
        lines.append(f"  This host has no nvidia-cutlass-dsl package metadata, and no build recorded the version "
                     f"of its runtime library ({libs}) in {cache.root / RUNTIME_LIBS}: `gemmc build` records it, "
                     "also on a hit (run it again where the cache was built); or install the "
                     "nvidia-cutlass-dsl-libs packages here")
    lines.append(f"  Fix: build it on a machine with nvidia-cutlass-dsl and the same versions ({_version_text(here)}) "
                 "with `gemmc build` (same problem and schedule) or `.build()`, into a cache you then copy here "
                 "(GEMMC_CACHE_DIR), or install nvidia-cutlass-dsl here.")
    return "\n".join(lines)


def build(emitted: EmittedKernel, cache: Optional[KernelCache] = None, *,
          material: Optional[str] = None) -> Artifact:
    """Build (or fetch) the kernel's .so + .ptx in the cache. `material` (e.g. the lowered IR text)
    replaces the emitted source as the key's identity when given. An entry whose kernel.ptx or kernel.py is
    missing or damaged is rebuilt; where that cannot be done (no compiler here, or a cache this host cannot
    write) it is still served, since its .so runs (`Artifact.defects` says what is wrong). On a host without
    the compiler a miss is a BuildError that says which entry and why."""
    cache = cache if cache is not None else default_cache()
    key = emitted_key(emitted, material, cache)
    art = cache.lookup(key)
    can_compile = compiler_available()
    if art is not None and (not art.defects or not can_compile):
        _record_runtime_libraries(cache)
        return art
    if not can_compile:
        raise BuildError(explain_unbuildable(emitted, cache, key, cache.inspect(key)[1]))
    function_name = f"gemmc_{key[:16]}"

    def builder(staging: Path) -> dict:
        cc = c_compiler()          # before the compile: a host that cannot link says so at once
        import cutlass.cute as cute
        obj, ptx = compile_with_ptx(emitted, cache.root)
        obj_path = staging / "kernel.o"
        try:
            obj.export_to_c(str(obj_path), function_name=function_name)
        except Exception as e:
            raise BuildError(f"export_to_c failed for {emitted.entry!r}: {type(e).__name__}: {e}") from e
        libs = cute.runtime.find_runtime_libraries(enable_tvm_ffi=True)
        link_shared(str(obj_path), str(staging / "kernel.so"), libs, cc)
        obj_path.unlink()
        (staging / "kernel.ptx").write_text(ptx)
        (staging / "kernel.py").write_text(emitted.source)
        return {
            "function": function_name,
            "entry": emitted.entry,
            "arch": emitted.arch,
            "compile_arch": compile_arch(emitted),
            "params": [param_to_dict(p) for p in emitted.params],
            "runtime_flavor": _runtime_flavor(libs),
            "versions": cache.versions(),
            "host": host_platform(),
        }

    try:
        built = cache.get_or_build(key, builder)
    except BuildError as e:
        if art is None:
            raise
        return _serve_unrepaired(art, e)
    _record_runtime_libraries(cache)
    return built


def _serve_unrepaired(art: Artifact, error: BuildError) -> Artifact:
    """A runnable entry (only kernel.ptx or kernel.py at fault) that this host failed to rebuild, e.g. in a
    read-only cache another account built: run it as it is, as a host without the compiler does."""
    warnings.warn(f"gemmc: the cache entry {art.directory} runs, but {'; '.join(art.defects)}, and rebuilding it "
                  f"failed ({error}); it is served as it is", stacklevel=3)
    return art

"""`CompiledKernel`: the user-facing callable that `gemmc.compile(...)` returns.

    k.source      the emitted CuTe DSL source (readable Python)
    k.ptx         the PTX (builds the kernel if it is not cached yet)
    k.build()     build into the cache (works without a GPU) -> Artifact
    k(a, b, ...)  validate, allocate the output, launch on torch's current stream -> output tensor

Loading a cached kernel never imports `cutlass`; only a cache miss (or a corrupt entry) compiles.
"""
from __future__ import annotations

import warnings
from typing import Optional

from .backends import EmittedKernel
from .cache import Artifact, KernelCache, default_cache
from .errors import BuildError


class CompiledKernel:
    def __init__(self, emitted: EmittedKernel, *, material: Optional[str] = None,
                 cache: Optional[KernelCache] = None, plan=None, spec=None, schedule=None, signature=None):
        """`material` is the key's identity (e.g. the lowered IR text); default: the emitted source.
        `plan`, `spec`, `schedule` are kept for inspection only. `signature` (a runtime.CallSignature): the
        arguments calls pass instead of the kernel's (a, b, *inputs), e.g. a @gemmc.kernel function's own."""
        self.emitted = emitted
        self.signature = signature
        self.material = material
        self.plan = plan
        self.spec = spec
        self.schedule = schedule
        self._cache = cache
        self._artifact: Optional[Artifact] = None
        self._launcher = None

    # -- inspection --
    @property
    def source(self) -> str:
        return self.emitted.source

    @property
    def arch(self) -> str:
        return self.emitted.arch

    @property
    def params(self):
        return self.emitted.params

    @property
    def cache(self) -> KernelCache:
        return self._cache if self._cache is not None else default_cache()

    @property
    def key(self) -> str:
        from .build import emitted_key
        return emitted_key(self.emitted, self.material, self.cache)

    # -- build --
    def build(self) -> Artifact:
        """The cached artifact (.so + .ptx), compiling on a miss."""
        if self._artifact is None:
            from .build import build
            self._artifact = build(self.emitted, self.cache, material=self.material)
        return self._artifact

    @property
    def ptx(self) -> str:
        art = self.build()
        if art.ptx_path is None:        # served for running by a host that cannot rebuild it (see build.build)
            why = "; ".join(art.defects) or "the entry has no kernel.ptx"
            raise BuildError(f"no PTX for {self.emitted.entry}: in the cache entry {art.directory}, {why}. The "
                             "kernel still runs; to restore its PTX, build it again on a machine with "
                             "nvidia-cutlass-dsl (`gemmc build`, same problem and schedule, or `.build()`) into "
                             "this cache")
        return art.ptx

    @property
    def so_path(self) -> str:
        return self.build().so_path

    # -- run --
    def _rebuild_after_load_error(self, error: Exception):
        """The cached .so failed its hash or is not a whole shared object (runtime.DamagedKernelError):
        rebuild it once. A host without the compiler leaves the entry for a build host to replace."""
        from .build import compiler_available
        from .runtime import load_function
        art = self.build()
        if not compiler_available():
            raise BuildError(f"the cached kernel {art.so_path} is damaged ({error}), and this host cannot rebuild "
                             "it: it has no CuTe DSL compiler (nvidia-cutlass-dsl). Build it again on a machine "
                             "that has (`gemmc build`, same problem and schedule, or `.build()`) and copy the "
                             f"cache ({self.cache.root}) here") from error
        warnings.warn(f"gemmc: the cache entry {art.directory} is damaged ({error}); rebuilding it", stacklevel=3)
        self.cache.invalidate(art.key)
        self._artifact = None
        art = self.build()
        return load_function(art.so_path, art.meta["function"], art.meta.get("runtime_flavor", ""),
                             art.so_sha256)

    @property
    def launcher(self):
        if self._launcher is None:
            from .runtime import launcher_from_artifact
            self._launcher = launcher_from_artifact(self.build(), on_load_error=self._rebuild_after_load_error,
                                                    signature=self.signature,
                                                    zero_k=self._zero_k if self.spec is not None else None)
        return self._launcher

    def _zero_k(self, a, b, inputs, out):
        """A call with K = 0: the accumulator is 0 and the output is the epilogue of it (gemmc.reference's,
        in f32, rounded once)."""
        from .reference import reference
        out.copy_(reference(self.spec, a, b, inputs))

    def __call__(self, *args, out=None, **named):
        return self.launcher(*args, out=out, **named)

    def __repr__(self) -> str:
        names = (self.signature.usage if self.signature is not None
                 else ", ".join(p.name for p in self.emitted.params))
        return f"<gemmc.CompiledKernel {self.emitted.entry}({names}) arch={self.emitted.arch}>"

"""An edited private copy of the SM90 kernel modules, for the diagnostic scripts (gpu_floor.py, cta_trace.py).

A diagnostic variant of a kernel (its MMA removed, timestamps added, ...) is the same generated module built
over a copy of gemmc/backends/sm90/kernel whose source the script has edited as text. The copy is a package
of its own (named after the digest of its source, so the kernel cache keeps every variant apart), imported
once per process; the generated module's import of the kernel package is pointed at it. gemmc's own modules
are never touched.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import sys
import tempfile
from pathlib import Path

from gemmc.backends.sm90 import kernel as sm90_kernel
from gemmc.compiled import CompiledKernel

KERNEL_DIR = Path(sm90_kernel.__file__).resolve().parent
KERNEL_IMPORT = "from gemmc.backends.sm90.kernel import "


def kernel_sources() -> dict[str, str]:
    """The kernel modules' source by module name (`consumer`, `gemm`, ...; `__init__` included)."""
    return {p.stem: p.read_text() for p in sorted(KERNEL_DIR.glob("*.py"))}


def expect(found: int, want, what: str, script: str) -> None:
    """Refuse an edit whose anchor is not where the script expects it (`want` None: at least once)."""
    if (want is None and found == 0) or (want is not None and found != want):
        raise ValueError(f"{what}: found {found} in the kernel modules, expected {want or 'some'} "
                         f"(the SM90 kernel modules changed; update scripts/{script})")


def _package(sources: dict[str, str]) -> str:
    """Import `sources` as a package (once per process for the same source); its name."""
    digest = hashlib.sha256("\0".join(f"{n}\0{t}" for n, t in sorted(sources.items())).encode()).hexdigest()
    name = f"gemmc_kernel_edit_{digest[:16]}"
    if name in sys.modules:
        return name
    root = Path(tempfile.mkdtemp(prefix=f"{name}-")) / name
    root.mkdir()
    for module, text in sources.items():
        (root / f"{module}.py").write_text(text)
    spec = importlib.util.spec_from_file_location(name, root / "__init__.py", submodule_search_locations=[str(root)])
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    spec.loader.exec_module(package)
    return name


def edited_kernel(kernel, sources: dict[str, str], script: str) -> CompiledKernel:
    """`kernel` (an SM90 CompiledKernel) built over the kernel modules `sources` instead of gemmc's."""
    generated = kernel.emitted.source
    expect(generated.count(KERNEL_IMPORT), 1, "the generated module's import of the kernel package", script)
    generated = generated.replace(KERNEL_IMPORT, f"from {_package(sources)} import ", 1)
    return CompiledKernel(dataclasses.replace(kernel.emitted, source=generated))

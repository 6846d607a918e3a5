"""SM80 backend: a multistage cp.async + ldmatrix + mma.sync kernel emitted from a `KernelPlan`.

    emit(plan, compile_arch=None) -> EmittedKernel

The kernel uses only Ampere instructions, so it also runs on Hopper. The plan says what it is built for
(plan.pipeline.compile_arch: pipeline-staging reads $GEMMC_SM80_COMPILE_ARCH, else sm_80); pass
compile_arch="sm_90a" (or `dataclasses.replace(k, compile_arch="sm_90a")`) to build it for an H100/H200.
"""
from .emit import emit, SM80_COMPILE_ARCHS  # noqa: F401

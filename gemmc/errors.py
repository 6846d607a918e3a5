"""Exception types. Every message says what was wrong and how to fix it."""


class GemmcError(Exception):
    """Base class of every error gemmc raises on purpose."""


class SpecError(GemmcError, ValueError):
    """The GEMM description is malformed or unsupported (dtype, layout, epilogue)."""


class TraceError(SpecError):
    """A `@gemmc.kernel` function used a construct gemmc cannot compile."""


class ScheduleError(GemmcError, ValueError):
    """A schedule violates a hardware limit or a divisibility rule."""

    def __init__(self, violations):
        self.violations = list(violations)
        lines = "\n".join(f"  - {v}" for v in self.violations)
        super().__init__(f"invalid schedule:\n{lines}")


class LaunchError(GemmcError, ValueError):
    """Arguments passed to a compiled kernel do not match what it was built for."""


class BuildError(GemmcError, RuntimeError):
    """The backend failed to compile or link a kernel."""


class PerformanceWarning(UserWarning):
    """The kernel runs and is correct, but slower than it should be (e.g. built for another GPU's SM count)."""

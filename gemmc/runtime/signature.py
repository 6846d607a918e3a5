"""The arguments a caller passes and how they bind to a kernel's (CallSignature)."""
from __future__ import annotations

from typing import Any, Sequence

from ..errors import LaunchError


_MISSING = object()


class CallSignature:
    """The arguments a caller passes, in order and by name, and how they bind: too many, unknown, repeated
    or missing ones raise a LaunchError naming the parameters; trailing parameters with defaults may be left
    out. A Launcher built with one takes these arguments instead of the kernel's (a, b, *inputs): a
    @gemmc.kernel function's own (gemmc.dsl.Kernel.call_signature).

    `names`: the caller's parameter names, in call order. `operands`: (kernel param, caller's name) pairs for
    the params the caller names otherwise, e.g. (("a", "x"), ("b", "w")). `defaults`: (name, value) pairs.
    `declared`: (name, declared shape) of vectors declared with unit dims, e.g. ("c", ("M", 1)): the caller
    passes that shape and the kernel gets a view without the unit dims.
    """

    def __init__(self, name: str, names: Sequence[str], *, operands: Sequence[tuple[str, str]] = (),
                 defaults: Sequence[tuple[str, Any]] = (), declared: Sequence[tuple[str, tuple]] = ()):
        self.name = name
        self.names = tuple(names)
        self.operands = tuple(operands)
        self.defaults = dict(defaults)
        self.declared = tuple(declared)
        self.usage = ", ".join(self.names)
        self._position = {n: j for j, n in enumerate(self.names)}
        unknown = [n for n in (*self.defaults, *(d for d, _ in self.declared)) if n not in self._position]
        if unknown:
            raise LaunchError(f"{name}: defaults or declared shapes for {unknown}, which are not among its "
                              f"arguments ({self.usage})")

    def __repr__(self) -> str:
        return f"<gemmc.CallSignature {self.name}({self.usage})>"

    def position(self, name: str) -> int:
        return self._position[name]

    def bind(self, args: Sequence, named: dict) -> tuple:
        """The call's arguments in `names` order, defaults filled in; LaunchError if they do not bind."""
        n = len(self.names)
        if len(args) == n and not named:
            return tuple(args)
        if len(args) > n:
            raise LaunchError(f"{self.name} takes {n} arguments ({self.usage}), got {len(args)} positional")
        values = list(args) + [_MISSING] * (n - len(args))
        for key, v in named.items():
            j = self._position.get(key)
            if j is None:
                raise LaunchError(f"{self.name} has no argument {key!r}; its arguments are: {self.usage} "
                                  "(and out=)")
            if values[j] is not _MISSING:
                raise LaunchError(f"{self.name}: argument {key!r} given twice (positionally and by name)")
            values[j] = v
        for j, v in enumerate(values):
            if v is _MISSING:
                name = self.names[j]
                if name not in self.defaults:
                    raise LaunchError(f"{self.name}: missing argument {name!r}; call it as {self.name}({self.usage})")
                values[j] = self.defaults[name]
        return tuple(values)

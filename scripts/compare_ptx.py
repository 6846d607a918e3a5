"""Compile a sample of SM90 schedules with the old, text-spliced emitter and with the current backend, and
compare the PTX: the evidence, without a GPU, that rewriting the backend left the kernels alone.

The old emitter is gemmc/backends/sm90/emit.py as of commit OLD_COMMIT, loaded from git into a temporary
module of the gemmc.backends.sm90 package (its relative imports resolve against this checkout). The PTX is
normalised (kernel and parameter names, labels, register numbers) and compared per schedule: identical,
or the instruction counts by opcode that differ.

    CUTE_DSL_ARCH=sm_90a python scripts/compare_ptx.py                  # the covering sample of compile_schedules.py
    CUTE_DSL_ARCH=sm_90a python scripts/compare_ptx.py --stride 40      # every 40th admitted schedule
    CUTE_DSL_ARCH=sm_90a python scripts/compare_ptx.py --keep /tmp/ptx  # keep both PTX files per schedule

The old emitter's PTX is cached under --old-cache (keyed by spec and schedule), so a rerun compiles only
the new side.
"""
import argparse
import collections
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

OLD_COMMIT = "7390398"
ROOT = Path(__file__).resolve().parent.parent


def old_emitter(commit: str = OLD_COMMIT):
    """gemmc/backends/sm90/emit.py at `commit`, as the module gemmc.backends.sm90._emit_at_<commit>."""
    import gemmc.backends.sm90  # noqa: F401  (the package its relative imports resolve in)
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:gemmc/backends/sm90/emit.py"],
                          check=True, capture_output=True, text=True).stdout
    d = Path(tempfile.mkdtemp(prefix="gemmc-old-emit-"))
    path = d / "emit.py"
    path.write_text(text)
    name = f"gemmc.backends.sm90._emit_at_{commit}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


_LABEL = re.compile(r"\$L__\w+")
_REG = re.compile(r"%(r|rd|p|f|fd|h|hh|rs|b|bs)\d+")
_ENTRY = re.compile(r"(\.entry|\.func)\s+(\S+?)\(")


def normalise(ptx: str) -> list[str]:
    """Instruction and directive lines with names, labels and register numbers abstracted."""
    names = {}
    for m in _ENTRY.finditer(ptx):
        names.setdefault(m.group(2), f"K{len(names)}")
    out = []
    for line in ptx.splitlines():
        line = line.split("//")[0].strip()
        if not line or line.startswith((".file", ".loc", ".section")):
            continue
        for old, new in names.items():
            line = line.replace(old, new)
        line = _LABEL.sub("$L", line)
        line = _REG.sub(lambda m: "%" + m.group(1), line)
        line = re.sub(r"\s+", " ", line)
        out.append(line)
    return out


def opcodes(lines: list[str]) -> collections.Counter:
    """Instruction counts by opcode (the mnemonic with its modifiers; a predicate guard dropped)."""
    c = collections.Counter()
    for line in lines:
        if line.startswith((".", "$L", "{", "}", ")", "(")) or not line.endswith(";"):
            continue
        if line.startswith("@"):
            line = line.split(" ", 1)[1]
        c[line.split(" ", 1)[0].rstrip(";")] += 1
    return c


def sample(stride: int):
    import gemmc
    from compile_schedules import covering_sample
    from source_hashes import specs
    items = [(name, s) for name, (spec, arch) in specs().items() if arch == "sm_90a"
             for s in gemmc.enumerate_schedules(spec, arch)]
    if stride:
        return items[::stride]
    return [(n, s) for n, _, s in covering_sample([(n, "sm_90a", s) for n, s in items])]


def ptx_of(emitted) -> str:
    from gemmc.build import compile_with_ptx
    return compile_with_ptx(emitted)[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stride", type=int, default=0, help="every STRIDE-th admitted schedule (default: the "
                    "covering sample)")
    ap.add_argument("--commit", default=OLD_COMMIT, help="the commit whose emit.py is the old emitter")
    ap.add_argument("--old-cache", default=os.path.join(tempfile.gettempdir(), "gemmc-old-ptx"),
                    help="where the old emitter's PTX is kept between runs")
    ap.add_argument("--keep", default="", help="a folder to write both PTX files of every schedule into")
    ap.add_argument("--only", default="", help="only schedules whose 'spec schedule' text contains this")
    ap.add_argument("--new", default="gemmc.backends.sm90.emit", help="the module whose emit(plan) is compared")
    args = ap.parse_args()
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import importlib
    from gemmc.compiler import lower
    from source_hashes import specs
    emit = importlib.import_module(args.new).emit
    old = old_emitter(args.commit)
    cache = Path(args.old_cache) / args.commit
    cache.mkdir(parents=True, exist_ok=True)
    items = [(n, s) for n, s in sample(args.stride) if args.only in f"{n} {s.short()}"]
    print(f"comparing {len(items)} schedules: emit.py at {args.commit} vs this checkout", flush=True)
    identical = same_mix = 0
    for name, s in items:
        _, plan = lower(specs()[name][0], s, "sm_90a")
        label = f"{name} {s.short()}"
        key = hashlib.sha256(old.emit(plan).source.encode()).hexdigest()[:24]
        old_path = cache / f"{key}.ptx"
        if not old_path.exists():
            old_path.write_text(ptx_of(old.emit(plan)))
        old_ptx = old_path.read_text()
        try:
            new_ptx = ptx_of(emit(plan))
        except Exception as e:
            print(f"FAIL {label}: {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
            continue
        if args.keep:
            keep = Path(args.keep)
            keep.mkdir(parents=True, exist_ok=True)
            safe = re.sub(r"[^\w.-]+", "_", label)
            (keep / f"{safe}.old.ptx").write_text(old_ptx)
            (keep / f"{safe}.new.ptx").write_text(new_ptx)
        a, b = normalise(old_ptx), normalise(new_ptx)
        if a == b:
            identical += 1
            print(f"identical   {label}", flush=True)
            continue
        ca, cb = opcodes(a), opcodes(b)
        if ca == cb:
            same_mix += 1
            print(f"same mix    {label} ({sum(ca.values())} instructions, in another order or registers)", flush=True)
            continue
        diff = ", ".join(f"{op} {ca[op]}->{cb[op]}" for op in sorted(set(ca) | set(cb)) if ca[op] != cb[op])
        print(f"DIFFERENT   {label}: {diff}", flush=True)
    print(f"{identical} identical, {same_mix} with the same instruction mix, "
          f"{len(items) - identical - same_mix} different, of {len(items)}")
    return 0 if identical + same_mix == len(items) else 1


if __name__ == "__main__":
    sys.exit(main())

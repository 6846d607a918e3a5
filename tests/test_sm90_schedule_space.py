"""Every schedule the SM90 predicate admits compiles on the CPU: CI compiles a covering sample (every value
of every schedule field, plus the pairs that interact); scripts/compile_schedules.py compiles them all."""
import gemmc
import pytest

from script_support import load_script

pytestmark = pytest.mark.slow

compile_schedules = load_script("compile_schedules")


def _sm90_items():
    specs = load_script("source_hashes").specs()
    return [(name, arch, s) for name, (spec, arch) in specs.items() if arch == "sm_90a"
            for s in gemmc.enumerate_schedules(spec, arch)]


def test_the_covering_sample_covers_every_field_value_and_pair():
    items = _sm90_items()
    sample = compile_schedules.covering_sample(items)
    wanted = set().union(*(compile_schedules.features(n, s) for n, _, s in items))
    got = set().union(*(compile_schedules.features(n, s) for n, _, s in sample))
    assert got == wanted and len(sample) < len(items)


def test_a_covering_sample_of_admitted_schedules_compiles(monkeypatch):
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    failures = [(n, s.short(), err) for (n, _, s), err in map(compile_schedules.compile_one,
                                                              compile_schedules.covering_sample(_sm90_items())) if err]
    assert failures == []

"""Stand-ins for the search tests on the CPU."""


class InlineBuilder:
    """Builder stand-in without processes (the real one is tested in test_search_builder): every schedule builds,
    except those `fails(schedule)` names, which fail with `error`."""

    def __init__(self, fails=lambda s: False, error="compile: no"):
        self.fails, self.error = fails, error

    def build(self, spec, schedules, arch, on_result=None):
        from gemmc.search.builder import BuildResult
        out = [BuildResult(s, False, 0.1, self.error) if self.fails(s) else BuildResult(s, True, 0.1, None)
               for s in schedules]
        for r in out if on_result else ():
            on_result(r)
        return out

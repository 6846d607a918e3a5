"""Stand-ins for the bench tests on the CPU: a virtual clock that advances only when a fake kernel runs,
and a fake kernel that computes a @ b.T for real."""


class VirtualClock:
    """Time advances only when a fake kernel runs; 'graphs' are plain loops."""

    def __init__(self):
        self.now_ms = 0.0
        self.prepared = []

    def prepare(self, calls):
        calls = list(calls)
        self.prepared.append(len(calls))
        return lambda: [c() for c in calls]

    def time_ms(self, unit):
        t0 = self.now_ms
        unit()
        return self.now_ms - t0


class FakeKernel:
    """a @ b.T computed for real (so the check sees the numbers), costing `us` of virtual time. `bug(call number
    from 1, a, result)` returns what the call writes instead (None: nothing)."""

    def __init__(self, clock, us, name="gemmc", log=None, wrong=False, skip_write=False, schedule=None, bug=None):
        self.clock, self.us, self.name, self.log = clock, us, name, log if log is not None else []
        self.wrong, self.skip_write, self.schedule, self.bug = wrong, skip_write, schedule, bug
        self.calls, self.out_args = 0, []

    def __call__(self, a, b, out=None):
        self.calls += 1
        self.out_args.append(out is not None)
        self.log.append(self.name)
        self.clock.now_ms += self.us / 1000
        res = (a.float() @ b.float().T).to(a.dtype)
        if self.wrong:
            res = res * 1.5
        if self.bug is not None:
            res = self.bug(self.calls, a, res)
        if out is None:
            return res
        if not self.skip_write and res is not None:
            out.copy_(res)
        return out

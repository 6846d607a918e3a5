"""`bayes`: a BoTorch GP over encoded schedules, log-EI evaluated on the whole feasible set.

The target is -log(time) (errors are never candidates again). The first points come from the
heuristic's ranking when available (else a space-filling design); after that each proposal is
the feasible schedule with the largest log expected improvement. A batch is chosen greedily with
the "kriging believer" trick: each pick is fantasized at its posterior mean before the next.
"""
from __future__ import annotations

import math
import random
import warnings

import torch

from ..choose.features import gp_features
from .heuristic_prior import heuristic_available, heuristic_order
from .strategy import BaseStrategy, SearchProblem


class BayesStrategy(BaseStrategy):
    name = "bayes"

    def __init__(self, seed: int = 0, n_init: int = 3, use_heuristic: bool = True, fit_maxiter: int = 75,
                 warm_maxiter: int = 25):
        super().__init__(seed)
        self.n_init = n_init
        self.use_heuristic = use_heuristic
        self.fit_maxiter = fit_maxiter
        self.warm_maxiter = warm_maxiter

    @property
    def deterministic(self) -> bool:
        """Seeded by the heuristic it is; without it the first point is random."""
        return self.use_heuristic and heuristic_available()

    def start(self, problem: SearchProblem) -> None:
        super().start(problem)
        x = torch.tensor([gp_features(s, problem.spec) for s in problem.candidates], dtype=torch.float64)
        lo, hi = x.min(0).values, x.max(0).values
        span = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
        self._x = (x - lo) / span                                     # [0, 1] per feature
        self._index = {s: i for i, s in enumerate(problem.candidates)}
        self._prior = heuristic_order(problem) if self.use_heuristic else None
        self._rng = random.Random(self.seed)
        self._hyper = None     # the last fit's hyperparameters: the next fit starts from them

    # ---- initial design ---------------------------------------------------------------------
    def _initial(self, n: int) -> list:
        picks = []
        if self._prior:
            # the heuristic's first choice, then its best ones that differ most from what we have
            for s in self._prior:
                if s not in self.proposed and s not in picks:
                    picks.append(s)
                    break
        rest = [s for s in self.remaining() if s not in picks]
        while len(picks) < n and rest:
            chosen = [self._index[s] for s in picks] + \
                [self._index[h.schedule] for h in self.history if h.schedule in self._index]
            if not chosen:
                s = self._rng.choice(rest)
            else:
                pool = rest if not self._prior else [s for s in self._prior[: max(24, 4 * n)] if s in set(rest)] or rest
                xs = self._x[[self._index[s] for s in pool]]
                d = torch.cdist(xs, self._x[chosen]).min(1).values
                s = pool[int(d.argmax())]
            picks.append(s)
            rest.remove(s)
        return picks

    # ---- model-based proposals --------------------------------------------------------------
    def _fit(self):
        from botorch.fit import fit_gpytorch_mll
        from botorch.models import SingleTaskGP
        from botorch.models.transforms import Standardize
        from gpytorch.mlls import ExactMarginalLogLikelihood

        ok = [h for h in self.history if h.ok and h.schedule in self._index]
        tx = self._x[[self._index[h.schedule] for h in ok]]
        ty = torch.tensor([[-math.log(h.time_us)] for h in ok], dtype=torch.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # botorch's data-scaling advice; the inputs are [0, 1] by design
            model = SingleTaskGP(tx, ty, outcome_transform=Standardize(m=1))
            if self._hyper is not None:
                model.load_state_dict(self._hyper, strict=False)
            mll = ExactMarginalLogLikelihood(model.likelihood, model)
            try:
                iters = self.fit_maxiter if self._hyper is None else self.warm_maxiter
                fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": iters}})
                self._hyper = {k: v.detach().clone() for k, v in model.state_dict().items()
                               if k.rsplit(".", 1)[-1] in ("raw_noise", "raw_constant", "raw_lengthscale",
                                                           "raw_outputscale")}
            except Exception:  # a failed fit keeps the previous hyperparameters; EI still ranks
                pass
        return model, float(ty.max())

    def _acquire(self, n: int) -> list:
        from botorch.acquisition import LogExpectedImprovement

        model, best_f = self._fit()
        rest = self.remaining()
        picks = []
        for _ in range(min(n, len(rest))):
            idx = [self._index[s] for s in rest]
            acq = LogExpectedImprovement(model, best_f=best_f)
            with torch.no_grad():
                vals = acq(self._x[idx].unsqueeze(1))
            j = int(vals.argmax())
            s = rest.pop(j)
            picks.append(s)
            if len(picks) < n and rest:
                xj = self._x[self._index[s]].unsqueeze(0)
                with torch.no_grad():
                    mean = model.posterior(xj).mean.reshape(1, 1)
                model = model.condition_on_observations(xj, mean)   # kriging believer fantasy
        return picks

    def propose(self, n: int):
        if not self._count(n) or not self.remaining():
            return []
        # successes outside this space (a resumed run's other rows) are no points for the GP
        n_ok = sum(h.ok and h.schedule in self._index for h in self.history)
        if n_ok < self.n_init:
            return self._take(self._initial(n))
        return self._take(self._acquire(n))

"""`SchedulePolicy`: the network that scores a (shape, schedule) pair, and its persistence (the blob the tuning
DB stores). `schedule="auto"` loads a stored one (gemmc.choose.tuning_db) and asks it for the best feasible
schedule; how it is trained, and how the rl strategy searches with it, are gemmc.search.rl's.
"""
from __future__ import annotations

import io
from typing import Optional, Sequence

import torch
from torch import nn

from ..errors import GemmcError
from ..schedule import Schedule
from ..spec import GemmSpec
from .features import FeatureSpec, policy_features, shape_features


class PolicyLoadError(GemmcError, ValueError):
    """A stored policy cannot be used: damaged, or trained on other features (the message says to retrain)."""


class SchedulePolicy(nn.Module):
    def __init__(self, feature_spec: FeatureSpec = FeatureSpec(), hidden: int = 128):
        super().__init__()
        self.feature_spec = feature_spec
        self.hidden = hidden
        d = feature_spec.dim
        self.net = nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, 1))
        self.register_buffer("mean", torch.zeros(d))
        self.register_buffer("std", torch.ones(d))
        self.trained_shapes = 0
        self.gpu_name: Optional[str] = None     # the GPU whose rows trained it (None: unknown); stored by the DB

    def encode(self, spec: GemmSpec, schedules: Sequence[Schedule]) -> torch.Tensor:
        shape = shape_features(spec)
        return torch.tensor([policy_features(s, spec, shape) for s in schedules], dtype=torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - self.mean) / self.std).squeeze(-1)

    def scores(self, spec: GemmSpec, schedules: Sequence[Schedule]) -> torch.Tensor:
        with torch.no_grad():
            return self(self.encode(spec, schedules))

    def best(self, spec: GemmSpec, schedules: Sequence[Schedule]) -> Schedule:
        return schedules[int(self.scores(spec, schedules).argmax())]

    # ---- persistence: weights + the feature spec they were trained on ---------------------------
    def to_bytes(self) -> bytes:
        buf = io.BytesIO()
        torch.save({"state_dict": self.state_dict(), "feature_spec": self.feature_spec.to_dict(),
                    "hidden": self.hidden, "trained_shapes": self.trained_shapes}, buf)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, blob: bytes) -> "SchedulePolicy":
        try:
            d = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
            fs = FeatureSpec.from_dict(d["feature_spec"])
        except Exception as e:   # torch raises EOFError, UnpicklingError or RuntimeError on a damaged blob
            raise PolicyLoadError(f"the stored policy is unreadable ({type(e).__name__}: {e}); "
                                  f"train a new one with `gemmc-search train-policy`") from None
        if fs != FeatureSpec():
            raise PolicyLoadError(f"stored policy uses features v{fs.version} ({fs.dim} dims), this gemmc uses "
                                  f"v{FeatureSpec().version} ({FeatureSpec().dim}): retrain with "
                                  f"`gemmc-search train-policy`")
        try:
            pol = cls(fs, d["hidden"])
            pol.load_state_dict(d["state_dict"])
        except Exception as e:   # the weights do not fit the network their own record describes
            raise PolicyLoadError(f"the stored policy's weights do not load ({type(e).__name__}: {e}); "
                                  f"train a new one with `gemmc-search train-policy`") from None
        pol.trained_shapes = d.get("trained_shapes", 0)
        return pol

"""Reproduce the illegal instruction the llm bench hit on its first shape (1x6144x4096, heuristic schedule):
static M=1 vs symbolic M run with M=1, same schedule."""
import torch
import gemmc
from gemmc.reference import rel_frobenius

for m_dim in ("M", 1):
    spec = gemmc.GemmSpec(m=m_dim, n=6144, k=4096)
    k = gemmc.compile(gemmc.GemmSpec(m=1, n=6144, k=4096), schedule="heuristic")
    sched = k.schedule
    k = gemmc.compile(spec, schedule=sched)
    a = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(6144, 4096, device="cuda", dtype=torch.bfloat16)
    out = torch.full((1, 6144), float("nan"), device="cuda", dtype=torch.bfloat16)
    print(f"m={m_dim} schedule={sched.short()}", flush=True)
    k(a, b, out=out)
    torch.cuda.synchronize()
    print("  rel err", rel_frobenius(out, a.float() @ b.float().T), flush=True)

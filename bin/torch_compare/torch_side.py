"""Torch side of the step-by-step comparison (run with /tmp/torchvenv/bin/python).
Loads jax_seed<seed>.npz, puts gedl_jax's initial weights into bin/torch_reference.py's ConvNet,
computes the reference loss + gradients on the same batch (float32 and float64), compares with
gedl_jax's, then runs the same N-step Adam trajectory with the reference loss."""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, "/work/main/bin")
import torch_reference as tr

torch.set_num_threads(1)
p = argparse.ArgumentParser()
p.add_argument("--seed", type=int, default=0)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--variants", default="edl,iedl,redl,red,gedl")
p.add_argument("--traj_epoch", type=int, default=0)
p.add_argument("--red_act", default="exp_clamp")
a = p.parse_args()
HERE = "runs/torch_compare"  # outputs (git-ignored); run from the repository root
os.makedirs(HERE, exist_ok=True)
z = np.load(os.path.join(HERE, f"jax_seed{a.seed}.npz"))
xb = torch.from_numpy(z["xb"]).unsqueeze(2)   # (nb, B, 1, 28, 28)
yb = torch.from_numpy(z["yb"].astype(np.int64))
init = {k[5:]: z[k] for k in z.files if k.startswith("init/")}

def make(dtype):
    m = tr.ConvNet()
    sd = m.state_dict()
    for k in sd:
        sd[k] = torch.from_numpy(init[k].copy())
    m.load_state_dict(sd)
    return m.to(dtype)

ns = argparse.Namespace(fisher_c=0.005, redl_lambda=0.1, red_loss="mse", red_act=a.red_act,
                        red_kl_strength=1.0, c_w=0.5, c_tau=100.0)
out = {}
for v in a.variants.split(","):
    for epoch in (0, 1):
        res = {}
        for dt in (torch.float32, torch.float64):
            m = make(dt)
            tau = tr.GedlTau(100.0)
            loss, terms = tr.loss_fn(v, m(xb[0].to(dt)), yb[0], epoch, ns, tau)
            m.zero_grad(); loss.backward()
            res[dt] = (loss.item(), {k: p.grad.detach().double().numpy() for k, p in m.named_parameters()})
        jl = float(z[f"{v}/e{epoch}/loss"])
        rel = []
        for k in res[torch.float64][1]:
            gj = z[f"{v}/e{epoch}/grad/{k}"].astype(np.float64)
            g64 = res[torch.float64][1][k]; g32 = res[torch.float32][1][k]
            scale = np.abs(g64).max() + 1e-30
            rel.append((k, np.abs(gj - g64).max() / scale, np.abs(g32 - g64).max() / scale))
        worst_j = max(rel, key=lambda r: r[1]); worst_t = max(rel, key=lambda r: r[2])
        print(f"{v} epoch {epoch}: loss jax {jl:.7f} torch32 {res[torch.float32][0]:.7f} "
              f"torch64 {res[torch.float64][0]:.7f} | max rel grad diff jax-vs-t64 "
              f"{worst_j[1]:.2e} ({worst_j[0]}), t32-vs-t64 {worst_t[2]:.2e}", flush=True)
    # trajectory
    m = make(torch.float32)
    opt = torch.optim.Adam(m.parameters(), lr=a.lr)
    tau = tr.GedlTau(100.0)
    traj = []
    for s in range(xb.shape[0]):
        logits = m(xb[s])
        loss, _ = tr.loss_fn(v, logits, yb[s], a.traj_epoch, ns, tau)
        opt.zero_grad(); loss.backward(); opt.step()
        alpha = tr.evidential_alpha(v, logits.detach(), ns)
        traj.append((loss.item(), alpha.sum(-1).mean().item(), (logits.argmax(-1) == yb[s]).float().mean().item()))
    t = np.asarray(traj); tj = z[f"{v}/traj"]
    print(f"{v} traj torch: loss {t[0,0]:.4f} -> {t[-1,0]:.4f}, meanS {t[0,1]:.2f} -> {t[-1,1]:.2f}, acc last10 {t[-10:,2].mean():.3f}")
    print(f"{v} traj jax  : loss {tj[0,0]:.4f} -> {tj[-1,0]:.4f}, meanS {tj[0,1]:.2f} -> {tj[-1,1]:.2f}, acc last10 {tj[-10:,2].mean():.3f}")
    for s in (0, 1, 2, 5, 10, 20, 40, 60, 92):
        if s < len(t):
            print(f"   step {s:3d}: loss torch {t[s,0]:.5f} jax {tj[s,0]:.5f} | S torch {t[s,1]:10.3f} jax {tj[s,1]:10.3f} | acc torch {t[s,2]:.3f} jax {tj[s,2]:.3f}")
    out[f"{v}/traj"] = t
np.savez(os.path.join(HERE, f"torch_seed{a.seed}.npz"), **out)

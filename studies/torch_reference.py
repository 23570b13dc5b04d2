#!/usr/bin/env python
"""Independent PyTorch transcription of the reference EDL-family training on MNIST.

Written from the reference PyTorch code (github.com/danruod/IEDL code_classical/models/
FisherEvidentialN.py and code_classical/dataset.py, github.com/MengyuanChen21/ICLR2024-REDL
code_classical/models/ModifiedEvidentialN.py, github.com/pandeydeep9/EvidentialResearch2023
MainMnistExperiment/losses.py) and the GEDL paper, NOT from gedl_jax. It imports nothing from
gedl_jax (nor from the rest of studies/), so it runs under any Python with torch and numpy.

Reference conventions kept on purpose:
- ConvNet: 3 x [Conv2d(k=5, pad=2) -> ReLU -> MaxPool2d(2)] (1->64->64->64), flatten NCHW
  (576), Linear 576->64->64->64->10 with ReLUs; PyTorch default init; no dropout / BN.
- Data: MNIST IDX files, pixels /255 in [0, 1], no normalisation. Split: the
  np.random.RandomState(seed).permutation(60000), first 48,000 train (then the first
  --train_examples of those), the rest validation.
- Loader: reshuffled every epoch, last partial batch kept (DataLoader drop_last=False) unless
  --drop_last.
- Every loss term is a batch mean of per-sample sums over classes (`.sum(-1).mean()`).
- KL annealing min(1, epoch/10) with the 0-based integer epoch (0 in epoch 0).
- KL numerics of IEDL/REDL: +1e-8 inside lgamma/digamma, non-finite per-sample terms -> 0.
- Adam (betas 0.9/0.999, eps 1e-8), no weight decay, constant lr (the reference has no cosine;
  --lr_schedule cosine reproduces gedl_jax's per-step cosine decay to 0 for comparison).

Variants (--variant):
  edl   EDL in the I-EDL protocol: softplus, alpha = e + 1, MSE + var
        + anneal * KL(Dir(a~)||Dir(1))
  iedl  I-EDL: Fisher-weighted MSE + var + fisher_c * (-log|I(alpha)|) + anneal * KL
        (fisher_c 0.005)
  redl  R-EDL: alpha = e + lambda (0.1), MSE without var
        + anneal * KL(Dir(e(1-y)+lambda)||Dir(lambda))
  red   RED: alpha = e + 1, exp evidence (no clamp, RED MNIST code; --red_act exp_clamp for
        clamp(-10, 10)), likelihood --red_loss (mse default = gedl_jax's choice; the RED repo
        default is log), + anneal * KL + the vacuity regulariser -mean_i (K/S_i)_sg * logit_{i,y_i}
  gedl  GEDL: softplus, W = (K + C_w K E)/(1 + K E) (sg), alpha = e + W/K, psi(S) - psi(alpha_y)
        + (1/tau) KL(Dir(alpha)||Dir(W/K)), tau = max(1, C_tau / sum_{i<=t} E[S]) with the
        per-epoch reading (completed epochs' mean S + running mean of the current epoch).

Example, from the repository root, with `$TORCH_PYTHON` a Python that has torch (e.g.
PATH/TO/torch-venv/bin/python) and the MNIST files in `$GEDL_DATA_DIR/mnist/` (else
`--data_dir=DIR`, the folder that holds `mnist/`):
  "$TORCH_PYTHON" -m studies.torch_reference --variant iedl --seeds 0,1,2 --epochs 3 \\
      --train_examples 12000 --batch_size 64 --lr 1e-3
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import math
import os
import struct
import sys
import time
from collections import OrderedDict

import numpy as np

try:   # not a gedl-jax dependency: without it --help still answers, and main() says to install it
    import torch
    import torch.nn.functional as F
    from torch import nn
except ModuleNotFoundError as missing:
    if missing.name != "torch":
        raise
    torch = F = nn = None

NUM_CLASSES = 10


# ------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------
def read_idx(path: str) -> np.ndarray:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    assert zero == 0 and dtype_code == 0x08, f"{path}: not a uint8 IDX file"
    shape = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    return data.reshape(shape)


def load_mnist(data_dir: str):
    d = os.path.join(data_dir, "mnist")
    tr_x = read_idx(os.path.join(d, "train-images-idx3-ubyte.gz"))
    tr_y = read_idx(os.path.join(d, "train-labels-idx1-ubyte.gz"))
    te_x = read_idx(os.path.join(d, "t10k-images-idx3-ubyte.gz"))
    te_y = read_idx(os.path.join(d, "t10k-labels-idx1-ubyte.gz"))
    assert tr_x.shape == (60000, 28, 28) and te_x.shape == (10000, 28, 28)
    return tr_x, tr_y.astype(np.int64), te_x, te_y.astype(np.int64)


def to_tensor(images_u8: np.ndarray) -> torch.Tensor:
    """ToTensor: uint8 HxW -> float32 1xHxW in [0, 1]."""
    return torch.from_numpy(images_u8.astype(np.float32) / 255.0).unsqueeze(1)


# ------------------------------------------------------------------------------------------
# Model (I-EDL / R-EDL "conv" architecture)
# ------------------------------------------------------------------------------------------
def conv_net(num_classes: int = NUM_CLASSES) -> nn.Module:
    """The reference's ConvNet: `convolutions`, flattened per image, then `linear` (the
    reference's parameter names, created in its order)."""
    layers = []
    c_in = 1
    for c_out in (64, 64, 64):
        layers += [nn.Conv2d(c_in, c_out, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2, padding=0)]
        c_in = c_out
    convolutions = nn.Sequential(*layers)
    dims = [64 * 3 * 3, 64, 64, 64]
    lin = []
    for a, b in zip(dims[:-1], dims[1:]):
        lin += [nn.Linear(a, b), nn.ReLU()]
    lin.append(nn.Linear(dims[-1], num_classes))
    return nn.Sequential(OrderedDict(convolutions=convolutions, flatten=nn.Flatten(),
                                     linear=nn.Sequential(*lin)))


# ------------------------------------------------------------------------------------------
# Losses (reference formulas; every term = batch mean of a per-sample class sum)
# ------------------------------------------------------------------------------------------
def kl_ref(alphas: torch.Tensor, target_alphas: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """IEDL/REDL compute_kl_loss: KL(Dir(alphas)||Dir(target)), +1e-8, non-finite -> 0, mean."""
    alp0 = alphas.sum(-1, keepdim=True)
    t0 = target_alphas.sum(-1, keepdim=True)
    alp0_term = torch.lgamma(alp0 + eps) - torch.lgamma(t0 + eps)
    alp0_term = torch.where(torch.isfinite(alp0_term), alp0_term, torch.zeros_like(alp0_term))
    alphas_term = torch.sum(torch.lgamma(target_alphas + eps) - torch.lgamma(alphas + eps)
                            + (alphas - target_alphas) * (torch.digamma(alphas + eps)
                                                          - torch.digamma(alp0 + eps)),
                            dim=-1, keepdim=True)
    alphas_term = torch.where(torch.isfinite(alphas_term), alphas_term,
                              torch.zeros_like(alphas_term))
    return torch.squeeze(alp0_term + alphas_term, -1).mean()


def kl_red(alpha: torch.Tensor) -> torch.Tensor:
    """RED / DOUG kl_divergence(alpha, K) to Dir(1), per sample (no eps, no masking)."""
    ones = torch.ones_like(alpha)
    s = alpha.sum(-1, keepdim=True)
    first = (torch.lgamma(s) - torch.lgamma(alpha).sum(-1, keepdim=True)
             + torch.lgamma(ones).sum(-1, keepdim=True) - torch.lgamma(ones.sum(-1, keepdim=True)))
    second = ((alpha - ones) * (torch.digamma(alpha) - torch.digamma(s))).sum(-1, keepdim=True)
    return (first + second).squeeze(-1)


def anneal(epoch: int) -> float:
    return float(np.minimum(1.0, epoch / 10.0))


class GedlTau:
    """tau_t = max(1, C_tau / sum_{i<=t} E[S]) with one term per epoch (running mean of the
    current epoch's batch-mean S + the finished epochs' means)."""

    def __init__(self, c_tau: float = 100.0):
        self.c_tau, self.completed, self.cur_sum, self.cur_n, self.epoch = c_tau, 0.0, 0.0, 0, 0

    def weight(self, epoch: int, batch_mean_s: float) -> float:
        if epoch > self.epoch:
            if self.cur_n:
                self.completed += self.cur_sum / self.cur_n
            self.cur_sum, self.cur_n, self.epoch = 0.0, 0, epoch
        self.cur_sum += batch_mean_s
        self.cur_n += 1
        cumulative = self.completed + self.cur_sum / self.cur_n
        tau = max(1.0, self.c_tau / max(cumulative, 1e-30))
        return 1.0 / tau


def evidential_alpha(variant: str, logits: torch.Tensor, args) -> torch.Tensor:
    """The alpha used for prediction / evaluation."""
    if variant in ("edl", "iedl"):
        return F.softplus(logits) + 1.0
    if variant == "redl":
        return F.softplus(logits) + args.redl_lambda
    if variant == "red":
        return red_evidence(logits, args) + 1.0
    if variant == "gedl":
        e = F.softplus(logits)
        w = gedl_w(e, args.c_w)
        return e + (w / NUM_CLASSES)[:, None]
    raise ValueError(variant)


def red_evidence(logits, args):
    if args.red_act == "exp":
        return torch.exp(logits)
    if args.red_act == "exp_clamp":
        return torch.exp(torch.clamp(logits, -10, 10))
    if args.red_act == "relu":
        return F.relu(logits)
    if args.red_act == "softplus":
        return F.softplus(logits)
    raise ValueError(args.red_act)


def gedl_w(e: torch.Tensor, c_w: float) -> torch.Tensor:
    with torch.no_grad():
        total = e.sum(-1)
        return (NUM_CLASSES + c_w * NUM_CLASSES * total) / (1.0 + NUM_CLASSES * total)


def loss_fn(variant: str, logits: torch.Tensor, labels: torch.Tensor, epoch: int, args,
            tau: GedlTau | None = None) -> tuple[torch.Tensor, dict]:
    y = torch.zeros_like(logits).scatter_(-1, labels.unsqueeze(-1), 1.0)
    terms = {}
    if variant in ("edl", "iedl"):
        alpha = F.softplus(logits) + 1.0            # evi_alp_, target_con = 1
        s = alpha.sum(-1, keepdim=True)
        if variant == "edl":                        # compute_mse
            mse = (y - alpha / s).pow(2).sum(-1).mean()
            var = (alpha * (s - alpha) / (s * s * (s + 1))).sum(-1).mean()
            fisher = torch.zeros(())
        else:                                       # compute_fisher_mse
            g1a = torch.polygamma(1, alpha)
            g1s = torch.polygamma(1, s)
            mse = ((y - alpha / s).pow(2) * g1a).sum(-1).mean()
            var = (alpha * (s - alpha) * g1a / (s * s * (s + 1))).sum(-1).mean()
            fisher = -(torch.log(g1a).sum(-1) + torch.log(1.0 - (g1s / g1a).sum(-1))).mean()
        kl_alpha = (alpha - 1.0) * (1 - y) + 1.0
        kl = kl_ref(kl_alpha, torch.ones_like(kl_alpha))
        w = anneal(epoch)
        fc = args.fisher_c if variant == "iedl" else 0.0
        loss = mse + var + fc * fisher + w * kl
        terms = dict(mse=mse.item(), var=var.item(), fisher=fisher.item(), kl=kl.item(), klw=w)
    elif variant == "redl":
        lam = args.redl_lambda
        e = F.softplus(logits)
        denom = e + 1.0 * (e.sum(-1, keepdim=True) - e) + lam * NUM_CLASSES   # lamb1 = 1
        mse = (y - (e + lam) / denom).pow(2).sum(-1).mean()
        kl_alpha = e * (1 - y) + lam
        kl = kl_ref(kl_alpha, torch.ones_like(kl_alpha) * lam)
        w = anneal(epoch)
        loss = mse + w * kl
        terms = dict(mse=mse.item(), kl=kl.item(), klw=w)
    elif variant == "red":
        e = red_evidence(logits, args)
        alpha = e + 1.0
        s = alpha.sum(-1, keepdim=True)
        if args.red_loss == "mse":
            lik = ((y - alpha / s) ** 2).sum(-1) + (alpha * (s - alpha) / (s * s * (s + 1))).sum(-1)
        elif args.red_loss == "log":
            lik = (y * (torch.log(s) - torch.log(alpha))).sum(-1)
        else:
            lik = (y * (torch.digamma(s) - torch.digamma(alpha))).sum(-1)
        w = anneal(epoch)
        kl_alpha = (alpha - 1) * (1 - y) + 1
        kl_b = kl_red(kl_alpha)
        loss = torch.mean(lik + args.red_kl_strength * w * kl_b)
        with torch.no_grad():
            vac = NUM_CLASSES / s.detach()
        reg = torch.sum(vac * (logits * y)) / logits.shape[0]
        loss = loss - reg
        terms = dict(lik=lik.mean().item(), kl=kl_b.mean().item(), klw=w, reg=reg.item())
    elif variant == "gedl":
        e = F.softplus(logits)
        wgt = gedl_w(e, args.c_w)                    # stop-gradient
        prior = (wgt / NUM_CLASSES)[:, None].expand_as(e)
        alpha = e + prior
        s = alpha.sum(-1)
        nll = (torch.digamma(s) - torch.digamma(alpha.gather(-1, labels[:, None])[:, 0])).mean()
        kl = kl_ref(alpha, prior)
        klw = tau.weight(epoch, s.detach().mean().item())
        loss = nll + klw * kl
        terms = dict(nll=nll.item(), kl=kl.item(), klw=klw, W=wgt.mean().item())
    else:
        raise ValueError(variant)
    return loss, terms


# ------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------
def evaluate(model, variant, x, y, args, batch=1024):
    with torch.no_grad():
        model.eval()
        correct, correct_logits, ties, s_sum, n = 0, 0, 0, 0.0, 0
        nll = 0.0
        for i in range(0, len(y), batch):
            logits = model(x[i:i + batch])
            alpha = evidential_alpha(variant, logits, args)
            s = alpha.sum(-1)
            p = alpha / s[:, None]
            yy = y[i:i + batch]
            correct += (alpha.argmax(-1) == yy).sum().item()       # reference metrics.accuracy
            correct_logits += (logits.argmax(-1) == yy).sum().item()  # reference validation
            ties += ((alpha == alpha.max(-1, keepdim=True)[0]).sum(-1) > 1).sum().item()
            s_sum += s.sum().item()
            nll += -torch.log(p.gather(-1, yy[:, None])[:, 0]).sum().item()
            n += len(yy)
        model.train()
        evaluate.last = dict(acc_logits=correct_logits / n, tied_max_alpha=ties / n)
        return correct / n, s_sum / n, nll / n


def run_seed(seed: int, data, args) -> dict:
    tr_x, tr_y, te_x, te_y = data
    perm = np.random.RandomState(seed).permutation(60000)
    train_idx = perm[:48000]
    val_idx = perm[48000:]
    if args.train_examples:
        train_idx = train_idx[:args.train_examples]
    if args.val_examples:
        val_idx = val_idx[:args.val_examples]
    xtr, ytr = to_tensor(tr_x[train_idx]), torch.from_numpy(tr_y[train_idx])
    xva, yva = to_tensor(tr_x[val_idx]), torch.from_numpy(tr_y[val_idx])
    xte, yte = to_tensor(te_x), torch.from_numpy(te_y)

    torch.manual_seed(seed)
    model = conv_net()
    if args.init_from:
        load_numpy_params(model, args.init_from)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    n = len(ytr)
    steps_per_epoch = n // args.batch_size if args.drop_last else math.ceil(n / args.batch_size)
    total_steps = steps_per_epoch * args.epochs
    sched = None
    if args.lr_schedule == "cosine":
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: 0.5 * (1 + math.cos(math.pi * min(step, total_steps) / total_steps)))
    gen = torch.Generator().manual_seed(seed)
    tau = GedlTau(args.c_tau) if args.variant == "gedl" else None
    best_val, best_state, history = -1.0, None, []
    t0 = time.time()
    for epoch in range(args.epochs):
        order = torch.randperm(n, generator=gen)
        loss_sum, correct, seen, nsteps = 0.0, 0, 0, 0
        term_sums: dict = {}
        for b in range(steps_per_epoch):
            idx = order[b * args.batch_size:(b + 1) * args.batch_size]
            xb, yb = xtr[idx], ytr[idx]
            logits = model(xb)
            loss, terms = loss_fn(args.variant, logits, yb, epoch, args, tau)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            loss_sum += loss.item()
            nsteps += 1
            correct += (logits.argmax(-1) == yb).sum().item()
            seen += len(yb)
            for k, v in terms.items():
                term_sums[k] = term_sums.get(k, 0.0) + v
        val_acc, val_s, _ = evaluate(model, args.variant, xva, yva, args)
        if val_acc > best_val:
            best_val, best_state = val_acc, copy.deepcopy(model.state_dict())
        rec = dict(epoch=epoch, train_loss=loss_sum / nsteps, train_acc=correct / seen,
                   val_acc=val_acc, val_mean_S=val_s,
                   **{k: v / nsteps for k, v in term_sums.items()})
        history.append(rec)
        terms_txt = " ".join(f"{k} {v / nsteps:.4g}" for k, v in term_sums.items())
        print(f"  seed {seed} epoch {epoch}: train loss {rec['train_loss']:.4f} "
              f"acc {rec['train_acc']:.4f} | val acc {val_acc:.4f} mean S {val_s:.2f} | "
              f"{terms_txt} | {time.time() - t0:.0f}s", flush=True)
    test_acc, test_s, test_nll = evaluate(model, args.variant, xte, yte, args)
    test_extra = dict(evaluate.last)
    model.load_state_dict(best_state)
    best_test_acc, best_test_s, best_test_nll = evaluate(model, args.variant, xte, yte, args)
    print(f"  seed {seed}: test acc (final) {test_acc:.4f} NLL {test_nll:.4f} mean S "
          f"{test_s:.2f} [argmax-logits acc {test_extra['acc_logits']:.4f}, tied max alpha "
          f"{test_extra['tied_max_alpha']:.4f}] | test acc (best val {best_val:.4f}) "
          f"{best_test_acc:.4f} NLL "
          f"{best_test_nll:.4f} | {time.time() - t0:.0f}s", flush=True)
    return dict(seed=seed, test_acc_final=test_acc, test_nll_final=test_nll,
                test_mean_S_final=test_s, test_final_argmax_logits_acc=test_extra["acc_logits"],
                test_final_tied_max_alpha=test_extra["tied_max_alpha"], best_val_acc=best_val,
                test_acc_best=best_test_acc,
                test_nll_best=best_test_nll, history=history, seconds=time.time() - t0)


def load_numpy_params(model: nn.Module, path: str) -> None:
    """Load weights from an .npz with the keys of model.state_dict() (torch layout)."""
    arrays = np.load(path)
    state = model.state_dict()
    for k in state:
        state[k] = torch.from_numpy(np.asarray(arrays[k], np.float32)).reshape(state[k].shape)
    model.load_state_dict(state)


def mean_std(xs):
    xs = np.asarray(xs, np.float64)
    return xs.mean(), (xs.std(ddof=1) if len(xs) > 1 else 0.0)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variant", required=True, choices=["edl", "iedl", "redl", "red", "gedl"],
                   help="the method trained: EDL, I-EDL, R-EDL, RED or GEDL (each one's "
                        "loss: this file's docstring)")
    p.add_argument("--seeds", default="0,1,2",
                   help="comma-separated seeds, one run each (split, init and batch order)")
    p.add_argument("--epochs", type=int, default=3, help="training epochs (default 3)")
    p.add_argument("--train_examples", type=int, default=12000, help="0 = all 48,000")
    p.add_argument("--val_examples", type=int, default=2000, help="0 = all 12,000")
    p.add_argument("--batch_size", type=int, default=64, help="reference: 64")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate (default 1e-3)")
    p.add_argument("--lr_schedule", default="constant", choices=["constant", "cosine"],
                   help="reference: constant; cosine = gedl_jax's per-step cosine to 0")
    p.add_argument("--drop_last", action="store_true", help="drop the last partial batch "
                   "(gedl_jax does; the reference DataLoader does not)")
    p.add_argument("--fisher_c", type=float, default=0.005,
                   help="iedl: weight of the -log|I(alpha)| term (default 0.005)")
    p.add_argument("--redl_lambda", type=float, default=0.1,
                   help="redl: the prior weight lambda, alpha = e + lambda (default 0.1)")
    p.add_argument("--red_loss", default="mse", choices=["mse", "log", "digamma"],
                   help="red: the likelihood term (default mse; the RED repository's is log)")
    p.add_argument("--red_act", default="exp", choices=["exp", "exp_clamp", "relu", "softplus"],
                   help="red: the evidence function (exp_clamp: exp of logits clamped to "
                        "[-10, 10])")
    p.add_argument("--red_kl_strength", type=float, default=1.0,
                   help="red: factor of the annealed KL term (default 1.0)")
    p.add_argument("--c_w", type=float, default=0.5,
                   help="gedl: C_w of the adaptive prior strength W (default 0.5)")
    p.add_argument("--c_tau", type=float, default=100.0,
                   help="gedl: C_tau of the KL temperature tau (default 100)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch's intra-op CPU threads (default 1)")
    p.add_argument("--data_dir", default=os.environ.get("GEDL_DATA_DIR"),
                   help="folder holding mnist/ with the official IDX files (default: "
                        "$GEDL_DATA_DIR)")
    p.add_argument("--init_from", default="", help=".npz of initial weights (state_dict keys)")
    p.add_argument("--json_out", default="", help="append one JSON line with all results")
    args = p.parse_args(argv)
    if not args.data_dir:
        p.error("give --data_dir (the folder holding mnist/) or set GEDL_DATA_DIR")
    if torch is None:
        p.exit(2, "error: torch is not installed: pip install torch (not a gedl-jax dependency), "
                  "or run this script with a Python that has it\n")
    torch.set_num_threads(args.threads)

    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    print(f"torch {torch.__version__}, numpy {np.__version__}, threads "
          f"{torch.get_num_threads()}; {' '.join(sys.argv)}", flush=True)
    data = load_mnist(args.data_dir)
    results = []
    for seed in seeds:
        results.append(run_seed(seed, data, args))
    fa = mean_std([r["test_acc_final"] for r in results])
    ba = mean_std([r["test_acc_best"] for r in results])
    per_seed = ", ".join(f"{r['test_acc_final'] * 100:.2f}" for r in results)
    print(f"SUMMARY variant={args.variant} bs={args.batch_size} lr={args.lr} "
          f"sched={args.lr_schedule} epochs={args.epochs} n={args.train_examples} "
          f"seeds={args.seeds}: test acc final {fa[0] * 100:.2f} ± {fa[1] * 100:.2f} "
          f"[{per_seed}] | best-val ckpt {ba[0] * 100:.2f} ± {ba[1] * 100:.2f}", flush=True)
    if args.json_out:
        with open(args.json_out, "a") as f:
            f.write(json.dumps(dict(args=vars(args), torch=torch.__version__,
                                    results=results)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

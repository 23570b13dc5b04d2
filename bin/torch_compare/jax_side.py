"""JAX side of the step-by-step comparison (run with /tmp/venv/bin/python).

1. Draws gedl_jax's initial ConvNet parameters exactly as train.py does for --seed
   (experiment.run_keys(seed)["init"] -> ConvNet.init, as steps.init_train_state does), converts them to torch layout.
2. Builds the batch sequence: seed's train split (RandomState(seed).permutation(60000)[:48000]
   [:12000]) in a fixed order (np RandomState(seed+1000).permutation), batch B.
3. For each variant: loss + grads of gedl_jax's loss (losses.per_example_loss, mean over batch)
   on batch 0 at epoch 0 and epoch 1; and a trajectory of N Adam(lr) steps over the batch
   sequence at a fixed epoch index, recording loss, mean S, batch accuracy.
Writes jax_seed<seed>.npz next to this file.
"""
import argparse
import gzip
import os
import struct

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gedl_jax import configuration
from gedl_jax import evidential as ev
from gedl_jax import networks as models
from gedl_jax.evidential import loss as losses
from gedl_jax.run import experiment

p = argparse.ArgumentParser()
p.add_argument("--seed", type=int, default=0)
p.add_argument("--batch", type=int, default=128)
p.add_argument("--steps", type=int, default=93)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--variants", default="edl,iedl,redl,red,gedl")
p.add_argument("--traj_epoch", type=int, default=0)
args = p.parse_args()
HERE = "runs/torch_compare"  # outputs (git-ignored); run from the repository root
os.makedirs(HERE, exist_ok=True)

def read_idx(path):
    raw = gzip.open(path, "rb").read()
    _, _, nd = struct.unpack(">HBB", raw[:4])
    shape = struct.unpack(">" + "I" * nd, raw[4:4 + 4 * nd])
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * nd).reshape(shape)

d = "/work/shared/data/mnist"
X = read_idx(f"{d}/train-images-idx3-ubyte.gz"); Y = read_idx(f"{d}/train-labels-idx1-ubyte.gz").astype(np.int32)
idx = np.random.RandomState(args.seed).permutation(60000)[:48000][:12000]
order = np.random.RandomState(args.seed + 1000).permutation(12000)
nb = args.steps
batches = idx[order[:nb * args.batch]].reshape(nb, args.batch)
xb_all = X[batches].astype(np.float32) / 255.0          # (nb, B, 28, 28)
yb_all = Y[batches]

model = models.ConvNet(num_classes=10)
config = configuration.build_config("mnist", "gedl")
init_key = experiment.run_keys(args.seed)["init"]
params0 = model.init({"params": init_key, "dropout": init_key}, jnp.zeros((1, 28, 28, 1)),
                     train=False)["params"]

def to_torch(params):
    out = {}
    for i, t in enumerate((0, 3, 6)):
        k = np.asarray(params[f"conv{i}"]["kernel"]); b = np.asarray(params[f"conv{i}"]["bias"])
        out[f"convolutions.{t}.weight"] = k.transpose(3, 2, 0, 1); out[f"convolutions.{t}.bias"] = b
    for i, t in enumerate((0, 2, 4, 6)):
        k = np.asarray(params[f"dense{i}"]["kernel"]); b = np.asarray(params[f"dense{i}"]["bias"])
        if i == 0:   # rows (h, w, c) -> torch columns (c, h, w)
            w = k.reshape(3, 3, 64, k.shape[1]).transpose(3, 2, 0, 1).reshape(k.shape[1], 576)
        else:
            w = k.T
        out[f"linear.{t}.weight"] = w; out[f"linear.{t}.bias"] = b
    return out

save = {f"init/{k}": v for k, v in to_torch(params0).items()}
save["xb"] = xb_all; save["yb"] = yb_all

def nhwc(x):
    return jnp.asarray(x)[..., None]

for variant in args.variants.split(","):
    cfg = configuration.build_config("mnist", variant)
    spec = losses.LossSpec.from_config(cfg)

    def loss_fn(params, x, y, epoch, tau_state):
        logits = model.apply({"params": params}, x, train=True)
        loss_B, new_tau, terms = losses.per_example_loss(spec, logits, y, tau_state,
                                                        jnp.int32(epoch))
        alpha = losses.evidential_outputs(spec, logits).alpha_BxK
        aux = (new_tau, jnp.mean(alpha.sum(-1)), jnp.mean(jnp.argmax(logits, -1) == y),
               terms.kl_weight, jnp.mean(terms.likelihood_B), jnp.mean(terms.kl_B))
        return jnp.mean(loss_B), aux

    grad_fn = jax.jit(jax.value_and_grad(loss_fn, has_aux=True), static_argnums=(3,))
    for epoch in (0, 1):
        (loss, aux), g = grad_fn(params0, nhwc(xb_all[0]), yb_all[0], epoch, ev.tau_init())
        save[f"{variant}/e{epoch}/loss"] = np.float64(loss)
        for k, v in to_torch(g).items():
            save[f"{variant}/e{epoch}/grad/{k}"] = v
        print(f"{variant} epoch {epoch}: jax loss {float(loss):.7f} kl_w {float(aux[3]):.3f} meanS {float(aux[1]):.3f}")

    # trajectory: plain Adam(lr) (no cosine), same batches, fixed epoch index
    opt = optax.adam(args.lr)
    @jax.jit
    def step(params, opt_state, tau_state, x, y):
        (loss, aux), g = jax.value_and_grad(loss_fn, has_aux=True)(params, x, y, args.traj_epoch, tau_state)
        upd, opt_state = opt.update(g, opt_state, params)
        return optax.apply_updates(params, upd), opt_state, aux[0], loss, aux[1], aux[2]
    params, ost, tau = params0, opt.init(params0), ev.tau_init()
    traj = []
    for s in range(nb):
        params, ost, tau, loss, ms, acc = step(params, ost, tau, nhwc(xb_all[s]), yb_all[s])
        traj.append((float(loss), float(ms), float(acc)))
    save[f"{variant}/traj"] = np.asarray(traj)
    t = np.asarray(traj)
    print(f"{variant} traj: loss {t[0,0]:.4f} -> {t[-1,0]:.4f}, meanS {t[0,1]:.2f} -> {t[-1,1]:.2f}, "
          f"acc last10 {t[-10:,2].mean():.3f}")

np.savez(os.path.join(HERE, f"jax_seed{args.seed}.npz"), **save)

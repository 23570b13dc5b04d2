"""Throughput of the ConvNet / VGG16 train and eval steps for each CPU implementation choice.

Train step: forward + backward of a softplus-evidence MSE loss + Adam update, jitted, synthetic
data, float32; eval step: forward only (train=False). All configurations are compiled first, then
timed in interleaved rounds (each round waits for an idle CPU, then times `--repeats` steps of
every configuration). Printed per configuration: img/s of the best round's median step time, and
every round's median (spread = machine noise; the project's CPUs are shared).

From the repository root:

    python -m studies.profile_models --model convnet --conv xla,auto \\
        --pool reduce_window,reshape,auto
    python -m studies.profile_models --model vgg16 --mode eval --batch 256 --rounds 2 --repeats 3
    "$TORCH_PYTHON" -m studies.profile_models --torch --model vgg16   # PyTorch reference

The PyTorch reference (`--torch`, needs a Python with torch, `$TORCH_PYTHON`, e.g.
PATH/TO/torch-venv/bin/python; not the project's venv) runs the same architectures, loss, Adam and
batch with `--threads` intra-op threads.
Results on the 2-core CPU are in the module docstring of gedl_jax/networks/layers.py.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

SHAPES = {"convnet": (28, 28, 1), "vgg16": (32, 32, 3)}


def wait_for_idle(max_wait_s: float = 60.0, idle_fraction: float = 0.9) -> None:
    """Waits (up to max_wait_s) until the CPU was >= idle_fraction idle over one second."""
    def snapshot():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[3] + v[4], sum(v)
    deadline = time.time() + max_wait_s
    while time.time() < deadline:
        i0, t0 = snapshot()
        time.sleep(1.0)
        i1, t1 = snapshot()
        if (i1 - i0) >= idle_fraction * max(t1 - t0, 1):
            return


def softplus_mse_loss(logits_BxK, labels_B):
    """Mean over the batch of the EDL MSE loss with alpha = softplus(logits) + 1."""
    import jax

    alpha_BxK = jax.nn.softplus(logits_BxK) + 1.0
    strength_B = alpha_BxK.sum(-1)
    p_BxK = alpha_BxK / strength_B[:, None]
    y_BxK = jax.nn.one_hot(labels_B, logits_BxK.shape[-1])
    per_example = ((y_BxK - p_BxK) ** 2 + p_BxK * (1 - p_BxK) / (strength_B[:, None] + 1)).sum(-1)
    return per_example.mean()


def jax_runner(name, conv, pool, mode, batch, dtype):
    """Returns a function that runs one (blocking) step, already compiled, and the compile time."""
    import jax
    import optax

    from gedl_jax import networks as models

    model = models.build_model(name, 10, dtype=dtype, conv_impl=conv, pool_impl=pool)
    key = jax.random.key(0)
    images = jax.random.uniform(key, (batch, *SHAPES[name]))
    labels = jax.random.randint(key, (batch,), 0, 10)
    variables = model.init(key, images[:2], train=False)
    state = {"params": variables["params"],
             "extra": {k: v for k, v in variables.items() if k != "params"}}
    tx = optax.adam(1e-3)
    state["opt"] = tx.init(state["params"])
    has_bn = "batch_stats" in variables

    @jax.jit
    def train_step(params, extra, opt_state):
        def loss_fn(p):
            if has_bn:
                logits, new = model.apply({"params": p, **extra}, images, train=True,
                                          mutable=["batch_stats"], rngs={"dropout": key})
            else:
                logits, new = model.apply({"params": p}, images, train=True), extra
            return softplus_mse_loss(logits, labels), dict(new)
        (loss, new_extra), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new_extra, opt_state, loss

    @jax.jit
    def eval_step(params, extra):
        return model.apply({"params": params, **extra}, images, train=False)

    def run():
        if mode == "train":
            state["params"], state["extra"], state["opt"], loss = train_step(
                state["params"], state["extra"], state["opt"])
            loss.block_until_ready()
        else:
            eval_step(state["params"], state["extra"]).block_until_ready()

    t0 = time.perf_counter()
    run()
    return run, time.perf_counter() - t0


TORCH_MISSING = ("torch is not installed: pip install torch (not a gedl-jax dependency), or run "
                 "this with a Python that has it ($TORCH_PYTHON)")


def require_torch(parser: argparse.ArgumentParser) -> None:
    """Exit 2 with one error line when torch cannot be imported: the PyTorch paths need it, and
    it is not a gedl-jax dependency (a traceback would bury what to do)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        parser.exit(2, f"{parser.prog}: error: {TORCH_MISSING}\n")


def torch_runner(name, mode, batch, threads):
    """The same step in PyTorch (reference architecture and default init)."""
    import torch
    from torch import nn

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if name == "convnet":
        layers, c = [], 1
        for _ in range(3):
            layers += [nn.Conv2d(c, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2)]
            c = 64
        layers += [nn.Flatten(), nn.Linear(576, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                   nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)]
    else:
        layers, c = [], 3
        for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                  512, 512, 512, "M"):
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(c, v, 3, padding=1), nn.BatchNorm2d(v), nn.ReLU(True)]
                c = v
        layers += [nn.Flatten(), nn.Dropout(0.5), nn.Linear(512, 512), nn.ReLU(True),
                   nn.Dropout(0.5), nn.Linear(512, 512), nn.ReLU(True), nn.Linear(512, 10)]
    model = nn.Sequential(*layers)
    h, w, c = SHAPES[name]
    images = torch.rand(batch, c, h, w)
    labels = torch.randint(0, 10, (batch,))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def run():
        if mode == "eval":
            model.eval()
            with torch.no_grad():
                model(images)
            return
        model.train()
        alpha = nn.functional.softplus(model(images)) + 1
        s = alpha.sum(-1, keepdim=True)
        p = alpha / s
        y = nn.functional.one_hot(labels, 10).float()
        loss = ((y - p) ** 2 + p * (1 - p) / (s + 1)).sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    t0 = time.perf_counter()
    run()
    return run, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="convnet", choices=tuple(SHAPES),
                    help="network: convnet (MNIST, 28x28x1) or vgg16 (CIFAR, 32x32x3)")
    ap.add_argument("--mode", default="train", choices=("train", "eval"),
                    help="time the train step (forward, backward, Adam) or the eval step "
                         "(forward)")
    ap.add_argument("--conv", default="xla,auto", help="comma list of conv_impl values")
    ap.add_argument("--pool", default="reduce_window,reshape,auto", help="comma list of pool_impl")
    ap.add_argument("--batch", type=int, default=None, help="default 128 train, 1024 eval")
    ap.add_argument("--repeats", type=int, default=10, help="timed steps per round")
    ap.add_argument("--rounds", type=int, default=3,
                    help="interleaved rounds, each after the CPU is idle; img/s is the best "
                         "round's")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                    help="compute dtype of the jax steps (not --torch)")
    ap.add_argument("--torch", action="store_true",
                    help="time the PyTorch reference instead (run with a python that has torch)")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (--torch)")
    args = ap.parse_args()
    batch = args.batch or (128 if args.mode == "train" else 1024)

    if args.torch:
        require_torch(ap)
        import torch
        header = f"torch {torch.__version__} threads {args.threads}"
        runners = {("torch", "torch"): torch_runner(args.model, args.mode, batch, args.threads)}
    else:
        import jax
        import jax.numpy as jnp
        header = f"jax {jax.__version__} {args.dtype} backend {jax.default_backend()}"
        runners = {(conv, pool): jax_runner(args.model, conv, pool, args.mode, batch,
                                            jnp.dtype(args.dtype))
                   for conv, pool in itertools.product(args.conv.split(","), args.pool.split(","))}
    print(f"{args.model} {args.mode} batch {batch}, {header}; "
          f"{args.rounds} rounds x {args.repeats} steps")
    medians = {k: [] for k in runners}
    for _ in range(args.rounds):
        wait_for_idle()
        for k, (run, _) in runners.items():
            times = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                run()
                times.append(time.perf_counter() - t)
            medians[k].append(statistics.median(times))
    print(f"{'conv_impl':>10} {'pool_impl':>14} {'img/s':>8} {'compile s':>9}  img/s per round")
    for (conv, pool), (_, compile_s) in runners.items():
        rounds = " ".join(f"{batch / m:.1f}" for m in medians[conv, pool])
        print(f"{conv:>10} {pool:>14} {batch / min(medians[conv, pool]):8.1f} {compile_s:9.1f}"
              f"  {rounds}")


if __name__ == "__main__":
    main()

"""Input throughput of the device-resident pipeline, next to the model's train step time.

For MNIST (28x28x1, no augmentation) and CIFAR-10 (32x32x3, flip + crop + rotation) shapes, the
training split is put on the device once; one jitted call then does what the train step does per
step: slice the epoch permutation, gather the batch, augment (CIFAR), scale to float32. Prints
images/s as the median over repeats after a warm-up (compile) call, the per-epoch permutation
cost, and the model's train step time at the same batch size, so anyone can see the input never
limits training.

    python tools/input_throughput.py --synthetic           # synthetic uint8, real split sizes
    python tools/input_throughput.py --data_dir DATA_DIR   # the real splits (+ decode times)
    python tools/input_throughput.py --batch 128,1024 --repeats 7 --steps 50

Without --data_dir it reads the real splits from $GEDL_DATA_DIR where that is set, else it times
synthetic arrays. The model step time is the real train step's, as bin/benchmark.py times it
(`gedl_jax.run.step_benchmark`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import jax
import numpy as np

from gedl_jax import data
from gedl_jax.run import numerics

SHAPES = {"mnist": ((48000, 28, 28, 1), False), "cifar10": ((47500, 32, 32, 3), True)}


def hardware() -> str:
    dev = jax.devices()[0]
    return (f"jax {jax.__version__} on {jax.device_count()} x {dev.platform}:"
            f"{getattr(dev, 'device_kind', '?')}; host CPU {numerics.host_cpu()}, "
            f"{os.cpu_count()} cores")


# ------------------------------------------------------------------------------------ model
def model_step_time(dataset: str, batch_size: int) -> float:
    """Seconds per jitted train step of the dataset's model (ConvNet for mnist, VGG16-bn for
    cifar10) at `batch_size`: the real GEDL train step on synthetic data
    (`run.step_benchmark.compiled_train_step`, what bin/benchmark.py times), the median of 3
    repeats of 3 steps after a warm-up step. The input numbers above do not depend on it."""
    from gedl_jax.run.step_benchmark import compiled_train_step

    model = "convnet" if dataset in ("mnist", "fashion_mnist", "kmnist") else "vgg16"
    run, _ = compiled_train_step(model, batch_size, "float32", 1, 3, device_loop=True)
    run(1)   # warm-up
    times = []
    for _ in range(3):
        start = time.perf_counter()
        run(3)
        times.append((time.perf_counter() - start) / 3)
    return statistics.median(times)


# ----------------------------------------------------------------------------- measurement
def make_input_step(batch_size: int, augment: bool):
    aug_key = jax.random.PRNGKey(1)

    @jax.jit
    def input_step(images, labels, perm, step):
        x, y = data.take_batch(images, labels, perm, step, batch_size)
        if augment:
            x = data.augment_cifar(jax.random.fold_in(aug_key, step), x)
        return data.to_float(x), y

    return input_step


def measure(images, labels, batch_size: int, augment: bool, repeats: int, steps: int
            ) -> tuple[float, float]:
    """(median seconds per input step, seconds for one epoch permutation)."""
    n = images.shape[0]
    perm_fn = jax.jit(data.epoch_permutation, static_argnums=1)
    perm = perm_fn(jax.random.PRNGKey(0), n).block_until_ready()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        perm_fn(jax.random.PRNGKey(len(times)), n).block_until_ready()
        times.append(time.perf_counter() - t)
    perm_time = statistics.median(times)
    step = make_input_step(batch_size, augment)
    per_epoch = n // batch_size   # full batches per epoch, as training (remainder dropped)
    jax.block_until_ready(step(images, labels, perm, 0))  # compile
    times = []
    for r in range(repeats):
        t = time.perf_counter()
        out = None
        for i in range(steps):
            out = step(images, labels, perm, (r * steps + i) % per_epoch)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t) / steps)
    return statistics.median(times), perm_time


def load_arrays(dataset: str, data_dir: str | None, cache_dir: str | None):
    shape, _ = SHAPES[dataset]
    if not data_dir:
        rng = np.random.default_rng(0)
        return (rng.integers(0, 256, shape, dtype=np.uint8),
                rng.integers(0, 10, shape[0]).astype(np.int32), "synthetic")
    with tempfile.TemporaryDirectory() as cold:
        t = time.perf_counter()
        source = data.load_split(dataset, "train", data_dir, cache_dir=cold).source
        decode = time.perf_counter() - t
        t = time.perf_counter()
        data.load_split(dataset, "train", data_dir, cache_dir=cold)
        hit = time.perf_counter() - t
    splits = data.load_train_val_test(dataset, data_dir, cache_dir=cache_dir)
    print(f"  {dataset} official train split ({source} files): verify + decode + cache write "
          f"{decode:.2f} s, "
          f"cache hit (incl. array sha256) {hit:.2f} s")
    return splits["train"].images, splits["train"].labels, "real"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default="mnist,cifar10",
                   help="comma-separated datasets: mnist (28x28x1), cifar10 (32x32x3, augmented)")
    p.add_argument("--batch", default="128,1024", help="comma-separated global batch sizes")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed repeats after the warm-up; each time is their median")
    p.add_argument("--steps", type=int, default=30, help="input steps timed per repeat")
    p.add_argument("--data_dir", default=os.environ.get("GEDL_DATA_DIR", ""),
                   help="real data folder (default $GEDL_DATA_DIR); empty: synthetic arrays")
    p.add_argument("--synthetic", action="store_true", help="ignore --data_dir")
    p.add_argument("--cache_dir", default=None,
                   help="decoded-array cache of the real splits (default $GEDL_CACHE_DIR, else "
                        "~/.cache/gedl_jax); the decode times use a fresh temporary one")
    args = p.parse_args(argv)
    data_dir = None if args.synthetic else (args.data_dir or None)
    print(hardware())
    rows = []
    for dataset in args.datasets.split(","):
        _, augment = SHAPES[dataset]
        images_np, labels_np, kind = load_arrays(dataset, data_dir, args.cache_dir)
        # on the default device, once, as training keeps its split
        images = jax.device_put(images_np)
        labels = jax.device_put(np.asarray(labels_np, np.int32))
        for b in (int(x) for x in args.batch.split(",")):
            t_in, t_perm = measure(images, labels, b, augment, args.repeats, args.steps)
            t_model = model_step_time(dataset, b)
            rows.append((dataset, kind, images_np.shape[0], b, augment, t_in, t_perm, t_model))
    print(f"\n{'dataset':8} {'data':9} {'N':>6} {'batch':>5} {'augment':7} {'input ms/step':>13} "
          f"{'input img/s':>12} {'perm ms/epoch':>13} {'model ms/step':>13} {'input share':>11}")
    for dataset, kind, n, b, augment, t_in, t_perm, t_model in rows:
        model = f"{t_model * 1e3:13.2f}"
        share = f"{t_in / t_model:11.1%}"
        print(f"{dataset:8} {kind:9} {n:6d} {b:5d} {str(augment):7} {t_in * 1e3:13.3f} "
              f"{b / t_in:12,.0f} {t_perm * 1e3:13.2f} {model} {share}")
    print("\ninput step = permutation slice + gather (+ flip/crop/rotation) + uint8->float32, "
          "one jitted call per step on the device-resident split; median of "
          f"{args.repeats} repeats x {args.steps} steps after warm-up.")


if __name__ == "__main__":
    main()

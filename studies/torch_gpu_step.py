"""An independent PyTorch reference of our GEDL train step, for the GPU speed comparison.

The same work as the step `bin/benchmark.py` times, written from the Flax definitions in PyTorch
(no jax, no gedl_jax: it runs under a Python that has only torch and numpy):

- Networks: the MNIST ConvNet (3 x [Conv 5x5 pad 2 -> ReLU -> MaxPool 2], 64 channels, MLP
  576 -> 64 -> 64 -> 64 -> 10) and the CIFAR VGG16-bn (configuration D, each 3x3 conv -> BatchNorm
  -> ReLU, classifier Dropout 0.5 -> 512 -> ReLU -> Dropout 0.5 -> 512 -> ReLU -> 10): the layer
  sizes of `gedl_jax/networks/protocol.py`, so the FLOPs match. PyTorch's default initialisation.
- Loss: GEDL's objective on every sample, mean over the batch: evidence e = softplus(logits)
  (PyTorch's `F.softplus`), W = (K + C_w K E) / (1 + K E) with E = sum_k e_k and C_w = 0.5 under
  `torch.no_grad()`, base rate a = 1/K, alpha = e + W a, the data term psi(S) - psi(alpha_y) with
  S = sum_k alpha_k, plus lambda KL(Dir(alpha) || Dir(W a)) in closed form (lgamma / digamma),
  W a detached. lambda is a fixed 1.0 here; our step weighs the KL by 1/tau_t, a scalar computed
  each step, which changes no shape and no FLOP count. `gedl_loss_per_sample` is the formula;
  tests/test_torch_gpu_step.py checks it against gedl_jax's in float64 (`--loss_check`).
- Optimiser: Adam, lr 1e-3, PyTorch's defaults otherwise, no weight decay (`capturable=True` in
  the cudagraphs mode, which graph capture needs).
- Input: a synthetic uint8 training set of batch x steps images resident on the device, stored
  NHWC (N, H, W, C) like ours; each step gathers its batch by index on the device (a step counter
  that lives on the device), permutes to NCHW (with `--memory_format=channels_last`, the default,
  that permute is free: NHWC storage is channels_last) and converts to float in [0, 1]. No
  augmentation, no host-to-device copy inside the timed loop.
- dtypes: float32, or bfloat16 through `torch.autocast` (parameters, batch statistics and the
  loss stay float32, as in our bfloat16 step).

Differences from our step, none of which adds work on the PyTorch side: our CIFAR preset also
augments (random crop and flip on the device), adds L2 weight decay and follows a cosine learning
rate; the KL weight and prior of the two differ only by the scalar 1/tau_t.

Modes:
- `eager`: the step as a plain PyTorch function.
- `compile`: `torch.compile` of the whole step function (data gather, forward, loss, backward and
  the Adam step; Dynamo splits it at `backward()`, and compiles the optimizer step as well), with
  `--compile_mode` (default "default"; "reduce-overhead" adds torch's own CUDA graphs,
  "max-autotune" searches kernels).
- `cudagraphs`: the whole step (gather, forward, loss, backward, Adam) captured once in a
  `torch.cuda.CUDAGraph` after warm-up steps on a side stream, then replayed (CUDA only).

TF32: `--tf32=on` (default) sets `torch.backends.cuda.matmul.allow_tf32 = True`,
`torch.backends.cudnn.allow_tf32 = True` and `torch.set_float32_matmul_precision("high")`;
`--tf32=off` sets both flags False and the precision "highest". The settings in force are printed
and written into every result.

Timing: 3 setup steps, timed as `setup_s` (compile mode: they compile the step, and any
recompilation a later call needs; cudagraphs mode: they are the warm-up on a side stream, then
the capture and 3 replays), `--warmup` more steps, then
`--repeats` repeats of `--steps` steps, each between `torch.cuda.synchronize()` calls; the median
over repeats gives images/s and step ms. One JSON line per configuration goes to stdout, and
with `--out FILE.json` all of them with the environment.

From the repository root, with a Python that has torch ($TORCH_PYTHON):

    "$TORCH_PYTHON" -m studies.torch_gpu_step --models=convnet,vgg16 --batches=128 \\
        --dtypes=float32,bfloat16 --modes=eager,compile,cudagraphs --out=torch.json
    "$TORCH_PYTHON" -m studies.torch_gpu_step --dry_run     # tiny, seconds, CPU without a GPU

`--dry_run` runs the same code with batch 8, 2 steps, 1 repeat, 1 warm-up step: on the CPU (no
GPU) in eager mode only (compile is skipped on the CPU unless `--modes` names it explicitly;
cudagraphs needs CUDA), so a CPU machine can check the script.
`studies/gpu_vs_torch.py` runs it beside `bin/benchmark.py` and tabulates both.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import numpy as np

try:   # not a gedl-jax dependency: without it --help still answers, and main() says to install it
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch import nn
except ModuleNotFoundError as missing:
    if missing.name != "torch":
        raise
    torch = F = nn = None

NUM_CLASSES = 10
C_W = 0.5
KL_WEIGHT = 1.0
LEARNING_RATE = 1e-3
IMAGE_SHAPES = {"convnet": (28, 28, 1), "vgg16": (32, 32, 3)}   # H, W, C
MODES = ("eager", "compile", "cudagraphs")
SETUP_STEPS = 3   # steps timed as setup_s, before the --warmup steps
DTYPES = ("float32", "bfloat16")   # torch's dtypes of these names
VGG16_CONFIG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                512, 512, 512, "M")


# --------------------------------------------------------------------------------------------
# Networks (transcribed from gedl_jax/networks/protocol.py)
# --------------------------------------------------------------------------------------------
def convnet(num_classes: int = NUM_CLASSES) -> nn.Module:
    """The MNIST ConvNet: 28 -> 14 -> 7 -> 3 (floor), flatten 576, MLP 64, 64, 64, K."""
    layers, channels = [], 1
    for _ in range(3):
        layers += [nn.Conv2d(channels, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2)]
        channels = 64
    layers += [nn.Flatten(), nn.Linear(64 * 3 * 3, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
               nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, num_classes)]
    return nn.Sequential(*layers)


def vgg16(num_classes: int = NUM_CLASSES) -> nn.Module:
    """vgg16_bn configuration D on 32x32 (flatten 512) and the I-EDL classifier."""
    layers, channels = [], 3
    for v in VGG16_CONFIG:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(channels, v, 3, padding=1), nn.BatchNorm2d(v, eps=1e-5,
                                                                            momentum=0.1),
                       nn.ReLU()]
            channels = v
    layers += [nn.Flatten(), nn.Dropout(0.5), nn.Linear(512, 512), nn.ReLU(), nn.Dropout(0.5),
               nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


NETWORKS = {"convnet": convnet, "vgg16": vgg16}


# --------------------------------------------------------------------------------------------
# GEDL's objective
# --------------------------------------------------------------------------------------------
def gedl_loss_per_sample(logits_BxK: torch.Tensor, labels_B: torch.Tensor,
                         c_w: float = C_W, kl_weight: float = KL_WEIGHT) -> torch.Tensor:
    """GEDL's per-sample objective: psi(S) - psi(alpha_y) + kl_weight KL(Dir(alpha) || Dir(W a)).

    In the dtype of `logits_BxK` (the train step passes float32 logits; the test float64).
    """
    num_classes = logits_BxK.shape[-1]
    evidence_BxK = F.softplus(logits_BxK)
    with torch.no_grad():
        total_B = evidence_BxK.sum(-1)
        w_B = (num_classes + c_w * num_classes * total_B) / (1.0 + num_classes * total_B)
        prior_BxK = (w_B / num_classes)[:, None].expand_as(evidence_BxK)   # W a, a = 1/K
    alpha_BxK = evidence_BxK + prior_BxK
    strength_B = alpha_BxK.sum(-1)
    alpha_y_B = alpha_BxK.gather(-1, labels_B[:, None])[:, 0]
    data_B = torch.digamma(strength_B) - torch.digamma(alpha_y_B)
    digamma_gap_BxK = torch.digamma(alpha_BxK) - torch.digamma(strength_B)[:, None]
    kl_B = (torch.lgamma(strength_B) - torch.lgamma(alpha_BxK).sum(-1)
            - torch.lgamma(w_B) + torch.lgamma(prior_BxK).sum(-1)
            + ((alpha_BxK - prior_BxK) * digamma_gap_BxK).sum(-1))
    return data_B + kl_weight * kl_B


# --------------------------------------------------------------------------------------------
# The train step
# --------------------------------------------------------------------------------------------
def tf32_settings(tf32: str) -> dict:
    """Applies `--tf32` ("on" / "off") and returns the settings now in force."""
    on = tf32 == "on"
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")
    return {"tf32": tf32,
            "cuda_matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision()}


def make_train_step(model_name: str, batch: int, steps: int, dtype: str, mode: str,
                    device: torch.device, memory_format: str, compile_mode: str = "default",
                    seed: int = 0):
    """Returns (step, setup_s): `step()` runs one train step in `mode` and returns its loss, a
    device tensor (not synchronised); setup_s is the time of the first `SETUP_STEPS` steps, which
    compile it (compile), or of `SETUP_STEPS` steps on a side stream, the capture and
    `SETUP_STEPS` replays (cudagraphs)."""
    torch.manual_seed(seed)
    channels_last = memory_format == "channels_last"
    model = NETWORKS[model_name]().to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    capturable = mode == "cudagraphs"
    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE, capturable=capturable)
    h, w, c = IMAGE_SHAPES[model_name]
    rng = np.random.default_rng(seed)
    n = batch * steps
    images_NxHxWxC = torch.from_numpy(rng.integers(0, 256, (n, h, w, c), np.uint8)).to(device)
    labels_N = torch.from_numpy(rng.integers(0, NUM_CLASSES, n)).to(device)
    offsets_B = torch.arange(batch, device=device)
    counter = torch.zeros((), dtype=torch.int64, device=device)   # step number, on the device
    autocast_dtype = getattr(torch, dtype)

    def train_step() -> torch.Tensor:
        index_B = (counter % steps) * batch + offsets_B
        counter.add_(1)
        x = images_NxHxWxC.index_select(0, index_B).permute(0, 3, 1, 2)   # NCHW view
        x = x.float() if channels_last else x.contiguous().float()
        x = x / 255.0
        y = labels_N.index_select(0, index_B)
        with torch.autocast(device.type, dtype=autocast_dtype,
                            enabled=autocast_dtype != torch.float32):
            logits = model(x)
        loss = gedl_loss_per_sample(logits.float(), y).mean()
        # set_to_none: in a capture, backward() then writes the gradients into buffers of the
        # graph's own pool on every replay (the pattern of PyTorch's CUDA-graph docs).
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    t0 = time.perf_counter()
    if mode == "eager":
        step = train_step
    elif mode == "compile":
        step = torch.compile(train_step, mode=compile_mode)
    elif mode == "cudagraphs":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(SETUP_STEPS):
                train_step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_loss = train_step()

        def step() -> torch.Tensor:
            graph.replay()
            return static_loss
    else:
        raise ValueError(f"unknown mode {mode!r}; allowed: {', '.join(MODES)}")
    for _ in range(SETUP_STEPS):   # compile: a later call may recompile
        step()
    synchronize(device)
    return step, time.perf_counter() - t0


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def skip_reason(mode: str, device: torch.device, dry_run: bool, modes_given: bool) -> str | None:
    """Why `mode` is not run on `device` (None: it runs)."""
    if mode == "cudagraphs" and device.type != "cuda":
        return "cudagraphs needs a CUDA device"
    if mode == "compile" and dry_run and device.type == "cpu" and not modes_given:
        return "compile is skipped in a CPU dry run (name it in --modes to include it)"
    return None


def bench_one(model_name: str, batch: int, dtype: str, mode: str, device: torch.device,
              steps: int, repeats: int, warmup: int, memory_format: str,
              compile_mode: str = "default") -> dict:
    """Times one configuration: median over repeats of `steps` steps."""
    step, setup_s = make_train_step(model_name, batch, steps, dtype, mode, device, memory_format,
                                    compile_mode)
    for _ in range(warmup):
        step()
    synchronize(device)
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(device)
        times.append((time.perf_counter() - t0) / steps)
    step_s = statistics.median(times)
    return {"images_per_s": batch / step_s, "step_ms": 1e3 * step_s,
            "step_ms_spread": [1e3 * min(times), 1e3 * max(times)], "setup_s": setup_s}


def environment(device: torch.device, tf32: dict, memory_format: str, compile_mode: str) -> dict:
    name = torch.cuda.get_device_name() if device.type == "cuda" else (
        platform.processor() or platform.machine())
    return {"framework": "torch", "device": name, "platform": device.type,
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
            "python": platform.python_version(), "memory_format": memory_format,
            "compile_mode": compile_mode, **tf32}


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------
def loss_check(path: str) -> int:
    """Prints the float64 per-sample loss of the logits / labels in the .npz at `path` (JSON)."""
    data = np.load(path)
    logits = torch.from_numpy(np.asarray(data["logits"], np.float64))
    labels = torch.from_numpy(np.asarray(data["labels"], np.int64))
    loss = gedl_loss_per_sample(logits, labels)
    print(json.dumps({"loss_per_sample": loss.tolist()}))
    return 0


def bad_input(message: str):
    """One `error:` line on stderr, exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def comma_list(text: str, allowed, what: str) -> list[str]:
    items = [t for t in text.split(",") if t]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        bad_input(f"--{what}: {','.join(bad) or 'empty'} is not one of {', '.join(allowed)}")
    return items


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="convnet,vgg16",
                   help="comma-separated networks: convnet (MNIST), vgg16 (CIFAR VGG16-bn)")
    p.add_argument("--batches", default="128", help="comma-separated batch sizes")
    p.add_argument("--dtypes", default="float32,bfloat16",
                   help="comma-separated: float32, bfloat16 (torch.autocast)")
    p.add_argument("--modes", default=None,
                   help=f"comma list of {', '.join(MODES)} (default: all three; a dry run on "
                        "the CPU: eager)")
    p.add_argument("--steps", type=int, default=20, help="steps per timed repeat (and the "
                                                         "number of batches in the data set)")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed repeats of --steps steps; images/s and step ms are their median")
    p.add_argument("--warmup", type=int, default=5,
                   help="warm-up steps (>= 1) after the 3 setup steps, before timing")
    p.add_argument("--tf32", default="on", choices=("on", "off"),
                   help="TF32 matmuls and convolutions (on: float32 matmul precision 'high'; "
                        "off: 'highest')")
    p.add_argument("--memory_format", default="channels_last",
                   choices=("channels_last", "contiguous"),
                   help="the model's and batch's memory format (channels_last: NHWC in memory)")
    p.add_argument("--compile_mode", default="default",
                   choices=("default", "reduce-overhead", "max-autotune",
                            "max-autotune-no-cudagraphs"),
                   help="torch.compile's mode in the compile mode")
    p.add_argument("--out", default=None, help="JSON file for all results and the environment")
    p.add_argument("--dry_run", action="store_true",
                   help="tiny check: batch 8, 2 steps, 1 repeat; the CPU when there is no GPU")
    p.add_argument("--dry-run", dest="dry_run", action="store_true",
                   help=argparse.SUPPRESS)   # the older spelling, still read
    p.add_argument("--loss_check", default=None, metavar="NPZ",
                   help="print the float64 per-sample loss of logits/labels in NPZ and exit")
    args = p.parse_args(argv)
    comma_list(args.models, NETWORKS, "models")
    comma_list(args.dtypes, DTYPES, "dtypes")
    if args.modes is not None:
        comma_list(args.modes, MODES, "modes")
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        batches = [0]
    if min(batches) < 1 or args.steps < 1 or args.repeats < 1 or args.warmup < 1:
        bad_input("--batches, --steps, --repeats and --warmup must be positive integers")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if torch is None:
        bad_input("torch is not installed: pip install torch (not a gedl-jax dependency), or run "
                  "this script with a Python that has it")
    if args.loss_check:
        return loss_check(args.loss_check)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batches = [int(b) for b in args.batches.split(",")]
    steps, repeats, warmup = args.steps, args.repeats, args.warmup
    if args.dry_run:
        batches, steps, repeats, warmup = [8], 2, 1, 1
    tf32 = tf32_settings(args.tf32)
    env = environment(device, tf32, args.memory_format, args.compile_mode)
    print(f"# {json.dumps(env)}", file=sys.stderr, flush=True)
    modes = (args.modes or ",".join(MODES)).split(",")
    rows = []
    for model_name in args.models.split(","):
        for batch in batches:
            for dtype in args.dtypes.split(","):
                for mode in modes:
                    row = {"model": model_name, "batch": batch, "dtype": dtype, "mode": mode,
                           "steps": steps, "repeats": repeats, "warmup": warmup, **env}
                    reason = skip_reason(mode, device, args.dry_run, args.modes is not None)
                    if reason:
                        print(f"# {model_name} b{batch} {dtype} {mode}: skipped: {reason}",
                              file=sys.stderr, flush=True)
                        row["skipped"] = reason
                    else:
                        try:
                            row.update(bench_one(model_name, batch, dtype, mode, device, steps,
                                                 repeats, warmup, args.memory_format,
                                                 args.compile_mode))
                        except Exception as e:  # e.g. out of memory, a mode that fails
                            row["error"] = repr(e)[:500]
                            print(f"# {model_name} b{batch} {dtype} {mode}: failed: {e!r}"[:500],
                                  file=sys.stderr, flush=True)
                        finally:
                            torch._dynamo.reset()
                            if device.type == "cuda":
                                torch.cuda.empty_cache()
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"environment": env, "results": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

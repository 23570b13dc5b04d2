"""studies/profile_step.py: HLO labelling of XLA thunks, trace aggregation, the ConvNet's
FLOPs."""

import gzip
import json

import jax
import pytest
import jax.numpy as jnp

from studies import profile_step
from gedl_jax import networks as models


def test_convnet_flops_written_out_for_torch_match_the_models_count():
    assert profile_step.CONVNET_FORWARD_FLOPS == models.model_flops_per_example(
        "convnet", (28, 28, 1))


ON_CPU_ONLY = pytest.mark.skipif(
    jax.default_backend() != "cpu",
    reason="studies/profile_step.py profiles XLA:CPU: it reads the CPU runtime's thunk names "
           "in the compiled HLO and its host trace (a GPU's kernels are named and traced "
           "differently)")


@ON_CPU_ONLY
def test_labels_tell_a_weight_gradient_from_a_forward_convolution():
    def loss(kernel_HxWxIxO, x_BxHxWxC):
        y = jax.lax.conv_general_dilated(x_BxHxWxC, kernel_HxWxIxO, (1, 1), ((2, 2), (2, 2)),
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return (jnp.tanh(y) ** 2).sum()

    kernel = jnp.ones((5, 5, 3, 4)) * 0.01
    x = jnp.ones((2, 12, 12, 3))
    text = jax.jit(jax.grad(loss)).lower(kernel, x).compile().as_text()
    labels = profile_step.hlo_labels(text)
    convs = [v for v in labels.values() if v.startswith("convolution")]
    windows = {v.split(" window ")[1].split(" ")[0] for v in convs}
    # The forward convolution has the kernel's 5x5 window; the weight gradient contracts over
    # the whole 12x12 image. Whether XLA fuses them into library calls or not, both show.
    assert "5x5" in windows and "12x12" in windows, labels


def test_trace_times_are_summed_per_thunk_and_divided_by_steps(tmp_path):
    events = [
        {"ph": "X", "name": "conv_fusion", "dur": 3000},
        {"ph": "X", "name": "conv_fusion", "dur": 1000},
        {"ph": "X", "name": "add_fusion", "dur": 500},
        {"ph": "X", "name": "$python_frame", "dur": 9000},           # Python, not XLA work
        {"ph": "X", "name": "ThunkExecutor::Execute", "dur": 9000},  # runtime wrapper
        {"ph": "X", "name": "end: conv_fusion", "dur": 9000},
        {"ph": "i", "name": "conv_fusion", "dur": 9000},             # not a complete event
    ]
    trace_dir = tmp_path / "plugins" / "profile" / "run"
    trace_dir.mkdir(parents=True)
    with gzip.open(trace_dir / "host.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    ops = profile_step.trace_op_times(str(tmp_path), steps=2)
    assert ops == [("conv_fusion", 2.0, 2), ("add_fusion", 0.25, 1)]


@ON_CPU_ONLY
def test_profiles_the_real_convnet_step(capsys):
    profile_step.main(["--steps=1", "--top=40", "--batch=8"])
    out = capsys.readouterr().out
    assert "our GEDL train step (convnet, batch 8" in out
    assert "GFLOP/s" in out and "convolution" in out

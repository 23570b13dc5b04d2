"""GPU readiness without a GPU: every preset's compiled train step and eval (predict) step lowers
for CUDA through `jax.export` on this CPU, so nothing host-only or CPU-only sits inside a step
program we ship for GPUs. Lowering only (no compile, no run): abstract shapes, a tiny batch.

A preset is a variant of `config_lib.VARIANTS`, and `<variant>,source` where the method has a
source recipe (`Method.source_recipe`; it can change the model). The other modifiers
(quick, ensemble) change sizes and counts, not the step program. Each network is reached through
the dataset whose preset selects it (`NETWORKS`); a network a config field selects is one more
entry there (ResNet-18: `"resnet18": ("cifar10", {"model": "resnet18"})`). The VGG16 and
ResNet-18 halves are marked slow (about 4-10 s a preset); the default suite lowers the GEDL
preset on each, the other presets are `extended` (`pytest --run-extended`). MC Dropout on
ResNet-18 (no dropout layer to switch on) is refused before any program exists: that refusal is
what the case checks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from gedl_jax import config as config_lib
from gedl_jax import configs, methods
from gedl_jax.run import experiment, optimizer, sharding, steps

# network -> (dataset whose presets select it, extra config fields)
NETWORKS: dict[str, tuple[str, dict]] = {
    "convnet": ("mnist", {}),
    "vgg16": ("cifar10", {}),
    "resnet18": ("cifar10", {"model": "resnet18"}),
}
SLOW_NETWORKS = {"vgg16", "resnet18"}
BATCH = 8


def presets() -> list[str]:
    variants = list(config_lib.VARIANTS)
    return variants + [f"{v},source" for v in variants
                       if config_lib.VARIANTS[v].get("method") in methods.source_recipes()]


def _cases():
    for network, (dataset, fields) in NETWORKS.items():
        for preset in presets():
            marks = []
            if network in SLOW_NETWORKS:   # the default suite lowers GEDL on each of them
                marks = [pytest.mark.slow] + ([] if preset == "gedl" else [pytest.mark.extended])
            yield pytest.param(network, dataset, fields, preset, marks=marks,
                               id=f"{network}-{preset.replace(',', '+')}")


def _image_shape(config) -> tuple[int, int, int]:
    return (28, 28, 1) if config.dataset in ("mnist", "fashion_mnist") else (32, 32, 3)


def _lower(config, network: str) -> tuple[export.Exported, export.Exported]:
    image_shape = _image_shape(config)
    labels_N = np.arange(4 * BATCH) % config.num_classes
    method = methods.from_config(config, methods.MethodSetup.from_labels(
        labels_N, config.num_classes, image_shape))
    tx = optimizer.make_optimizer(config, total_steps=100)
    mesh = sharding.make_mesh(jax.devices()[:1])
    channels = image_shape[-1]
    stats = ((0.5,) * channels, (0.25,) * channels) if config.normalize else (None, None)
    settings = steps.StepSettings(steps_per_epoch=4, batch_size=BATCH,
                                  augment=bool(config.augment), normalize_mean=stats[0],
                                  normalize_std=stats[1])
    keys = experiment.run_keys(0)
    state = jax.eval_shape(lambda k: steps.init_train_state(method, tx, k, image_shape),
                           keys["init"])
    n = len(labels_N)
    # the program a GPU trains with: up to 4 steps per call in the device loop
    # (config.steps_per_dispatch), the step itself inside it
    train = export.export(steps.make_train_step(method, tx, mesh, settings, keys, max_steps=4,
                                                device_loop=True), platforms=("cuda",))(
        state, jax.ShapeDtypeStruct((), jnp.int32),
        jax.ShapeDtypeStruct((n, *image_shape), jnp.uint8),
        jax.ShapeDtypeStruct((n,), jnp.int32), jax.ShapeDtypeStruct((n,), jnp.int32))
    predict = export.export(steps.make_predict_step(method, mesh, *stats),
                            platforms=("cuda",))(
        state.variables, state.method_state,
        jax.ShapeDtypeStruct((BATCH, *image_shape), jnp.uint8), keys["dropout"])
    return train, predict


@pytest.mark.parametrize("network,dataset,fields,preset", list(_cases()))
def test_train_and_eval_steps_lower_for_cuda(network, dataset, fields, preset):
    config = config_lib.set_fields(configs.build_config(dataset, preset), **fields)
    if network != "convnet" or fields:   # the preset really runs the network named
        assert config.model == network
    if network == "resnet18" and config.method == "mc_dropout":
        with pytest.raises(ValueError, match="MC Dropout needs dropout"):
            _lower(config, network)
        return
    train, predict = _lower(config, network)
    for exported in (train, predict):
        assert exported.platforms == ("cuda",)
        text = exported.mlir_module()
        # No host callback (jax.debug.print, pure_callback, io_callback) inside a step: each
        # would stop the GPU at every step to run Python on the host.
        assert "callback" not in text


def test_the_cases_cover_every_variant_and_network():
    ids = {p.id for p in _cases()}
    for network in NETWORKS:
        for variant in config_lib.VARIANTS:
            assert f"{network}-{variant}" in ids


def test_memory_analysis_script_prints_the_table(capsys):
    """tools/memory_analysis.py (the numbers in docs/performance.md), on the ConvNet at a tiny
    size: one row per step, the peak = arguments + outputs + temporaries - aliased."""
    from tools import memory_analysis as script

    assert script.main(["--models=convnet", "--batches=8", "--train_examples=64"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines()
            if line.startswith("| convnet |")]
    assert [r.split("|")[4].strip() for r in rows] == ["train", "eval"]
    for row in rows:
        args, outs, temps, aliased, peak = (float(x.replace(",", ""))
                                            for x in row.split("|")[5:10])
        assert peak > 0 and abs(args + outs + temps - aliased - peak) < 0.3   # 0.1 MiB digits

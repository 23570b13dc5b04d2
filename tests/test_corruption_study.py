"""The CIFAR-10-C corruption study's plumbing (gedl_jax.evaluate.corruption_study) without a
trained network: the restored run and the network's outputs are stand-ins, everything else
(loss spec, data loading from a regenerated set, summaries, JSON, table, plot) is the real code.
"""

import json
import types

import numpy as np
import pytest
from data_fixtures import specs_for, write_npz

from gedl_jax import configuration, data, evaluate, evaluation, parallel, train
from gedl_jax.data import corruptions, registry


def test_loss_spec_uses_the_training_label_frequencies():
    config = configuration.build_config("cifar10", "gedl")
    labels = np.array([0] * 6 + [1] * 3 + [2] * 1, np.int32)
    split = data.Split(np.zeros((10, 32, 32, 3), np.uint8), labels, "cifar10/train")
    assert evaluate.loss_spec(config, split).base_rate is None  # uniform 1/K
    config.base_rate = "label_frequency"
    spec = evaluate.loss_spec(config, split)
    np.testing.assert_allclose(spec.base_rate, [0.6, 0.3, 0.1] + [0.0] * 7)
    assert spec.base_rate == train._label_frequencies(labels, 10)  # what training used


@pytest.mark.usefixtures("no_network", "isolated_env")
def test_corruption_study_scores_the_trained_alpha_and_names_its_source(tmp_path, monkeypatch):
    root = tmp_path / "data"
    rng = np.random.default_rng(0)
    test_images = rng.integers(0, 256, (12, 32, 32, 3), dtype=np.uint8)
    test_labels = np.arange(12) % 10
    write_npz(root / "cifar10" / "test.npz", test_images, test_labels)
    with registry.override_file_specs("cifar10", "arrays",
                                      specs_for(root / "cifar10", ["test.npz"])):
        corruptions.regenerate_cifar10c(root, corruptions=["snow", "pixelate"], seed=4)

    config = configuration.build_config("cifar10", "gedl")
    config.base_rate = "label_frequency"
    config.data_dir, config.tfds_data_dir = str(root), str(tmp_path / "tfds")
    train_labels = np.array([0] * 30 + [1] * 10, np.int32)  # a skewed training split
    loaded = {"splits": {
        "train": data.Split(np.zeros((40, 32, 32, 3), np.uint8), train_labels, "cifar10/train"),
        "test": data.Split(test_images, test_labels.astype(np.int32), "cifar10/test")}}
    mesh = types.SimpleNamespace(size=1)
    state = types.SimpleNamespace(params=None, batch_stats=None)
    monkeypatch.setattr(evaluate, "restore_run", lambda w, o=None: (config, state, None, mesh,
                                                                     loaded))
    specs = []

    def fake_eval_step(model, spec, mesh_, mean, std):
        specs.append(spec)
        return "eval_step"

    def fake_outputs(eval_step, params, batch_stats, mesh_, split, batch_size, with_labels=True):
        # alpha depends on the images, so that clean and corrupted sets differ.
        brightness = split.images.reshape(len(split), -1).mean(-1) / 255.0
        alpha = 1.0 + np.outer(brightness, np.arange(1, 11))
        return evaluation.ModelOutputs(alpha=alpha, prior_strength=np.full(len(split), 0.5),
                                       labels=split.labels)

    monkeypatch.setattr(parallel, "make_eval_step", fake_eval_step)
    monkeypatch.setattr(evaluate, "_outputs", fake_outputs)
    study = evaluate.corruption_study(["run_a", "run_b"], ["snow", "pixelate"], tmp_path / "out",
                                      num_examples=5)
    assert len(specs) == 2  # one eval step per run
    for spec in specs:
        np.testing.assert_allclose(spec.base_rate, [0.75, 0.25] + [0.0] * 8)
    snow = study["snow"]
    assert snow["source"] == "regenerated"
    assert "regenerated" in snow["source_label"] and "approximate" in snow["source_label"]
    assert "approximate" not in study["pixelate"]["source_label"]
    assert snow["regenerated_provenance"]["seed"] == 4
    assert snow["num_examples"] == {s: 5 for s in range(6)}
    assert sorted(snow["measures"]) == list(range(6)) and snow["ensemble_epistemic"] is not None
    assert set(snow["accuracy"]) == set(range(6))
    on_disk = json.loads((tmp_path / "out" / "corruption_study.json").read_text())
    assert on_disk["snow"]["source_label"] == snow["source_label"]
    table = (tmp_path / "out" / "corruption_study.md").read_text()
    assert "regenerated CIFAR-10-C" in table and "| snow | 5 | 5 |" in table
    assert (tmp_path / "out" / "corruption_snow.png").stat().st_size > 0

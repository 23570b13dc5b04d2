"""The CIFAR-10-C corruption study's plumbing (gedl_jax.run.corruption_study) without a
trained network: the restored run and the network's outputs are stand-ins, everything else
(loss spec, data loading from a regenerated set, summaries, JSON, table, plot) is the real code.
"""

import json
import types

import numpy as np
import pytest
from data_fixtures import specs_for, write_npz

from gedl_jax import configs, data, evaluate, evaluation
from gedl_jax.data import regenerate, registry
from gedl_jax.run import ensemble, experiment, workdir


def test_the_method_uses_the_training_label_frequencies():
    config = configs.build_config("cifar10", "gedl")
    labels = np.array([0] * 6 + [1] * 3 + [2] * 1, np.int32)
    split = data.Split(np.zeros((10, 32, 32, 3), np.uint8), labels, "cifar10/train")
    assert experiment.build_method(config, split).spec.base_rate is None  # uniform 1/K
    config.base_rate = "label_frequency"
    spec = experiment.build_method(config, split).spec
    np.testing.assert_allclose(spec.base_rate, [0.6, 0.3, 0.1] + [0.0] * 7)


@pytest.mark.usefixtures("no_network", "isolated_env")
def test_corruption_study_scores_the_trained_alpha_and_names_its_source(tmp_path, monkeypatch):
    """A plain run and a 2-member ensemble: the runs' Dirichlet measures are averaged over the
    three networks, the ensemble's mutual information comes from its members."""
    root = tmp_path / "data"
    rng = np.random.default_rng(0)
    test_images = rng.integers(0, 256, (12, 32, 32, 3), dtype=np.uint8)
    test_labels = np.arange(12) % 10
    write_npz(root / "cifar10" / "test.npz", test_images, test_labels)
    with registry.override_file_specs("cifar10", "arrays",
                                      specs_for(root / "cifar10", ["test.npz"])):
        regenerate.regenerate_cifar10c(root, corruptions=["snow", "pixelate"], seed=4)

    config = configs.build_config("cifar10", "gedl")
    config.base_rate = "label_frequency"
    config.data_dir, config.tfds_data_dir = str(root), str(tmp_path / "tfds")
    ensemble_config = config.copy_and_resolve_references()
    ensemble_config.ensemble_size = 2
    train_labels = np.array([0] * 30 + [1] * 10, np.int32)  # a skewed training split
    run_data = experiment.RunData(
        train=data.Split(np.zeros((40, 32, 32, 3), np.uint8), train_labels, "cifar10/train"),
        validation=data.Split(np.zeros((0, 32, 32, 3), np.uint8), train_labels[:0], "v"),
        test=data.Split(test_images, test_labels.astype(np.int32), "cifar10/test"),
        ood={}, train_index=np.arange(40))
    mesh = types.SimpleNamespace(size=1)

    def restored(offset):
        return workdir.RestoredRun(experiment.Experiment.from_config(
            experiment.resolve_config(config, 1), run_data),
                                   types.SimpleNamespace(offset=offset), mesh)

    monkeypatch.setattr(workdir, "saved_config",
                        lambda w, o=None: ensemble_config if w == "ens" else config)
    monkeypatch.setattr(workdir, "restore_run", lambda w, o=None, **kw: restored(0.0))
    monkeypatch.setattr(ensemble, "restore_members",
                        lambda dirs, o=None: [restored(0.0), restored(2.0)])
    base_rates = []

    def fake_predict(run, split, with_labels=True, batch_size=None):
        base_rates.append(run.experiment.method.spec.base_rate)
        # alpha depends on the images (clean and corrupted sets differ) and on the member.
        brightness = split.images.reshape(len(split), -1).mean(-1) / 255.0
        alpha = 1.0 + np.outer(brightness, np.arange(1, 11)) + run.state.offset * np.eye(
            10)[np.arange(len(split)) % 10]
        return evaluation.dirichlet_predictions(evaluation.ModelOutputs(
            alpha, np.full(len(split), 0.5), split.labels))

    monkeypatch.setattr(workdir, "predict", fake_predict)
    study = evaluate.corruption_study(["run_a", "ens"], ["snow", "pixelate"], tmp_path / "out",
                                      num_examples=5)
    assert len(base_rates) == 2 * 3 * 6   # corruptions x networks x severities
    for base_rate in base_rates:  # what training used: the training split's label frequencies
        np.testing.assert_allclose(base_rate, [0.75, 0.25] + [0.0] * 8)
    snow = study["snow"]
    assert snow["source"] == "regenerated"
    assert "regenerated" in snow["source_label"] and "approximate" in snow["source_label"]
    assert "approximate" not in study["pixelate"]["source_label"]
    assert snow["regenerated_provenance"]["seed"] == 4
    assert snow["num_examples"] == {s: 5 for s in range(6)}
    assert sorted(snow["measures"]) == list(range(6)) and snow["num_runs"] == 3
    assert all(v > 0 for v in snow["ensemble_epistemic"].values())   # the members disagree
    assert set(snow["accuracy"]) == set(range(6))
    on_disk = json.loads((tmp_path / "out" / "corruption_study.json").read_text())
    assert on_disk["snow"]["source_label"] == snow["source_label"]
    table = (tmp_path / "out" / "corruption_study.md").read_text()
    assert "regenerated CIFAR-10-C" in table and "| snow | 5 | 5 |" in table
    assert (tmp_path / "out" / "corruption_snow.png").stat().st_size > 0

"""Own networks and own data in the run engine, in process: config validation, the number of
classes and the default model from the data, the network contract checked per method before any
step (features, MC Dropout's switch), what each method reads from a user network, Prior
Networks' noise on vectors, `val_*` arrays, OOD shape errors, and `tfds:<name>` datasets."""

from __future__ import annotations

import numpy as np
import pytest
from own_fixtures import write_image_data, write_user_package, write_vector_data

from gedl_jax import config as config_lib
from gedl_jax import configs, data, methods
from gedl_jax.methods import common, prior_networks
from gedl_jax.run import experiment


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("own_inproc")
    write_user_package(root / "pkg")
    return root / "pkg", write_image_data(root / "data"), write_vector_data(root / "data")


@pytest.fixture
def userpkg(files, monkeypatch):
    monkeypatch.syspath_prepend(str(files[0]))
    return files


def _config(preset: str, dataset, model: str = "", **fields):
    c = configs.build_config("custom", f"{preset},quick")
    config_lib.set_fields(c, dataset=f"npz:{dataset}", model=model, **fields)
    experiment.resolve_own_data(c)
    config_lib.validate(c)
    return c


def _method(c):
    official = experiment.OfficialData.load(c)
    return experiment.build_method(experiment.resolve_config(c, 1),
                                   official.for_seed(c, 0).train)


# ------------------------------------------------------------------------- configuration
def test_model_accepts_builtins_and_module_specs_and_names_the_form_otherwise():
    c = configs.build_config("mnist", "gedl")
    for model in ("convnet", "resnet18", "mlp", "pkg.nets:Net", "a:Outer.Inner"):
        config_lib.validate(config_lib.set_fields(c, model=model))
    with pytest.raises(ValueError, match="<importable.module>:<Name>"):
        config_lib.validate(config_lib.set_fields(c, model="not a spec"))


def test_custom_config_needs_a_dataset_and_json_model_kwargs():
    c = configs.build_config("custom", "gedl")
    with pytest.raises(ValueError, match="npz:<path"):
        config_lib.validate(c)
    config_lib.set_fields(c, dataset="npz:x.npz", model="mlp", model_kwargs="[1]")
    with pytest.raises(ValueError, match="JSON object"):
        config_lib.validate(c)


def test_quick_on_custom_data_uses_all_of_it():
    c = configs.build_config("custom", "edl,quick")
    assert (c.train_examples, c.val_examples, c.num_epochs) == (0, 0, 2)
    assert c.run_name == "custom_edl_quick"


# -------------------------------------------------------------------------------- data
def test_classes_and_default_model_come_from_the_data(userpkg):
    _, _, (vectors, _) = userpkg
    c = _config("gedl", vectors)
    assert (c.num_classes, c.model) == (3, "mlp")


def test_images_need_a_named_model_and_vectors_no_augmentation(userpkg):
    _, (images, _), (vectors, _) = userpkg
    c = configs.build_config("custom", "gedl")
    config_lib.set_fields(c, dataset=f"npz:{images}")
    with pytest.raises(ValueError, match="name a network"):
        experiment.resolve_own_data(c)
    config_lib.set_fields(c, dataset=f"npz:{vectors}", augment=True)
    with pytest.raises(ValueError, match="augment"):
        experiment.resolve_own_data(c)


def test_an_ood_set_of_another_shape_is_one_line(userpkg):
    _, (images, _), (_, vectors_ood) = userpkg
    c = _config("gedl", images, "userpkg.nets:NNXCNN", ood_datasets=f"npz:{vectors_ood}")
    with pytest.raises(data.CorruptDataError, match="same shape") as e:
        experiment.OfficialData.load(c)
    assert "\n" not in str(e.value)


def test_the_files_validation_arrays_validate(tmp_path, userpkg):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    y = np.arange(40) % 2
    np.savez(tmp_path / "d.npz", train_images=x, train_labels=y, test_images=x[:8],
             test_labels=y[:8], val_images=x[:6], val_labels=y[:6])
    c = _config("gedl", tmp_path / "d.npz", batch_size=8)
    run = experiment.OfficialData.load(c).for_seed(c, 0)
    assert (len(run.train), len(run.validation)) == (40, 6)
    np.testing.assert_array_equal(run.validation.images, x[:6])


# ------------------------------------------------------------------------------ networks
def test_a_feature_method_refuses_a_network_without_features(userpkg):
    _, (images, _), _ = userpkg
    c = _config("duq", images, "userpkg.nets:NoFeatures")
    with pytest.raises(ValueError, match="features") as e:
        _method(c)
    assert "\n" not in str(e.value)


def test_mc_dropout_needs_the_dropout_switch(userpkg):
    _, (images, _), _ = userpkg
    with pytest.raises(ValueError, match="MC Dropout needs"):
        _method(_config("mc_dropout", images, "userpkg.nets:LinenCNN"))
    assert _method(_config("mc_dropout", images, "userpkg.nets:NNXCNN")).name == "mc_dropout"


def test_what_each_method_reads_from_a_user_network(userpkg):
    _, (images, _), _ = userpkg
    duq = _method(_config("duq", images, "userpkg.nets:LinenCNN"))
    assert isinstance(duq.eval_model.backbone, common.UserBackbone)
    assert (duq.eval_model.backbone.with_features, duq.eval_model.backbone.with_logits) == \
        (True, False)
    postnet = _method(_config("postnet", images, "userpkg.nets:NNXCNN"))
    assert (postnet.eval_model.encoder.with_features, postnet.eval_model.encoder.with_logits) \
        == (False, True)
    variables = postnet.init(np.zeros(2, np.uint32), (8, 8, 1))
    head = variables["params"]["encoder"]["net"]
    assert head["head"]["kernel"].shape[-1] == 6   # the latent dimension, as num_classes
    daedl = _method(_config("daedl", images, "userpkg.nets:LinenCNN"))
    assert "cannot be imposed" in daedl.describe()
    fedl = _method(_config("fedl", images, "userpkg.nets:NNXCNN"))
    assert "cannot be imposed" in fedl.describe()


def test_user_classes_get_only_the_settings_they_take_plus_model_kwargs(userpkg):
    _, _, (vectors, _) = userpkg
    c = _config("mc_dropout", vectors, "userpkg.nets:MLP", model_kwargs='{"width": 7}')
    net = common.user_network(methods.resolved(c), 3, axis_name=None,
                              input_shape=(2,))   # no dropout_rate field
    assert net.module.width == 7
    with pytest.raises(ValueError, match="MC Dropout needs"):
        methods.from_config(c, methods.MethodSetup(3, (1, 1, 1), (2,)))
    builtin = common.user_network(methods.resolved(c), 3, axis_name=None)
    c2 = _config("mc_dropout", vectors, "mlp")
    assert common.user_network(methods.resolved(c2), 3,
                               axis_name=None).module.dropout_rate == 0.5
    assert builtin.spec == "userpkg.nets:MLP"


def test_prior_network_noise_on_vectors_spans_each_features_batch_range():
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(64, 5)) * np.arange(1, 6) + np.arange(5) * 10).astype(np.float32)
    u = np.asarray(prior_networks.ood_noise(np.array([0, 7], np.uint32), x), np.float64)
    lo, hi = x.astype(np.float64).min(0), x.astype(np.float64).max(0)
    assert u.shape == x.shape
    assert np.all(u >= lo - 1e-5) and np.all(u <= hi + 1e-5)
    # uniform over [lo, hi] per feature: the mean sits near the middle (64 draws, 5 sd bound)
    mid, sd = (lo + hi) / 2, (hi - lo) / np.sqrt(12 * 64)
    assert np.all(np.abs(u.mean(0) - mid) < 5 * sd)
    with pytest.raises(ValueError, match="noise_uniform"):
        prior_networks.ood_noise(np.array([0, 7], np.uint32), x, "noise_smoothed")


def test_prior_networks_refuse_smoothed_noise_for_vectors(userpkg):
    _, _, (vectors, _) = userpkg
    c = _config("kl_pn", vectors, method_args='{"ood": "noise_smoothed"}')
    with pytest.raises(ValueError, match="noise_uniform"):
        _method(c)


# ---------------------------------------------------------------------------------- TFDS
def _prepare_tiny_tfds(data_dir):
    tfds = pytest.importorskip("tensorflow_datasets")

    class TinyGedlImages(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "image": tfds.features.Tensor(shape=(8, 8, 1), dtype=np.uint8),
                "label": tfds.features.ClassLabel(num_classes=3)}))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(60, 0),
                    "test": self._generate_examples(24, 1)}

        def _generate_examples(self, n, seed):
            rng = np.random.default_rng(seed)
            for i in range(n):
                yield i, {"image": rng.integers(0, 256, (8, 8, 1), dtype=np.uint8),
                          "label": i % 3}

    TinyGedlImages(data_dir=str(data_dir), file_format="array_record").download_and_prepare()
    return "tiny_gedl_images"


def test_a_prepared_tfds_dataset_by_name(tmp_path, userpkg):
    name = _prepare_tiny_tfds(tmp_path / "tfds")
    own = data.load_own(f"tfds:{name}", tmp_path / "tfds")
    assert (own.num_classes, own.train.image_shape, len(own.train), len(own.test)) == \
        (3, (8, 8, 1), 60, 24)
    c = configs.build_config("custom", "gedl")
    config_lib.set_fields(c, dataset=f"tfds:{name}", tfds_data_dir=str(tmp_path / "tfds"),
                             model="userpkg.nets:NNXCNN", batch_size=8)
    experiment.resolve_own_data(c)
    config_lib.validate(c)
    official = experiment.OfficialData.load(c)
    assert c.num_classes == 3 and len(official.test) == 24
    # as an OOD set (its test split) beside other training data of the same image shape
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, (40, 8, 8, 1), dtype=np.uint8)
    y = np.arange(40) % 3
    np.savez(tmp_path / "d.npz", train_images=x, train_labels=y, test_images=x[:8],
             test_labels=y[:8])
    c = configs.build_config("custom", "gedl")
    config_lib.set_fields(c, dataset=f"npz:{tmp_path / 'd.npz'}",
                             tfds_data_dir=str(tmp_path / "tfds"), model="userpkg.nets:NNXCNN",
                             ood_datasets=f"tfds:{name}", batch_size=8)
    experiment.resolve_own_data(c)
    config_lib.validate(c)
    assert len(experiment.OfficialData.load(c).ood[f"tfds:{name}"]) == 24
    with pytest.raises(data.MissingDataError, match="not prepared"):
        data.load_own("tfds:no_such_dataset_here", tmp_path / "tfds")


# ------------------------------------------------------------------------- the docs' example
def test_the_library_docs_trainer_example_runs_as_written(tmp_path, monkeypatch, fast_compile):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "library.md").read_text()
    section = text.split("## Your network and data in the trainer", 1)[1]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "library_trainer_example"}
    exec(compile(code, "docs/library.md", "exec"), namespace)  # noqa: S102
    evaluation = namespace["result"]["evaluation"]
    assert evaluation["id"]["num_examples"] == 120
    assert list(evaluation["ood"]) == ["npz:toy_ood.npz"]
    alpha = np.asarray(namespace["alpha"])
    assert alpha.shape == (5, 3) and np.all(alpha > 0)


def test_a_file_written_again_is_read_again(tmp_path):
    x = np.zeros((20, 3), np.float32)
    for k in (2, 4):
        y = np.arange(20) % k
        np.savez(tmp_path / "d.npz", train_images=x, train_labels=y, test_images=x[:4],
                 test_labels=y[:4] % 2)
        assert data.load_own(f"npz:{tmp_path / 'd.npz'}").num_classes == k

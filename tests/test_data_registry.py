"""Registry: names, shapes, protocol defaults, and checksums equal to TFDS's registrations."""

import ast
import pathlib

import pytest

from gedl_jax import config as config_lib
from gedl_jax import data
from gedl_jax.data import registry

pytestmark = pytest.mark.usefixtures("no_network", "isolated_env")

PAPER_DATASETS = ("mnist", "fashion_mnist", "kmnist", "cifar10", "cifar100", "svhn_cropped",
                  "cifar10_corrupted")


def test_every_paper_dataset_is_registered():
    for name in PAPER_DATASETS:
        info = data.DATASETS[name]
        assert info.name == name
    assert data.DATASETS["mnist"].image_shape == (28, 28, 1)
    assert data.DATASETS["cifar10"].image_shape == (32, 32, 3)
    assert data.DATASETS["cifar100"].num_classes == 100
    assert data.DATASETS["svhn_cropped"].num_examples["test"] == 26032
    assert data.DATASETS["mnist"].val_fraction == 0.2
    assert data.DATASETS["cifar10"].val_fraction == 0.05


def test_default_ood_sets_follow_the_protocol():
    assert data.default_ood_sets("mnist") == ("kmnist", "fashion_mnist")
    assert data.default_ood_sets("cifar10") == ("svhn_cropped", "cifar100")
    for name in ("mnist", "fashion_mnist", "cifar10", "cifar100"):
        for ood in data.default_ood_sets(name):
            assert ood in data.DATASETS and ood != name


DATASET_FACTS = ("num_classes", "val_fraction", "ood_datasets")


@pytest.mark.parametrize("name", sorted(set(config_lib.DATASET_DEFAULTS) - {"custom"}))
def test_the_config_defaults_are_the_registry_facts(name):
    """K, the validation fraction and the OOD sets a config starts from are the registry's, for
    every dataset a config knows (the registry is the one place they are written)."""
    info = data.DATASETS[name]
    expected = {"num_classes": info.num_classes, "val_fraction": info.val_fraction,
                "ood_datasets": info.default_ood}
    assert {k: config_lib.DATASET_DEFAULTS[name][k] for k in DATASET_FACTS} == expected
    config = config_lib.default_config(name)
    assert (config.num_classes, config.val_fraction, tuple(config.ood_datasets)) == (
        info.num_classes, info.val_fraction, info.default_ood)


def test_configuration_writes_no_dataset_fact_of_its_own():
    """No registered dataset's entry in configuration's protocol table spells a fact itself."""
    tree = ast.parse(pathlib.Path(config_lib.presets.__file__).read_text())
    table = next(node.value for node in ast.walk(tree) if isinstance(node, ast.AnnAssign)
                 and getattr(node.target, "id", "") == "_PROTOCOL_SETTINGS")
    spelled = {}
    for key, value in zip(table.keys, table.values):
        name = ast.literal_eval(key)
        if name in data.DATASETS:
            spelled[name] = {k.arg for k in value.keywords} & set(DATASET_FACTS)
    assert set(spelled) == set(config_lib.DATASET_DEFAULTS) - {"custom"}
    assert not any(spelled.values()), spelled


def test_own_data_defaults_to_the_registry_validation_fraction():
    assert config_lib.default_config("npz:/x.npz").val_fraction == (
        registry.OWN_DATA_VAL_FRACTION)


def test_unknown_dataset_is_a_clear_error():
    with pytest.raises(data.DataError, match="known datasets"):
        data.get_info("imagenet")


def test_fifteen_benchmark_corruptions_five_severities():
    assert len(data.CORRUPTIONS) == 15 and len(set(data.CORRUPTIONS)) == 15
    assert data.SEVERITIES == (1, 2, 3, 4, 5)
    assert registry.corruption_file_stem("frosted_glass_blur") == "glass_blur"
    assert registry.corruption_file_stem("glass_blur") == "glass_blur"
    with pytest.raises(data.DataError):
        registry.corruption_file_stem("rain")


@pytest.mark.parametrize("name", PAPER_DATASETS)
def test_embedded_copy_equals_what_tfds_registers(name):
    """The fallback copy (used where TFDS is not installed) is exactly TFDS's registration."""
    tfds_specs = registry.tfds_registered_files(name)
    if tfds_specs is None:
        pytest.skip("tensorflow_datasets not importable here")
    copy = registry._copied_specs(name, "copy")
    assert {k: (v.size, v.sha256, v.url) for k, v in tfds_specs.items()} == \
        {k: (v.size, v.sha256, v.url) for k, v in copy.items()}


def test_official_file_names_are_registered():
    """Every file an official source needs has a registered size and sha256."""
    for name in PAPER_DATASETS:
        info = data.DATASETS[name]
        specs = data.registered_files(name, "official")
        for src in info.sources:
            if src.kind != "official":
                continue
            for files in src.split_files.values():
                for f in files:
                    assert f in specs, (name, f)
                    assert len(specs[f].sha256) == 64 and specs[f].size > 0
    cifar_arrays = data.registered_files("cifar10", "arrays")
    assert set(cifar_arrays) == {"train.npz", "test.npz"}


def test_fallback_when_tfds_missing(monkeypatch):
    monkeypatch.setattr(registry, "tfds_registered_files", lambda name: None)
    specs = data.registered_files("mnist", "official")
    assert specs["train-images-idx3-ubyte.gz"].size == 9912422


def test_resolve_data_dir(tmp_path, monkeypatch):
    # Nothing given: the default folder under the user's cache, created on demand.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    default = tmp_path / "xdg" / "gedl_jax" / "data"
    assert data.default_data_dir() == default
    with pytest.raises(data.MissingDataError, match="from default"):
        data.resolve_data_dir(None)
    assert data.resolve_data_dir("", create=True) == default and default.is_dir()  # "" = unset
    monkeypatch.setenv("GEDL_DATA_DIR", str(tmp_path))
    assert data.resolve_data_dir(None) == tmp_path
    other = tmp_path / "other"
    other.mkdir()
    assert data.resolve_data_dir(str(other)) == other  # explicit beats the environment
    with pytest.raises(data.MissingDataError, match="does not exist"):
        data.resolve_data_dir(tmp_path / "nope")


def test_resolve_cache_dir(tmp_path, monkeypatch):
    assert data.resolve_cache_dir(tmp_path / "c") == tmp_path / "c"
    monkeypatch.setenv("GEDL_CACHE_DIR", str(tmp_path / "env"))
    assert data.resolve_cache_dir("") == tmp_path / "env"
    monkeypatch.delenv("GEDL_CACHE_DIR")
    assert data.resolve_cache_dir(None).name == "gedl_jax"

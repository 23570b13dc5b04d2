"""Bad configurations fail before any work, naming the field and the allowed values."""

import json
import pathlib

import pytest

from gedl_jax import config as config_lib
from gedl_jax import configs

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("dataset", ["mnist", "cifar10", "cifar100"])
@pytest.mark.parametrize("variant", sorted(config_lib.VARIANTS))
def test_every_variant_builds_and_validates(dataset, variant):
    config = configs.build_config(dataset, f"{variant},quick")
    config_lib.validate(config, num_devices=1)
    assert config.variant == variant
    assert config.num_epochs == 2


def test_paper_defaults():
    mnist = configs.build_config("mnist", None)
    cifar = configs.build_config("cifar10", None)
    assert mnist.variant == "gedl" and mnist.learning_rate == 1e-3 and mnist.weight_decay == 0
    assert cifar.learning_rate == 1e-4 and cifar.weight_decay == 5e-4 and cifar.augment
    for c in (mnist, cifar):
        assert (c.batch_size, c.num_epochs, c.c_tau, c.c_w) == (128, 200, 100.0, 0.5)
        assert c.lr_schedule == "cosine" and c.tau_reading == "epoch"
    assert config_lib.parse_list(mnist.ood_datasets) == ["kmnist", "fashion_mnist"]


def test_default_workdir_name_and_download_fields():
    assert configs.build_config("mnist", None).run_name == "mnist_gedl"
    assert configs.build_config("cifar10", "edl,quick").run_name == "cifar10_edl_quick"
    c = configs.build_config("mnist", None)
    assert (c.download, c.data_mirror) == ("auto", "")
    c.download = "sometimes"
    with pytest.raises(ValueError, match=r"config.download=.*'auto', 'never', 'force'"):
        config_lib.validate(c)


def test_unknown_variant_lists_allowed():
    with pytest.raises(ValueError, match="unknown config argument.*gedl"):
        configs.build_config("mnist", "gedel")
    with pytest.raises(ValueError, match="choose one variant"):
        configs.build_config("mnist", "edl,gedl")


@pytest.mark.parametrize("field,value,match", [
    ("likelihood", "cross_entropy", r"config.likelihood=.*allowed values.*digamma"),
    ("evidence", "sigmoid", r"config.evidence=.*softplus"),
    ("tau_reading", "epochs", r"config.tau_reading=.*'epoch', 'step'"),
    ("kl_target", "some", r"config.kl_target"),
    ("learning_rate", 0.0, r"config.learning_rate=0.0 must be > 0"),
    ("val_fraction", 1.5, r"config.val_fraction"),
    ("weight_decay", -1.0, r"config.weight_decay"),
    ("prior_strength_value", "abcK", r"config.prior_strength_value"),
    ("seeds", ("1", "x"), r"config.seeds"),
])
def test_bad_field_names_field(field, value, match):
    config = configs.build_config("mnist", None)
    config[field] = value
    with pytest.raises(ValueError, match=match):
        config_lib.validate(config, num_devices=1)


def test_batch_not_divisible_by_devices():
    config = configs.build_config("mnist", None)
    config.batch_size = 130
    with pytest.raises(ValueError, match=r"batch_size=130 is not divisible.*4"):
        config_lib.validate(config, num_devices=4)


def test_unknown_dataset():
    with pytest.raises(ValueError, match="not supported.*mnist"):
        config_lib.default_config("imagenet")


def test_prior_strength_parsing():
    c = configs.build_config("cifar100", "redl")
    w = config_lib.prior_strength(c.prior_strength_value, c.num_classes)
    assert w == pytest.approx(10.0)  # 0.1 * 100
    c.prior_strength_value = "2.0"  # a str field: --config.prior_strength_value=2.0 parses so
    assert config_lib.prior_strength(c.prior_strength_value, c.num_classes) == 2.0


def test_red_evidence_clip_follows_the_reference_per_dataset():
    # RED's MNIST code uses exp(o) unclamped, its CIFAR code exp(clamp(o, -10, 10))
    # (github.com/pandeydeep9/EvidentialResearch2023, MainMnistExperiment/losses.py and
    # MainCifar10Experiments/utilFiles/losses.py).
    assert configs.build_config("mnist", "red").exp_clip == 80.0
    assert configs.build_config("cifar10", "red").exp_clip == 10.0
    assert configs.build_config("mnist", "gedl").exp_clip == 10.0  # untouched elsewhere


def test_init_default_and_validation():
    c = configs.build_config("mnist", "gedl")
    assert c.init == "flax"   # chosen by the ablation in docs/results/init_ablation/
    c.init = "kaiming"
    with pytest.raises(ValueError, match=r"config.init='kaiming'.*\['torch', 'flax'\]"):
        config_lib.validate(c)


@pytest.mark.parametrize("path", sorted(str(p.relative_to(REPO)) for p in
                                        (REPO / "docs" / "results").rglob("config.json")))
def test_every_committed_config_reads_through_the_legacy_table(path):
    """The committed runs' config.json files hold the flat method settings of before
    config.method_args: read (as a workdir is restored), the run's method gets the values it
    was trained with, in method_args, and no old name is left."""
    from gedl_jax import methods
    from gedl_jax.run import experiment
    from gedl_jax.run.workdir import config_from_saved

    saved = json.loads((REPO / path).read_text())
    config = experiment.resolve_config(config_from_saved(saved), 1)   # as a restore does
    assert not set(config_lib.LEGACY_METHOD_FIELDS) & set(config)
    k = int(config.num_classes)
    method = methods.from_config(config, methods.MethodSetup(k, (5,) * k, (28, 28, 1)))
    for old, (owners, key) in config_lib.LEGACY_METHOD_FIELDS.items():
        if old in saved and config.method in owners:
            want = saved[old] if (old, saved[old]) != ("daedl_logit_clip", 0) else float("inf")
            assert getattr(method, key) == want, old


def test_an_old_flat_method_flag_names_its_new_spelling():
    assert config_lib.legacy_flag_message("c_tau") is None
    message = config_lib.legacy_flag_message("duq_length_scale")
    assert "--config.method_args='{\"length_scale\": <value>}'" in message
    assert "config.method=duq" in message
    assert "kl_pn or rkl_pn" in config_lib.legacy_flag_message("pn_ood")
    old = {"method": "duq", "duq_length_scale": 0.2, "pn_ood": "noise_uniform",
           "method_args": '{"gamma": 0.9}'}
    assert config_lib.upgrade_saved(old) == {
        "method": "duq", "method_args": '{"gamma": 0.9, "length_scale": 0.2}'}

"""Experiment configuration: defaults, the EDL variants as presets, and validation.

The paper's point (Table unified_edl) is that EDL, I-EDL, R-EDL, RED and GEDL differ only in three
choices: the prior (base rate `a`, strength `W`), the posterior update (evidence strength `tau`,
i.e. the KL weight 1/tau and its schedule) and the training objective. Each choice is a config
field here; a variant is a named set of field values (`VARIANTS`), never a code fork.

Config files in `gedl_jax/configs/` call `build_config(dataset, arg)`, where `arg` is the text
after the colon of `--config=configs/mnist.py:gedl,quick`: a comma-separated list of one variant
name and optional modifiers (`MODIFIERS`: `quick`, `ensemble`, `source`).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import ml_collections

from gedl_jax.data import registry

# Allowed values of every enumerated field: validation errors list them. `method` is any method
# a preset names (`method_names`): a new method's preset is what makes it allowed.
ALLOWED: dict[str, tuple[str, ...]] = {
    "dataset": ("mnist", "fashion_mnist", "cifar10", "cifar100"),
    "data_source": ("auto", "raw", "tfds"),
    "download": ("auto", "never", "force"),
    "model": ("convnet", "vgg16", "resnet18", "mlp"),   # or "<importable.module>:<Name>"
    "recipe": ("protocol", "source"),
    "dropout_placement": ("dense", "all"),
    "init": ("torch", "flax"),
    "evidence": ("softplus", "relu", "exp"),
    "base_rate": ("uniform", "label_frequency"),
    "prior_strength": ("fixed", "adaptive"),
    "likelihood": ("digamma", "log", "mse", "mse_novar", "fisher_mse"),
    "kl_target": ("all", "masked", "none"),
    "kl_schedule": ("gedl_tau", "edl_anneal", "constant"),
    "tau_reading": ("epoch", "step", "completed_epochs"),
    "tau_form": ("c_over_sum", "sum_over_c"),
    "lr_schedule": ("cosine", "constant"),
    "weight_decay_mode": ("l2", "decoupled"),
    "compute_dtype": ("float32", "bfloat16"),
    # float32 convolutions and matmuls: XLA's default (TF32 on NVIDIA Ampere+) or true float32
    # (gedl_jax/run/numerics.py)
    "matmul_precision": ("default", "highest"),
    # how an image-folder OOD set's images of another size are made the model's (data.image_folder)
    "image_resize": ("crop", "stretch"),
}

# Per-dataset protocol: models of the I-EDL/R-EDL code (github.com/danruod/IEDL and
# github.com/MengyuanChen21/ICLR2024-REDL, code_classical/), the paper's Table
# implementation_details for the optimiser, and I-EDL's fisher_c from its configs
# (code_classical/configs/1_mnist/mnist-iedl.json, 2_cifar10/cifar10-iedl.json). The dataset's
# own facts (K, the validation fraction, the OOD sets) are the registry's (gedl_jax/data/
# registry.py), merged in by `_with_dataset_facts`.
_PROTOCOL_SETTINGS: dict[str, dict[str, Any]] = {
    "mnist": dict(model="convnet", learning_rate=1e-3, weight_decay=0.0, augment=False,
                  iedl_fisher_logdet_weight=0.005, red_exp_clip=80.0),
    "fashion_mnist": dict(model="convnet", learning_rate=1e-3, weight_decay=0.0, augment=False,
                          iedl_fisher_logdet_weight=0.005, red_exp_clip=80.0),
    "cifar10": dict(model="vgg16", learning_rate=1e-4, weight_decay=5e-4, augment=True,
                    iedl_fisher_logdet_weight=0.05, red_exp_clip=10.0),
    "cifar100": dict(model="vgg16", learning_rate=1e-4, weight_decay=5e-4, augment=True,
                     warmup_epochs=5, iedl_fisher_logdet_weight=0.05, red_exp_clip=10.0),
    # Your own data (`configs/custom.py`, `--config.dataset=npz:<path>` or `tfds:<name>`): the
    # MNIST family's optimiser settings; K comes from the data; the model must be named
    # (`--config.model=...`), else the MLP for vectors (`custom_model`); no OOD sets unless named.
    "custom": dict(model="", num_classes=0, learning_rate=1e-3, weight_decay=0.0,
                   val_fraction=registry.OWN_DATA_VAL_FRACTION, augment=False, ood_datasets=(),
                   iedl_fisher_logdet_weight=0.005, red_exp_clip=80.0),
}


def _with_dataset_facts(dataset: str, settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` plus the registry's num_classes, val_fraction and ood_datasets of `dataset`
    (none for "custom", which is not a registered dataset)."""
    if dataset not in registry.DATASETS:
        return dict(settings)
    info = registry.DATASETS[dataset]
    return dict(settings, num_classes=info.num_classes, val_fraction=info.val_fraction,
                ood_datasets=info.default_ood)


# Every dataset's defaults: its protocol settings and the registry's facts.
DATASET_DEFAULTS: dict[str, dict[str, Any]] = {
    name: _with_dataset_facts(name, settings) for name, settings in _PROTOCOL_SETTINGS.items()}


def _variant(**kw: Any) -> dict[str, Any]:
    return kw


DEFAULT_METHOD = "evidential"   # the method of a preset that names none: the EDL family


# Each variant is the paper's Table unified_edl row; where the paper leaves a choice open it is
# read as the method's public reference code does (named per variant below). "K" stands for the
# number of classes.
# A preset's value that depends on the dataset: apply_variant reads it from the dataset's
# protocol settings as "<preset>_<field>" (I-EDL's fisher_c, RED's exp clip).
PER_DATASET = "per_dataset"

VARIANTS: dict[str, dict[str, Any]] = {
    # GEDL: adaptive W (Eq. weight_update), accumulated-strength tau (Eq. tau_schedule),
    # unmasked KL to the per-sample prior Dir(W a) (Eq. elbo), digamma NLL (Prop. closed-form).
    "gedl": _variant(evidence="softplus", prior_strength="adaptive", c_w=0.5,
                     likelihood="digamma", kl_target="all", kl_schedule="gedl_tau", c_tau=100.0,
                     tau_reading="epoch", red_regularizer_weight=0.0, fisher_logdet_weight=0.0),
    # EDL as run in the I-EDL/R-EDL protocol (the "EDL" loss of github.com/danruod/IEDL,
    # code_classical/models/FisherEvidentialN.py): MSE with variance, W = K, KL on the masked
    # target, annealed min(1, epoch/10) over 0-based epochs.
    "edl": _variant(evidence="softplus", prior_strength="fixed", prior_strength_value="K",
                    likelihood="mse", kl_target="masked", kl_schedule="edl_anneal",
                    red_regularizer_weight=0.0, fisher_logdet_weight=0.0),
    # I-EDL (github.com/danruod/IEDL, code_classical/models/FisherEvidentialN.py):
    # Fisher-weighted MSE and variance + fisher_c * (-log det FIM).
    "iedl": _variant(evidence="softplus", prior_strength="fixed", prior_strength_value="K",
                     likelihood="fisher_mse", kl_target="masked", kl_schedule="edl_anneal",
                     red_regularizer_weight=0.0, fisher_logdet_weight=PER_DATASET),
    # R-EDL (github.com/MengyuanChen21/ICLR2024-REDL, code_classical/models/
    # ModifiedEvidentialN.py): lambda = 0.1 -> W = lambda K; MSE without the variance term;
    # KL target Dir(lambda), true class reset to lambda.
    "redl": _variant(evidence="softplus", prior_strength="fixed", prior_strength_value="0.1K",
                     likelihood="mse_novar", kl_target="masked", kl_schedule="edl_anneal",
                     red_regularizer_weight=0.0, fisher_logdet_weight=0.0),
    # RED (github.com/pandeydeep9/EvidentialResearch2023, MainMnistExperiment/losses.py and
    # MainCifar10Experiments/utilFiles/losses.py): EDL's MSE loss + annealed masked KL + the
    # correct-evidence regularizer -stopgrad(u) * logit_y on every sample; exp evidence as RED's
    # code per dataset: unclamped on MNIST (the clip of 80 only guards float32 overflow of S),
    # clamp(-10, 10) on CIFAR.
    "red": _variant(evidence="exp", exp_clip=PER_DATASET, prior_strength="fixed",
                    prior_strength_value="K",
                    likelihood="mse", kl_target="masked", kl_schedule="edl_anneal",
                    red_regularizer_weight=1.0, fisher_logdet_weight=0.0),
    # The four rows of the paper's ablation (Table ablation), all on the digamma objective.
    "ablation_base": _variant(evidence="softplus", prior_strength="fixed",
                              prior_strength_value="K", likelihood="digamma", kl_target="masked",
                              kl_schedule="edl_anneal", red_regularizer_weight=0.0,
                              fisher_logdet_weight=0.0),
    "ablation_kl_all": _variant(evidence="softplus", prior_strength="fixed",
                                prior_strength_value="K", likelihood="digamma", kl_target="all",
                                kl_schedule="edl_anneal", red_regularizer_weight=0.0,
                                fisher_logdet_weight=0.0),
    "ablation_kl_all_tau": _variant(evidence="softplus", prior_strength="fixed",
                                    prior_strength_value="K", likelihood="digamma",
                                    kl_target="all", kl_schedule="gedl_tau", c_tau=100.0,
                                    tau_reading="epoch", red_regularizer_weight=0.0,
                                    fisher_logdet_weight=0.0),
}
VARIANTS["ablation_full"] = dict(VARIANTS["gedl"])

# Methods beyond the EDL family (gedl_jax.methods): presets of their own fields.
VARIANTS.update({
    # A softmax cross-entropy classifier (the members of a deep ensemble).
    "softmax": _variant(method="softmax"),
    # The softmax classifier with a last-layer Laplace posterior fitted after training
    # (probit predictive, prior precision chosen on the validation split).
    "laplace": _variant(method="laplace"),
    # MC Dropout (Gal & Ghahramani 2016): the ConvNet gets p = 0.5 after its hidden Dense
    # layers (VGG16 keeps its classifier's 0.5), T = 10 test-time passes.
    "mc_dropout": _variant(method="mc_dropout", dropout_rate=0.5, dropout_placement="dense",
                           mc_samples=10),
    # DUQ (van Amersfoort et al. 2020), KL-PN (Malinin & Gales 2018), RKL-PN (2019), PostNet
    # (Charpentier et al. 2020), DAEDL (Yoon & Kim 2024), F-EDL (Yoon & Kim 2025): each
    # method's settings and their defaults are its dataclass fields (gedl_jax/methods/<file>.py);
    # `config.method_args` changes them.
    "duq": _variant(method="duq"),
    "kl_pn": _variant(method="kl_pn"),
    "rkl_pn": _variant(method="rkl_pn"),
    "postnet": _variant(method="postnet"),
    "daedl": _variant(method="daedl"),
    "fedl": _variant(method="fedl"),
})

# The `source` modifier (`configs/mnist.py:postnet,source`): config.recipe = "source" and the
# original repository's training settings that this toolkit's trainer has, per method and
# dataset family ("mnist": MNIST / Fashion-MNIST, "cifar": CIFAR-10 / CIFAR-100). What a
# reference does beyond these fields (SGD, step decays, its model selection) is not reproduced;
# each method's module docstring says what its "source" reading changes in the model itself.
SOURCE_RECIPES: dict[str, dict[str, dict[str, Any]]] = {
    # KaosEngineer/PriorNetworks: gradient-norm clip 10, inputs standardised, batch 128.
    "kl_pn": {"mnist": dict(grad_clip_norm=10.0, normalize=True, batch_size=128),
              "cifar": dict(grad_clip_norm=10.0, normalize=True, batch_size=128)},
    "rkl_pn": {"mnist": dict(grad_clip_norm=10.0, normalize=True, batch_size=128),
               "cifar": dict(grad_clip_norm=10.0, normalize=True, batch_size=128)},
    # sharpenb/Posterior-Network: Adam lr 1e-4 / 2.5e-4, batch 64, <= 200 epochs.
    "postnet": {"mnist": dict(learning_rate=1e-4, batch_size=64, lr_schedule="constant",
                              weight_decay=0.0, num_epochs=200),
                "cifar": dict(learning_rate=2.5e-4, batch_size=64, lr_schedule="constant",
                              weight_decay=0.0, num_epochs=200)},
    # TaeseongYoon/DAEDL: Adam lr 1e-3, batch 64, 100 epochs; CIFAR inputs standardised.
    "daedl": {"mnist": dict(learning_rate=1e-3, batch_size=64, lr_schedule="constant",
                            weight_decay=0.0, num_epochs=100, normalize=False),
              "cifar": dict(learning_rate=1e-3, batch_size=64, lr_schedule="constant",
                            weight_decay=0.0, num_epochs=100, normalize=True)},
    # TaeseongYoon/F-EDL: Adam lr 5e-4, no weight decay, batch 64, 100 epochs, standardised.
    "fedl": {"mnist": dict(learning_rate=5e-4, batch_size=64, lr_schedule="constant",
                           weight_decay=0.0, num_epochs=100, normalize=True),
             "cifar": dict(learning_rate=5e-4, batch_size=64, lr_schedule="constant",
                           weight_decay=0.0, num_epochs=100, normalize=True)},
}

# "quick": a few-minute run; "ensemble": a deep ensemble of ENSEMBLE_SIZE members of the
# variant (softmax members when no variant is named: `configs/mnist.py:ensemble`).
MODIFIERS = ("quick", "ensemble", "source")
ENSEMBLE_SIZE = 5
ENSEMBLE_PRESET = "softmax"   # the members' preset when `ensemble` names no variant

# Fields holding lists, with their item type: tuples in the config (`normalize_lists`).
LIST_FIELDS: dict[str, type] = {"seeds": int, "ood_datasets": str, "extra_ood": str,
                               "ood_groups": str}

# Fields that do not change the trained parameters: a resumed run may change them.
RESUME_SAFE_FIELDS = frozenset({
    "evaluate_at_end", "plots", "log_every_steps", "ood_datasets", "extra_ood", "image_resize",
    "ood_groups",
    "eval_batch_size", "seeds", "data_dir", "cache_dir", "data_source", "tfds_data_dir",
    "checkpoint_every_steps", "checkpoint_interval_seconds", "distributed", "download",
    "data_mirror", "run_name",
    "eval_examples", "coordinator_address", "num_processes", "process_id", "mc_samples",
    "epoch_eval", "allow_chance", "conformal_alpha", "calibrate", "aupr_trapezoidal",
    "bootstrap_samples", "bootstrap_confidence", "bootstrap_interval",
    "posthoc_scores",
    # equal parameters on a CPU; on a GPU equal to rounding (deterministic) and bit for bit
    # (steps_per_dispatch: tests/test_multi_step.py)
    "deterministic", "steps_per_dispatch"})

# Fields added after runs had been published, with the value those earlier runs used. A workdir's
# config.json that lacks such a field is read with this value (to resume or evaluate it).
LEGACY_DEFAULTS: dict[str, Any] = {"init": "torch"}

# Method settings that were flat config fields before `config.method_args`: old field -> (the
# methods that read it, its name in method_args). A saved config.json (an old workdir, a
# pretrained model) is read through `upgrade_saved`; the command line names the new spelling.
LEGACY_METHOD_FIELDS: dict[str, tuple[tuple[str, ...], str]] = {
    "duq_length_scale": (("duq",), "length_scale"),
    "duq_gamma": (("duq",), "gamma"),
    "duq_gradient_penalty": (("duq",), "gradient_penalty"),
    "pn_ood": (("kl_pn", "rkl_pn"), "ood"),
    "pn_ood_weight": (("kl_pn", "rkl_pn"), "ood_weight"),
    "pn_target_form": (("kl_pn", "rkl_pn"), "target_form"),
    "pn_target_concentration": (("kl_pn", "rkl_pn"), "target_concentration"),
    "pn_target_smoothing": (("kl_pn", "rkl_pn"), "target_smoothing"),
    "pn_kl_epsilon": (("kl_pn", "rkl_pn"), "kl_epsilon"),
    "postnet_latent_dim": (("postnet",), "latent_dim"),
    "postnet_flow_layers": (("postnet",), "flow_layers"),
    "postnet_entropy_weight": (("postnet",), "entropy_weight"),
    "daedl_kl_weight": (("daedl",), "kl_weight"),
    "daedl_logit_clip": (("daedl",), "logit_clip"),
    "fedl_head_hidden": (("fedl",), "head_hidden"),
    "fedl_head_dropout": (("fedl",), "head_dropout"),
}


def upgrade_saved(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config.json's fields in this version's spelling: the old flat method settings
    (`LEGACY_METHOD_FIELDS`) of the run's method move into `method_args` with the values the run
    used (a value also given in method_args wins); those of other methods are dropped."""
    saved = dict(saved)
    flat = {name: saved.pop(name) for name in LEGACY_METHOD_FIELDS if name in saved}
    moved = {LEGACY_METHOD_FIELDS[name][1]: value for name, value in flat.items()
             if saved.get("method") in LEGACY_METHOD_FIELDS[name][0]}
    if moved:
        given = method_args(ml_collections.ConfigDict({"method_args":
                                                       saved.get("method_args", "")}))
        saved["method_args"] = json.dumps({**moved, **given}, sort_keys=True)
    return saved


def legacy_flag_message(name: str) -> str | None:
    """The error for an old flat method setting on the command line (`--config.<name>=...`):
    its new spelling; None for any other name."""
    if name not in LEGACY_METHOD_FIELDS:
        return None
    owners, key = LEGACY_METHOD_FIELDS[name]
    return (f"--config.{name} was replaced by config.method_args (the settings of "
            f"config.method={' or '.join(owners)}): use --config.method_args='{{\"{key}\": "
            f"<value>}}'")

# --- Your own network and data (docs/library.md) -------------------------------------------
# `config.model` beyond the protocol networks: "resnet18", "mlp" or "<importable.module>:<Name>"
# (gedl_jax.networks.user); `config.dataset` / an OOD set: "npz:<path>", "tfds:<name>" or
# "images:<folder>".
PROTOCOL_MODELS = ("convnet", "vgg16")   # networks.Backbone; every other model is a user network
DATA_PREFIXES = registry.OWN_DATA_PREFIXES
_MODEL_SPEC = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")


def is_custom_dataset(name: Any) -> bool:
    """Whether a dataset name is your own data ("npz:<path>", "tfds:<name>", "images:<folder>")."""
    return str(name).startswith(DATA_PREFIXES)


def defaults_key(dataset: str) -> str:
    """The `DATASET_DEFAULTS` entry of a dataset: "custom" for npz:/tfds:/images: data."""
    return "custom" if is_custom_dataset(dataset) else dataset


def is_user_model(model: str) -> bool:
    """Whether `config.model` is loaded by `networks.user.load_network` (not the protocol
    ConvNet / VGG16)."""
    return model not in PROTOCOL_MODELS


def model_kwargs(c: ml_collections.ConfigDict) -> dict[str, Any]:
    """`config.model_kwargs` (a JSON object) as a dict, lists as tuples; {} when empty."""
    return _json_object(c, "model_kwargs", "constructor keywords", '{"width": 64}')


def method_args(c: ml_collections.ConfigDict) -> dict[str, Any]:
    """`config.method_args` (a JSON object of the method's own settings) as a dict, lists as
    tuples; {} when empty. The method checks the names and values (`Method.resolved_settings`)."""
    return _json_object(c, "method_args", "the method's settings", '{"length_scale": 0.2}')


def _json_object(c: ml_collections.ConfigDict, field: str, what: str,
                 example: str) -> dict[str, Any]:
    text = str(c.get(field, "") or "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"config.{field}={text!r} is not JSON ({e}); give an object, "
                         f"e.g. '{example}'") from None
    if not isinstance(value, dict):
        raise ValueError(f"config.{field}={text!r} must be a JSON object of {what}, "
                         f"e.g. '{example}'")
    # JSON lists as tuples: a module's fields must be hashable (e.g. MLP's hidden=(64, 64))
    return {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}


def _own_choice(field: str, value: Any) -> bool:
    """Values allowed beyond `ALLOWED`: own data and own networks."""
    if field == "dataset":
        return is_custom_dataset(value) or value == "custom"
    return field == "model" and isinstance(value, str) and (
        value == "" or bool(_MODEL_SPEC.fullmatch(value)))   # "": from the data (_validate_own)


def _validate_own(c: ml_collections.ConfigDict) -> None:
    """The config-only checks of own data and networks (the network's contract and the arrays
    are checked when they load, before any step)."""
    if c.dataset == "custom":
        raise ValueError("config.dataset='custom' names no data: give --config.dataset="
                         "npz:<path to .npz>, tfds:<prepared TFDS name> or images:<folder>")
    if c.model == "" and not is_custom_dataset(c.dataset):
        raise ValueError("config.model is empty: give --config.model=convnet, vgg16, resnet18, "
                         "mlp or <importable.module>:<Name>")
    model_kwargs(c)
    if c.model_kwargs and not is_user_model(c.model):
        raise ValueError(f"config.model_kwargs is for own networks (resnet18, mlp, "
                         f"<module>:<Name>); config.model={c.model!r} takes none")
    if c.recipe == "source" and c.model not in PROTOCOL_MODELS:
        raise ValueError(f"config.recipe='source' rebuilds the reference's own networks; "
                         f"config.model={c.model!r} is not one of them: use "
                         f"config.recipe='protocol'")


def default_config(dataset: str) -> ml_collections.ConfigDict:
    """All fields with their defaults (GEDL on `dataset`). Each field documents its meaning."""
    if defaults_key(dataset) not in DATASET_DEFAULTS:
        raise ValueError(f"config.dataset={dataset!r} is not supported; allowed: "
                         f"{sorted(DATASET_DEFAULTS)}")
    d = DATASET_DEFAULTS[defaults_key(dataset)]
    c = ml_collections.ConfigDict()
    c.variant = "gedl"                 # name of the variant preset applied (recorded in outputs)
    c.run_name = f"{dataset}_gedl"     # default workdir name: runs/<run_name> (set by the preset)
    _data_fields(c, d, dataset)
    _model_fields(c, d)
    _method_fields(c)
    _baseline_fields(c)
    _prior_fields(c)
    _posterior_fields(c)
    _objective_fields(c, d)
    _optimisation_fields(c, d)
    _loop_fields(c)
    _evaluation_fields(c)
    return c


def _evaluation_fields(c: ml_collections.ConfigDict) -> None:
    """Fields: evaluation extras (docs/evaluation.md); none changes a default result."""
    c.conformal_alpha = 0.1            # miscoverage of the conformal sets (LAC, APS, RAPS),
                                       # calibrated on the validation split
    c.calibrate = False                # post-hoc calibration fitted on the validation split:
                                       # temperature scaling (categorical), evidence scale (EDL
                                       # family); calibrated rows in every table
    c.aupr_trapezoidal = False         # also OpenOOD's trapezoidal AUPR (its own table)
    c.bootstrap_samples = 0            # > 0: bootstrap intervals of every metric over that
                                       # many resamples of the test and OOD examples (a table)
    c.bootstrap_confidence = 0.95      # the intervals' level
    c.bootstrap_interval = "percentile"   # or "basic": the percentile bounds reflected about
                                       # the metric on all examples (corrects ECE's upward
                                       # bias to first order; evaluation.bootstrap)
    c.posthoc_scores = "auto"          # post-hoc OOD scores of a softmax / EDL-family network
                                       # (evaluation.posthoc): "auto" = every one its network
                                       # gives the inputs for, "none", or a comma list of msp,
                                       # max_logit, energy, neg_entropy, neg_mahalanobis,
                                       # neg_knn_distance, vim; results' "posthoc" section


def _data_fields(c: ml_collections.ConfigDict, d: dict[str, Any], dataset: str) -> None:
    """Fields: data."""
    c.dataset = dataset                # in-distribution dataset (TFDS name)
    c.data_dir = ""                    # folder with one subfolder per dataset; "" ->
                                       # $GEDL_DATA_DIR, else ~/.cache/gedl_jax/data (printed)
    c.download = "auto"                # "auto": fetch missing official files (verified) before
                                       # training; "never": offline; "force": fetch again.
                                       # $GEDL_OFFLINE=1 means "never"
    c.data_mirror = ""                 # base URL or folder <mirror>/<dataset>/<file> to fetch
                                       # from instead of the official URLs ("" -> $GEDL_DATA_MIRROR)
    c.cache_dir = ""                   # decoded-array cache; "" -> $GEDL_CACHE_DIR or
                                       # ~/.cache/gedl_jax
    c.data_source = "auto"             # "raw" official files in data_dir, "tfds" a prepared TFDS
                                       # dataset, "auto": raw files if present, else TFDS
    c.tfds_data_dir = ""               # where TFDS keeps prepared datasets ("" = TFDS default)
    c.ood_datasets = tuple(d["ood_datasets"])  # OOD test sets (names); the command line also
                                       # takes "kmnist,fashion_mnist"
                                       # ("" for none, e.g. where SVHN/CIFAR-100 are absent)
    c.extra_ood = ()                   # extra OOD sets: folders of IDX files
    c.ood_groups = ()                  # "GROUP=SET": the near/far group (OpenOOD's averages) of
                                       # an evaluated OOD set, over the registry's; e.g.
                                       # "far=images:/data/textures,near=npz:c100.npz"
    c.image_resize = "crop"            # an images:<folder> OOD set's images of another size than
                                       # the model's: "crop" (aspect kept, scaled to cover, centre
                                       # cut: torchvision Resize+CenterCrop) or "stretch"
    c.val_fraction = d["val_fraction"]  # fraction of the official train split held out
    c.split_seed = -1                  # seed of the train/val permutation; -1 -> same as `seed`
    c.normalize = False                # standardise with ID channel stats (reference: no)
    c.augment = d["augment"]           # CIFAR flip + crop(pad 4) + rotation(15 deg), on device
    c.train_examples = 0               # use only the first N training examples (0 = all)
    c.val_examples = 0                 # use only the first N validation examples (0 = all)
    c.eval_examples = 0                # evaluate on N evenly spaced examples of the test set and of
                                       # each OOD set (0 = all; smoke runs)


def _model_fields(c: ml_collections.ConfigDict, d: dict[str, Any]) -> None:
    """Fields: model."""
    c.model = d["model"]               # "convnet" (MNIST) or "vgg16" (CIFAR, batch norm)
    c.num_classes = d["num_classes"]   # K
    c.init = "flax"                    # parameter init: "flax" = flax's defaults (lecun_normal
                                       # kernels, zero biases); "torch" = the PyTorch reference
                                       # code's (U(+-1/sqrt(fan_in)) weights and biases; VGG convs
                                       # N(0, sqrt(2/(9 C_out)))), which every result published
                                       # before this option used. Why "flax" is the default:
                                       # docs/reproduction.md ("Initialisation")
    c.compute_dtype = "float32"        # conv/matmul dtype; params and loss stay float32
    c.matmul_precision = "default"     # float32 conv/matmul products: "default" = XLA's choice
                                       # (TF32 tensor cores on NVIDIA Ampere and later GPUs, as
                                       # jax and PyTorch's cuDNN do), "highest" = float32; no
                                       # effect on a CPU (docs/gpu.md, "Numerics")
    c.dropout_rate = 0.0               # ConvNet dropout after hidden ReLUs (MC Dropout: 0.5);
                                       # VGG16's classifier dropout is always 0.5 (protocol)
    c.dropout_placement = "dense"      # ConvNet dropout after the hidden Dense layers only, or
                                       # "all": after every conv ReLU too
    c.model_kwargs = ""                # own networks (model "resnet18", "mlp", "pkg.mod:Name"):
                                       # further constructor keywords as a JSON object, e.g.
                                       # '{"width": 64}' (docs/library.md)


def _method_fields(c: ml_collections.ConfigDict) -> None:
    """Fields: method (gedl_jax.methods)."""
    c.method = DEFAULT_METHOD          # "evidential" (the EDL family: fields below), "softmax",
                                       # "mc_dropout", "duq", "kl_pn", "rkl_pn", "postnet",
                                       # "daedl", "fedl", "laplace" (gedl_jax.methods.METHODS)
    c.method_args = ""                 # the method's own settings as a JSON object, e.g.
                                       # '{"length_scale": 0.2}' for DUQ; each setting, its
                                       # default and its allowed values are its method
                                       # dataclass's fields (gedl_jax/methods/<method>.py)
    c.mc_samples = 10                  # MC Dropout: test-time passes T
    c.ensemble_size = 0                # >= 2: a deep ensemble of that many members of the method
                                       # (trained as seeds seed*N+m, scored as one model)


def _baseline_fields(c: ml_collections.ConfigDict) -> None:
    """Fields: the reading of the non-EDL baselines (their own settings: `method_args`)."""
    c.recipe = "protocol"              # baselines' reading: "protocol" (the I-EDL/R-EDL pipeline
                                       # every row uses) or "source" (the original repository's
                                       # recipe, where it differs; set by the `source` modifier)


def _prior_fields(c: ml_collections.ConfigDict) -> None:
    """Fields: prior (Eq. e2alpha, weight_update)."""
    c.evidence = "softplus"            # evidence activation e = f(logits)
    c.exp_clip = 10.0                  # clamp of the logits for exp evidence
    c.base_rate = "uniform"            # base rate a: uniform 1/K or training label frequencies
    c.prior_strength = "adaptive"      # W fixed (EDL, R-EDL) or adaptive (GEDL)
    c.prior_strength_value = "K"       # W when fixed: a number, "K" or "<x>K" (R-EDL: "0.1K")
    c.c_w = 0.5                        # GEDL's C_w: limit of the adaptive W as evidence grows


def _posterior_fields(c: ml_collections.ConfigDict) -> None:
    """Fields: posterior update: KL weight 1/tau (Eq. elbo, tau_schedule)."""
    c.kl_schedule = "gedl_tau"         # "gedl_tau", "edl_anneal" (min(1, epoch/10)), "constant"
    c.kl_weight = 1.0                  # multiplier of the KL term (the constant when "constant")
    c.annealing_epochs = 10.0          # EDL annealing length in epochs
    c.c_tau = 100.0                    # GEDL's C_tau
    c.tau_reading = "epoch"            # the sum in Eq. tau_schedule: one term per epoch (default),
                                       # per step, or per completed epoch (docs/gedl_readings.md)
    c.tau_form = "c_over_sum"          # tau = C_tau / sum (Eq. tau_schedule) or sum / C_tau


def _objective_fields(c: ml_collections.ConfigDict, d: dict[str, Any]) -> None:
    """Fields: objective."""
    c.likelihood = "digamma"           # data term: digamma NLL, log, MSE (+/- var), Fisher MSE
    c.kl_target = "all"                # KL(Dir(alpha)||Dir(Wa)) on all samples, EDL's masked, none
    c.fisher_logdet_weight = 0.0       # I-EDL's weight of -log det of the Fisher information
    c.red_regularizer_weight = 0.0     # RED's correct-evidence regularizer weight
    c.warmup_epochs = d.get("warmup_epochs", 0)  # non-evidential (softmax CE) warm-up epochs


def _optimisation_fields(c: ml_collections.ConfigDict, d: dict[str, Any]) -> None:
    """Fields: optimisation (paper Table implementation_details)."""
    c.learning_rate = d["learning_rate"]  # Adam peak learning rate
    c.lr_schedule = "cosine"           # cosine decay to 0 over all steps, or constant
    c.weight_decay = d["weight_decay"]  # 5e-4 on CIFAR
    c.weight_decay_mode = "l2"         # "l2": added to the gradient before Adam (PyTorch Adam's
                                       # weight_decay); "decoupled": AdamW
    c.batch_size = 128                 # global batch, split over all devices
    c.num_epochs = 200
    c.grad_clip_norm = 0.0             # 0 = off


def _loop_fields(c: ml_collections.ConfigDict) -> None:
    """Fields: loop."""
    c.seed = 0                         # model init, data order, augmentation
    c.seeds = ()                       # several seeds in one command: (0, 1, 2) (or "0,1,2" on
                                       # the command line) -> workdir/seed_<s>
    c.vmap_seeds = False               # train those seeds together in one program (vmap over a
                                       # seed axis): pays on an accelerator a small model can't fill
    c.eval_batch_size = 1024
    c.eval_every_epochs = 1            # validation accuracy every N epochs (best checkpoint)
    c.log_every_steps = 100            # progress line / metrics fetch interval
    c.checkpoint_every_steps = 0       # extra mid-epoch checkpoints (0 = only at epoch ends)
    c.checkpoint_interval_seconds = 60.0   # epoch-end checkpoints (last, and best if it changed)
                                       # at most this often; always at the run's end, a
                                       # preemption and checkpoint_every_steps. 0 = every epoch
                                       # end. A hard kill loses at most this much training
    c.steps_per_dispatch = 100         # train steps per compiled call off the CPU (a device-side
                                       # loop; it ends early at log points, epoch ends and
                                       # checkpoints): fewer host round trips. A CPU runs one
                                       # step per call whatever this says. Any value > 1 gives
                                       # the same parameters bit for bit; 1 compiles the step
                                       # alone, equal to float32 rounding on a GPU
                                       # (tests/test_multi_step.py)
    c.deterministic = True             # on a GPU: deterministic kernels and autotuning choices
                                       # kept in the workdir, so a resumed run equals the
                                       # uninterrupted one bit for bit (run/numerics.py); False:
                                       # XLA's fastest kernels. No effect on a CPU
    c.evaluate_at_end = True           # test + OOD evaluation of the best checkpoint
    c.epoch_eval = False               # also score the test and OOD sets with the current
                                       # parameters at each validation (accuracy, AUPR, mean S),
                                       # logged as split "epoch_eval": when detection turns down
    c.plots = True                     # write PNG plots at the end
    c.allow_chance = False             # a run whose best validation accuracy is at chance level
                                       # ends with exit status 3; True when that is intended
    c.distributed = False              # call jax.distributed.initialize() (multi-host; see
                                       # docs/multihost.md); the three fields below, where empty,
                                       # come from JAX_COORDINATOR_ADDRESS or SLURM/Open MPI/TPU
    c.coordinator_address = ""         # "host:port" of process 0's coordinator service
    c.num_processes = 0                # number of processes (hosts) in the job; 0 = auto
    c.process_id = -1                  # this process's index in [0, num_processes); -1 = auto


def _parse_prior_strength(value: Any, num_classes: int) -> float:
    """'K' -> K, '0.1K' -> 0.1 K, numbers as they are."""
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    try:
        if text.endswith("K"):
            factor = text[:-1].strip()
            return (float(factor) if factor else 1.0) * num_classes
        return float(text)
    except ValueError:
        raise ValueError(f"config.prior_strength_value={value!r} must be a number, 'K' or "
                         f"'<factor>K' (e.g. '0.1K' for R-EDL's lambda = 0.1)") from None


def apply_variant(c: ml_collections.ConfigDict, name: str) -> None:
    """Set the fields of the variant `name` of `VARIANTS` on `c` (in place)."""
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; allowed: {sorted(VARIANTS)}")
    for key, value in VARIANTS[name].items():
        if value == PER_DATASET:   # the dataset's protocol setting "<preset>_<field>"
            value = DATASET_DEFAULTS[defaults_key(c.dataset)][f"{name}_{key}"]
        c[key] = value
    c.variant = name


def apply_quick(c: ml_collections.ConfigDict) -> None:
    """A few-minute smoke version of a config: 2 epochs on a subset (CPU friendly); a run that
    ends at chance level warns instead of failing (config.allow_chance)."""
    c.num_epochs = 2
    c.train_examples = 6400 if c.dataset in ("mnist", "fashion_mnist") else 2560
    c.val_examples = 2000
    if defaults_key(c.dataset) == "custom":   # own data: all of it (its size is unknown here)
        c.train_examples = c.val_examples = 0
    c.log_every_steps = 10
    c.warmup_epochs = min(c.warmup_epochs, 1)
    # A smoke run checks that everything runs; two epochs on a small set of one's own data
    # need not learn, so ending at chance level is a warning, not exit 3.
    c.allow_chance = True


def apply_source(c: ml_collections.ConfigDict) -> None:
    """config.recipe = "source" and the method's `SOURCE_RECIPES` settings for the dataset."""
    if c.method not in SOURCE_RECIPES:
        raise ValueError(f"the 'source' modifier has no recipe for config.method={c.method!r}; "
                         f"it exists for {sorted(SOURCE_RECIPES)}")
    family = "cifar" if c.dataset.startswith("cifar") else "mnist"
    for key, value in SOURCE_RECIPES[c.method][family].items():
        c[key] = value
    c.recipe = "source"
    c.variant = f"{c.variant}_source"


def build_config(dataset: str, arg: str | None) -> ml_collections.ConfigDict:
    """`arg` is the text after ':' in --config=configs/<dataset>.py:<arg>."""
    c = default_config(dataset)
    tokens = [t.strip() for t in (arg or "").split(",") if t.strip()]
    variants = [t for t in tokens if t in VARIANTS]
    unknown = [t for t in tokens if t not in VARIANTS and t not in MODIFIERS]
    ensemble = "ensemble" in tokens
    if unknown:
        raise ValueError(f"unknown config argument(s) {unknown}; use one variant of "
                         f"{sorted(VARIANTS)} and optionally modifiers {list(MODIFIERS)}, e.g. "
                         f"configs/{dataset}.py:gedl,quick")
    if len(variants) > 1:
        raise ValueError(f"choose one variant, got {variants}")
    apply_variant(c, variants[0] if variants else (ENSEMBLE_PRESET if ensemble else "gedl"))
    if ensemble:
        c.ensemble_size = ENSEMBLE_SIZE
        c.variant = "ensemble" if not variants else f"{c.variant}_ensemble"
    if "source" in tokens:
        apply_source(c)
    if "quick" in tokens:
        apply_quick(c)
    c.run_name = "_".join([dataset, c.variant] + (["quick"] if "quick" in tokens else []))
    return c


def resolved_prior_strength(c: ml_collections.ConfigDict) -> float:
    """The prior strength W as a number (`prior_strength_value`: a number, 'K' or '0.1K')."""
    return _parse_prior_strength(c.prior_strength_value, c.num_classes)


def as_tuple(field: str, value: Any) -> tuple:
    """A list field's value as the tuple the config holds: a tuple or list, or comma-separated
    text (the command line's `--config.seeds=0,1,2`, which ml_collections passes on as the
    tuple ("0,1,2",) for a tuple of strings); empty items are dropped, seeds become ints."""
    items = value.split(",") if isinstance(value, str) else list(value)
    parts = [p for item in items
             for p in (item.split(",") if isinstance(item, str) else [item])]
    parts = [p.strip() if isinstance(p, str) else p for p in parts]
    parts = [p for p in parts if p != ""]
    if LIST_FIELDS[field] is int:
        try:
            return tuple(int(p) for p in parts)
        except (TypeError, ValueError):
            raise ValueError(f"config.{field}={as_written(value)} must be a list of integers, "
                             f"e.g. --config.{field}=0,1,2") from None
    return tuple(str(p) for p in parts)


def normalize_lists(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Every list field of `c` as a tuple of its items (`as_tuple`), in place; called once, where
    a config comes in from the command line or a saved config.json."""
    for field in LIST_FIELDS:
        if field in c:
            c[field] = as_tuple(field, c[field])
    return c


class ResolvedConfig(ml_collections.FrozenConfigDict):
    """A run's config as `resolve` returns it: read-only (setting a field raises
    AttributeError), so nothing below the run's entry point changes or resolves it again. Its
    text fields that hold values are parsed once, when it is made: `method_arguments` and
    `model_arguments` (the JSON objects `method_args` and `model_kwargs`, as dicts) and
    `prior_strength_W` (`prior_strength_value` as a number: 'K' and '0.1K' are resolved)."""

    def __init__(self, c: ml_collections.ConfigDict):
        super().__init__(c)
        # Not fields (config.json and the field list stay as they are): plain attributes of this
        # object, set past FrozenConfigDict's refusal of new attributes.
        object.__setattr__(self, "_parsed", {
            "method_args": method_args(self), "model_kwargs": model_kwargs(self),
            "prior_strength": resolved_prior_strength(self)})

    @property
    def method_arguments(self) -> dict[str, Any]:
        """`method_args` parsed (a new dict each time, so no reader can change another's)."""
        return dict(self._parsed["method_args"])

    @property
    def model_arguments(self) -> dict[str, Any]:
        """`model_kwargs` parsed (a new dict each time)."""
        return dict(self._parsed["model_kwargs"])

    @property
    def prior_strength_W(self) -> float:
        """The prior strength W as a number (`resolved_prior_strength`)."""
        return self._parsed["prior_strength"]


def parsed_method_args(c: ml_collections.ConfigDict) -> dict[str, Any]:
    """`method_args` as a dict: as parsed by `resolve` for a `ResolvedConfig`, else parsed now
    (a config not resolved yet: validation's, a test's, the own-loop API's)."""
    return c.method_arguments if isinstance(c, ResolvedConfig) else method_args(c)


def parsed_model_kwargs(c: ml_collections.ConfigDict) -> dict[str, Any]:
    """`model_kwargs` as a dict (as `parsed_method_args`)."""
    return c.model_arguments if isinstance(c, ResolvedConfig) else model_kwargs(c)


def prior_strength_number(c: ml_collections.ConfigDict) -> float:
    """W as a number (as `parsed_method_args`)."""
    return c.prior_strength_W if isinstance(c, ResolvedConfig) else resolved_prior_strength(c)


def resolve(c: ml_collections.ConfigDict, num_devices: int = 1,
            own_data: dict[str, Any] | None = None) -> ResolvedConfig:
    """The config a run reads, resolved once where it starts: a copy of `c` (left as it is) with
    its list fields as tuples (`normalize_lists`), the fields your own data decides set
    (`own_data`: num_classes, model; `gedl_jax.run.experiment.own_data_facts`), validated
    (`validate_config`) and frozen. A `ResolvedConfig` is returned as it is."""
    if isinstance(c, ResolvedConfig):
        return c
    copy = (c.as_configdict() if isinstance(c, ml_collections.FrozenConfigDict)
            else c.copy_and_resolve_references())
    resolved = ResolvedConfig(set_fields(normalize_lists(copy), **(own_data or {})))
    validate_config(resolved, num_devices)   # the methods' checks read the parsed values
    return resolved


def _resolved_with(c: ResolvedConfig, **fields: Any) -> ResolvedConfig:
    """A resolved copy of `c` with `fields` changed (the per-seed and per-member copies, whose
    changes validation has nothing against), not validated again."""
    return ResolvedConfig(set_fields(c.as_configdict(), **fields))


def set_fields(c: ml_collections.ConfigDict, **fields: Any) -> ml_collections.ConfigDict:
    """Set `fields` on `c` in place (list fields also from comma-separated text) and return it:
    `set_fields(config, ood_datasets="kmnist", num_epochs=3)`."""
    for key, value in fields.items():
        c[key] = as_tuple(key, value) if key in LIST_FIELDS else value
    return c


def parse_seeds(c: ml_collections.ConfigDict) -> list[int]:
    """The seeds of a run: `config.seeds`, else the one `config.seed`."""
    return list(as_tuple("seeds", c.seeds)) or [int(c.seed)]


def with_seed(c: ml_collections.ConfigDict, seed: int) -> ml_collections.ConfigDict:
    """A copy of `c` for one seed of a several-seed run (`seeds` cleared); resolved where `c`
    is."""
    if isinstance(c, ResolvedConfig):
        return _resolved_with(c, seed=int(seed), seeds=())
    seeded = c.copy_and_resolve_references()
    with seeded.unlocked():
        seeded.seed = int(seed)
        seeded.seeds = ()
    return seeded


def ensemble_member_config(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The config of a deep ensemble's members: the same method and settings, no ensemble, no
    evaluation of its own (the ensemble is evaluated as one model); resolved where `c` is."""
    if isinstance(c, ResolvedConfig):
        return _resolved_with(c, ensemble_size=0, seeds=(), evaluate_at_end=False, plots=False)
    member = c.copy_and_resolve_references()
    with member.unlocked():
        member.ensemble_size = 0
        member.seeds = ()
        member.evaluate_at_end = False
        member.plots = False
    return member


def parse_list(value: Any) -> list[str]:
    """The items of a list field of names: ("a", "b") or "a, b,c" -> ["a", "b", "c"]; "" -> []."""
    return list(as_tuple("ood_datasets", value))


def method_names() -> tuple[str, ...]:
    """Every `config.method` some preset of `VARIANTS` uses (the methods/ table builds them)."""
    return tuple(dict.fromkeys(v.get("method", DEFAULT_METHOD) for v in VARIANTS.values()))


def validate_config(c: ml_collections.ConfigDict, num_devices: int = 1) -> None:
    """Raise ValueError naming the field and its allowed values before any work starts."""
    for field, item_type in LIST_FIELDS.items():
        value = c.get(field, ())
        if not isinstance(value, tuple) or not all(isinstance(v, item_type) for v in value):
            raise ValueError(f"config.{field}={as_written(value)} must be a tuple of "
                             f"{item_type.__name__} (configuration.normalize_lists turns \"a,b\" "
                             f"into one)")
    _validate_own(c)
    for field, allowed in {**ALLOWED, "method": method_names()}.items():
        value = c.get(field)
        if value not in allowed and not _own_choice(field, value):
            own = {"model": " or '<importable.module>:<Name>'",
                   "dataset": " or 'npz:<path>', 'tfds:<name>', 'images:<folder>'"
                   }.get(field, "")
            raise ValueError(f"config.{field}={value!r} is not allowed; allowed values: "
                             f"{list(allowed)}{own}")
    for field, value in c.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"config.{field}={value!r} must be a finite number")
    k_from_data = is_custom_dataset(c.dataset) and c.num_classes == 0   # set from the data
    if c.num_classes < 2 and not k_from_data:
        raise ValueError(f"config.num_classes={c.num_classes} must be >= 2")
    positive = ("learning_rate", "batch_size", "num_epochs", "eval_batch_size",
                "eval_every_epochs", "log_every_steps", "steps_per_dispatch", "c_tau", "exp_clip",
                "annealing_epochs", "mc_samples")
    for field in positive:
        if not c[field] > 0:
            raise ValueError(f"config.{field}={c[field]!r} must be > 0")
    non_negative = ("weight_decay", "kl_weight", "fisher_logdet_weight", "red_regularizer_weight",
                    "warmup_epochs", "train_examples", "val_examples", "eval_examples",
                    "checkpoint_every_steps", "checkpoint_interval_seconds",
                    "grad_clip_norm", "c_w")
    for field in non_negative:
        if c[field] < 0:
            raise ValueError(f"config.{field}={c[field]!r} must be >= 0")
    if not 0.0 <= c.dropout_rate < 1.0:
        raise ValueError(f"config.dropout_rate={c.dropout_rate!r} must be in [0, 1)")
    if c.ensemble_size < 0 or c.ensemble_size == 1:
        raise ValueError(f"config.ensemble_size={c.ensemble_size} must be 0 (no ensemble) or "
                         f">= 2 members")
    _validate_evaluation(c)
    if not 0.0 < c.val_fraction < 1.0:
        raise ValueError(f"config.val_fraction={c.val_fraction!r} must be in (0, 1)")
    if c.batch_size % num_devices:
        raise ValueError(f"config.batch_size={c.batch_size} is not divisible by the number of "
                         f"devices ({num_devices}); use a multiple of {num_devices}")
    if c.eval_batch_size % num_devices:
        raise ValueError(f"config.eval_batch_size={c.eval_batch_size} is not divisible by the "
                         f"number of devices ({num_devices})")
    w = prior_strength_number(c)
    if c.prior_strength == "fixed" and not w > 0 and not k_from_data:
        raise ValueError(f"config.prior_strength_value={c.prior_strength_value!r} must give W > 0")
    if c.warmup_epochs >= c.num_epochs:
        raise ValueError(f"config.warmup_epochs={c.warmup_epochs} must be < num_epochs="
                         f"{c.num_epochs}")
    seeds = parse_seeds(c)
    for field, values in (("seed", [c.seed]), ("seeds", list(c.seeds))):
        if any(not 0 <= v < 2**32 for v in values):   # a PRNG seed: an unsigned 32-bit int
            raise ValueError(f"config.{field}={as_written(c[field])}: a seed must be in "
                             f"[0, 2**32)")
    if c.dataset in c.get("ood_datasets", ()):
        others = ",".join(o for o in c.ood_datasets if o != c.dataset)
        raise ValueError(f"config.ood_datasets={','.join(c.ood_datasets)!r} lists "
                         f"{c.dataset!r}, the dataset trained on (config.dataset): leave it out "
                         f"(--config.ood_datasets={others}), its test set is not OOD")
    _validate_no_repeats(c)
    if c.vmap_seeds and len(seeds) > 1 and c.base_rate == "label_frequency" \
            and c.split_seed < 0:
        raise ValueError("config.vmap_seeds=True with config.base_rate='label_frequency' needs one "
                         "train split for all seeds (its base rate is compiled into the step): "
                         "set config.split_seed, or config.vmap_seeds=False")
    _validate_distributed(c)
    _validate_methods(c)
    expected_model = DATASET_DEFAULTS[defaults_key(c.dataset)]["model"]
    if c.model != expected_model:
        # Not an error (a user may try VGG on MNIST) but the input shape must suit the model.
        if c.model == "vgg16" and c.dataset in ("mnist", "fashion_mnist"):
            raise ValueError("config.model='vgg16' needs 32x32 RGB input; MNIST-family data is "
                             "28x28x1: use config.model='convnet'")


def _validate_evaluation(c: ml_collections.ConfigDict) -> None:
    """The evaluation extras' fields (`_evaluation_fields`)."""
    if not 0.0 < c.get("conformal_alpha", 0.1) < 1.0:
        raise ValueError(f"config.conformal_alpha={c.conformal_alpha!r} must be in (0, 1)")
    if not 0.0 < c.get("bootstrap_confidence", 0.95) < 1.0:
        raise ValueError(f"config.bootstrap_confidence={c.bootstrap_confidence!r} must be in "
                         f"(0, 1)")
    from gedl_jax.evaluation.bootstrap import INTERVAL_METHODS   # its owner; no import cycle
    if c.get("bootstrap_interval", "percentile") not in INTERVAL_METHODS:
        raise ValueError(f"config.bootstrap_interval={c.bootstrap_interval!r} must be one of "
                         f"{INTERVAL_METHODS}")
    if c.get("bootstrap_samples", 0) < 0 or c.get("bootstrap_samples", 0) == 1:
        raise ValueError(f"config.bootstrap_samples={c.bootstrap_samples!r} must be 0 (none) or "
                         f">= 2 (1,000 is usual)")
    _parsed_ood_groups(c)   # which sets it may name: `check_ood_groups`, where they are known


def as_written(value: Any) -> str:
    """A list field's value as the command line writes it ("1,x", not "('1,x',)")."""
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value)


def _identity(field: str):
    """What makes two items of a list field the same item: an OOD set by the set it names
    (`registry.ood_identity`: real paths), anything else by its value."""
    return registry.ood_identity if field in ("ood_datasets", "extra_ood") else (lambda v: v)


def _repeats(items, identity) -> list[str]:
    """The items of `items` that name one already listed, as written ("x/../a.npz (=
    a.npz)" where the spellings differ)."""
    first: dict[Any, Any] = {}
    repeated = []
    for item in items:
        key = identity(item)
        if key in first:
            same = str(first[key]) == str(item)
            repeated.append(str(item) if same else f"{item} (= {first[key]})")
        else:
            first[key] = item
    return sorted(set(repeated))


def _validate_no_repeats(c: ml_collections.ConfigDict) -> None:
    """A seed or an OOD set listed twice (also under two spellings of one path) would be
    trained or scored twice."""
    for field in LIST_FIELDS:
        items = list(c.get(field, ()))
        repeated = _repeats(items, _identity(field))
        if repeated:
            raise ValueError(f"config.{field}={as_written(items)} lists "
                             f"{', '.join(repeated)} twice: list each once")
    both = _repeats([*c.get("ood_datasets", ()), *c.get("extra_ood", ())],
                    registry.ood_identity)
    if both:
        raise ValueError(f"{', '.join(both)} is in both config.ood_datasets and "
                         f"config.extra_ood: list each OOD set once")


def _parsed_ood_groups(c: ml_collections.ConfigDict) -> dict[str, str]:
    try:
        return registry.parse_ood_groups(c.get("ood_groups", ()))
    except ValueError as e:
        raise ValueError(f"config.ood_groups: {e}") from None


def check_ood_groups(c: ml_collections.ConfigDict, ood_names) -> dict[str, str]:
    """`c.ood_groups` parsed (`registry.parse_ood_groups`), every set it groups checked to be
    among `ood_names`, the OOD sets evaluated (a training run's: config.ood_datasets and
    config.extra_ood; an evaluation's: those and its --ood sets): a misspelt set would otherwise
    end in no group, silently."""
    declared = _parsed_ood_groups(c)
    missing = [name for name in declared if name not in ood_names]
    if missing:
        raise ValueError(f"config.ood_groups groups {', '.join(map(repr, missing))}, not among "
                         f"the OOD sets evaluated ({', '.join(map(repr, ood_names)) or 'none'}):"
                         f" name each set as config.ood_datasets, config.extra_ood or "
                         f"evaluate --ood does")
    return declared


def add_ood_groups(entries, added) -> tuple[str, ...]:
    """`config.ood_groups` `entries` with the "GROUP=SET" entries `added` (`evaluate
    --ood_group`): an added set's group replaces the one `entries` gave it."""
    merged = {**registry.parse_ood_groups(entries), **registry.parse_ood_groups(added)}
    return tuple(f"{group}={name}" for name, group in merged.items())


def _validate_distributed(c: ml_collections.ConfigDict) -> None:
    given = [f for f, unset in (("coordinator_address", ""), ("num_processes", 0),
                                ("process_id", -1)) if c.get(f, unset) != unset]
    if given and not c.distributed:
        raise ValueError(f"config.{given[0]} is set but config.distributed=False: add "
                         f"--config.distributed=True to start a multi-process run")
    address = str(c.get("coordinator_address", ""))
    if address:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"config.coordinator_address={address!r} must be 'host:port' "
                             f"(e.g. '10.0.0.1:1234'), the address of process 0")
    num_processes, process_id = int(c.get("num_processes", 0)), int(c.get("process_id", -1))
    if num_processes < 0:
        raise ValueError(f"config.num_processes={num_processes} must be >= 1 (0 = auto-detect)")
    if process_id < -1 or (num_processes and process_id >= num_processes):
        raise ValueError(f"config.process_id={process_id} must be in [0, num_processes="
                         f"{num_processes}) (-1 = auto-detect)")
    if (num_processes > 0) != (process_id >= 0):
        raise ValueError("config.num_processes and config.process_id go together: set both "
                         "(or neither, to auto-detect them from the cluster)")


def _validate_methods(c: ml_collections.ConfigDict) -> None:
    """The config-level checks of the method (its own settings are its class's to check:
    `gedl_jax.methods.check_config`)."""
    method_args(c)
    if c.recipe == "source" and c.method not in SOURCE_RECIPES:
        raise ValueError(f"config.recipe='source' is not available for config.method="
                         f"{c.method!r} (sources exist for {sorted(SOURCE_RECIPES)}); use "
                         f"config.recipe='protocol'")

"""The presets: each dataset's protocol settings, the named variants (`VARIANTS`: EDL, I-EDL,
R-EDL, RED, GEDL, the ablation rows and every other method) and the modifiers (`quick`,
`ensemble`, `source`), and the configs they make (`default_config`, `build_config`).

The paper's point (Table unified_edl) is that EDL, I-EDL, R-EDL, RED and GEDL differ only in three
choices: the prior (base rate `a`, strength `W`), the posterior update (evidence strength `tau`,
i.e. the KL weight 1/tau and its schedule) and the training objective. Each choice is a config
field (`schema`); a variant is a named set of field values, never a code fork.

The `source` modifier applies a method's original-repository recipe, which the method owns
(`Method.source_recipe`, gedl_jax/methods/): `build_config` takes those recipes as an argument
(`gedl_jax.configs.build_config` passes the methods'), so the config imports no method.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_collections

from gedl_jax.config.fields import DEFAULT_METHOD, PerDataset
from gedl_jax.config.schema import FIELDS
from gedl_jax.config.values import defaults_key
from gedl_jax.data import registry

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

# "quick": a few-minute run; "ensemble": a deep ensemble of ENSEMBLE_SIZE members of the
# variant (softmax members when no variant is named: `configs/mnist.py:ensemble`); "source":
# the method's original-repository recipe (`apply_source`).
MODIFIERS = ("quick", "ensemble", "source")
ENSEMBLE_SIZE = 5
ENSEMBLE_PRESET = "softmax"   # the members' preset when `ensemble` names no variant
# A method's source recipe: {dataset family ("mnist", "cifar"): {field: value}}.
Recipes = Mapping[str, Mapping[str, Mapping[str, Any]]]


def method_names() -> tuple[str, ...]:
    """Every `config.method` some preset of `VARIANTS` uses (the methods/ table builds them)."""
    return tuple(dict.fromkeys(v.get("method", DEFAULT_METHOD) for v in VARIANTS.values()))


def default_config(dataset: str) -> ml_collections.ConfigDict:
    """All fields with their defaults (GEDL on `dataset`); `schema.help_text` documents each."""
    if defaults_key(dataset) not in DATASET_DEFAULTS:
        raise ValueError(f"config.dataset={dataset!r} is not supported; allowed: "
                         f"{sorted(DATASET_DEFAULTS)}")
    d = {**DATASET_DEFAULTS[defaults_key(dataset)], "dataset": dataset,
         "run_name": f"{dataset}_gedl"}
    d.setdefault("warmup_epochs", 0)
    c = ml_collections.ConfigDict()
    for name, f in FIELDS.items():
        value = d[f.default.key] if isinstance(f.default, PerDataset) else f.default
        c[name] = tuple(value) if f.items is not None else value
    return c


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
    c.train_examples = 6400 if registry.dataset_family(c.dataset) == "mnist" else 2560
    c.val_examples = 2000
    if defaults_key(c.dataset) == "custom":   # own data: all of it (its size is unknown here)
        c.train_examples = c.val_examples = 0
    c.log_every_steps = 10
    c.warmup_epochs = min(c.warmup_epochs, 1)
    # A smoke run checks that everything runs; two epochs on a small set of one's own data
    # need not learn, so ending at chance level is a warning, not exit 3.
    c.allow_chance = True


def apply_source(c: ml_collections.ConfigDict, recipes: Mapping[str, Recipes]) -> None:
    """config.recipe = "source" and the method's source recipe (`recipes[config.method]`, the
    methods' `source_recipe`) for the dataset's family."""
    if not recipes.get(c.method):
        raise ValueError(f"the 'source' modifier has no recipe for config.method={c.method!r}; "
                         f"it exists for {sorted(n for n, r in recipes.items() if r)}")
    family = registry.dataset_family(c.dataset) or "mnist"
    for key, value in recipes[c.method][family].items():
        c[key] = value
    c.recipe = "source"
    c.variant = f"{c.variant}_source"


def build_config(dataset: str, arg: str | None,
                 source_recipes: Mapping[str, Recipes] | None = None
                 ) -> ml_collections.ConfigDict:
    """`arg` is the text after ':' in --config=configs/<dataset>.py:<arg>: one variant of
    `VARIANTS` and optional `MODIFIERS`. The `source` modifier needs `source_recipes` (method
    -> its recipe); `gedl_jax.configs.build_config`, what the config files call, passes the
    methods' own."""
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
        if source_recipes is None:
            raise ValueError("the 'source' modifier applies a method's own recipe: build the "
                             "config with gedl_jax.configs.build_config (as --config= does)")
        apply_source(c, source_recipes)
    if "quick" in tokens:
        apply_quick(c)
    c.run_name = "_".join([dataset, c.variant] + (["quick"] if "quick" in tokens else []))
    return c

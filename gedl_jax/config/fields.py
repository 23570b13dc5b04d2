"""Every config field, once: its default, doc, group, allowed values, list-ness and whether a
resumed run may change it (`Field`). `schema.py` builds the views (`ALLOWED`, `LIST_FIELDS`,
`RESUME_SAFE_FIELDS`, the help) from `ALL`; `presets.default_config` builds a ConfigDict."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from gedl_jax.evidential import activations, schedules
from gedl_jax.evidential import loss as loss_lib


@dataclasses.dataclass(frozen=True)
class PerDataset:
    """A default read from the dataset's defaults (`presets.DATASET_DEFAULTS[dataset][key]`);
    "dataset" and "run_name" are the dataset's name and "<dataset>_gedl"."""

    key: str


@dataclasses.dataclass(frozen=True)
class Field:
    """One config field: what the ConfigDict holds under `name` and what is known of it."""

    name: str
    default: Any
    doc: str
    group: str
    allowed: tuple[Any, ...] | None = None   # the values validation accepts (None: any)
    items: type | None = None                # a list field: the type of its items
    resume_safe: bool = False                # a resumed run may change it (no parameter does)

    def __post_init__(self):
        object.__setattr__(self, "doc", " ".join(self.doc.split()))

    @property
    def kind(self) -> str:
        """The value's type as the help prints it."""
        if self.items is not None:
            return f"list of {self.items.__name__}"
        if isinstance(self.default, PerDataset):
            return {"dataset": "str", "run_name": "str"}.get(self.default.key, "per dataset")
        return type(self.default).__name__


def loss_default(name: str) -> Any:
    """The EDL family's default of `name`: `LossSpec`'s, the loss's own (written once)."""
    return {f.name: f.default for f in dataclasses.fields(loss_lib.LossSpec)}[name]


def _group(name: str):
    return functools.partial(Field, group=name)


_header, _data, _model, _method = map(_group, ("header", "data", "model", "method"))
_baseline, _prior, _posterior = map(_group, ("baseline", "prior", "posterior"))
_objective, _optimisation = map(_group, ("objective", "optimisation"))
_loop, _evaluation = map(_group, ("loop", "evaluation"))
SAFE = {"resume_safe": True}
DEFAULT_METHOD = "evidential"   # the method of a preset that names none: the EDL family

# The allowed values of an option the math dispatches on are the keys of the math's own table.
ALL: tuple[Field, ...] = (
    _header("variant", "gedl", "name of the variant preset applied (recorded in outputs)"),
    _header("run_name", PerDataset("run_name"),
            "default workdir name: runs/<run_name> (set by the preset)", **SAFE),
    # --- data
    _data("dataset", PerDataset("dataset"),
          "in-distribution dataset (TFDS name), or your own: npz:<path>, tfds:<name>, "
          "images:<folder>", allowed=("mnist", "fashion_mnist", "cifar10", "cifar100")),
    _data("data_dir", "", 'folder with one subfolder per dataset; "" -> $GEDL_DATA_DIR, else '
          "~/.cache/gedl_jax/data (printed)", **SAFE),
    _data("download", "auto", '"auto": fetch missing official files (verified) before '
          'training; "never": offline; "force": fetch again. $GEDL_OFFLINE=1 means "never"',
          allowed=("auto", "never", "force"), **SAFE),
    _data("data_mirror", "", "base URL or folder <mirror>/<dataset>/<file> to fetch from "
          'instead of the official URLs ("" -> $GEDL_DATA_MIRROR)', **SAFE),
    _data("cache_dir", "", 'decoded-array cache; "" -> $GEDL_CACHE_DIR or ~/.cache/gedl_jax',
          **SAFE),
    _data("data_source", "auto", '"raw" official files in data_dir, "tfds" a prepared TFDS '
          'dataset, "auto": raw files if present, else TFDS', allowed=("auto", "raw", "tfds"),
          **SAFE),
    _data("tfds_data_dir", "", 'where TFDS keeps prepared datasets ("" = TFDS default)', **SAFE),
    _data("ood_datasets", PerDataset("ood_datasets"), "OOD test sets (names); the command line "
          'also takes "kmnist,fashion_mnist" ("" for none, e.g. where SVHN/CIFAR-100 are '
          "absent)", items=str, **SAFE),
    _data("extra_ood", (), "extra OOD sets: folders of IDX files", items=str, **SAFE),
    _data("ood_groups", (), "\"GROUP=SET\": the near/far group (OpenOOD's averages) of an "
          "evaluated OOD set, over the registry's; e.g. "
          '"far=images:/data/textures,near=npz:c100.npz"', items=str, **SAFE),
    _data("image_resize", "crop", "an images:<folder> OOD set's images of another size than "
          'the model\'s: "crop" (aspect kept, scaled to cover, centre cut: torchvision '
          'Resize+CenterCrop) or "stretch"', allowed=("crop", "stretch"), **SAFE),
    _data("val_fraction", PerDataset("val_fraction"),
          "fraction of the official train split held out"),
    _data("split_seed", -1, "seed of the train/val permutation; -1 -> same as `seed`"),
    _data("normalize", False, "standardise with ID channel stats (reference: no)"),
    _data("augment", PerDataset("augment"),
          "CIFAR flip + crop(pad 4) + rotation(15 deg), on device"),
    _data("train_examples", 0, "use only the first N training examples (0 = all)"),
    _data("val_examples", 0, "use only the first N validation examples (0 = all)"),
    _data("eval_examples", 0, "evaluate on N evenly spaced examples of the test set and of "
          "each OOD set (0 = all; smoke runs)", **SAFE),
    # --- model
    _model("model", PerDataset("model"), '"convnet" (MNIST) or "vgg16" (CIFAR, batch norm); '
           'your own: "resnet18", "mlp" or "<importable.module>:<Name>"',
           allowed=("convnet", "vgg16", "resnet18", "mlp")),
    _model("num_classes", PerDataset("num_classes"), "K"),
    _model("init", "flax", 'parameter init: "flax" = flax\'s defaults (lecun_normal kernels, '
           'zero biases); "torch" = the PyTorch reference code\'s (U(+-1/sqrt(fan_in)) weights '
           "and biases; VGG convs N(0, sqrt(2/(9 C_out)))), which every result published "
           'before this option used. Why "flax" is the default: docs/reproduction.md '
           '("Initialisation")', allowed=("torch", "flax")),
    _model("compute_dtype", "float32", "conv/matmul dtype; params and loss stay float32",
           allowed=("float32", "bfloat16")),
    _model("matmul_precision", "default", 'float32 conv/matmul products: "default" = XLA\'s '
           "choice (TF32 tensor cores on NVIDIA Ampere and later GPUs, as jax and PyTorch's "
           'cuDNN do), "highest" = float32; no effect on a CPU (docs/gpu.md, "Numerics")',
           allowed=("default", "highest")),
    _model("dropout_rate", 0.0, "ConvNet dropout after hidden ReLUs (MC Dropout: 0.5); "
           "VGG16's classifier dropout is always 0.5 (protocol)"),
    _model("dropout_placement", "dense", "ConvNet dropout after the hidden Dense layers only, "
           'or "all": after every conv ReLU too', allowed=("dense", "all")),
    _model("model_kwargs", "", 'own networks (model "resnet18", "mlp", "pkg.mod:Name"): '
           "further constructor keywords as a JSON object, e.g. '{\"width\": 64}' "
           "(docs/library.md)"),
    # --- method (its allowed values: the methods the presets name, presets.method_names)
    _method("method", DEFAULT_METHOD, '"evidential" (the EDL family: its fields are the prior, '
            'posterior and objective groups), "softmax", "mc_dropout", "duq", "kl_pn", '
            '"rkl_pn", "postnet", "daedl", "fedl", "laplace" (gedl_jax.methods.METHODS)'),
    _method("method_args", "", "the method's own settings as a JSON object, e.g. "
            "'{\"length_scale\": 0.2}' for DUQ; each setting, its default and its allowed "
            "values are its method dataclass's fields (gedl_jax/methods/<method>.py)"),
    _method("mc_samples", 10, "MC Dropout: test-time passes T", **SAFE),
    _method("ensemble_size", 0, ">= 2: a deep ensemble of that many members of the method "
            "(trained as seeds seed*N+m, scored as one model)"),
    # --- baselines
    _baseline("recipe", "protocol", "baselines' reading: \"protocol\" (the I-EDL/R-EDL "
              'pipeline every row uses) or "source" (the original repository\'s recipe, where '
              "it differs; set by the `source` modifier)", allowed=("protocol", "source")),
    # --- prior
    _prior("evidence", loss_default("evidence"), "evidence activation e = f(logits)",
           allowed=activations.ACTIVATIONS),
    _prior("exp_clip", loss_default("exp_clip"), "clamp of the logits for exp evidence"),
    _prior("base_rate", "uniform", "base rate a: uniform 1/K or training label frequencies",
           allowed=("uniform", "label_frequency")),
    _prior("prior_strength", loss_default("prior_strength"),
           "W fixed (EDL, R-EDL) or adaptive (GEDL)", allowed=tuple(loss_lib.PRIOR_STRENGTHS)),
    _prior("prior_strength_value", "K",
           'W when fixed: a number, "K" or "<x>K" (R-EDL: "0.1K")'),
    _prior("c_w", loss_default("c_w"), "GEDL's C_w: limit of the adaptive W as evidence grows"),
    # --- posterior
    _posterior("kl_schedule", loss_default("kl_schedule"),
               '"gedl_tau", "edl_anneal" (min(1, epoch/10)), "constant"',
               allowed=tuple(loss_lib.KL_SCHEDULES)),
    _posterior("kl_weight", loss_default("kl_weight"),
               'multiplier of the KL term (the constant when "constant")'),
    _posterior("annealing_epochs", loss_default("annealing_epochs"),
               "EDL annealing length in epochs"),
    _posterior("c_tau", loss_default("c_tau"), "GEDL's C_tau"),
    _posterior("tau_reading", loss_default("tau_reading"), "the sum in Eq. tau_schedule: one "
               "term per epoch (default), per step, or per completed epoch "
               "(docs/gedl_readings.md)", allowed=schedules.TAU_READINGS),
    _posterior("tau_form", loss_default("tau_form"),
               "tau = C_tau / sum (Eq. tau_schedule) or sum / C_tau",
               allowed=schedules.TAU_FORMS),
    # --- objective
    _objective("likelihood", loss_default("likelihood"),
               "data term: digamma NLL, log, MSE (+/- var), Fisher MSE",
               allowed=tuple(loss_lib.LIKELIHOODS)),
    _objective("kl_target", loss_default("kl_target"),
               "KL(Dir(alpha)||Dir(Wa)) on all samples, EDL's masked, none",
               allowed=tuple(loss_lib.KL_TARGETS)),
    _objective("fisher_logdet_weight", loss_default("fisher_logdet_weight"),
               "I-EDL's weight of -log det of the Fisher information"),
    _objective("red_regularizer_weight", loss_default("red_regularizer_weight"),
               "RED's correct-evidence regularizer weight"),
    _objective("warmup_epochs", PerDataset("warmup_epochs"),
               "non-evidential (softmax CE) warm-up epochs"),
    # --- optimisation
    _optimisation("learning_rate", PerDataset("learning_rate"), "Adam peak learning rate"),
    _optimisation("lr_schedule", "cosine", "cosine decay to 0 over all steps, or constant",
                  allowed=("cosine", "constant")),
    _optimisation("weight_decay", PerDataset("weight_decay"), "5e-4 on CIFAR"),
    _optimisation("weight_decay_mode", "l2", '"l2": added to the gradient before Adam '
                  '(PyTorch Adam\'s weight_decay); "decoupled": AdamW',
                  allowed=("l2", "decoupled")),
    _optimisation("batch_size", 128, "global batch, split over all devices"),
    _optimisation("num_epochs", 200, "training epochs (the paper's 200)"),
    _optimisation("grad_clip_norm", 0.0, "global gradient-norm clip; 0 = off"),
    # --- loop
    _loop("seed", 0, "model init, data order, augmentation"),
    _loop("seeds", (), 'several seeds in one command: (0, 1, 2) (or "0,1,2" on the command '
          "line) -> workdir/seed_<s>", items=int, **SAFE),
    _loop("vmap_seeds", False, "train those seeds together in one program (vmap over a seed "
          "axis): pays on an accelerator a small model can't fill"),
    _loop("eval_batch_size", 1024, "batch of the evaluation's forward passes", **SAFE),
    _loop("eval_every_epochs", 1, "validation accuracy every N epochs (best checkpoint)"),
    _loop("log_every_steps", 100, "progress line / metrics fetch interval", **SAFE),
    _loop("checkpoint_every_steps", 0,
          "extra mid-epoch checkpoints (0 = only at epoch ends)", **SAFE),
    _loop("checkpoint_interval_seconds", 60.0, "epoch-end checkpoints (last, and best if it "
          "changed) at most this often; always at the run's end, a preemption and "
          "checkpoint_every_steps. 0 = every epoch end. A hard kill loses at most this much "
          "training", **SAFE),
    _loop("steps_per_dispatch", 100, "train steps per compiled call off the CPU (a "
          "device-side loop; it ends early at log points, epoch ends and checkpoints): fewer "
          "host round trips. A CPU runs one step per call whatever this says. Any value > 1 "
          "gives the same parameters bit for bit; 1 compiles the step alone, equal to float32 "
          "rounding on a GPU (tests/test_multi_step.py)", **SAFE),
    _loop("deterministic", True, "on a GPU: deterministic kernels and autotuning choices kept "
          "in the workdir, so a resumed run equals the uninterrupted one bit for bit "
          "(run/numerics.py); False: XLA's fastest kernels. No effect on a CPU", **SAFE),
    _loop("evaluate_at_end", True, "test + OOD evaluation of the best checkpoint", **SAFE),
    _loop("epoch_eval", False, "also score the test and OOD sets with the current parameters "
          "at each validation (accuracy, AUPR, mean S), logged as split \"epoch_eval\": when "
          "detection turns down", **SAFE),
    _loop("plots", True, "write PNG plots at the end", **SAFE),
    _loop("tracker", "none", '"mlflow": also log the run to MLflow (pip install '
          "'gedl-jax[mlflow]'): the config as params, metrics.jsonl's records with their steps, "
          "the final evaluation's headline numbers and result files; metrics.jsonl and "
          'TensorBoard are written either way (docs/library.md, "Tracking runs with MLflow")',
          allowed=("none", "mlflow"), **SAFE),
    _loop("tracker_uri", "", 'where config.tracker logs: "" -> $MLFLOW_TRACKING_URI, else '
          "./mlruns (a local folder, no server); or a folder, sqlite:///<file>.db, a server's "
          "http(s) URL", **SAFE),
    _loop("tracker_experiment", "", 'the MLflow experiment of the run: "" -> '
          '$MLFLOW_EXPERIMENT_NAME, else "gedl-jax"', **SAFE),
    _loop("allow_chance", False, "a run whose best validation accuracy is at chance level ends "
          "with exit status 3; True when that is intended", **SAFE),
    _loop("distributed", False, "call jax.distributed.initialize() (multi-host; see "
          "docs/multihost.md); the three fields below, where empty, come from "
          "JAX_COORDINATOR_ADDRESS or SLURM/Open MPI/TPU", **SAFE),
    _loop("coordinator_address", "", "\"host:port\" of process 0's coordinator service",
          **SAFE),
    _loop("num_processes", 0, "number of processes (hosts) in the job; 0 = auto", **SAFE),
    _loop("process_id", -1, "this process's index in [0, num_processes); -1 = auto", **SAFE),
    # --- evaluation
    _evaluation("conformal_alpha", 0.1, "miscoverage of the conformal sets (LAC, APS, RAPS), "
                "calibrated on the validation split", **SAFE),
    _evaluation("calibrate", False, "post-hoc calibration fitted on the validation split: "
                "temperature scaling (categorical), evidence scale (EDL family); calibrated "
                "rows in every table", **SAFE),
    _evaluation("aupr_trapezoidal", False, "also OpenOOD's trapezoidal AUPR (its own table)",
                **SAFE),
    _evaluation("bootstrap_samples", 0, "> 0: bootstrap intervals of every metric over that "
                "many resamples of the test and OOD examples (a table)", **SAFE),
    _evaluation("bootstrap_confidence", 0.95, "the intervals' level", **SAFE),
    # the methods of gedl_jax.evaluation.bootstrap.INTERVAL_METHODS (a test keeps them equal:
    # the config does not import the evaluation)
    _evaluation("bootstrap_interval", "percentile", 'or "basic": the percentile bounds '
                "reflected about the metric on all examples (corrects ECE's upward bias to "
                "first order; evaluation.bootstrap)", allowed=("percentile", "basic"), **SAFE),
    _evaluation("posthoc_scores", "auto", "post-hoc OOD scores of a softmax / EDL-family "
                'network (evaluation.posthoc): "auto" = every one its network gives the inputs '
                'for, "none", or a comma list of msp, max_logit, energy, neg_entropy, '
                "neg_mahalanobis, neg_knn_distance, vim; results' \"posthoc\" section", **SAFE),
)

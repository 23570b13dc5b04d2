"""A run's setup, in one place for training and evaluation alike.

From a config: the inputs obtained (downloaded and verified, or named in one error), the
official splits loaded and checked, the seeded train/validation split (`data.split_indices`),
the OOD sets, the normalisation statistics, and the method (its models and loss, with the base
rate a computed from the training split's label counts where configured). Training
(`gedl_jax.train`) and evaluation (`gedl_jax.run.workdir`) both build a run with
`Experiment.from_config`, so what is evaluated is what was trained. Nothing here trains or
evaluates.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from gedl_jax import config as config_lib
from gedl_jax import data, files, methods
from gedl_jax.config import ResolvedConfig
from gedl_jax.run import heartbeat


@dataclasses.dataclass(frozen=True)
class DataSources:
    """Where the run's data comes from (config.data_dir, cache_dir, data_source, tfds_data_dir)."""

    data_dir: str | None
    cache_dir: str | None
    source: str
    tfds_data_dir: str | None

    @classmethod
    def from_config(cls, config) -> DataSources:
        return cls(data_dir=config.data_dir or None, cache_dir=config.cache_dir or None,
                   source=config.data_source, tfds_data_dir=config.tfds_data_dir or None)

    def kwargs(self) -> dict[str, Any]:
        """The fields as keyword arguments of the data loaders."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class RunData:
    """One seed's splits: train and validation carved from the official training split, the
    official test split, and the OOD sets. `train_index`: the training examples' indices into
    the official training split (the order `train` lists them in)."""

    train: data.Split
    validation: data.Split
    test: data.Split
    ood: dict[str, data.Split]
    train_index: np.ndarray


def obtain_inputs(config, sources: DataSources | None = None) -> None:
    """Pre-flight: make every split and OOD set of the run loadable before any work, i.e.
    downloaded and verified (config.download, config.data_mirror), or all missing files named in
    one error. Under jax.distributed only process 0 downloads; the others wait at a barrier and
    then verify the files as they load them. `sources`: the run's, else the config's."""
    own_id = data.is_own(config.dataset)   # npz:/tfds: data is read where it is, no fetching
    wanted = ([] if own_id else [(config.dataset, "train"), (config.dataset, "test")]) + [
        data.source_split(name) for name in config.ood_datasets
        if data.is_ood_name(name)]   # a derived OOD set (cifar10_gray28): its source's files
    if not wanted:
        return
    # The decoded-array cache and the verified-checksum records are written as the data loads.
    files.check_writable(data.resolve_cache_dir(config.cache_dir or None),
                         "the data cache (config.cache_dir, else $GEDL_CACHE_DIR)")
    fetching = dict(download=config.get("download", "auto"),
                    mirror=config.get("data_mirror", "") or None)
    sources = (sources or DataSources.from_config(config)).kwargs()
    if jax.process_count() == 1:
        data.ensure_available(wanted, **sources, **fetching)
        return
    from jax.experimental import multihost_utils

    failure = None
    if jax.process_index() == 0:
        try:
            data.ensure_available(wanted, **sources, **fetching)
        except data.DataError as e:  # reach the barrier first, so no process waits forever
            failure = e
    multihost_utils.sync_global_devices("gedl_jax: inputs obtained")
    if failure is not None:
        raise failure


@dataclasses.dataclass(frozen=True)
class OfficialData:
    """The official training and test splits and the OOD sets, loaded and checked once for all
    seeds of a run."""

    train: data.Split
    test: data.Split
    ood: dict[str, data.Split]
    validation: data.Split | None = None   # own data's val_* arrays (else cut from train)

    @classmethod
    def load(cls, config, *, obtain: bool = True) -> OfficialData:
        """`config`: one whose list fields are tuples (`resolve_config`, or `saved_config`'s)."""
        ood_names = config.ood_datasets + config.extra_ood
        what = f"loading {config.dataset}" + (f" and {len(ood_names)} OOD set(s)"
                                              if ood_names else "")
        with heartbeat.announced(f"{what} (decoded once, then read from the cache)"):
            return cls._load(config, obtain, DataSources.from_config(config))

    @classmethod
    def _load(cls, config, obtain: bool, data_sources: DataSources) -> OfficialData:
        if obtain:
            obtain_inputs(config, data_sources)
        sources = dict(data_sources.kwargs(), download="never")
        validation = None
        if data.is_own(config.dataset):
            own = data.load_own(config.dataset, config.tfds_data_dir or None,
                                config.cache_dir or None)
            official, test, validation = own.train, own.test, own.validation
        else:
            official = data.load_split(config.dataset, "train", **sources)
            test = data.load_split(config.dataset, "test", **sources)
        for split in (official, test):
            _check_labels_fit(config, split)
        ood = {}
        for name in config.ood_datasets + config.extra_ood:
            ood[name] = load_ood_set(config, name, official, data_sources, download="never")
        return cls(official, test.subset(config.eval_examples), ood, validation)

    def for_seed(self, config, seed: int) -> RunData:
        """Seed `seed`'s splits (the protocol split of `data.split_indices`, shortened to
        config.train_examples / val_examples when those are set)."""
        split_seed = seed if config.split_seed < 0 else config.split_seed
        train_idx, val_idx = data.split_indices(len(self.train), config.val_fraction, split_seed)
        if self.validation is not None:   # the file's own validation set
            train_idx = np.arange(len(self.train))
            val_idx = np.arange(len(self.validation))
        for field, idx, part in (("train_examples", train_idx, "training"),
                                 ("val_examples", val_idx, "validation")):
            if config[field] > len(idx):
                raise ValueError(f"config.{field}={config[field]} exceeds the {len(idx)} "
                                 f"examples of the {part} split of {config.dataset}; use at "
                                 f"most {len(idx)}, or 0 for all")
        if config.train_examples:
            train_idx = train_idx[:config.train_examples]
        if config.val_examples:
            val_idx = val_idx[:config.val_examples]
        val_source = self.train if self.validation is None else self.validation
        return RunData(train=self.train.take(train_idx, f"{config.dataset}/train"),
                       validation=val_source.take(val_idx, f"{config.dataset}/validation"),
                       test=self.test, ood=self.ood, train_index=train_idx)


def load_ood_set(config, name: str, train: data.Split, sources: DataSources | None = None,
                 **fetching) -> data.Split:
    """The OOD set `name` (a built-in or derived name, an IDX folder, "npz:<path>",
    "tfds:<name>" or "images:<folder>", whose images config.image_resize sizes), checked to
    have the shape of the `train` examples and cut to
    config.eval_examples evenly spaced examples as the test set is (a set added at evaluation,
    `evaluate --extra_ood`, included). `sources`: the run's, else the config's; `fetching`:
    `download` / `mirror` for `data.load_ood` (its defaults: fetch what is missing)."""
    if data.is_own(name):
        ood = data.load_own_ood(name, train, config.tfds_data_dir or None,
                                image_resize=config.get("image_resize", "crop"),
                                cache_dir=config.cache_dir or None,
                                num_examples=int(config.eval_examples))
    else:
        ood = data.load_ood(name, **(sources or DataSources.from_config(config)).kwargs(),
                            **fetching)
    _check_ood_shape(name, ood, train)
    return ood.subset(config.eval_examples)


def _check_labels_fit(config, split: data.Split) -> None:
    if len(split.labels) and int(split.labels.max()) >= config.num_classes:
        raise ValueError(f"config.num_classes={config.num_classes} but {split.name} has labels up "
                         f"to {int(split.labels.max())}: set config.num_classes to at least "
                         f"{int(split.labels.max()) + 1}")


def _check_ood_shape(name: str, ood: data.Split, train: data.Split) -> None:
    if ood.images.shape[1:] != train.images.shape[1:]:
        raise ValueError(f"OOD set {name!r} has images of shape {ood.images.shape[1:]}, but the "
                         f"model reads {train.images.shape[1:]} ({train.name}): an OOD set needs "
                         f"the in-distribution image size and channels")


def check_data_sizes(config, run_data: RunData) -> None:
    """The checks of the config that need the data: one whole batch of training examples,
    something to validate on. Called before anything is written into the workdir."""
    num_train, where = len(run_data.train.labels), f" of {config.dataset}"
    if config.batch_size > num_train:
        raise ValueError(f"config.batch_size={config.batch_size} exceeds the {num_train} "
                         f"training examples{where}: use --config.batch_size="
                         f"{_fitting_batch(num_train)} or less, or more config.train_examples")
    if len(run_data.validation.labels) < 1:
        raise ValueError(f"the validation split{where} is empty: raise config.val_fraction or "
                         f"config.val_examples")


def _fitting_batch(num_train: int) -> int:
    """The largest power of two <= num_train (a batch size that fits)."""
    return 1 << (max(num_train, 1).bit_length() - 1)


def resolve_config(config, num_devices: int) -> ResolvedConfig:
    """The config a run reads, resolved once where the run starts (and where a workdir is
    restored): `config.resolve` with the facts of your own data (`own_data_facts`) and the
    method's own settings (`methods.settings_for`, checked and kept on the config). A resolved
    config is returned as it is; `config` itself is not changed."""
    return config_lib.resolve(config, num_devices, own_data_facts, methods.settings_for)

def own_data_facts(config) -> dict[str, Any]:
    """For your own data (`config.dataset` "npz:<path>" / "tfds:<name>"), the fields the data
    decides: num_classes from the labels, model "mlp" where none is named and the inputs are
    vectors; one-line errors for what the data rules out (no model for images, augmentation of
    vectors). {} for the built-in datasets."""
    if not data.is_own(config.dataset):
        return {}
    own = data.load_own(config.dataset, config.tfds_data_dir or None,
                        config.cache_dir or None)
    shape = own.train.image_shape
    facts: dict[str, Any] = {"num_classes": int(own.num_classes)}
    if not config.model:
        if len(shape) != 1:
            raise ValueError(f"{config.dataset} holds images {shape}: name a network, "
                             f"--config.model=resnet18, or <importable.module>:<Name> "
                             f"(the MLP is the default only for vectors)")
        facts["model"] = "mlp"
    if config.augment and len(shape) != 3:
        raise ValueError(f"config.augment=True flips and crops images (H, W, C); "
                         f"{config.dataset} holds inputs of shape {shape}: set "
                         f"--config.augment=False")
    return facts


def resolve_own_data(config) -> None:
    """`own_data_facts` set on `config`, in place (before validating it yourself)."""
    config_lib.set_fields(config, **own_data_facts(config))


def load_run_data(config) -> RunData:
    """Seed `config.seed`'s splits and the OOD sets, loaded (and checked) before any work."""
    return OfficialData.load(config).for_seed(config, int(config.seed))


def normalization_stats(config, train: data.Split
                        ) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """Per-channel (mean, std) of the training split in [0, 1] units, or (None, None)."""
    if not config.normalize:
        return None, None
    mean, std = data.channel_stats(train)
    return tuple(float(x) for x in np.ravel(mean)), tuple(float(x) for x in np.ravel(std))


def build_method(config, train: data.Split) -> methods.Method:
    """The method of a resolved config (`resolve_config`); its base rate / class counts come
    from the training split."""
    setup = methods.MethodSetup.from_labels(train.labels, config.num_classes,
                                            train.images.shape[1:])
    return methods.build(config, setup)


def run_keys(seed: int) -> dict[str, jax.Array]:
    """A seed's independent random streams: parameter init, data order, augmentation,
    dropout."""
    init, order, augment, dropout = jax.random.split(jax.random.PRNGKey(seed), 4)
    return {"init": init, "order": order, "augment": augment, "dropout": dropout}


def predict_key(seed: int) -> jax.Array:
    """The key of a seed's predictions (MC Dropout's test-time masks): a stream of its own
    (the dropout stream folded with a step number training never reaches)."""
    return jax.random.fold_in(run_keys(seed)["dropout"], 2**31 - 1)


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A seed's run, set up: config, data, method and normalisation."""

    config: Any
    data: RunData
    method: methods.Method
    normalization: tuple[tuple[float, ...] | None, tuple[float, ...] | None]

    @classmethod
    def from_config(cls, config: ResolvedConfig, run_data: RunData | None = None) -> Experiment:
        """A run's setup from its resolved config (`resolve_config`): its data loaded (or
        `run_data`), its method built."""
        run_data = run_data if run_data is not None else load_run_data(config)
        return cls(config, run_data, build_method(config, run_data.train),
                   normalization_stats(config, run_data.train))

    @property
    def seed(self) -> int:
        return int(self.config.seed)

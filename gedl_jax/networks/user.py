"""Your own network: load `"<importable.module>:<Name>"` (or a built-in name), adapt, check.

    net = load_network("mypkg.nets:SmallCNN", num_classes=10, input_shape=(28, 28, 1))
    variables = net.init(jax.random.PRNGKey(0))                 # {"params", ["batch_stats"]}
    logits_BxK = net.apply(variables, x_BxHxWxC, train=False)
    logits_BxK, updates = net.apply(variables, x, train=True, rngs={"dropout": key},
                                    mutable=["batch_stats"])
    feats_BxF = net.features(variables, x, train=False)          # where a method needs features

Built-in names: "resnet18" (`gedl_jax.networks.resnet:ResNet18`, the CIFAR ResNet-18) and "mlp"
(`gedl_jax.networks.mlp:MLP`).

The contract a network class must meet (checked by `load_network` on a batch of zeros; every
violation is a ValueError naming the network, what was expected and what was found):

**Linen** (`flax.linen.Module` subclass)
  - constructed as `Name(num_classes=K)` (more keyword arguments may be passed through
    `load_network(..., **kwargs)`); a network with BatchNorm (any collection updated in
    training) that is to train data-parallel (`load_network(..., axis_name="data")`, what the
    shard_map trainer needs even on one device) must take an `axis_name` field and pass it to
    its BatchNorm layers, so their statistics are averaged over the global batch;
  - called as `module(x, train=bool)` (inputs (B, ...) float32: NHWC images in [0, 1], or
    vectors) and returning one floating array of logits (B, K), finite on a batch of zeros;
  - BatchNorm statistics (or any other state updated in training) in the `batch_stats`
    collection; dropout drawn from the `dropout` rng stream (`self.make_rng("dropout")`, which
    `nn.Dropout` does) and on only when `train` is True.

**NNX** (`flax.nnx.Module` subclass)
  - constructed as `Name(num_classes=K, rngs=nnx.Rngs(seed))` (extra keyword arguments and
    `axis_name` as for Linen: an `axis_name` parameter passed to `nnx.BatchNorm`);
  - called as `module(x)`, its mode set by `module.train()` / `module.eval()` (which switch
    `nnx.Dropout` and `nnx.BatchNorm`), returning logits (B, K) as above;
  - `nnx.Param` variables are the parameters, `nnx.BatchStat` variables the `batch_stats`
    (any other non-RNG variable type becomes the collection of its registered name); dropout
    keys come from the `Rngs` the module was built with ("dropout" stream, else "default").

  An NNX network is wrapped in `NNXAdapter`, a Linen module with the same `init` / `apply`
  shape (`nnx.bridge.ToLinen`'s approach, plus the train/eval mode and `features`): each call
  builds the NNX module from the Linen rngs, overwrites its state with the given variables, sets
  `train()` / `eval()`, runs it and writes the updated state back into the mutable collections.
  Under `jit` the throw-away initialisation is dead code; its RNG state is never stored (dropout
  keys come fresh from the `dropout` rng of each call, so a step is a pure function).

**MC Dropout** (optional: only MC Dropout needs it) dropout on at test time with frozen
BatchNorm statistics: Linen, a keyword `dropout: bool | None = None` of `__call__` overriding
`train` for the dropout layers alone (as `gedl_jax.networks.ConvNet` has); NNX networks get it from
the adapter (`eval()`, then `deterministic=False` on every module that has the attribute).
`Network.mc_dropout` says whether the network has it.

**Features** (only for the methods that read features rather than logits: DUQ, PostNet, DAEDL,
F-EDL; see INTEGRATION notes) a method `features(x, train=bool)` (Linen: reached as
`module.apply(variables, x, train=..., method="features")`; NNX: `module.features(x)` in the
current mode) returning floating (B, F), the penultimate representation. Without it,
`load_network(..., need_features=True)` fails with one line naming this contract.

**Features and logits in one pass** (optional; DAEDL and F-EDL read both) a method
`features_and_logits(x, train=bool)` (Linen: `apply(..., method="features_and_logits")`; NNX:
`module.features_and_logits(x)`) returning the tuple `(features (B, F), logits (B, K))` of one
forward pass, each what `features` and `__call__` return. With it, those methods run the
network once per call; without it twice (features, then logits), so in training its BatchNorm
statistics move twice per step and the two passes draw different dropout masks. `load_network`
checks it when a method needs features: shapes, and on a random batch in eval mode the same
values as the two separate calls. The built-in "resnet18" and "mlp" have it.

So one code path serves both kinds: `Network.module` is a Linen module either way, and
`Network.init` / `Network.apply` / `Network.features` are thin, pure conveniences over it (jit,
vmap and shard_map safe; `Network` is hashable).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.core import FrozenDict, unfreeze
from flax.nnx import variablelib

BUILTIN: dict[str, str] = {
    "resnet18": "gedl_jax.networks.resnet:ResNet18",
    "mlp": "gedl_jax.networks.mlp:MLP",
}
KINDS = ("linen", "nnx")
FEATURES_CONTRACT = ("a method `features(x, train=bool)` returning the penultimate features "
                     "(B, F) (Linen: reached with apply(..., method='features'); NNX: "
                     "module.features(x))")
FEATURES_AND_LOGITS_CONTRACT = ("`features_and_logits(x, train=bool)` must return the tuple "
                                "(features(x, train), module(x, train)) of one forward pass")
CHECK_BATCH = 2   # examples in the zeros batch of the checks (BatchNorm needs more than one)
Variables = dict[str, Any]


def _fail(spec: str, message: str) -> ValueError:
    return ValueError(f"network {spec!r}: {message}")


def _error_text(e: BaseException) -> str:
    """The first line of an exception, for a one-line error."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


# ------------------------------------------------------------------------------- resolving
def resolve(spec: str) -> type:
    """The class named by `spec`: a built-in name (`BUILTIN`) or "<importable.module>:<Name>"
    (`<Name>` may be dotted, e.g. "pkg.nets:Outer.Inner").

    Args:
      spec: the network's name.

    Returns:
      The class (not yet checked to be a Flax module).

    Raises:
      ValueError: a malformed spec, a module that does not import, or a missing attribute.
    """
    target = BUILTIN.get(spec, spec)
    module_name, colon, attr = target.partition(":")
    if not colon or not module_name or not attr:
        raise ValueError(f"network {spec!r} is neither a built-in ({', '.join(BUILTIN)}) nor "
                         f"'<importable.module>:<Name>' (e.g. 'mypkg.nets:SmallCNN')")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as e:  # noqa: BLE001  (ImportError, AttributeError, errors inside the module)
        raise ValueError(f"cannot import {spec!r}: {_error_text(e)}") from e
    return obj


def kind_of(cls: Any) -> str:
    """"linen" or "nnx" for a Flax module class; ValueError otherwise."""
    if isinstance(cls, type) and issubclass(cls, nn.Module):
        return "linen"
    if isinstance(cls, type) and issubclass(cls, nnx.Module):
        return "nnx"
    what = f"the class {cls.__name__}" if isinstance(cls, type) else \
        f"a {type(cls).__name__}"
    raise ValueError(f"{what} is neither a flax.linen.Module nor a flax.nnx.Module subclass")


def accepts(cls: type, name: str) -> bool:
    """Whether the Flax module class `cls` takes the constructor keyword `name` (for passing a
    network only the settings it has)."""
    return _accepts(cls, kind_of(cls), name)


def _accepts(cls: type, kind: str, name: str) -> bool:
    """Whether the constructor of `cls` takes the keyword `name`."""
    if kind == "linen":
        return name in {f.name for f in dataclasses.fields(cls)}
    params = inspect.signature(cls.__init__).parameters
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def feature_reader(module: nn.Module) -> str | None:
    """How the penultimate features of a loaded user network's Linen `module` (an NNX class
    behind its `NNXAdapter`) are read: "features_and_logits" (one pass for both), "features"
    (a pass of its own), or None (the class has neither method). Whether the method keeps
    the contract is `check(..., need_features=True)`'s to say."""
    cls = module.nnx_class if isinstance(module, NNXAdapter) else type(module)
    if callable(getattr(cls, "features_and_logits", None)):
        return "features_and_logits"
    if callable(getattr(cls, "features", None)):
        return "features"
    return None


# ------------------------------------------------------------------------------ NNX as Linen
def _nnx_rngs(linen_module: nn.Module) -> nnx.Rngs:
    """Streams "default", "params" and "dropout" for building the NNX module, from the Linen
    rngs of this call (a fixed key for a stream the call has none of: its values are either
    overwritten by the given variables or, for dropout, not used outside training)."""
    def key(name):
        return linen_module.make_rng(name) if linen_module.has_rng(name) \
            else jax.random.PRNGKey(0)
    params = key("params")
    return nnx.Rngs(params, params=params, dropout=key("dropout"))


class NNXAdapter(nn.Module):
    """A Linen module running the NNX network class `nnx_class` (see the module docstring).

    Attributes:
      nnx_class: the NNX Module class (hashable), built as
        `nnx_class(num_classes=..., rngs=nnx.Rngs(...), **kwargs)`.
      num_classes: K.
      kwargs: further constructor keywords (a FrozenDict, hashable).
    """

    nnx_class: Any
    num_classes: int
    kwargs: Mapping[str, Any] = FrozenDict()

    def _build(self):
        return self.nnx_class(num_classes=self.num_classes, rngs=_nnx_rngs(self),
                              **dict(self.kwargs))

    def _load(self, module) -> None:
        """Overwrite the module's state with this call's variables, collection by collection."""
        for tree in self.variables.values():
            nnx.update(module, unfreeze(tree))

    def _store(self, module) -> None:
        """The module's non-RNG state into the mutable Linen collections (by variable type)."""
        by_collection: dict[str, list] = {}
        for path, var in nnx.to_flat_state(nnx.state(module, nnx.Not(nnx.RngState))):
            name = variablelib.variable_name_from_type(type(var), allow_register=True)
            by_collection.setdefault(name, []).append((path, var.get_value()))
        for collection, flat in by_collection.items():
            if self.is_mutable_collection(collection):
                for key, value in nnx.traversals.unflatten_mapping(flat).items():
                    self.put_variable(collection, key, value)

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False, *, features: bool = False,
                 dropout: bool | None = None, both: bool = False):
        """`module(x)` (or `module.features(x)`, or with `both` `module.features_and_logits(x)`)
        in `train()` or `eval()` mode; `dropout`, if given, then switches the dropout layers
        alone (MC Dropout: train=False, dropout=True)."""
        module = self._build()
        if self.variables:   # always in apply; in init once an earlier call stored them (a
            self._load(module)   # parent calling both `features` and `__call__`)
        if train:
            module.train()
        else:
            module.eval()
        if dropout is not None:
            module.set_attributes(deterministic=not dropout, raise_if_not_found=False)
        if both:
            out = tuple(module.features_and_logits(x))
        else:
            out = module.features(x) if features else module(x)
        self._store(module)
        return out

    def features(self, x: jax.Array, train: bool = False) -> jax.Array:
        """The NNX network's `features(x)` in the mode `train` selects."""
        return self(x, train=train, features=True)

    def features_and_logits(self, x: jax.Array, train: bool = False):
        """The NNX network's `features_and_logits(x)` (where it has one) in the mode `train`
        selects."""
        return self(x, train=train, both=True)


# ---------------------------------------------------------------------------------- Network
@dataclasses.dataclass(frozen=True)
class Network:
    """A loaded (and, by `load_network`, checked) network behind one Linen interface.

    Attributes:
      spec: the name it was loaded by.
      module: the Linen module (an NNX network wrapped in `NNXAdapter`): usable wherever a
        Linen module is (`module.init`, `module.apply`, as a submodule).
      kind: "linen" or "nnx".
      num_classes: K.
      input_shape: per-example input shape the checks ran on (None if unchecked).
      has_features: whether the class has a `features` method.
      has_features_and_logits: whether it also has `features_and_logits` (one forward pass for
        both; module docstring).
      syncs_batch_stats: whether `axis_name` was passed to the constructor (False where the
        class takes none: its BatchNorm, if any, then normalises per device).
      axis_name: the data-parallel axis it was loaded for (None: one device, no shard_map).
      mc_dropout: whether `apply(..., train=False, dropout=True)` keeps dropout on with frozen
        statistics (MC Dropout; module docstring).
    """

    spec: str
    module: nn.Module
    kind: str
    num_classes: int
    input_shape: tuple[int, ...] | None = None
    has_features: bool = False
    has_features_and_logits: bool = False
    syncs_batch_stats: bool = False
    mc_dropout: bool = False
    axis_name: str | None = None

    def init(self, key: jax.Array, input_shape: Sequence[int] | None = None) -> Variables:
        """Fresh variables ({"params": ..., and "batch_stats" etc. where the network has them})
        from a batch of zeros of `input_shape` (default: the checked one), in eval mode.

        Args:
          key: PRNG key (used for the "params" and "dropout" streams).
          input_shape: per-example input shape, e.g. (32, 32, 3) or (D,).

        Returns:
          The variables, a plain dict of collections.
        """
        shape = tuple(input_shape if input_shape is not None else self.input_shape or ())
        if not shape:
            raise ValueError(f"network {self.spec!r}: init needs the per-example input_shape")
        zeros = jnp.zeros((CHECK_BATCH, *shape), jnp.float32)
        return dict(self.module.init({"params": key, "dropout": key}, zeros, train=False))

    def apply(self, variables: Mapping[str, Any], x: jax.Array, *, train: bool = False,
              rngs: Mapping[str, jax.Array] | None = None,
              mutable: bool | Sequence[str] = False, dropout: bool | None = None):
        """Logits (B, K); with `mutable` (e.g. ["batch_stats"] in training) also the updated
        collections, as Linen's apply. `rngs={"dropout": key}` where dropout is on;
        `dropout=True` with `train=False`: MC Dropout (needs `mc_dropout`)."""
        kwargs = {}
        if dropout is not None:
            if not self.mc_dropout:
                raise _fail(self.spec, "MC Dropout needs `__call__(x, train=..., dropout=...)` "
                                       "(a keyword switching dropout alone), which this "
                                       "Linen class lacks")
            kwargs["dropout"] = dropout
        return self.module.apply(dict(variables), x, train=train, rngs=dict(rngs or {}),
                                 mutable=mutable, **kwargs)

    def features(self, variables: Mapping[str, Any], x: jax.Array, *, train: bool = False,
                 rngs: Mapping[str, jax.Array] | None = None,
                 mutable: bool | Sequence[str] = False):
        """The network's `features` (B, F) (see the module docstring's features contract)."""
        self.require_features()
        return self.module.apply(dict(variables), x, train=train, rngs=dict(rngs or {}),
                                 mutable=mutable, method="features")

    def features_and_logits(self, variables: Mapping[str, Any], x: jax.Array, *,
                            train: bool = False, rngs: Mapping[str, jax.Array] | None = None,
                            mutable: bool | Sequence[str] = False):
        """(features (B, F), logits (B, K)) of one forward pass, where the network has
        `features_and_logits`; with `mutable`, as Linen's apply, also the updated collections."""
        if not self.has_features_and_logits:
            raise _fail(self.spec, f"the {self.kind} class has no `features_and_logits` "
                                   f"method (optional: `features` and the logits separately "
                                   f"serve every method)")
        return self.module.apply(dict(variables), x, train=train, rngs=dict(rngs or {}),
                                 mutable=mutable, method="features_and_logits")

    def require_features(self, needed_by: str = "this method") -> None:
        """ValueError (one line, naming the contract) unless the network has `features`."""
        if not self.has_features:
            raise _fail(self.spec, f"{needed_by} needs the network's features, but the "
                                   f"{self.kind} class has no `features` method; expected "
                                   + FEATURES_CONTRACT)


# ------------------------------------------------------------------------------- building
def build(spec: str, num_classes: int, *, axis_name: str | None = None,
          **kwargs: Any) -> Network:
    """The network `spec` constructed for K = `num_classes`, unchecked (see `load_network`).

    Args:
      spec: a built-in name or "<importable.module>:<Name>".
      num_classes: K.
      axis_name: data-parallel mesh axis for synchronised BatchNorm, passed where the class
        takes an `axis_name`.
      **kwargs: further constructor keywords (e.g. hidden=(512,), dtype=jnp.bfloat16).

    Returns:
      The Network (its `input_shape` None until checked).

    Raises:
      ValueError: not importable, not a Flax module class, or the constructor refuses
        `Name(num_classes=K, ...)` (NNX: `Name(num_classes=K, rngs=nnx.Rngs(0), ...)`).
    """
    cls = resolve(spec)
    try:
        kind = kind_of(cls)
    except ValueError as e:
        raise _fail(spec, str(e)) from None
    syncs = axis_name is not None and _accepts(cls, kind, "axis_name")
    if syncs:
        kwargs = {**kwargs, "axis_name": axis_name}
    shown = ", ".join([f"num_classes={num_classes}"]
                      + (["rngs=nnx.Rngs(0)"] if kind == "nnx" else [])
                      + [f"{k}={v!r}" for k, v in kwargs.items()])
    expected = ("a Linen network is constructed as Name(num_classes=K)" if kind == "linen" else
                "an NNX network is constructed as Name(num_classes=K, rngs=nnx.Rngs(seed))")
    try:
        if kind == "linen":
            module: nn.Module = cls(num_classes=num_classes, **kwargs)
        else:   # build it abstractly once, so a bad signature fails here, not inside a trace
            nnx.eval_shape(lambda: cls(num_classes=num_classes, rngs=nnx.Rngs(0), **kwargs))
            module = NNXAdapter(cls, int(num_classes), FrozenDict(kwargs))
    except Exception as e:  # noqa: BLE001
        raise _fail(spec, f"cannot construct {cls.__name__}({shown}): {_error_text(e)}; "
                          f"{expected}") from e
    mc_dropout = kind == "nnx" or "dropout" in inspect.signature(cls.__call__).parameters
    return Network(spec, module, kind, int(num_classes),
                   has_features=callable(getattr(cls, "features", None)),
                   has_features_and_logits=callable(getattr(cls, "features_and_logits", None)),
                   syncs_batch_stats=syncs, mc_dropout=mc_dropout,
                   axis_name=axis_name)


# ------------------------------------------------------------------------------- checking
def _check_output(spec: str, what: str, out: Any, batch: int, width: int | None) -> None:
    expected = f"({batch}, {width})" if width is not None else f"({batch}, F)"
    if not hasattr(out, "shape") or not hasattr(out, "dtype"):
        raise _fail(spec, f"{what} returned a {type(out).__name__}; expected one floating "
                          f"array of shape {expected}")
    shape_ok = out.ndim == 2 and out.shape[0] == batch and (width is None
                                                            or out.shape[1] == width)
    if not shape_ok:
        raise _fail(spec, f"{what} returned shape {tuple(out.shape)} for a batch of {batch}; "
                          f"expected {expected}")
    if not jnp.issubdtype(out.dtype, jnp.floating):
        raise _fail(spec, f"{what} returned dtype {out.dtype}; expected floating values")


def _abstract_init(network: Network, x: jax.Array, key: jax.Array, call: str):
    """(init, abstract variables, names of the mutable collections), checked: the init runs on
    a batch of zeros (abstractly), yields "params", and a network with training statistics can
    average them over the data-parallel axis when one is asked for."""
    spec, module = network.spec, network.module

    def init(k):
        return dict(module.init({"params": k, "dropout": k}, x, train=False))

    try:
        abstract = jax.eval_shape(init, key)
    except Exception as e:  # noqa: BLE001
        raise _fail(spec, f"init on a batch of zeros {tuple(x.shape)} (calling {call}) failed: "
                          f"{_error_text(e)}") from e
    if "params" not in abstract:
        raise _fail(spec, f"has no parameters (collections {sorted(abstract)}); expected a "
                          f"'params' collection")
    state_names = [c for c in abstract if c != "params"]
    if network.axis_name and state_names and not network.syncs_batch_stats:
        raise _fail(spec, f"updates {state_names} in training but its constructor takes no "
                          f"`axis_name`, so data-parallel training (axis "
                          f"{network.axis_name!r}) cannot average those statistics over the "
                          f"devices; add an `axis_name: str | None = None` "
                          f"{'field' if network.kind == 'linen' else 'parameter'} and pass it "
                          f"to every BatchNorm")

    return init, abstract, state_names


def check(network: Network, input_shape: Sequence[int], *, need_features: bool = False,
          key: jax.Array | None = None) -> Variables:
    """Runs the contract's checks on a batch of zeros; returns the variables it initialised.

    Shapes and dtypes are checked abstractly first (`jax.eval_shape`: no compilation), then one
    jitted init + eval forward + training forward (mutable collections, a dropout key) checks
    that the outputs are finite.

    Args:
      network: from `build`.
      input_shape: per-example input shape.
      need_features: also require and check `features`.
      key: PRNG key of the init (default PRNGKey(0)).

    Returns:
      The initialised variables.

    Raises:
      ValueError: naming the network, what was expected and what was found.
    """
    spec, module = network.spec, network.module
    key = jax.random.PRNGKey(0) if key is None else key
    x = jnp.zeros((CHECK_BATCH, *input_shape), jnp.float32)
    call = "module(x)" if network.kind == "nnx" else "module(x, train=...)"
    if need_features:
        network.require_features()

    init, abstract, state_names = _abstract_init(network, x, key, call)

    def forward(variables, train, method=None, inputs=x):
        def run(x):
            out = module.apply(variables, x, train=train, rngs={"dropout": key},
                               mutable=state_names if train else False, method=method)
            return out[0] if train else out

        if not network.syncs_batch_stats:
            return run(inputs)
        # A network built with an axis_name averages over it in training: bind the name (a
        # named vmap over one "device") as shard_map will.
        out = jax.vmap(run, axis_name=network.axis_name)(inputs[None])
        return jax.tree.map(lambda a: a[0], out)

    outputs = {"logits (eval)": (lambda v: forward(v, False), network.num_classes),
               "logits (train)": (lambda v: forward(v, True), network.num_classes)}
    if need_features:
        outputs["features (eval)"] = (lambda v: forward(v, False, "features"), None)
        outputs["features (train)"] = (lambda v: forward(v, True, "features"), None)
    for what, (fn, width) in outputs.items():
        try:
            out = jax.eval_shape(fn, abstract)
        except Exception as e:  # noqa: BLE001
            mode = "train()" if "train" in what else "eval()"
            shown = (f"{call} in {mode} mode" if network.kind == "nnx"
                     else f"module(x, train={'train' in what})")
            if what.startswith("features"):
                shown = shown.replace("module(x", "module.features(x")
            raise _fail(spec, f"calling {shown} failed: {_error_text(e)}") from e
        _check_output(spec, what, out, CHECK_BATCH, width)

    @jax.jit
    def run(k):
        variables = init(k)
        return variables, {what: fn(variables) for what, (fn, _) in outputs.items()}

    variables, values = run(key)
    for what, value in values.items():
        if not bool(jnp.all(jnp.isfinite(value))):
            raise _fail(spec, f"{what} are not finite on a batch of zeros {tuple(x.shape)}: "
                              f"{int(jnp.sum(~jnp.isfinite(value)))} of {value.size} values "
                              f"are NaN or inf")
    if need_features and network.has_features_and_logits:
        _check_features_and_logits(network, forward, abstract, variables, x, key)
    return variables


def _check_features_and_logits(network: Network, forward, abstract, variables: Variables,
                               x: jax.Array, key: jax.Array) -> None:
    """The optional one-pass method: a (features, logits) pair in both modes, and on a random
    batch in eval mode the values `features` and `__call__` give separately."""
    spec, what = network.spec, "features_and_logits"
    for train in (False, True):
        try:
            out = jax.eval_shape(lambda v, t=train: forward(v, t, what), abstract)
        except Exception as e:  # noqa: BLE001
            raise _fail(spec, f"calling module.features_and_logits(x) in "
                              f"{'train' if train else 'eval'} mode failed: "
                              f"{_error_text(e)}") from e
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise _fail(spec, f"{what} returned a {type(out).__name__}; "
                              f"{FEATURES_AND_LOGITS_CONTRACT}")
        _check_output(spec, f"{what}'s features", out[0], CHECK_BATCH, None)
        _check_output(spec, f"{what}'s logits", out[1], CHECK_BATCH, network.num_classes)
    x_random = jax.random.uniform(jax.random.fold_in(key, 1), x.shape, jnp.float32)

    @jax.jit
    def both_ways(v):
        return (forward(v, False, what, x_random),
                (forward(v, False, "features", x_random), forward(v, False, None, x_random)))

    together, separate = both_ways(variables)
    for name, got, want in zip(("features", "logits"), together, separate):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        if got.shape != want.shape:
            found = f"shape {got.shape}, not {want.shape}"
        elif not np.allclose(got, want, rtol=1e-5, atol=1e-6):
            found = f"values up to {np.max(np.abs(got - want)):.3g} apart"
        else:
            continue
        raise _fail(spec, f"{what} returned {name} other than the separate call's ({found} on "
                          f"a random batch in eval mode); {FEATURES_AND_LOGITS_CONTRACT}")


def load_network(spec: str, num_classes: int, input_shape: Sequence[int] | None = None, *,
                 need_features: bool = False, axis_name: str | None = None,
                 **kwargs: Any) -> Network:
    """Resolve, construct and (given `input_shape`) check the network `spec`.

    Args:
      spec: "resnet18", "mlp" or "<importable.module>:<Name>" (a Linen or NNX module class).
      num_classes: K.
      input_shape: per-example input shape, e.g. (32, 32, 3) or (D,); None skips the checks
        that need a forward pass (the construction is still checked).
      need_features: the method reads features: require the `features` contract.
      axis_name: data-parallel mesh axis for synchronised BatchNorm (where the class takes
        `axis_name`).
      **kwargs: further constructor keywords.

    Returns:
      The Network.

    Raises:
      ValueError: every violation of the contract (module docstring), one line each.
    """
    network = build(spec, num_classes, axis_name=axis_name, **kwargs)
    if need_features:
        network.require_features()
    if input_shape is None:
        return network
    check(network, tuple(input_shape), need_features=need_features)
    return dataclasses.replace(network, input_shape=tuple(int(s) for s in input_shape))

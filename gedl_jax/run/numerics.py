"""The numerics policy of a run: the precision of float32 products, and deterministic GPU kernels.

**Precision** (`config.matmul_precision`), applied to everything a run traces (train step,
validation, evaluation) as `jax.default_matmul_precision`:
- "default": XLA's choice for float32 convolutions and matmuls. On NVIDIA Ampere and later
  GPUs that is TF32 tensor cores (inputs rounded to a 10-bit mantissa, float32 accumulation),
  as jax and PyTorch's cuDNN convolutions do by default; on a CPU, float32.
- "highest": float32 products everywhere (on a tensor-core GPU, several times slower matmuls).
On a CPU both give bit-identical programs (tests/test_numerics.py). The value is part of the
run's config (config.json), printed in the run's first line and written with its results.

**Determinism** (`config.deterministic`, default on): a resumed run must equal the uninterrupted
one bit for bit on a GPU as on a CPU. Two things differ between processes on a GPU, and each has
an XLA flag, read once, when the backend starts:
- execution: reductions and scatters with atomic adds sum in a different order each run:
  `--xla_gpu_exclude_nondeterministic_ops=true` compiles deterministic implementations only;
- compilation: autotuning times candidate kernels (convolution algorithms, GEMM and Triton
  configurations) and keeps the fastest, so a second process can pick another kernel that
  rounds differently. `--xla_gpu_per_fusion_autotune_cache_dir=<dir>` stores each choice in
  `<dir>` the first time and reads it back in every later process, so the resumed process
  runs the kernels of the first one. The trainer keeps that folder in the run's workdir
  (`xla_autotune/`), so it travels with the checkpoints.
The stricter `--xla_gpu_deterministic_ops=true` also excludes the non-deterministic kernels and
in addition turns autotuning off (XLA's heuristic kernels, the same in every process without a
cache); it is kept where a user's XLA_FLAGS set it (`flags_in_force` accepts either). What each
costs in step time: `bin/benchmark.py --deterministic=true|ops|false`; whether a resumed run
equals the uninterrupted one under each: `python -m studies.resume_check`.
`configure_process` sets the flags before the backend starts (the training CLI calls it first
thing). A library caller whose jax already runs on a GPU without them gets one line saying so
(`describe` reports it in the run's first line too). On a CPU the flags change nothing.

**The host CPU** is recorded with the results too (`host_cpu`): XLA:CPU compiles for the
host's vector extensions, so the same model evaluated on two CPUs can differ in the last bits
of its float32 outputs.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pathlib
import platform
from collections.abc import Iterator

from gedl_jax import config as config_lib

PRECISIONS = config_lib.ALLOWED["matmul_precision"]
AUTOTUNE_FOLDER = "xla_autotune"   # inside a workdir
_EXCLUDE_NONDETERMINISTIC = "--xla_gpu_exclude_nondeterministic_ops=true"
DETERMINISTIC_OPS = "--xla_gpu_deterministic_ops=true"   # the stricter flag (module docstring)
_AUTOTUNE_CACHE = "--xla_gpu_per_fusion_autotune_cache_dir="


def backend_started() -> bool:
    """Whether jax has started its backends (after which XLA_FLAGS are no longer read)."""
    from jax._src import xla_bridge

    started = getattr(xla_bridge, "backends_are_initialized", None)   # jax >= 0.4.3x
    return bool(started()) if started else bool(getattr(xla_bridge, "_backends", {}))


def _flag_name(flag: str) -> str:
    return flag.split("=", 1)[0]


def determinism_flags(autotune_dir: str | os.PathLike | None) -> list[str]:
    """The XLA flags of deterministic GPU execution and persisted autotuning choices."""
    flags = [_EXCLUDE_NONDETERMINISTIC]
    if autotune_dir is not None:
        flags.append(f"{_AUTOTUNE_CACHE}{os.fspath(autotune_dir)}")
    return flags


def with_flags(existing: str, flags: list[str]) -> str:
    """`existing` XLA_FLAGS with `flags` added; a flag the user set already is kept as set."""
    present = {_flag_name(f) for f in existing.split()}
    added = [f for f in flags if _flag_name(f) not in present]
    return " ".join(filter(None, [existing.strip(), *added]))


_autotune_folder: list[pathlib.Path] = []   # the folder this process's XLA_FLAGS name


def configure_process(deterministic: bool, workdir: str | os.PathLike | None) -> bool:
    """Set the determinism flags in XLA_FLAGS if jax's backend has not started yet.

    Returns whether they are in force for this process (False: not asked for, or the backend
    started without them). The autotuning folder is `workdir/xla_autotune`, made by
    `make_autotune_folder` once the run has checked its config and workdir (nothing is
    written before a bad input is reported).
    """
    if not deterministic:
        return False
    if backend_started():
        return flags_in_force()
    autotune_dir = None
    if workdir is not None:
        autotune_dir = pathlib.Path(workdir).resolve() / AUTOTUNE_FOLDER
        _autotune_folder[:] = [autotune_dir]
    os.environ["XLA_FLAGS"] = with_flags(os.environ.get("XLA_FLAGS", ""),
                                         determinism_flags(autotune_dir))
    return True


def make_autotune_folder() -> None:
    """Create the autotuning folder `configure_process` named, before the first compile."""
    for folder in _autotune_folder:
        folder.mkdir(parents=True, exist_ok=True)


def flags_in_force() -> bool:
    """Whether XLA_FLAGS (as read when the backend started) ask for deterministic GPU kernels
    (`--xla_gpu_exclude_nondeterministic_ops` or the stricter `--xla_gpu_deterministic_ops`)."""
    names = {_flag_name(_EXCLUDE_NONDETERMINISTIC), _flag_name(DETERMINISTIC_OPS)}
    for flag in os.environ.get("XLA_FLAGS", "").split():
        name, _, value = flag.partition("=")
        if name in names and value.lower() in ("", "true", "1"):
            return True
    return False


def on_gpu() -> bool:
    """Whether jax's default backend is a GPU (starts the backend)."""
    import jax

    return jax.default_backend() == "gpu"


@contextlib.contextmanager
def precision(config) -> Iterator[None]:
    """`config.matmul_precision` for everything traced inside (see the module docstring)."""
    import jax

    value = str(config.get("matmul_precision", "default"))
    if value not in PRECISIONS:
        raise ValueError(f"config.matmul_precision={value!r}; allowed: {list(PRECISIONS)}")
    with jax.default_matmul_precision(value):
        yield


def describe(config) -> str:
    """One phrase for the run's first line: the arithmetic and kernels this run uses."""
    value = str(config.get("matmul_precision", "default"))
    if not on_gpu():
        return f"float32 products (matmul_precision {value}: no effect on a CPU)"
    products = "TF32 tensor cores" if value == "default" else "float32"
    if not config.get("deterministic", True):
        kernels = "fastest kernels (deterministic=False: a resume equals the run to rounding)"
    elif flags_in_force():
        kernels = "deterministic kernels, autotuning kept in the workdir"
    else:
        kernels = ("deterministic kernels NOT in force: jax started before the run could set "
                   "them; start jax through gedl_jax.train, or call "
                   "gedl_jax.run.numerics.configure_process first")
    return f"{products} for float32 convolutions and matmuls (matmul_precision {value}), {kernels}"


def record(config) -> dict[str, object]:
    """What a run's results record of its numerics (eval_results.json, provenance)."""
    import jax

    return {"matmul_precision": str(config.get("matmul_precision", "default")),
            "deterministic": bool(config.get("deterministic", True)),
            "deterministic_flags_in_force": flags_in_force(),
            "backend": jax.default_backend(),
            "device_kind": getattr(jax.devices()[0], "device_kind", jax.devices()[0].platform),
            "host_cpu": host_cpu()}


# The widest vector extension XLA:CPU may compile for, by /proc/cpuinfo flag, widest first.
_VECTOR_EXTENSIONS = ("avx512f", "avx2", "avx", "sve", "asimd")


@functools.cache
def host_cpu() -> str:
    """The host CPU's model, architecture and widest vector extension, e.g. "AMD EPYC
    (x86_64, avx512f)" (`describe_cpu` of /proc/cpuinfo, where there is one)."""
    try:
        cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    return describe_cpu(cpuinfo, platform.machine(), platform.processor())


def describe_cpu(cpuinfo: str, machine: str, processor: str = "") -> str:
    """The first processor's "model name" in `cpuinfo` (else `processor`), with `machine` and
    the widest of `_VECTOR_EXTENSIONS` in its "flags" (x86) or "Features" (Arm) line."""
    model, flags = "", None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "features") and flags is None:
            flags = set(value.split())
    widest = next((f for f in _VECTOR_EXTENSIONS if f in (flags or ())), None)
    details = ", ".join(x for x in (machine, widest) if x)
    name = model or processor or "unknown CPU"
    return f"{name} ({details})" if details else name

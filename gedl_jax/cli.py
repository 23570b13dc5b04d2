"""What every gedl-jax command line shares: flags parsed with a one-line error, `--help` that
exits 0, and exceptions turned into one `error: ...` line and a documented exit status
(docs/robustness.md) instead of a traceback. `--debug` or GEDL_DEBUG=1 shows the traceback too.

Exit status of every CLI:
    0   finished
    1   a crash (a bug: the traceback is printed)
    2   bad input (config, data, workdir, flags): the message says what to fix; nothing was lost
    3   the run diverged (a non-finite loss) or ended at chance accuracy
        (`--config.allow_chance=True` when that is intended)
    74  a file could not be written (disk full, quota, I/O error): the previous checkpoint is
        intact; free space and rerun the same command to continue
    75  stopped by SIGTERM/SIGINT (Ctrl-C): what was saved is named; rerun the same command

Imports nothing from gedl_jax: each CLI passes its own error classes.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 3
EXIT_WRITE_FAILED = 74   # EX_IOERR of sysexits.h
EXIT_INTERRUPTED = 75    # EX_TEMPFAIL: rerun to continue (= preemption.EXIT_PREEMPTED)

HELP_FLAGS = ("-h", "--help", "--helpshort", "--helpfull", "-?")

# Bad input whatever the CLI: a ValueError names the field, the others the file or folder.
BAD_INPUT: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, PermissionError,
                                              NotADirectoryError, IsADirectoryError)


def debug_requested(argv: Sequence[str]) -> bool:
    return "--debug" in argv or os.environ.get("GEDL_DEBUG", "") not in ("", "0")


def one_line(error: BaseException | str) -> str:
    """An exception's message on one line, from the innermost cause that says something (the
    wrappers of absl / ml_collections add "Error whilst parsing config file" and a traceback
    in the text)."""
    if isinstance(error, str):
        return " ".join(error.split())
    chain, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append(error)
        error = error.__cause__ or error.__context__
    for e in chain:   # the outermost message that is not a wrapper around a traceback
        text = str(e)
        if not text or "Traceback (most recent call last)" in text:
            continue
        return _readable(e, text)
    return type(chain[0]).__name__


def _readable(error: BaseException, text: str) -> str:
    if isinstance(error, AttributeError):  # ml_collections: an unknown config field
        name = re.search(r"([A-Za-z_][\w.]*)", text)
        hint = re.search(r'Did you mean "([\w.]+)"', text)
        if name:
            return (f"unknown config field {name.group(1)!r}"
                    f"{f' (did you mean {hint.group(1)!r}?)' if hint else ''}; the fields and "
                    f"their defaults are in gedl_jax/configuration.py")
    if "Failed loading config file" in text:
        path = re.search(r"Attempted \[.*?\]:\s*(\S+)", text)
        reason = re.search(r"\[Errno \d+\] ([^:\n]+)", text)
        return (f"cannot load the config file {path.group(1) if path else ''}"
                f" ({reason.group(1) if reason else 'see --debug'}); give a config name, "
                f"e.g. --config=mnist:gedl, or the path of a config file")
    return " ".join(text.split())


def print_error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)


def show_help(doc: str, extra: str = "") -> None:
    from absl import flags  # noqa: PLC0415

    print(doc.strip() + "\n")
    if extra:
        print(extra.strip() + "\n")
    for module, _ in sorted(flags.FLAGS.flags_by_module_dict().items()):
        if "gedl_jax" in module or "bin/" in module or module == "__main__":
            print(flags.FLAGS.module_help(module))


def run(body: Callable[[], int], argv: Sequence[str] | None, *, doc: str, help_extra: str = "",
        codes: Sequence[tuple[tuple[type[BaseException], ...], int]] = ()) -> int:
    """Parse absl flags from `argv` (the flags are defined already), then call `body()`.

    `codes`: (exception classes, exit status) tried in order before the defaults (bad input ->
    2, a full disk -> 74, KeyboardInterrupt -> 75; anything else is a crash: traceback, 1).
    """
    from absl import flags  # noqa: PLC0415
    from absl import logging as absl_logging  # noqa: PLC0415

    argv = list(sys.argv if argv is None else argv)
    debug = debug_requested(argv)
    argv = [a for a in argv if a != "--debug"]
    if any(a in HELP_FLAGS for a in argv[1:]):
        show_help(doc, help_extra)
        return EXIT_OK
    try:
        rest = flags.FLAGS(argv)
        for name in list(flags.FLAGS):   # a config file is loaded on first access: now
            getattr(flags.FLAGS, name)
        if len(rest) > 1:
            raise ValueError(f"unexpected arguments {rest[1:]}: every option is a --flag "
                             f"(--help lists them)")
    except (flags.Error, ValueError, OSError, AttributeError, KeyError) as e:
        return _report(e, EXIT_BAD_INPUT, debug)
    absl_logging.set_verbosity(absl_logging.WARNING)  # Orbax logs every save at INFO
    absl_logging.use_python_logging()
    try:
        return body()
    except BaseException as e:  # noqa: BLE001 (each class below has its exit status)
        if isinstance(e, SystemExit):
            raise
        for classes, code in codes:
            if isinstance(e, classes):
                return _report(e, code, debug)
        if is_write_failure(e):
            return _report(e, EXIT_WRITE_FAILED, debug, prefix=_write_prefix(e))
        if isinstance(e, KeyboardInterrupt):
            return _report("interrupted (Ctrl-C)", EXIT_INTERRUPTED, debug)
        if isinstance(e, BAD_INPUT) or "Failed loading config file" in str(e):
            return _report(e, EXIT_BAD_INPUT, debug)
        traceback.print_exc()
        print_error(f"{type(e).__name__}: {one_line(e)} (a crash: please report it with the "
                    f"traceback above)")
        return EXIT_CRASH


def is_write_failure(error: BaseException) -> bool:
    from gedl_jax import files  # noqa: PLC0415

    return files.is_disk_full(error)


def _write_prefix(error: BaseException) -> str:
    return "" if "no space left" in str(error).lower() else "no space left on device: "


def _report(error: BaseException | str, code: int, debug: bool, prefix: str = "") -> int:
    if debug and isinstance(error, BaseException):
        traceback.print_exception(error)
    message = one_line(error)
    if code == EXIT_INTERRUPTED and not isinstance(error, str):
        print(message, file=sys.stderr, flush=True)
    else:
        print_error(prefix + message)
    return code

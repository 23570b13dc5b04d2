"""What every gedl-jax command line shares: flags parsed with a one-line error, `--help` that
exits 0, and exceptions turned into one `error: ...` line and a documented exit status
(docs/robustness.md) instead of a traceback. `--debug` or GEDL_DEBUG=1 shows the traceback too.

Exit status of every CLI:
    0   finished
    1   a crash (a bug: the traceback is printed)
    2   bad input (config, data, workdir, flags), or out of device or host memory: the
        message says what to fix; nothing was lost
    3   the run diverged (a non-finite loss) or ended at chance accuracy
        (`--config.allow_chance=True` when that is intended)
    74  a file could not be written (disk full, quota, I/O error): the previous checkpoint is
        intact; free space and rerun the same command to continue
    75  stopped by SIGTERM/SIGINT (Ctrl-C): what was saved is named; rerun the same command

absl-flag CLIs (train, evaluate) call `run`; argparse ones (`python -m gedl_jax.data.fetch`,
`bin/reproduce.py`, `bin/report.py`) build an `ArgumentParser` from here and call
`run_argparse`: the same one-line errors and exit statuses.

Imports nothing from gedl_jax but `files` (which errors are a full disk or memory that ran
out): each CLI passes its own error classes. (Its old name `gedl_jax.cli` still works for one
release, with a DeprecationWarning.)
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Sequence

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 3
EXIT_WRITE_FAILED = 74   # EX_IOERR of sysexits.h
EXIT_INTERRUPTED = 75    # EX_TEMPFAIL: rerun to continue (= preemption.EXIT_PREEMPTED)

HELP_FLAGS = ("-h", "--help", "--helpshort", "--helpfull", "-?", "--fields")
# The help that also lists every config field (the schema's, gedl_jax/config/fields.py).
FULL_HELP_FLAGS = ("--helpfull", "--fields")

# One name per idea across the commands (tests/test_entry_points.py walks every entry point): a
# flag that sets a config field is spelled as the field (gedl_jax/config/fields.py), the
# bootstrap's settings all begin with `bootstrap_`, and every name is snake_case, as absl's and
# the config's. The idea -> (its name, the other spellings no command may use for it).
VOCABULARY: dict[str, tuple[str, tuple[str, ...]]] = {
    "bootstrap replicates": ("bootstrap_samples", ("samples", "replicates", "n_bootstrap")),
    "bootstrap interval method": ("bootstrap_interval", ("interval", "interval_method")),
    "bootstrap intervals' level": ("bootstrap_confidence", ("confidence", "level")),
    "seed of the bootstrap's draws": ("bootstrap_seed", ()),
    "post-hoc calibration on the validation split": ("calibrate", ("calibrated", "calibration")),
    "OOD sets evaluated besides the run's own": ("extra_ood", ("ood", "extra_ood_sets")),
    "the OOD sets (and their order)": ("ood_datasets", ("ood_sets", "ood")),
    "near/far group of an OOD set": ("ood_groups", ("ood_group",)),
    "the data folder": ("data_dir", ("data", "datadir", "data_folder")),
    "a run's folder": ("workdir", ("run_dir", "rundir")),
}

# The spellings a command retired in 0.1.0, each with the name that replaced it: they still work
# in 0.1.x, with a one-line warning, and 0.2.0 removes them (CHANGELOG.md).
# The command (its module under gedl_jax/commands/, or a script's name) -> {old: new}.
RENAMED_FLAGS: dict[str, dict[str, str]] = {
    "evaluate": {"--ood": "--extra_ood", "--ood_group": "--ood_groups"},
    "compare": {"--samples": "--bootstrap_samples", "--interval": "--bootstrap_interval",
                "--confidence": "--bootstrap_confidence", "--seed": "--bootstrap_seed",
                "--calibrated": "--calibrate"},
    "report": {"--ood": "--ood_datasets", "--no-extra": "--no_extra"},
    "reproduce": {"--ood_sets": "--ood_datasets"},
}


def rename_retired(argv: Sequence[str], renamed: dict[str, str]) -> list[str]:
    """`argv` with each retired spelling (`RENAMED_FLAGS`) written as its new name, and one
    `warning:` line on stderr per spelling used (`--samples=9`, `--samples 9` and a boolean's
    `--nocalibrated` alike)."""
    out, warned = [], set()
    for arg in argv:
        name, sep, value = arg.partition("=")
        negated = name.startswith("--no") and f"--{name[4:]}" in renamed
        old = f"--{name[4:]}" if negated else name
        new = renamed.get(old)
        if new is None or not arg.startswith("--"):
            out.append(arg)
            continue
        if old not in warned:
            warned.add(old)
            print(f"warning: {old} is now {new}; the old name goes in 0.2.0",
                  file=sys.stderr, flush=True)
        out.append(f"--no{new[2:]}{sep}{value}" if negated else f"{new}{sep}{value}")
    return out


def command_name(module_form: str) -> str:
    """How the user started this command, for the lines that tell them what to type next: the
    installed command's name (`gedl-train`, from [project.scripts]) when that is what runs,
    else `module_form` (`python -m gedl_jax.train`)."""
    invoked = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return invoked if invoked.startswith("gedl-") else module_form


def fields_command() -> str:
    """The command that lists every config field with its default and doc."""
    return f"`{command_name('python -m gedl_jax.train')} --helpfull`"

# Bad input whatever the CLI: a ValueError names the field, the others the file or folder.
BAD_INPUT: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, PermissionError,
                                              NotADirectoryError, IsADirectoryError)


def debug_requested(argv: Sequence[str]) -> bool:
    return "--debug" in argv or os.environ.get("GEDL_DEBUG", "") not in ("", "0")


# The longest line an error prints: a message longer than that leads with a first line (the
# cause and the way out) and gives the rest as detail lines (`error_text`).
MAX_LINE = 200
DETAIL_INDENT = "  "


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


def error_text(error: BaseException | str) -> str:
    """What a command prints after `error: `: `one_line(error)`, except for a message of
    gedl-jax with details, whose lines after the first all begin with `DETAIL_INDENT` (the
    files a run is missing, the sets it knows): its first line (the cause and the way out),
    then the detail lines as written, each on a line of its own."""
    text = error if isinstance(error, str) else str(error)
    head, *rest = text.rstrip().split("\n")
    details = [line.rstrip() for line in rest if line.strip()]
    single = one_line(error)
    if not details or not all(line.startswith(DETAIL_INDENT) for line in details) or \
            single != " ".join(text.split()):   # a wrapper's message, or one made readable
        return single
    return "\n".join([" ".join(head.split()), *details])


def _readable(error: BaseException, text: str) -> str:
    raw = re.search(r"\('Non-boolean argument to boolean flag', '([^']*)'\)", text)
    if raw:   # absl prints the ValueError's args tuple
        text = text.replace(raw.group(0), f"{raw.group(1)!r} is not a boolean: use true or false")
    if isinstance(error, AttributeError):  # ml_collections: an unknown config field
        name = re.search(r"([A-Za-z_][\w.]*)", text)
        hint = re.search(r'Did you mean "([\w.]+)"', text)
        if name:
            return (f"unknown config field {name.group(1)!r}"
                    f"{f' (did you mean {hint.group(1)!r}?)' if hint else ''}; {fields_command()} "
                    f"lists every field with its default and doc")
    if isinstance(error, KeyError) and _raised_in(error, "ml_collections"):
        # a nested override of a field that does not exist (--config.foo.bar=1): the
        # ConfigDict's KeyError holds only the quoted key
        key = re.search(r"'([^']+)'", text)
        hint = re.search(r'Did you mean "([\w.]+)"', text)
        return (f"unknown config field {key.group(1) if key else text!r}"
                f"{f' (did you mean {hint.group(1)!r}?)' if hint else ''}; {fields_command()} "
                f"lists every field with its default and doc")
    if "Failed loading config file" in text:
        path = re.search(r"Attempted \[.*?\]:\s*(\S+)", text)
        reason = re.search(r"\[Errno \d+\] ([^:\n]+)", text)
        return (f"cannot load the config file {path.group(1) if path else ''}"
                f" ({reason.group(1) if reason else 'see --debug'}); give a config name, "
                f"e.g. --config=mnist:gedl, or the path of a config file")
    return " ".join(text.split())


def _raised_in(error: BaseException, package: str) -> bool:
    """Whether `error` was raised from inside `package`'s code (its traceback's frames)."""
    tb = error.__traceback__
    while tb is not None:
        if package in tb.tb_frame.f_code.co_filename.replace("\\", "/").split("/"):
            return True
        tb = tb.tb_next
    return False


def print_error(message: str) -> None:
    print(f"error: {message}", file=sys.stderr, flush=True)


def show_help(doc: str, extra: str = "") -> None:
    from absl import flags

    print(doc.strip() + "\n")
    if extra:
        print(extra.strip() + "\n")
    for module, _ in sorted(flags.FLAGS.flags_by_module_dict().items()):
        if "gedl_jax" in module or "bin/" in module or module == "__main__":
            print(flags.FLAGS.module_help(module))


def run(body: Callable[[], int], argv: Sequence[str] | None, *, doc: str, help_extra: str = "",
        codes: Sequence[tuple[tuple[type[BaseException], ...], int]] = (),
        renamed: Callable[[str], str | None] | None = None, help_full: str = "",
        renamed_flags: dict[str, str] | None = None) -> int:
    """Parse absl flags from `argv` (the flags are defined already), then call `body()`.

    `codes`: (exception classes, exit status) tried in order before the defaults (bad input ->
    2, a full disk -> 74, KeyboardInterrupt -> 75; anything else is a crash: traceback, 1).
    `renamed`: a config field's name -> the error naming its new spelling (None: not renamed),
    checked on every `--config.<field>` before parsing. `help_full`: what `--helpfull` (or
    `--fields`) prints after the help (the train command: every config field).
    `renamed_flags`: the command's retired spellings (`RENAMED_FLAGS`), read as their new names.
    """
    from absl import flags
    from absl import logging as absl_logging

    argv = list(sys.argv if argv is None else argv)
    argv = argv[:1] + rename_retired(argv[1:], renamed_flags or {})
    debug = debug_requested(argv)
    argv = [a for a in argv if a != "--debug"]
    if any(a in HELP_FLAGS for a in argv[1:]):
        full = help_full if any(a in FULL_HELP_FLAGS for a in argv[1:]) else ""
        try:
            show_help(doc, help_extra + ("\n\n" + full if full else ""))
            sys.stdout.flush()
        except BrokenPipeError:
            # The reader closed the pipe (`--helpfull | head`): it has all it wanted. Further
            # writes (the interpreter's own flush at exit) go to /dev/null, not a traceback.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    for arg in argv[1:]:
        field = re.match(r"--config\.(\w+)(=|$)", arg)
        message = renamed(field.group(1)) if field and renamed else None
        if message:
            return _report(message, EXIT_BAD_INPUT, debug)
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
    return guarded(body, debug, codes)


def guarded(body: Callable[[], int], debug: bool,
            codes: Sequence[tuple[tuple[type[BaseException], ...], int]] = ()) -> int:
    """`body()`, with its exceptions turned into one line and an exit status (see `run`)."""
    try:
        with contextlib.nullcontext() if debug else quiet_write_failures(), \
                contextlib.nullcontext() if debug else quiet_callback_errors(), \
                warnings_as_lines():
            return body()
    except BaseException as e:  # noqa: BLE001 (each class below has its exit status)
        if isinstance(e, SystemExit):
            raise
        for classes, code in codes:
            if isinstance(e, classes):
                return _report(e, code, debug)
        checked = callback_error(e)
        if checked is not None:   # the check's own error, as an eager call raises it
            if debug:
                traceback.print_exception(e)
            return _report(checked, EXIT_BAD_INPUT, False)
        if is_write_failure(e):
            return _report(e, EXIT_WRITE_FAILED, debug, prefix=_write_prefix(e))
        memory = out_of_memory(e)
        if memory is not None:
            if debug:
                traceback.print_exception(e)
            print_error(memory)
            return EXIT_BAD_INPUT
        if isinstance(e, KeyboardInterrupt):
            return _report("interrupted (Ctrl-C)", EXIT_INTERRUPTED, debug)
        if isinstance(e, BAD_INPUT) or "Failed loading config file" in str(e):
            return _report(e, EXIT_BAD_INPUT, debug)
        traceback.print_exc()
        print_error(f"{type(e).__name__}: {one_line(e)} (a crash: please report it with the "
                    f"traceback above)")
        return EXIT_CRASH


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the house rules: a bad argument (an unknown option, a value outside
    `choices`, a missing required one) is one `error:` line naming what to do, exit 2; `--help`
    exits 0; `--debug` is accepted (see `run_argparse`)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        self.add_argument("--debug", action="store_true",
                          help="on an error, print the traceback too (or set GEDL_DEBUG=1)")

    def error(self, message: str):   # argparse: usage lines, then "prog: error: ..."
        print_error(f"{one_line(message)}; `{self.prog} --help` lists the arguments")
        raise SystemExit(EXIT_BAD_INPUT)


def run_argparse(parser: argparse.ArgumentParser, body: Callable[[argparse.Namespace], int],
                 argv: Sequence[str] | None = None,
                 codes: Sequence[tuple[tuple[type[BaseException], ...], int]] = (),
                 renamed: dict[str, str] | None = None) -> int:
    """Parse `argv` (default sys.argv[1:]) with `parser` (an `ArgumentParser` of this module),
    then `body(args)` under the exit statuses of `run`. `renamed`: the command's retired
    spellings (`RENAMED_FLAGS`), read as their new names. Returns the exit status."""
    argv = rename_retired(list(sys.argv[1:] if argv is None else argv), renamed or {})
    debug = debug_requested(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:   # --help (0) or `ArgumentParser.error` (2)
        return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
    return guarded(lambda: body(args), debug, codes)


@contextlib.contextmanager
def warnings_as_lines():
    """While a command runs, a RuntimeWarning or UserWarning raised by gedl_jax itself prints as
    one `warning: ...` line (not Python's "file:line: RuntimeWarning: ..." and the source line
    after it); other packages' warnings print as before."""
    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if "gedl_jax" in str(filename) and issubclass(category, (RuntimeWarning, UserWarning)):
            print(f"warning: {one_line(str(message))}", file=file or sys.stderr, flush=True)
        else:
            previous(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = previous


def _is_write_failure_text(text: str) -> bool:
    return "No space left on device" in text or "os_error_code='28'" in text \
        or "Disk quota exceeded" in text


class _WriteFailureFilter(logging.Filter):
    """Drops the log records that report a failed write (disk full, quota) or its aftermath in
    the library's threads (an event loop closed under them): the CLI's own line says it once."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and (is_write_failure(error) or _is_aftermath(error)):
            return False
        return not _is_write_failure_text(record.getMessage())


def _is_aftermath(error: BaseException) -> bool:
    return isinstance(error, RuntimeError) and "Event loop is closed" in str(error)


class _StderrWithoutWriteFailureTracebacks:
    """sys.stderr, less the tracebacks that native threads print straight to it (TensorStore's
    callbacks into an event loop that the failed save closed): a block from "Traceback (most
    recent call last):" to its exception line is held back, and dropped when that line is a
    failed write or its aftermath; everything else passes through as written."""

    HEAD = "Traceback (most recent call last):"

    def __init__(self, stream):
        self.stream, self.block, self.partial = stream, None, ""
        self.open_tracebacks, self.ends = 0, []

    def write(self, text: str) -> int:
        self.partial += text
        while "\n" in self.partial:
            line, self.partial = self.partial.split("\n", 1)
            self._line(line + "\n")
        if self.block is None and self.partial and not (
                self.HEAD.startswith(self.partial) or self.partial.startswith(self.HEAD)):
            self.stream.write(self.partial)
            self.partial = ""
        return len(text)

    def _line(self, line: str) -> None:
        if self.block is None:
            if line.startswith(self.HEAD):
                self.block, self.open_tracebacks, self.ends = [line], 1, []
            else:
                self.stream.write(line)
            return
        self.block.append(line)
        if line.startswith(self.HEAD):
            # two threads printing at once interleave their tracebacks line by line: the
            # block ends at the last of their exception lines
            self.open_tracebacks += 1
        elif line.strip() and not line[0].isspace():   # an exception line ends a traceback
            self.ends.append(line)
            self.open_tracebacks -= 1
            if self.open_tracebacks == 0:
                block, self.block = self.block, None
                if not all(_is_write_failure_text(end) or "Event loop is closed" in end
                           for end in self.ends):
                    self.stream.write("".join(block))

    def release(self) -> None:
        """Whatever is held back, written out."""
        self.stream.write("".join(self.block or []) + self.partial)
        self.block, self.partial = None, ""
        self.stream.flush()

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name):
        return getattr(self.stream, name)


@contextlib.contextmanager
def quiet_write_failures():
    """While a command runs: the checkpoint library's (Orbax's) error records and its threads'
    tracebacks about a failed write are not printed (hundreds of lines on a full disk, ahead of
    the one `error:` line that says what happened and what to do). When the command itself
    ends in a failed write, the record filters and hooks stay until the process exits. Every
    other record and thread exception is printed as before; `--debug` prints everything."""
    record_filter = _WriteFailureFilter()
    loggers = [logging.getLogger(name) for name in ("absl", "asyncio", "orbax")]
    previous_hook, previous_unraisable_hook = threading.excepthook, sys.unraisablehook

    def thread_hook(args) -> None:
        if args.exc_value is not None and (is_write_failure(args.exc_value)
                                           or _is_aftermath(args.exc_value)):
            return
        previous_hook(args)

    def unraisable_hook(args) -> None:
        # TensorStore's callbacks into the event loop that a failed save closed raise where
        # nothing can catch them (pybind11 reports them as unraisable), often from two threads
        # at once: dropped here whole, before they are printed interleaved
        if args.exc_value is not None and (is_write_failure(args.exc_value)
                                           or _is_aftermath(args.exc_value)):
            return
        previous_unraisable_hook(args)

    for logger in loggers:
        logger.addFilter(record_filter)
    threading.excepthook, sys.unraisablehook = thread_hook, unraisable_hook
    stderr = sys.stderr
    sys.stderr = _StderrWithoutWriteFailureTracebacks(stderr)
    failed_write = False
    try:
        yield
    except BaseException as e:
        failed_write = is_write_failure(e)
        raise
    finally:
        sys.stderr.release()
        sys.stderr = stderr
        # after a failed write the process is about to exit, and the library's leftovers still
        # report it as they are collected (asyncio's "Task exception was never retrieved", an
        # event loop closed under a callback): the filters stay for the rest of the process
        if not failed_write:
            threading.excepthook, sys.unraisablehook = previous_hook, previous_unraisable_hook
            for logger in loggers:
                logger.removeFilter(record_filter)


# The last "ValueError: ..." line of a traceback that jax put into the text of its error.
_CALLBACK_VALUE_ERROR = re.compile(r"^ValueError: (.+)$", re.MULTILINE)


def callback_error(error: BaseException) -> ValueError | None:
    """The ValueError a check of gedl-jax raised inside a compiled program (a
    `jax.debug.callback`: a label outside the classes under `jax.jit`, say), which jax reports
    as "INTERNAL: CpuCallback error calling callback: <traceback>" with the check's message on
    its last line: that ValueError again, so a command prints it as the eager call does (one
    line, exit 2); None for any other error."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = str(error)
        if "Callback error" in text and "gedl_jax" in text:
            found = _CALLBACK_VALUE_ERROR.findall(text)
            if found:
                return ValueError(found[-1].strip())
        error = error.__cause__ or error.__context__
    return None


class _CallbackErrorFilter(logging.Filter):
    """Drops jax's "jax.debug.callback failed" record (and its traceback) of a check of
    gedl-jax that raised ValueError: the command reports it itself, in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (isinstance(error, ValueError) and _raised_in(error, "gedl_jax"))


@contextlib.contextmanager
def quiet_callback_errors():
    """While a command runs: jax's log record of a check that failed inside a compiled
    program is not printed (`callback_error` reports it when the program's error arrives)."""
    logger, record_filter = logging.getLogger("jax._src.debugging"), _CallbackErrorFilter()
    logger.addFilter(record_filter)
    try:
        yield
    finally:
        logger.removeFilter(record_filter)


def out_of_memory(error: BaseException) -> str | None:
    """The `error:` line of an out-of-memory error anywhere in `error`'s chain
    (`files.out_of_memory`); None for any other error. It is not a crash: the line says what
    to lower."""
    from gedl_jax import files

    found = files.out_of_memory(error)
    if found is None:
        return None
    device = not isinstance(found, MemoryError)
    text = str(found).strip()
    first = " ".join(text.splitlines()[0].split()) if text else "MemoryError"
    short = first if len(first) <= 60 else first[:57] + "..."
    return (f"out of {'device' if device else 'host'} memory ({short}): lower "
            f"--config.batch_size or --config.eval_batch_size, or --config.train_examples\n"
            f"  {first[:MAX_LINE - 2]}\n"
            f"  what the run holds did not fit: the training and validation images (kept on the "
            f"device), the model and its optimizer state, one batch's activations\n"
            f"  --config.eval_batch_size may change any time; the other two make a new run. Or "
            f"free the device (another process may hold its memory: nvidia-smi)\n"
            f"  Checkpoints already saved are intact.")


def is_write_failure(error: BaseException) -> bool:
    from gedl_jax import files

    return files.is_disk_full(error)


def _write_prefix(error: BaseException) -> str:
    return "" if "no space left" in str(error).lower() else "no space left on device: "


def _report(error: BaseException | str, code: int, debug: bool, prefix: str = "") -> int:
    if debug and isinstance(error, BaseException):
        traceback.print_exception(error)
    message = error_text(error)
    if code == EXIT_INTERRUPTED and not isinstance(error, str):
        print(message, file=sys.stderr, flush=True)
    else:
        print_error(prefix + message)
    return code

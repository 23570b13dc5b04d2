"""Every entry point of the repository, walked: the installed commands (`[project.scripts]`),
the `python -m` modules of gedl_jax, and every script under bin/, tools/ and studies/ (Python
or shell).

- `--help` exits 0 at once, with the usage on stdout, and writes nothing (nothing trained, no
  folder made: started in an empty folder, it leaves it empty).
- Every flag in the printed help has a help text.
- One name per idea across the commands (`cli.VOCABULARY`): no entry point spells an idea any
  other way, and no flag is spelled with a hyphen; no command offers its retired spellings
  (`cli.RENAMED_FLAGS`) as flags.
- A flag whose help says which config field it sets (`(config.FIELD`) is named as the field.
- The retired spellings still work for one release, each with one warning line.

bin/train and bin/test pass their arguments through after the setup (tests/test_entrypoints.py
checks that `--help` reaches the command); the command they run is walked here.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import tomllib

import pytest

from gedl_jax.commands import cli

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT_FOLDERS = ("bin", "tools", "studies")
HELP_TIMEOUT_S = 60
MAIN_BLOCK = re.compile(r'^if __name__ == "__main__":', re.MULTILINE)
WRAPPERS = ("bin/train", "bin/test")   # they pass --help through (module docstring)


def _python_scripts() -> list[str]:
    return sorted(str(p.relative_to(REPO)) for folder in SCRIPT_FOLDERS
                  for p in (REPO / folder).rglob("*.py") if MAIN_BLOCK.search(p.read_text()))


def _shell_scripts() -> list[str]:
    return sorted(str(p.relative_to(REPO)) for folder in SCRIPT_FOLDERS
                  for p in (REPO / folder).rglob("*.sh"))


def _modules() -> list[str]:
    """The gedl_jax modules that run as programs (`python -m NAME`)."""
    found = []
    for path in sorted((REPO / "gedl_jax").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if path.name == "__main__.py":
            found.append(".".join(parts[:-1]))
        elif MAIN_BLOCK.search(path.read_text()):
            found.append(".".join(parts))
    return found


def _installed() -> dict[str, str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def _command(kind: str, name: str) -> list[str]:
    if kind == "script":
        return [sys.executable, str(REPO / name)]
    if kind == "shell":
        return ["bash", str(REPO / name)]
    if kind == "module":
        return [sys.executable, "-m", name]
    module, function = _installed()[name].split(":")
    # as the installed launcher runs it: sys.argv[0] is the command's name
    return [sys.executable, "-c", f"import sys; sys.argv[0] = {name!r}; "
                                  f"from {module} import {function}; sys.exit({function}())"]


ENTRY_POINTS = ([("installed", n) for n in sorted(_installed())]
                + [("module", m) for m in _modules()]
                + [("script", s) for s in _python_scripts()]
                + [("shell", s) for s in _shell_scripts()])


def _help(kind: str, name: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
    """`--help` of an entry point, started in `cwd` (an empty folder: nothing may appear in it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    return subprocess.run([*_command(kind, name), "--help"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=HELP_TIMEOUT_S)


# An option's entry in argparse's help ("  -h, --help  text", "  --out OUT  text", or the text on
# the next lines when the invocation is long) and in absl's ("  --[no]latex: text").
ARGPARSE_ENTRY = re.compile(r"^  (-{1,2}[A-Za-z]\S*(?: \S+)*)(?:\s{2,}(\S.*))?$")
ABSL_ENTRY = re.compile(r"^  --(?:\[no\])?([\w.-]+):(.*)$")
POSITIONALS = re.compile(r"^positional arguments:$")
FLAG_NAME = re.compile(r"(?<![\w-])--?([A-Za-z][\w-]*)")


def parse_flags(text: str) -> dict[str, str]:
    """Every flag of a printed help (argparse's or absl's) -> its help text ("" when none), and
    argparse's positionals, as `<name>`."""
    flags: dict[str, str] = {}
    lines = text.splitlines()
    positional = False
    for i, line in enumerate(lines):
        if POSITIONALS.match(line):
            positional = True
            continue
        if positional and not line.strip():
            positional = False
        following = lines[i + 1] if i + 1 < len(lines) else ""
        continued = following.startswith("    ") and not following.lstrip().startswith("-")
        absl = ABSL_ENTRY.match(line)
        if absl:
            flags[absl.group(1)] = absl.group(2).strip()   # the lines below: absl's notes
            continue
        entry = ARGPARSE_ENTRY.match(line)
        if entry:
            help_text = (entry.group(2) or "").strip() or (following.strip() if continued else "")
            for name in FLAG_NAME.findall(entry.group(1)):
                flags[name] = help_text
        elif positional and re.match(r"^  [A-Za-z]", line):
            name, _, rest = line.strip().partition("  ")
            flags[f"<{name.strip()}>"] = rest.strip() or (following.strip() if continued
                                                          else "")
    return flags


def test_parse_flags_reads_both_formats_and_finds_a_flag_without_help():
    argparse_help = """usage: x [-h] [--repeats REPEATS] [--out OUT] run

positional arguments:
  run                   the run folder
  other

options:
  -h, --help            show this help message and exit
  --repeats REPEATS
  --a_very_long_option_name A_VERY_LONG_OPTION_NAME
                        text on the next line
  --dry-run, --dry_run  both spellings
"""
    assert parse_flags(argparse_help) == {
        "<run>": "the run folder", "<other>": "", "h": "show this help message and exit",
        "help": "show this help message and exit", "repeats": "",
        "a_very_long_option_name": "text on the next line", "dry-run": "both spellings",
        "dry_run": "both spellings"}
    absl_help = """gedl_jax/commands/evaluate.py:
  --[no]calibrate: Fit the post-hoc calibrators
    (default: 'false')
  --workdir: Workdir(s) of runs.;
    repeat this option to specify a list of values
  --quiet:
    (default: 'false')
"""
    parsed = parse_flags(absl_help)
    assert parsed["calibrate"] == "Fit the post-hoc calibrators"
    assert parsed["workdir"] == "Workdir(s) of runs.;"
    assert parsed["quiet"] == ""


@pytest.mark.parametrize(("kind", "name"), ENTRY_POINTS, ids=[n for _, n in ENTRY_POINTS])
def test_help_exits_0_and_every_flag_has_help_and_its_idea_s_one_name(kind, name, tmp_path):
    proc = _help(kind, name, tmp_path)
    assert proc.returncode == 0, f"{name} --help: exit {proc.returncode}\n{proc.stderr[-2000:]}"
    assert proc.stdout.strip(), f"{name} --help printed nothing on stdout"
    assert not list(tmp_path.iterdir()), f"{name} --help wrote {list(tmp_path.iterdir())}"
    flags = parse_flags(proc.stdout)
    missing = sorted(f for f, text in flags.items() if not text)
    assert not missing, f"{name}: flags without a help text: {missing}"

    synonyms = {s: idea for idea, (_, others) in cli.VOCABULARY.items() for s in others}
    for flag, text in flags.items():
        if flag.startswith("<") or flag in ("h", "help"):
            continue
        assert flag not in synonyms, (f"{name}: --{flag} spells {synonyms[flag]!r}, whose name "
                                      f"is --{cli.VOCABULARY[synonyms[flag]][0]}")
        assert "-" not in flag, f"{name}: --{flag}: flags are snake_case, as the config fields"
        field = re.match(r"\(config\.(\w+)\b", text)
        assert field is None or field.group(1) == flag, (
            f"{name}: --{flag} sets config.{field.group(1)}: name it --{field.group(1)}")


@pytest.mark.parametrize("name", sorted(_installed()))
def test_installed_commands_say_their_own_name(name, tmp_path):
    """An installed command's usage and advice name it as the user typed it (`gedl-report`), not
    as a module path."""
    proc = _help("installed", name, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert name in proc.stdout, proc.stdout[:500]


def test_the_installed_commands_are_the_documented_five():
    assert sorted(_installed()) == ["gedl-compare", "gedl-evaluate", "gedl-fetch", "gedl-report",
                                    "gedl-train"]
    for target in _installed().values():   # each names a function that exists
        module, function = target.split(":")
        assert callable(getattr(__import__(module, fromlist=[function]), function))


def test_the_vocabulary_is_one_name_per_idea():
    names = [name for name, _ in cli.VOCABULARY.values()]
    assert len(names) == len(set(names))
    for idea, (name, others) in cli.VOCABULARY.items():
        assert name not in others, idea
    # a retired spelling's new name is an idea's name (or the snake_case of a hyphenated one)
    for command, renamed in cli.RENAMED_FLAGS.items():
        for old, new in renamed.items():
            assert old != new and new.lstrip("-") in {*names, old.lstrip("-").replace("-", "_")}, (
                command, old, new)


def test_rename_retired_reads_each_old_spelling_as_its_new_name_with_one_warning(capsys):
    renamed = cli.RENAMED_FLAGS["compare"]
    argv = ["a", "b", "--samples=50", "--interval", "basic", "--calibrated", "--samples=60",
            "--scores=mp", "--seed=3"]
    assert cli.rename_retired(argv, renamed) == [
        "a", "b", "--bootstrap_samples=50", "--bootstrap_interval", "basic", "--calibrate",
        "--bootstrap_samples=60", "--scores=mp", "--bootstrap_seed=3"]
    warnings = capsys.readouterr().err.splitlines()
    assert warnings == [
        "warning: --samples is now --bootstrap_samples; the old name goes in 0.2.0",
        "warning: --interval is now --bootstrap_interval; the old name goes in 0.2.0",
        "warning: --calibrated is now --calibrate; the old name goes in 0.2.0",
        "warning: --seed is now --bootstrap_seed; the old name goes in 0.2.0"]
    # absl's negated boolean and a value that only looks like the old name are read right
    assert cli.rename_retired(["--nocalibrated", "--out=--samples"], renamed) == [
        "--nocalibrate", "--out=--samples"]
    assert cli.rename_retired(["--ood=kmnist", "--ood_groups=far=x"],
                              cli.RENAMED_FLAGS["evaluate"]) == ["--extra_ood=kmnist",
                                                                 "--ood_groups=far=x"]


@pytest.mark.parametrize("command", sorted(cli.RENAMED_FLAGS))
def test_every_retired_spelling_points_at_a_flag_the_command_has(command, tmp_path):
    kind, name = {"evaluate": ("installed", "gedl-evaluate"),
                  "compare": ("installed", "gedl-compare"),
                  "report": ("installed", "gedl-report"),
                  "reproduce": ("script", "bin/reproduce.py")}[command]
    flags = parse_flags(_help(kind, name, tmp_path).stdout)
    for old, new in cli.RENAMED_FLAGS[command].items():
        assert new.lstrip("-") in flags, (command, new)
        assert old.lstrip("-") not in flags, (command, old)


def test_a_retired_spelling_still_works_end_to_end(tmp_path):
    """`gedl-report --ood=... --no-extra` (the 0.1 spellings) prints what the new ones print,
    plus one warning line per old name."""
    import json

    run = tmp_path / "runs" / "gedl_seed0"
    run.mkdir(parents=True)
    run.joinpath("eval_results.json").write_text(json.dumps({
        "variant": "gedl", "seed": 0, "dataset": "mnist",
        "id": {"accuracy": 0.99, "misclassification": {"mp": {"aupr": 0.4}}},
        "ood": {name: {"detection": {"mp": {"aupr_in": 0.9}, "um": {"aupr_in": 0.8}}}
                for name in ("KMNIST", "FMNIST")}}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}

    def report(*args):
        return subprocess.run([sys.executable, "bin/report.py", str(tmp_path / "runs"), *args],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=120)

    new, old = report("--ood_datasets=FMNIST", "--no_extra"), report("--ood=FMNIST", "--no-extra")
    assert new.returncode == old.returncode == 0, old.stderr
    assert old.stdout == new.stdout and "FMNIST" in new.stdout and "KMNIST" not in new.stdout
    assert new.stderr == ""
    assert old.stderr.splitlines() == [
        "warning: --ood is now --ood_datasets; the old name goes in 0.2.0",
        "warning: --no-extra is now --no_extra; the old name goes in 0.2.0"]


def test_help_into_a_closed_pipe_ends_quietly(tmp_path):
    """`gedl-train --helpfull | head -1`: once the reader has closed the pipe, every write
    fails (EPIPE); the command still exits 0, without a BrokenPipeError traceback. The read end
    is closed before the command starts, so the test does not depend on timing."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "gedl_jax.train", "--helpfull"],
                              cwd=tmp_path, env=env, stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=HELP_TIMEOUT_S)
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("name", _shell_scripts())
def test_a_shell_script_started_by_a_relative_path_from_its_folder_prints_its_help(name):
    """`cd tools && bash gpu_check.sh --help`: a script that changes folder before it prints its
    header comment must not read it back through a relative `$0`."""
    script = REPO / name
    proc = subprocess.run(["bash", script.name, "--help"], cwd=script.parent,
                          capture_output=True, text=True, timeout=HELP_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() and "No such file" not in proc.stderr, proc.stderr

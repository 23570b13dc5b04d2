"""Repository hygiene: no absolute machine path, no reference to a file the repository lacks.

Every text file git tracks (`git ls-files`: committed or staged, as it is in the working tree) is
read, and the test fails naming `file:line` for:

(a) **An absolute machine path**: a string starting with a slash, one of the folder names in
    `MACHINE_ROOTS` and a slash, that is not the tail of a longer path or URL. Use an
    environment variable (`$GEDL_DATA_DIR`, `$TORCH_PYTHON`), a required argument, a
    placeholder (`PATH/TO/...`, `DATA_DIR`, `RUNS_DIR`) or a path relative to the repository
    (`--workdir=runs/quick`).
(b) **A reference to a file the repository does not hold**:
    1. the team's private notes, which users do not have (the Markdown notes named in
       `NOTE_STEMS`, any note under a `spec` folder, and the shared folder beside the checkout;
       `PRIVATE_NOTE` spells out the forms). Cite the public paper or repository a fact comes
       from instead, or state the fact;
    2. a relative markdown link `[text](path)` (in .md files and notebooks) whose target, taken
       relative to the linking file, is not a file or folder of the repository;
    3. a repository path starting with `docs/`, `bin/`, `tools/`, `studies/` or `benchmarks/`
       (the old name of `studies/`), or a module `studies.<name>`, `tools.<name>` or
       `benchmarks.<name>`, mentioned anywhere, that does not exist. Not checked: templates (the
       path goes on with `*`, `{`, `<` or `$`) and outputs a command would write (after `--out=`,
       `--out ` or `>`), and the pages the docs build writes (`BUILT_PAGES`). A path that no
       longer exists may be named as history: it passes when
       its paragraph (the block of non-blank lines around it) cites a commit that holds it,
       as "commit abc1234" or "abc1234:path" (checked with `git cat-file` when the clone has
       that commit).

Which files are exempt, and why:
- **Recorded program output** under docs/results/ is left as the program wrote it, paths of the
  machine it ran on included, so it is exempt from (a), (b2) and (b3); the private notes (b1) are
  checked in it too. Recorded output is: `*.json`, `*.txt`, `*.log`, `*.tex`, and the markdown
  files programs write: `results.md` (bin/reproduce.py), `table.md` (the init ablation's table
  script), `corruption_study.md` (the corruption study of gedl_jax.evaluate) and
  `benchmark_*.md` (bin/benchmark.py). Everything else under docs/results/ is written by hand
  (every `README.md`, notes such as `torch_reference_quick.md`, the `*.sh` queues) and is
  checked like any file.
- This file, which has to spell out what it looks for.
- `PENDING`: references that are known and are to be fixed elsewhere, listed per file with the
  exact text found. A listed text that no longer occurs fails the test too, so the list shrinks
  to empty as they are fixed.
"""

from __future__ import annotations

import pathlib
import posixpath
import re
import shutil
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SELF = "tests/test_repository_hygiene.py"

# {file: {the exact text the checks report}}: known references to be fixed elsewhere.
PENDING: dict[str, set[str]] = {}

# The top-level folders that make a path machine-specific. This file spells no such path out:
# its planted examples are built from these names (`_machine_path`), so that it passes its own
# rule and any other scanner for machine paths.
MACHINE_ROOTS = ("tmp", "work", "home", "root", "Users")
ABSOLUTE_PATH = re.compile(r"(?<![\w.~}$-])/(?:" + "|".join(MACHINE_ROOTS)
                           + r")/[^\s`'\")\]]*")
# The private notes' file stems and the shared folder's name, joined into patterns below (so
# that this file names no file outside the repository itself).
NOTE_STEMS = ("variants", "platform", "ecosystem", "architecture_review", "style")
SHARED = "shared"
PRIVATE_NOTE = re.compile(
    rf"\b(?:{'|'.join(NOTE_STEMS)})\.md\b"
    r"|(?<![\w-])spec/[\w.-]+\.md\b"
    rf"|\.\./{SHARED}\b|\b{SHARED}/(?:spec|paper)\b")
MARKDOWN_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REPO_PATH = re.compile(
    r"(?<![\w./~$-])((?:docs|bin|tools|studies|benchmarks)/[\w.-]+(?:/[\w.-]+)*/?)")
SCRIPT_MODULE = re.compile(r"(?<![\w./-])(studies|tools|benchmarks)\.([A-Za-z_]\w*)")
OUTPUT_BEFORE = re.compile(r"(?:--out[= ]|>\s*)$")
# What tools/docs.sh writes among the pages it stages for each build, which git ignores: named
# and linked as the site holds them, never committed.
BUILT_PAGES = ("docs/executed",)
COMMIT = re.compile(r"\bcommits?\s+([0-9a-f]{7,40})\b|\b([0-9a-f]{7,40}):")
RECORDED_SUFFIXES = (".json", ".txt", ".log", ".tex")
RECORDED_MARKDOWN = re.compile(r"(?:results|table|corruption_study|benchmark_[\w-]+)\.md")


def _git(root: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)


@pytest.fixture(scope="module")
def checkout() -> list[str]:
    if shutil.which("git") is None or _git(REPO, "rev-parse", "--show-toplevel").returncode:
        pytest.skip("not a git checkout: the hygiene checks run on `git ls-files`")
    listed = _git(REPO, "ls-files", "-z").stdout
    return sorted({f for f in listed.split("\0") if f and (REPO / f).is_file()})


def _text(root: pathlib.Path, path: str) -> str | None:
    raw = (root / path).read_bytes()
    if b"\0" in raw:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def is_recorded_output(path: str) -> bool:
    if not path.startswith("docs/results/"):
        return False
    name = posixpath.basename(path)
    return name.endswith(RECORDED_SUFFIXES) or bool(RECORDED_MARKDOWN.fullmatch(name))


def _paragraphs(lines: list[str]) -> list[str]:
    """For each line, the text of its paragraph (the block of non-blank lines around it)."""
    out, start = [""] * len(lines), 0
    for i in range(len(lines) + 1):
        if i == len(lines) or not lines[i].strip():
            block = "\n".join(lines[start:i])
            for j in range(start, i):
                out[j] = block
            start = i + 1
    return out


def _built(path: str) -> bool:
    """Whether `path` is a page the docs build writes (`BUILT_PAGES`), or their folder."""
    return any(path == p or path.startswith(p + "/") for p in BUILT_PAGES)


class _History:
    """Whether a paragraph cites a commit that holds a path the checkout no longer has."""

    def __init__(self, root: pathlib.Path) -> None:
        self._root = root
        self._known: dict[str, bool] = {}

    def _commit_known(self, commit: str) -> bool:
        if commit not in self._known:
            self._known[commit] = not _git(self._root, "cat-file", "-e",
                                           f"{commit}^{{commit}}").returncode
        return self._known[commit]

    def holds(self, paragraph: str, path: str) -> bool:
        commits = {a or b for a, b in COMMIT.findall(paragraph)}
        if not commits:
            return False
        known = [c for c in commits if self._commit_known(c)]
        if not known:   # a shallow clone: the cited commit cannot be checked here
            return True
        return any(not _git(self._root, "cat-file", "-e", f"{c}:{path}").returncode
                   for c in known)


def violations(files: list[str], root: pathlib.Path = REPO) -> list[tuple[str, int, str, str]]:
    """(file, line, the text found, what is wrong) for every file of `files` under `root`."""
    present = set(files)
    folders = {str(p) for f in files for p in pathlib.PurePosixPath(f).parents}
    history = _History(root)
    found = []
    for path in files:
        if path == SELF:
            continue
        text = _text(root, path)
        if text is None:
            continue
        recorded = is_recorded_output(path)
        lines = text.splitlines()
        paragraphs = _paragraphs(lines)
        links = path.endswith((".md", ".ipynb"))
        for number, line in enumerate(lines, 1):
            for m in PRIVATE_NOTE.finditer(line):
                found.append((path, number, m.group(0), "cites the team's private notes or "
                              "shared folder, which users do not have: cite the public paper or "
                              "repository, or state the fact"))
            if recorded:
                continue
            for m in ABSOLUTE_PATH.finditer(line):
                found.append((path, number, m.group(0), "absolute machine path: use an "
                              "environment variable, an argument, a placeholder or a relative "
                              "path"))
            if links:
                for m in MARKDOWN_LINK.finditer(line):
                    target = m.group(1)
                    if re.match(r"[A-Za-z][\w+.-]*:", target) or target.startswith("#"):
                        continue
                    target = target.split("#")[0].split("?")[0]
                    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path),
                                                                 target))
                    if (resolved not in present and resolved not in folders
                            and not _built(resolved)):
                        found.append((path, number, target, f"links to {resolved}, which the "
                                      "repository does not hold"))
            for m in REPO_PATH.finditer(line):
                mention = m.group(1).rstrip("/.")
                after = line[m.end():m.end() + 1]
                if after in ("*", "{", "<", "$") or OUTPUT_BEFORE.search(line[:m.start()]):
                    continue
                if mention in present or mention in folders or _built(mention):
                    continue
                if history.holds(paragraphs[number - 1], mention):
                    continue
                found.append((path, number, mention, "names a path the repository does not "
                              "hold (if it is history, cite the commit that holds it in the "
                              "same paragraph)"))
            for m in SCRIPT_MODULE.finditer(line):
                module = f"{m.group(1)}/{m.group(2)}.py"
                if module not in present and f"{m.group(1)}/{m.group(2)}" not in folders:
                    found.append((path, number, m.group(0), f"names a module, but {module} "
                                  "does not exist"))
    return found


def test_no_machine_paths_and_no_references_to_files_the_repository_lacks(checkout):
    unexpected, pending_seen = [], set()
    for path, number, text, problem in violations(checkout):
        if text in PENDING.get(path, ()) or any(p in text for p in PENDING.get(path, ())):
            pending_seen.add((path, next(p for p in PENDING[path] if p in text)))
            continue
        unexpected.append(f"{path}:{number}: {text!r}: {problem}")
    stale = [f"PENDING[{path!r}] lists {text!r}, which no longer occurs there: remove it"
             for path, texts in PENDING.items() for text in texts
             if (path, text) not in pending_seen]
    assert not unexpected + stale, "\n".join(unexpected + stale)


def _machine_path(root: str, *rest: str) -> str:
    """An absolute path under one of `MACHINE_ROOTS`, for the planted examples."""
    assert root in MACHINE_ROOTS
    return "/" + "/".join((root, *rest))


def test_the_checks_catch_what_they_are_for(tmp_path):
    """Each rule fires on a planted example and stays quiet on the allowed forms."""
    tmp_data = _machine_path("tmp", "data")
    work_data = _machine_path("work", "data")
    home_venv = _machine_path("home", "me", "venv")
    files = ["docs/a.md", "docs/results/run/results.md", "docs/results/run/README.md",
             "bin/tool.py", "studies/x.py"]
    planted = {
        "docs/a.md": (f"data in {tmp_data}\n"                    # (a)
                      f"see {NOTE_STEMS[0]}.md 9.2 and ../{SHARED}/data\n"  # (b1) twice
                      "[b](missing.md) [c](a.md) [d](https://x.org/tmp/y) [e](#anchor)\n"
                      "`bin/gone.py` and `studies/x.py` and `python -m studies.y`\n"
                      "the old `benchmarks/x.py` and `python -m benchmarks.x`\n"
                      "write `--out=docs/results/new.json`, `docs/*.md`, `bin/${X}`\n"
                      "~/runs and $HOME/work/x and runs/tmp/x are not absolute\n"),
        "docs/results/run/results.md": f"Command: --data_dir={work_data}\n",   # recorded: exempt
        "docs/results/run/README.md": f"run with {home_venv}\n",            # by hand: checked
        "bin/tool.py": "", "studies/x.py": "",
    }
    for name, text in planted.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = {(path, number, text) for path, number, text, _ in violations(files, tmp_path)}
    assert found == {
        ("docs/a.md", 1, tmp_data),
        ("docs/a.md", 2, f"{NOTE_STEMS[0]}.md"),
        ("docs/a.md", 2, f"../{SHARED}"),
        ("docs/a.md", 3, "missing.md"),
        ("docs/a.md", 4, "bin/gone.py"),
        ("docs/a.md", 4, "studies.y"),
        ("docs/a.md", 5, "benchmarks/x.py"),
        ("docs/a.md", 5, "benchmarks.x"),
        ("docs/results/run/README.md", 1, home_venv),
    }, found


def test_docs_hold_no_code(checkout):
    """docs/ holds text, tables, plots and run logs: a study's scripts live in studies/<study>/."""
    code = [f for f in checkout if f.startswith("docs/") and f.endswith((".py", ".sh"))]
    assert not code, f"move these to studies/<study>/: {code}"


# Files that hold arrays or datasets. The repository ships only the pretrained weights
# (gedl_jax/pretrained/, registered with their sha256); data is downloaded or generated, never
# committed (a scratch run's output in the checkout is easily added by `git add -A`).
ARRAY_SUFFIXES = (".npz", ".npy", ".gz", ".msgpack", ".tar", ".zip", "-ubyte", ".pkl", ".h5",
                  ".tfrecord", ".array_record")


def test_no_data_files_are_tracked(checkout):
    data_files = [f for f in checkout if f.endswith(ARRAY_SUFFIXES)
                  and not f.startswith("gedl_jax/pretrained/")]
    assert not data_files, f"data files tracked by git (git rm --cached them): {data_files}"


def test_no_script_loads_another_by_its_file_path(checkout):
    """Scripts are not libraries: a script, study or test imports what it uses as a module
    (`gedl_jax...`, `bin.<name>`, `tools.<name>`, `studies.<...>`), never by its file path."""
    loader = "spec_from" + "_file_location"   # spelt in two parts: this file is read too
    found = [f"{path}:{number}" for path in checkout if path.endswith((".py", ".ipynb", ".sh"))
             and (text := _text(REPO, path)) is not None
             for number, line in enumerate(text.splitlines(), 1) if loader in line]
    assert not found, f"load these as modules instead: {found}"


def test_the_top_level_configs_is_the_packages_folder(checkout):
    """The documented `--config=configs/<name>.py` names a real path from a clone's root: the
    top-level `configs` is a relative link to gedl_jax/configs (the presets written once, in the
    package, which the wheel ships), tracked as a link, not a folder of copies."""
    listed = _git(REPO, "ls-files", "-s", "configs").stdout.split()
    assert listed[:1] == ["120000"] and listed[-1] == "configs", f"configs is {listed}"
    assert _git(REPO, "cat-file", "-p", listed[1]).stdout == "gedl_jax/configs"
    assert (REPO / "configs" / "mnist.py").resolve() == (
        REPO / "gedl_jax" / "configs" / "mnist.py").resolve()


def test_no_lock_file_is_tracked(checkout):
    """A lock file belongs to the process that holds it (a workdir's `.gedl_jax.lock`, a tool's
    turn-taking), never to the repository."""
    locks = [f for f in checkout if posixpath.basename(f).endswith(".lock")]
    assert not locks, f"lock files tracked by git (git rm --cached them): {locks}"


def test_ruff_finds_nothing():
    """The lint of pyproject.toml's [tool.ruff] (line length, pyflakes, bugbear, pyupgrade to
    Python 3.11) over the whole checkout. ruff is in the dev extra, pinned in the constraints."""
    # the files git tracks (a copy's untracked scratch, such as a device copy's, is not ours)
    tracked = [p for p in _git(REPO, "ls-files", "-z").stdout.split("\0")
               if p.endswith((".py", ".ipynb")) and (REPO / p).is_file()]
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache",
                           "--output-format=concise", "--force-exclude", *tracked],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]

#!/usr/bin/env python
"""Compare the eval_results.json of two study folders run by run: are the numbers identical?

    python bin/compare_results.py OLD_OUT NEW_OUT

OLD_OUT / NEW_OUT are `bin/reproduce.py --out` folders (runs/<name>/seed_<s>/eval_results.json).
Every run present in both is compared on its numbers (the text of "conventions", the recorded
workdir, plot and ensemble-member paths, and the "method" / "scores" labels added by later
versions are ignored). Keys only the NEW results have (sections added by later versions, such as
"id.selective" or "conformal") are not compared; each line counts them.
Prints one line per run and exits 1 if any differs: a check that a code change kept every result.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

IGNORED = frozenset({"workdir", "plots", "ensemble_members", "conventions", "method", "scores"})


def numbers(tree):
    if isinstance(tree, dict):
        return {k: numbers(v) for k, v in tree.items() if k not in IGNORED}
    return tree


def restricted(new, old, added: list[str], path: str = ""):
    """`new` cut to the keys `old` has (recursively); the keys only `new` has go to `added`."""
    if not (isinstance(new, dict) and isinstance(old, dict)):
        return new
    added.extend(f"{path}{k}" for k in new if k not in old)
    return {k: restricted(new[k], old[k], added, f"{path}{k}.") for k in new if k in old}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("old", help="the reference bin/reproduce.py --out folder")
    p.add_argument("new", help="the bin/reproduce.py --out folder compared with it")
    args = p.parse_args(argv)
    old, new = pathlib.Path(args.old), pathlib.Path(args.new)
    same = different = 0
    for path in sorted(old.glob("runs/*/seed_*/eval_results.json")):
        other = new / path.relative_to(old)
        if not other.exists():
            continue
        a, b = numbers(json.loads(path.read_text())), numbers(json.loads(other.read_text()))
        added: list[str] = []
        ok = a == restricted(b, a, added)
        same, different = same + ok, different + (not ok)
        print(f"{path.parent.relative_to(old)}: {'identical' if ok else 'DIFFERENT'} "
              f"(accuracy {a['id']['accuracy']} / {b['id']['accuracy']})"
              + (f", {len(added)} new key(s) not compared" if added else ""))
    print(f"{same} identical, {different} different")
    return 1 if different or not same else 0


if __name__ == "__main__":
    sys.exit(main())

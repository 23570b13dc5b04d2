"""Images/s of finished training runs' loops, from their metrics.jsonl.

    python -m studies.loop_rate WORKDIR [WORKDIR ...]

For each workdir: the train steps between its first and its last train record and the seconds
between them (the first record's window, which compiles, is left out; validations and
checkpoints inside are counted), as img/s with the run's batch size. Two checkouts timed on one
machine this way compare their training loops (docs/performance.md, "The training loop").
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys


def loop_rate(workdir: pathlib.Path) -> tuple[int, float, float]:
    """(steps, seconds, images/s) between the first and last train records of `workdir`."""
    config = json.loads((workdir / "config.json").read_text())
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    if len(train) < 2:
        raise ValueError(f"{workdir}: fewer than two train records")
    steps = train[-1]["step"] - train[0]["step"]
    seconds = train[-1]["time"] - train[0]["time"]
    return steps, seconds, steps * config["batch_size"] / seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.loop_rate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workdirs", nargs="+", metavar="WORKDIR",
                        help="a finished run's folder (its config.json and metrics.jsonl)")
    for workdir in parser.parse_args(argv).workdirs:
        steps, seconds, rate = loop_rate(pathlib.Path(workdir))
        print(f"{workdir}: {steps} steps in {seconds:.1f} s, {rate:,.0f} img/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""The GPU check's report moved to tools/gpu_report.py (a maintainer tool); this old name
forwards to it for one release, with a line that says so."""

import pathlib
import sys

if __name__ == "__main__":
    print("bin/gpu_report.py moved to tools/gpu_report.py; the old name goes in 0.2.0",
          file=sys.stderr)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))   # the repository root
    from tools import gpu_report

    sys.exit(gpu_report.main())

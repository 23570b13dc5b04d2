"""Maintainer tools: what keeps the repository itself in order (its lock files, the wheel check,
the docs site, the GPU check and its report, the memory and input-throughput probes, the
architecture document). `bin/` holds the user tools. Run from the repository root, as
`python -m tools.<name>` or `bash tools/<name>.sh`; the tests import the Python ones as
`tools.<name>`. Imports nothing at import time.
"""

"""Research and speed scripts of gedl-jax (see studies/README.md).

A package so that its scripts import each other as `studies.<name>`; run them from the
repository root with `python -m studies.<name>`. It imports nothing at import time: some of its
scripts run under a Python that has torch but not jax.
"""

"""The `>>>` examples in the docstrings of the public evidential functions (and of the modules in
OTHER_MODULES) run and print what they say (doctest), and every public function has one."""

import doctest
import importlib
import inspect

import jax.numpy as jnp
import numpy as np
import pytest

from gedl_jax import evidential as ev

MODULES = ["gedl_jax.evidential", "gedl_jax.evidential.activations",
           "gedl_jax.evidential.dirichlet", "gedl_jax.evidential.loss_terms",
           "gedl_jax.evidential.prior", "gedl_jax.evidential.schedules",
           "gedl_jax.evidential.uncertainty"]
PUBLIC_FUNCTIONS = [n for n in ev.__all__ if inspect.isfunction(getattr(ev, n))]


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run(module_name):
    module = importlib.import_module(module_name)
    # The namespace the package docstring states: jnp, np and ev.
    result = doctest.testmod(module, extraglobs={"jnp": jnp, "np": np, "ev": ev},
                             optionflags=doctest.ELLIPSIS, verbose=False, report=True)
    assert result.attempted > 0, f"{module_name} has no examples"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed"


# Modules beyond the evidential math whose docstrings show examples too (no namespace given).
OTHER_MODULES = ["gedl_jax.data.registry", "gedl_jax.evaluation.tables.context", "gedl_jax.paper",
                 "gedl_jax.evaluation.against_paper",
                 "gedl_jax.evaluation.metrics", "gedl_jax.evaluation.calibration",
                 "gedl_jax.evaluation.checks"]


@pytest.mark.parametrize("module_name", OTHER_MODULES)
def test_other_docstring_examples_run(module_name):
    result = doctest.testmod(importlib.import_module(module_name), verbose=False, report=True)
    assert result.attempted > 0, f"{module_name} has no examples"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed"


@pytest.mark.parametrize("name", PUBLIC_FUNCTIONS)
def test_every_public_function_has_an_example(name):
    doc = inspect.getdoc(getattr(ev, name)) or ""
    assert "Example:\n  >>> " in doc, f"ev.{name} has no runnable example"

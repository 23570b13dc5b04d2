"""Old module names (gedl_jax._MOVED) still import for one release: reading a name from one
warns (DeprecationWarning naming the new place) and gives the new module's object; tools that
walk sys.modules see no warning."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import warnings

import pytest

import gedl_jax


def _public_name(module) -> str:
    return next(n for n in sorted(vars(module)) if not n.startswith("_"))


@pytest.mark.parametrize("old", sorted(gedl_jax._MOVED))
def test_an_old_name_warns_and_reads_from_the_new_module(old):
    new = importlib.import_module(gedl_jax._MOVED[old])
    name = _public_name(new)
    alias = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new.__name__}"):
        value = getattr(alias, name)
    assert value is getattr(new, name)
    with pytest.warns(DeprecationWarning):
        exec(f"from {old} import {name} as imported", namespace := {})
    assert namespace["imported"] is getattr(new, name)
    with pytest.raises(AttributeError), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        alias.no_such_name_anywhere   # noqa: B018


def test_submodules_and_package_attributes_of_old_names():
    from gedl_jax.methods import duq

    with pytest.warns(DeprecationWarning, match="gedl_jax.baselines moved"):
        import gedl_jax.baselines.duq as old_duq   # `as` reads duq from the old package
    assert old_duq is duq
    with pytest.warns(DeprecationWarning):
        from gedl_jax.baselines import duq as via_package
    assert via_package is duq
    assert gedl_jax.steps is sys.modules["gedl_jax.steps"]
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        gedl_jax.nothing   # noqa: B018


def test_walking_sys_modules_neither_warns_nor_imports():
    """inspect.getmodule reads __file__ of every module in sys.modules: the old names answer
    without a warning and without importing their new modules (checked in a fresh process)."""
    code = ("import warnings, sys, inspect\n"
            "warnings.simplefilter('error')\n"
            "import gedl_jax\n"
            "assert inspect.getmodule(inspect.getmodule) is inspect\n"
            "assert 'gedl_jax.run.steps' not in sys.modules and 'jax' not in sys.modules\n"
            "import gedl_jax.steps, gedl_jax.baselines.duq\n"
            "assert 'gedl_jax.run.steps' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_own_loop_names_load_on_first_use():
    assert gedl_jax.EvidentialObjective is importlib.import_module(
        "gedl_jax.methods.own_loop").EvidentialObjective
    assert inspect.getmodule(gedl_jax.EvidentialObjective).__name__ == "gedl_jax.methods.own_loop"

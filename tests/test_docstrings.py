"""Every public name has a docstring: the modules of the API reference (the `gedl_jax.<name>:
api/<page>.md` entries of mkdocs.yml's nav, which list every module of `gedl_jax.run` too:
tests/test_docs_site.py), and in each the names it exports (`__all__`, else every function and
class it defines without a leading underscore), with the public methods of those classes. These are
the names the docs site's API reference shows (mkdocstrings, `filters: public`)."""

from __future__ import annotations

import importlib
import inspect
import warnings

from tools import api_pages


def api_modules() -> list[str]:
    return [module for module, _ in api_pages.entries()]


def public_names(module) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return [n for n, o in vars(module).items()
            if not n.startswith("_") and (inspect.isfunction(o) or inspect.isclass(o))
            and o.__module__ == module.__name__]


def missing_docstrings(name: str) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = importlib.import_module(name)
    missing = [] if inspect.getdoc(module) else [name]
    for attr in public_names(module):
        obj = getattr(module, attr)
        if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.ismodule(obj)):
            continue   # constants and type aliases: documented where they are defined
        if not inspect.getdoc(obj):
            missing.append(f"{name}.{attr}")
        if inspect.isclass(obj):
            missing += [f"{name}.{attr}.{m}" for m, f in vars(obj).items()
                        if not m.startswith("_") and inspect.isfunction(f)
                        and f.__name__ == m and not f.__doc__]   # (not a lambda field default)
    return missing


def test_the_api_reference_lists_the_public_packages():
    modules = set(api_modules())
    for package in ("evidential", "evaluation", "networks", "methods", "data", "run",
                    "config", "configs", "train", "evaluate"):
        assert f"gedl_jax.{package}" in modules


def test_every_public_name_has_a_docstring():
    missing = [m for name in api_modules() for m in missing_docstrings(name)]
    assert not missing, "no docstring: " + ", ".join(missing)

"""The operator has one exception root, and its hierarchy docstring names every error."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import agentsafe.operator
from agentsafe.operator import errors
from agentsafe.operator.errors import OperatorError


def _operator_exceptions() -> list[type[BaseException]]:
    classes: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(agentsafe.operator.__path__, "agentsafe.operator."):
        module = importlib.import_module(info.name)
        for _name, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == module.__name__:
                classes[f"{value.__module__}.{value.__qualname__}"] = value
    return list(classes.values())


def test_every_operator_error_is_under_the_one_root() -> None:
    found = _operator_exceptions()
    assert len(found) > 5
    outside = [cls.__qualname__ for cls in found if not issubclass(cls, OperatorError)]
    assert outside == []


def test_the_hierarchy_docstring_names_every_error() -> None:
    doc = errors.__doc__ or ""
    named = set(re.findall(r"[├└]── (\w+)", doc)) | {"OperatorError"}
    public = {cls.__name__ for cls in _operator_exceptions() if not cls.__name__.startswith("_")}
    assert public - named == set(), "operator/errors.py's docstring misses some"
    assert named - public == set(), "operator/errors.py's docstring names a class that is gone"

"""A class an option names (`optim.spec_rule`, `search.algorithm`), so that a researcher's
own rule or search algorithm runs without editing tts. A value is one of:

- a built-in's name (the caller's registry: `RULES`, `POLICIES`), first;
- an installed package's entry point in the option's group (`tts.spec_rules`,
  `tts.search_algorithms`), looked up with `importlib.metadata` as vLLM finds its plugins:
  a package declares `[project.entry-points."tts.spec_rules"] first_child =
  "mypkg.rules:FirstChild"` and the plain word `first_child` names it;
- `module:attribute`, a class in the user's own module. The module is imported as
  `python -m` would import it from the folder `tts` was started in: that folder goes first
  on `sys.path` (besides `PYTHONPATH` and what is installed). A launcher's job (Hydra's
  joblib processes, a Ray worker) imports it from the folder the sweep was started in
  (`hydra.runtime.cwd`, `tts.hydra_app`), so a cluster whose workers run on other hosts
  needs that folder at the same path there, or the module installed.

The plain name (a run's variant label and folder name, never `module:attribute`) is the
built-in's or the entry point's name, else the class's own `name` attribute, else the
attribute's name lowercased.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from typing import NamedTuple


class Named(NamedTuple):
    name: str  # the plain name: labels and folder names
    cls: type


def on_path(folder: str) -> None:
    """`folder` first on `sys.path`, as `python -m` puts the folder it starts in (once)."""
    folder = os.path.abspath(folder)
    if folder not in sys.path:
        sys.path.insert(0, folder)


def installed(group: str) -> list[str]:
    """The names of the entry points installed packages declare in `group`."""
    return sorted({ep.name for ep in entry_points(group=group)})


def load_class(field: str, value: str, builtins: Mapping[str, type], group: str, kind: type,
               also: Sequence[str] = ()) -> Named:
    """The class `value` names (module docstring), a concrete subclass of `kind`, with its
    plain name. A ValueError of one line names `field`, what was tried, and the valid
    choices (`also`: names the caller takes itself, listed first, such as `auto`)."""
    if value in builtins:
        return Named(value, builtins[value])
    try:
        return _load(value, builtins, group, kind)
    except ValueError as err:  # the installed names are looked up only now, for the message
        raise ValueError(f"{field}: {err}; valid choices: {', '.join([*also, *builtins, *installed(group)])}, "
                         "or module:attribute (a class in your own module: mymodule:MyClass)") from err.__cause__


def _load(value: str, builtins: Mapping[str, type], group: str, kind: type) -> Named:
    """`load_class` for a value that is no built-in's name; a ValueError says why not."""
    module, colon, attr = value.partition(":")
    if not colon:
        found = [ep for ep in entry_points(group=group) if ep.name == value]
        if not found:
            raise ValueError(f"unknown {value!r} (not a built-in, nor an installed package's entry point in {group})")
        try:
            obj = found[0].load()
        except Exception as err:  # the package's own import failing, whatever it raised
            raise ValueError(f"{value!r}, entry point {found[0].value} of {group}, does not load "
                             f"({_first_line(err)})") from err
        return Named(value, _checked(value, obj, kind))
    if not module or not attr:
        raise ValueError(f"{value!r} is not module:attribute")
    on_path(os.getcwd())
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as err:  # a module not found, a missing attribute, or the module's own error
        raise ValueError(f"{value!r} does not import ({_first_line(err)}; modules are found from "
                         f"{os.getcwd()}, PYTHONPATH and installed packages)") from err
    cls = _checked(value, obj, kind)
    declared = cls.__dict__.get("name")
    name = declared if isinstance(declared, str) and declared else attr.rpartition(".")[2].lower()
    if builtins.get(name, cls) is not cls:
        raise ValueError(f"{value!r} is named {name!r}, as the built-in {builtins[name].__name__} is; "
                         "give the class another `name`")
    return Named(name, cls)


def _checked(value: str, obj: object, kind: type) -> type:
    """`obj` where it is a concrete subclass of `kind`; else a ValueError says what it is."""
    if not (isinstance(obj, type) and issubclass(obj, kind)):
        raise ValueError(f"{value!r} is {obj!r}, not a {kind.__name__} subclass")
    if inspect.isabstract(obj):
        raise ValueError(f"{value!r} is abstract: it does not define {', '.join(sorted(obj.__abstractmethods__))}")
    return obj


def _first_line(err: Exception) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__

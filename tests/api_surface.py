"""Fakes built from an API-surface table (``tests/data/tensorrt_api.json``), so they cannot drift from it.

A fake class names the table class it stands for (``Surface`` subclass with ``api = "ILayer"``). Reading a public
member the table does not list raises ``NotInApiTable`` (an AttributeError, as the real binding would raise); a
method's arguments and every returned value are checked against the declared types, so the fake cannot return
what the real API never does (an object with ``.numpy()`` where TensorRT returns an ndarray). ``SurfaceModule``
does the same for a module's names, and ``enums`` builds each table enum with exactly the table's values.

Versions: a section with ``versions`` (TensorRT's, written by ``scripts/tensorrt_api_table.py`` from the real
bindings wheels) lists per version the members it lacks. ``enums`` and ``SurfaceModule`` take the version to
imitate (default: the newest the table holds) and refuse what that version lacks, naming the version:
``BuilderFlag.INT8`` under 11.x raises ``NotInApiTable``, as the real 11.x bindings raise AttributeError.
"""

from __future__ import annotations

import enum
import functools
import json
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

TABLE_PATH = Path(__file__).resolve().parent / "data" / "tensorrt_api.json"


@functools.cache
def table() -> dict[str, Any]:
    """The API-surface table."""
    return json.loads(TABLE_PATH.read_text())


class NotInApiTable(AttributeError):
    """Code touched a member the API-surface table does not list (or a fake broke a declared type)."""


REGISTRY: dict[str, type | tuple[type, ...]] = {}  # table type name → fake class or enums (one per version)


def versions(section: str) -> list[str]:
    """The versions the table describes for ``section``, oldest first ([] where it has no versions)."""
    return sorted(table()[section].get("versions", {}), key=lambda v: tuple(int(p) for p in v.split(".")))


def imitated(section: str, version: str | None = None) -> str:
    """The table version that stands for ``version``: itself, the one of its major version, or the newest."""
    known = versions(section)
    if version is None or not known:
        return known[-1] if known else ""
    if version in known:
        return version
    same_major = [v for v in known if v.split(".")[0] == str(version).split(".")[0]]
    if not same_major:
        raise NotInApiTable(f"the table has no {section} {version}; it describes {', '.join(known)}")
    return same_major[-1]


def absent(section: str, version: str | None = None) -> frozenset[str]:
    """Dotted members ('BuilderFlag.INT8') the table lists but ``version`` lacks."""
    spec = table()[section].get("versions")
    return frozenset(spec[imitated(section, version)]["absent"]) if spec else frozenset()


def _refusal(section: str, version: str, dotted: str) -> str:
    note = table()[section].get("enum_notes", {}).get(dotted, "")
    why = f" ({note})" if note else ""
    return f"{dotted} is not in {section} {version}{why} (tests/data/tensorrt_api.json)"


def conforms(value: Any, declared: str) -> bool:
    """Whether ``value`` is of the table type ``declared`` ('int', 'Dims', 'ILayer | None', ...)."""
    if " | " in declared:
        return any(conforms(value, part) for part in declared.split(" | "))
    if declared == "None":
        return value is None
    if declared == "int":
        return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if declared == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if declared == "Dims":
        return isinstance(value, (tuple, list)) and all(conforms(d, "int") for d in value)
    if declared == "list[Dims]":
        return isinstance(value, list) and all(conforms(d, "Dims") for d in value)
    simple = {"str": str, "bool": bool, "bytes": (bytes, bytearray), "numpy.ndarray": np.ndarray, "type": type}
    if declared in simple:
        return isinstance(value, simple[declared])
    if declared not in REGISTRY:
        raise NotInApiTable(f"type '{declared}' has no fake; add one built from the table")
    return isinstance(value, REGISTRY[declared])


def _check(what: str, value: Any, declared: str | list[str]) -> Any:
    if isinstance(declared, list):  # cuda-python's (err, value...) tuple
        ok = isinstance(value, tuple) and len(value) == len(declared)
        if not ok or not all(conforms(v, d) for v, d in zip(value, declared, strict=True)):
            raise NotInApiTable(f"{what} returned {value!r}; the table says a tuple ({', '.join(declared)})")
        return value
    if not conforms(value, declared):
        raise NotInApiTable(f"{what} returned {type(value).__name__} {value!r:.60}; the table says {declared}")
    return value


def checked_call(what: str, function: Callable, spec: Mapping[str, Any]) -> Callable:
    """``function`` with its positional arguments and its result checked against ``spec``."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        declared = spec["args"]
        if kwargs or len(args) != len(declared):
            raise NotInApiTable(f"{what} takes {len(declared)} positional arguments ({', '.join(declared)})")
        for i, (arg, kind) in enumerate(zip(args, declared, strict=True)):
            if not conforms(arg, kind):
                raise NotInApiTable(f"{what} argument {i} is {type(arg).__name__} {arg!r:.40}; the table says {kind}")
        return _check(what, function(*args), spec["returns"])

    return call


def members(section: str, api: str, version: str | None = None) -> dict[str, Any]:
    """The table's members of class ``api`` that ``version`` has, its bases' included."""
    spec = table()[section]["classes"][api]
    found: dict[str, Any] = {}
    for base in spec.get("bases", ()):
        found |= members(section, base, version)
    lacking = absent(section, version)
    return found | {name: m for name, m in spec["members"].items() if f"{api}.{name}" not in lacking}


class Surface:
    """Base of the fake classes: only the table's members are readable, and their types are checked."""

    api: ClassVar[str]
    section: ClassVar[str] = "tensorrt"
    # The table version whose members are readable (None: the newest). No class member the table lists differs
    # between its versions today (test_tensorrt_api checks), so the fakes share one set of classes.
    imitates: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "api" in cls.__dict__:
            REGISTRY[cls.api] = cls
            declared = {n for v in versions(cls.section) or [None] for n in members(cls.section, cls.api, v)}
            own = ("api", "imitates")
            extra = [n for n in cls.__dict__ if not n.startswith("_") and n not in declared and n not in own]
            if extra:
                raise NotInApiTable(f"fake {cls.__name__} defines {extra}, which {cls.api} does not have")

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("_") or name in ("api", "section", "imitates"):
            return object.__getattribute__(self, name)
        api = type(self).api
        spec = members(type(self).section, api, type(self).imitates).get(name)
        if spec is None:
            raise NotInApiTable(f"'{api}' object has no attribute '{name}' (not in tests/data/tensorrt_api.json)")
        value = object.__getattribute__(self, name)
        if spec["kind"] == "method":
            return checked_call(f"{api}.{name}", value, spec)
        return _check(f"{api}.{name}", value, spec["type"])

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_"):
            spec = members(type(self).section, type(self).api, type(self).imitates).get(name)
            if spec is None or not spec.get("settable"):
                raise NotInApiTable(f"'{type(self).api}.{name}' is not a settable member in the table")
            _check(f"{type(self).api}.{name} =", value, spec["type"])
        object.__setattr__(self, name, value)


class _RefusingEnumType(enum.EnumType):
    """An enum class whose missing members raise NotInApiTable, naming the version that lacks them."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        section, version, lacking = type.__getattribute__(cls, "_surface_")
        dotted = f"{type.__getattribute__(cls, '_table_name_')}.{name}"
        if dotted in lacking:
            raise NotInApiTable(_refusal(section, version, dotted))
        where = "(not in tests/data/tensorrt_api.json)"
        raise NotInApiTable(f"type object '{cls.__name__}' has no attribute '{name}' {where}")


class _IntEnum(enum.IntEnum, metaclass=_RefusingEnumType):
    pass


class _Enum(enum.Enum, metaclass=_RefusingEnumType):
    pass


@functools.cache
def enums(section: str, version: str | None = None) -> dict[str, type[enum.Enum]]:
    """Each table enum of ``section`` with the values ``version`` has (registered for type checks)."""
    version = imitated(section, version)
    lacking = absent(section, version)
    made = {}
    for name, values in table()[section]["enums"].items():
        base = _IntEnum if table()[section]["int_enums"] else _Enum
        kept = [v for v in values if f"{name}.{v}" not in lacking]
        made[name] = base(name.rsplit(".", 1)[-1], kept)
        type.__setattr__(made[name], "_surface_", (section, version, lacking))
        type.__setattr__(made[name], "_table_name_", name)
        known = REGISTRY.get(name, ())
        REGISTRY[name] = (*(known if isinstance(known, tuple) else (known,)), made[name])
    return made


class SurfaceModule(types.ModuleType):
    """A module whose public names are the table's ``module`` section (less what ``version`` lacks); functions are
    checked like methods."""

    def __init__(self, name: str, section: str, values: Mapping[str, Any], version: str | None = None) -> None:
        super().__init__(name)
        version = imitated(section, version)
        spec = {n: s for n, s in table()[section]["module"].items() if n not in absent(section, version)}
        missing = sorted(set(spec) - set(values))
        extra = sorted(n for n in values if n not in spec and not n.startswith("_"))  # _state: the fake's own
        if missing or extra:
            raise NotInApiTable(f"fake {name}: missing {missing}, not in the table {extra}")
        object.__setattr__(self, "_section", section)
        object.__setattr__(self, "_spec", spec)
        object.__setattr__(self, "_imitates", version)
        for key, value in values.items():
            object.__setattr__(self, key, value)

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("_") and name != "__version__":
            return object.__getattribute__(self, name)
        spec = object.__getattribute__(self, "_spec").get(name)
        if spec is None:
            module, section = object.__getattribute__(self, "__name__"), object.__getattribute__(self, "_section")
            version = object.__getattribute__(self, "_imitates")
            if name in absent(section, version):
                raise NotInApiTable(f"module '{module}' has no attribute '{name}': " + _refusal(section, version, name))
            raise NotInApiTable(f"module '{module}' has no attribute '{name}' (not in tests/data/tensorrt_api.json)")
        value = object.__getattribute__(self, name)
        if spec["kind"] == "function":
            return checked_call(name, value, spec)
        if spec["kind"] == "attribute" and spec["type"] != "enum":
            return _check(name, value, spec["type"])
        return value

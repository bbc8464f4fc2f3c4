"""Whether `--override KEY=JSON` settings are ones this vLLM's `EngineArgs` takes: each key a
field of it, each value of the type the field declares. Checked before anything is made, so a
typo or a value of the wrong type is refused by name instead of reaching the engine (or, worse,
being taken: `enable_prefix_caching="maybe"` is a true value to Python).

The types are read from the installed vLLM, never copied into the kit: the annotations of
`EngineArgs`' dataclass fields, widened by `LLM.__init__`'s where it declares the same
parameter (it also takes a dict for a config object, an int for `compilation_config`).

An override value is JSON, so only a JSON value can fit: null always does (it removes the
setting, leaving vLLM's default), an integer fits `float`, a JSON object fits a config class
(vLLM builds the config from its fields), a string fits an enum by a member's name or value.
A type no JSON value can be (a callable, a class, `torch.dtype`) fits nothing. A field whose
annotation cannot be resolved in this vLLM is not checked by type, and the check says so.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import enum
import json
import sys
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from repro.core.errors import ReproError


class OverrideRefused(ReproError):
    """An --override this vLLM's EngineArgs does not take (an unknown key or a value of
    another type)."""


@dataclass(frozen=True)
class OverrideCheck:
    """What the check did: `notes` say what it could not check, and why (never silent)."""

    checked: bool
    notes: list[str] = field(default_factory=list)


# A verdict of `fits`: True, False, or None where the annotation cannot be decided.
Fit = bool | None

_SEQUENCES = (list, set, frozenset, tuple, collections.abc.Sequence, collections.abc.Set)
_MAPPINGS = (dict, collections.abc.Mapping)


def check_overrides(overrides: dict[str, Any], *, flag: str = "--override") -> OverrideCheck:
    """Refuse an override this Python's vLLM would not take; raises `OverrideRefused`.

    Without an importable vLLM nothing can be checked: the result says so, and the caller
    prints it (a run in that Python cannot start an engine either).
    """
    if not overrides:
        return OverrideCheck(checked=True)
    try:
        fields_, version = engine_arg_fields()
    except Exception as exc:  # an import of vLLM can fail in many ways (ImportError, OSError…)
        return OverrideCheck(
            checked=False,
            notes=[
                f"{flag} keys and values not checked: vLLM is not importable in this Python "
                f"({type(exc).__name__}: {exc}), so its EngineArgs cannot be read; run where "
                "vLLM is installed (its engine needs it too)"
            ],
        )
    unknown = []
    for key in overrides:
        if key not in fields_:
            near = difflib.get_close_matches(key, list(fields_), n=1)
            unknown.append(f"{key} (did you mean {near[0]}?)" if near else key)
    if unknown:
        raise OverrideRefused(
            f"{flag}: vLLM {version} has no engine argument {', '.join(unknown)}; nothing was "
            "started (the names are EngineArgs' fields, as in `vllm serve --help` with _ for -)"
        )
    wrong: list[str] = []
    notes: list[str] = []
    for key, value in overrides.items():
        annotation = fields_[key]
        verdict = None if value is None else fits(annotation, value)
        if value is None or verdict is True:
            continue
        if verdict is None:
            notes.append(
                f"{flag} {key}: not checked by type; vLLM {version} declares it as "
                f"{_text(annotation)}, which the kit cannot read as JSON types"
            )
            continue
        wrong.append(
            f"{flag} {key}={json.dumps(value)}: vLLM {version}'s EngineArgs.{key} takes "
            f"{describe(annotation)} (or null for vLLM's default), found {_found(value)}"
        )
    if wrong:
        raise OverrideRefused(
            "; ".join(wrong) + "; give the value as JSON of that type (numbers bare, strings "
            "in double quotes, true or false); nothing was started"
        )
    return OverrideCheck(checked=True, notes=notes)


def engine_arg_fields() -> tuple[dict[str, Any], str]:
    """Each `EngineArgs` field's annotation, resolved where it can be (else its text), and
    vLLM's version. Imports vLLM."""
    # lazy: vllm, found only in an engine environment
    import vllm
    from vllm.engine.arg_utils import EngineArgs

    widened = _llm_parameter_types()
    out = {}
    for f in dataclasses.fields(EngineArgs):
        annotation = _resolve(EngineArgs, f.name, f.type)
        extra = widened.get(f.name)
        out[f.name] = annotation if extra is None else typing.Union[annotation, extra]  # noqa: UP007
    return out, str(getattr(vllm, "__version__", "?"))


def _llm_parameter_types() -> dict[str, Any]:
    """`LLM.__init__`'s parameter types, where they resolve (the kit passes settings there)."""
    try:
        # lazy: vllm, found only in an engine environment
        from vllm import LLM

        hints = typing.get_type_hints(LLM.__init__)
    except Exception:  # another release's LLM may not resolve: EngineArgs' types alone then
        return {}
    hints.pop("return", None)
    return hints


def _resolve(cls: type, name: str, annotation: Any) -> Any:
    """An annotation as a type: a string one is evaluated in the module that declared it.

    Field by field: `typing.get_type_hints(EngineArgs)` fails whole on a single name that
    module imports only for type checkers (vLLM 0.32.0's `QuantizationConfigArgs`)."""
    if not isinstance(annotation, str):
        return annotation
    owner = next((c for c in cls.__mro__ if name in vars(c).get("__annotations__", {})), cls)
    holder = type("_Field", (), {"__annotations__": {name: annotation}})
    try:
        module = vars(sys.modules[owner.__module__])
        return typing.get_type_hints(holder, globalns=module)[name]
    except Exception:
        return annotation  # left as text: `fits` cannot decide it, and the check says so


def fits(annotation: Any, value: Any) -> Fit:
    """Whether the JSON `value` is of the type `annotation` (None: cannot be decided)."""
    if isinstance(annotation, str | typing.ForwardRef):
        return None
    if annotation is Any or annotation is object:
        return True
    if annotation is None or annotation is type(None):
        return value is None
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return fits(args[0], value)
    if origin is typing.Union or origin is types.UnionType:
        return _any_of(fits(arg, value) for arg in args)
    if origin is typing.Literal:
        # 1 == True in Python; a Literal[1] does not take true.
        return any(type(value) is type(arg) and value == arg for arg in args)
    if origin is not None:
        return _generic(origin, args, value)
    if isinstance(annotation, typing.TypeVar):
        return None
    if hasattr(annotation, "__supertype__"):  # typing.NewType
        return fits(annotation.__supertype__, value)
    if not isinstance(annotation, type):
        return None
    return _class(annotation, value)


def _class(cls: type, value: Any) -> Fit:
    if cls is bool:
        return isinstance(value, bool)
    if cls is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if cls is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if cls is str:
        return isinstance(value, str)
    if issubclass(cls, enum.Enum):
        return any(
            value == member.name or (type(value) is type(member.value) and value == member.value)
            for member in cls
        )
    if issubclass(cls, _MAPPINGS):
        return isinstance(value, dict)
    if issubclass(cls, _SEQUENCES) and not issubclass(cls, str):
        return isinstance(value, list)
    if dataclasses.is_dataclass(cls) or hasattr(cls, "model_fields"):
        return isinstance(value, dict)  # vLLM builds a config object from a dict of its fields
    return False  # a class no JSON value is (torch.dtype, a connector class…)


def _generic(origin: Any, args: tuple[Any, ...], value: Any) -> Fit:
    if origin is type or origin is collections.abc.Callable:
        return False  # a class or a function: no JSON value is one
    if isinstance(origin, type) and issubclass(origin, _MAPPINGS):
        if not isinstance(value, dict):
            return False
        return _all_of(fits(args[1], v) for v in value.values()) if len(args) == 2 else True
    if isinstance(origin, type) and issubclass(origin, _SEQUENCES):
        if not isinstance(value, list):  # JSON's only sequence (a set or tuple is given as one)
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                return False
            return _all_of(fits(a, v) for a, v in zip(args, value, strict=True))
        return _all_of(fits(args[0], v) for v in value) if args else True
    if isinstance(origin, type):
        return _class(origin, value)
    return None


def _any_of(verdicts: collections.abc.Iterable[Fit]) -> Fit:
    seen = list(verdicts)
    if True in seen:
        return True
    return None if None in seen else False


def _all_of(verdicts: collections.abc.Iterable[Fit]) -> Fit:
    seen = list(verdicts)
    if False in seen:
        return False
    return None if None in seen else True


def describe(annotation: Any) -> str:
    """The type in words, as a refusal says it ("an integer", "true or false", "one of …")."""
    if annotation is Any or annotation is object:
        return "any value"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return describe(args[0])
    if origin is typing.Union or origin is types.UnionType:
        parts = [a for a in args if a is not type(None) and _json_can_be(a)]
        # A part this vLLM's annotations left unresolved says nothing beside the others.
        readable = [a for a in parts if not isinstance(a, str | typing.ForwardRef)] or parts
        return " or ".join(dict.fromkeys(describe(a) for a in readable)) or _text(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(json.dumps(a) for a in args)
    if isinstance(origin, type) and issubclass(origin, _MAPPINGS):
        each = args[1] if len(args) == 2 else Any
        return "a JSON object" + _each("value", each)
    if isinstance(origin, type) and issubclass(origin, _SEQUENCES):
        return "a list" + _each("item", args[0] if args else Any)
    if isinstance(annotation, type):
        if annotation in _WORDS:
            return _WORDS[annotation]
        if issubclass(annotation, enum.Enum):
            return "one of " + ", ".join(json.dumps(m.name) for m in annotation)
        if issubclass(annotation, _MAPPINGS):
            return "a JSON object"
        if issubclass(annotation, _SEQUENCES):
            return "a list"
        if dataclasses.is_dataclass(annotation) or hasattr(annotation, "model_fields"):
            return f"a JSON object of {annotation.__name__}'s fields"
    return _text(annotation)


_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_PLURALS = {bool: "true/false values", int: "integers", float: "numbers", str: "strings"}


def _each(what: str, annotation: Any) -> str:
    """How a container's items are described: " of strings", ", each value one of …"."""
    if annotation is Any or annotation is object:
        return ""
    if annotation in _PLURALS:
        return f" of {_PLURALS[annotation]}"
    return f", each {what} {describe(annotation)}"


def _json_can_be(annotation: Any) -> bool:
    """Whether some JSON value could fit `annotation` (a union's callable or class part: no)."""
    origin = typing.get_origin(annotation)
    if origin is type or origin is collections.abc.Callable:
        return False
    if origin is None and isinstance(annotation, type):
        return (
            annotation in (bool, int, float, str)
            or issubclass(annotation, (enum.Enum, *_MAPPINGS, *_SEQUENCES))
            or dataclasses.is_dataclass(annotation)
            or hasattr(annotation, "model_fields")
        )
    return True


def _text(annotation: Any) -> str:
    if isinstance(annotation, typing.ForwardRef):
        return annotation.__forward_arg__
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _found(value: Any) -> str:
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {json.dumps(value)}"
    if isinstance(value, str):
        return f"the string {json.dumps(value)}"
    if isinstance(value, list):
        return f"the list {json.dumps(value)}"
    return f"the object {json.dumps(value)}"

"""The engine's payload converter: Temporal's default one, with dataclasses decoded faster.

Temporal's JSON converter rebuilds a dataclass from its payload by resolving the class's type
hints (`typing.get_type_hints`, which evaluates every annotation string) at each decode. A job's
workflow and stages decode about a dozen stage payloads (engine/contracts.py) per job, so that
lookup alone was a visible share of the worker's CPU per job. `CachedDataclassHints` does what
the default converter does for a dataclass (same fields, unknown keys ignored, the same errors)
with each class's hints resolved once. The wire format is unchanged: payloads are encoded by the
default converter and stay plain JSON, so histories recorded before decode the same, and any
other SDK or converter reads what this one writes.

This module is passed through Temporal's workflow sandbox (it is under `engine`): the cache
lives once per process, not once per workflow run.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import typing
from typing import Any

from temporalio.converter import (
    CompositePayloadConverter,
    DataConverter,
    DefaultPayloadConverter,
    JSONPlainPayloadConverter,
    JSONTypeConverter,
    value_to_type,
)

_Field = tuple[str, Any, bool]  # name, resolved hint, init

# One entry per dataclass, for the process: Temporal builds a payload converter per workflow run
# (and per serialization context), so a cache held by the converter would start empty each time.
_FIELDS: dict[type, tuple[_Field, ...]] = {}


class CachedDataclassHints(JSONTypeConverter):
    """A dataclass hint, decoded as `temporalio.converter.value_to_type` decodes it, with the
    class's resolved type hints kept per class."""

    def __init__(self) -> None:
        self._converters: tuple[JSONTypeConverter, ...] = (self,)

    def _fields_of(self, hint: Any) -> tuple[_Field, ...] | None:
        if not isinstance(hint, type):
            return None
        got = _FIELDS.get(hint)
        if got is not None:
            return got
        if not dataclasses.is_dataclass(hint) or issubclass(hint, collections.abc.Mapping):
            return None  # the default converter's other branches (a Mapping goes first there)
        hints = typing.get_type_hints(hint)
        got = tuple((f.name, hints[f.name], f.init) for f in dataclasses.fields(hint))
        _FIELDS[hint] = got
        return got

    def to_typed_value(self, hint: type, value: Any) -> Any:
        fields = self._fields_of(hint)
        if fields is None:
            return JSONTypeConverter.Unhandled
        if not isinstance(value, dict):
            raise TypeError(f"Cannot convert to dataclass {hint}, value is {type(value)} not dict")
        init: dict[str, Any] = {}
        late: dict[str, Any] = {}
        for name, field_hint, is_init in fields:
            field_value = value.get(name, dataclasses.MISSING)
            if field_value is dataclasses.MISSING:
                continue  # a missing required field fails in the constructor, as by default
            try:
                converted = value_to_type(field_hint, field_value, self._converters)
            except Exception as err:
                raise TypeError(f"Failed converting field {name} on dataclass {hint}") from err
            (init if is_init else late)[name] = converted
        obj = hint(**init)
        for name, field_value in late.items():
            object.__setattr__(obj, name, field_value)
        return obj


class EnginePayloadConverter(CompositePayloadConverter):
    """Temporal's default payload converters, the JSON one with `CachedDataclassHints`."""

    def __init__(self) -> None:
        super().__init__(
            *(
                JSONPlainPayloadConverter(custom_type_converters=[CachedDataclassHints()])
                if isinstance(c, JSONPlainPayloadConverter)
                else c
                for c in DefaultPayloadConverter.default_encoding_payload_converters
            )
        )


DATA_CONVERTER = dataclasses.replace(
    DataConverter.default, payload_converter_class=EnginePayloadConverter
)

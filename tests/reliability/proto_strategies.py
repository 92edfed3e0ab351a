"""Hypothesis strategies for arbitrary protobuf messages, built from their descriptors.

    messages(tokenizer_pb2.TokenizeRequest, overrides={"TokenizeRequest.model": st.just(M)})

Every field may be left unset; scalars mix plausible values (so that a message gets past the
first check) with those that break code (0, -1, the type's limits, NaN and infinities, empty
and odd strings); repeated fields get a few elements, map
fields a few entries, nested messages recurse to a bounded depth, and at most one member of
each oneof is set. An override (keyed by "Message.field", the message's own name) replaces a
field's whole value strategy: a list for a repeated field, None to leave the field unset.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

Overrides = Mapping[str, st.SearchStrategy[Any]]
MAX_REPEATED = 4
MAX_DEPTH = 3

_F = FieldDescriptor


def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    """Plausible small values (so that requests get past the first check), the type's edges,
    and anything in between."""
    edges = sorted({v for v in (0, 1, -1, low, high, low + 1, high - 1) if low <= v <= high})
    plausible = st.integers(max(low, 0), min(high, 16))
    return st.one_of(plausible, st.sampled_from(edges), st.integers(low, high))


def _floats(width: int) -> st.SearchStrategy[float]:
    return st.one_of(st.floats(0, 1, width=width), st.floats(width=width))  # NaN, inf included


_SIGNED32 = _integers(-(2**31), 2**31 - 1)
_SIGNED64 = _integers(-(2**63), 2**63 - 1)
_UNSIGNED32 = _integers(0, 2**32 - 1)
_UNSIGNED64 = _integers(0, 2**64 - 1)
# Protobuf strings must be valid Unicode (no lone surrogates: the client refuses to send them).
ODD_STRINGS = st.one_of(
    st.sampled_from(["", " ", "\x00", "\ufffd", "\u202e", "\U0001f600", "a" * 10_000, "-1"]),
    st.text(max_size=40),
)

_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    _F.TYPE_INT32: _SIGNED32,
    _F.TYPE_SINT32: _SIGNED32,
    _F.TYPE_SFIXED32: _SIGNED32,
    _F.TYPE_INT64: _SIGNED64,
    _F.TYPE_SINT64: _SIGNED64,
    _F.TYPE_SFIXED64: _SIGNED64,
    _F.TYPE_UINT32: _UNSIGNED32,
    _F.TYPE_FIXED32: _UNSIGNED32,
    _F.TYPE_UINT64: _UNSIGNED64,
    _F.TYPE_FIXED64: _UNSIGNED64,
    _F.TYPE_BOOL: st.booleans(),
    _F.TYPE_FLOAT: _floats(32),
    _F.TYPE_DOUBLE: _floats(64),
    _F.TYPE_STRING: ODD_STRINGS,
    _F.TYPE_BYTES: st.binary(max_size=64),
}


def messages(
    message_class: type[Message], overrides: Overrides | None = None, depth: int = MAX_DEPTH
) -> st.SearchStrategy[Message]:
    """Instances of message_class with any subset of fields set."""
    return _message(message_class.DESCRIPTOR, message_class, dict(overrides or {}), depth)


def _message(
    descriptor: Descriptor, message_class: type[Message], overrides: Overrides, depth: int
) -> st.SearchStrategy[Message]:
    @st.composite
    def build(draw: st.DrawFn) -> Message:
        msg = message_class()
        chosen_oneofs = {
            oneof.name: draw(st.sampled_from([None, *(f.name for f in oneof.fields)]))
            for oneof in descriptor.oneofs
        }
        for field in descriptor.fields:
            oneof = field.containing_oneof
            if oneof is not None and chosen_oneofs[oneof.name] != field.name:
                continue
            value = draw(_field_value(descriptor, field, overrides, depth))
            if value is not None:
                _assign(msg, field, value)
        return msg

    return build()


def _field_value(
    owner: Descriptor, field: FieldDescriptor, overrides: Overrides, depth: int
) -> st.SearchStrategy[Any]:
    key = f"{owner.name}.{field.name}"
    if key in overrides:
        return overrides[key]
    if _is_map(field):
        entry = field.message_type
        keys = _single(entry, entry.fields_by_name["key"], overrides, depth)
        values = _single(entry, entry.fields_by_name["value"], overrides, depth)
        return st.none() | st.dictionaries(keys, values, max_size=MAX_REPEATED)
    element = _single(owner, field, overrides, depth)
    if _is_repeated(field):
        return st.none() | st.lists(element, max_size=MAX_REPEATED)
    return st.none() | element


def _single(
    owner: Descriptor, field: FieldDescriptor, overrides: Overrides, depth: int
) -> st.SearchStrategy[Any]:
    """One value of the field's element type."""
    if field.type == _F.TYPE_MESSAGE:
        if depth <= 0:
            return st.just(None)
        cls = _message_class(field)
        return _message(field.message_type, cls, overrides, depth - 1)
    if field.type == _F.TYPE_ENUM:
        # proto3 enums are open: numbers without a name must be survived too.
        named = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(named), _SIGNED32)
    return _SCALARS[field.type]


def _assign(msg: Message, field: FieldDescriptor, value: Any) -> None:
    container = getattr(msg, field.name)
    if _is_map(field):
        value_is_message = field.message_type.fields_by_name["value"].type == _F.TYPE_MESSAGE
        for k, v in value.items():
            if not value_is_message:
                container[k] = v
            elif v is not None:
                container[k].CopyFrom(v)
    elif _is_repeated(field):
        items = [v for v in value if v is not None]
        if field.type == _F.TYPE_MESSAGE:
            for item in items:
                container.add().CopyFrom(item)
        else:
            container.extend(items)
    elif field.type == _F.TYPE_MESSAGE:
        container.CopyFrom(value)
    else:
        setattr(msg, field.name, value)


def _message_class(field: FieldDescriptor) -> type[Message]:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(field.message_type)


def _is_repeated(field: FieldDescriptor) -> bool:
    return field.is_repeated


def _is_map(field: FieldDescriptor) -> bool:
    return (
        _is_repeated(field)
        and field.type == _F.TYPE_MESSAGE
        and field.message_type.GetOptions().map_entry
    )

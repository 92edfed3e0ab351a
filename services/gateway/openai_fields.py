"""Typed readers for fields of an OpenAI request body, each raising InvalidArgument(param=...).

JSON `null` means "not given" everywhere (clients generated from the OpenAPI document send
explicit nulls for unset optionals). `bool` is rejected where a number is expected: Python's
`True` is an `int`, JSON's `true` is not a number.
"""

from __future__ import annotations

from typing import Any

from services.common.errors import InvalidArgument

JsonObject = dict[str, Any]

# The stack carries token ids, max_tokens, top_k and priority as protobuf int32: a bigger
# value is refused here rather than failing when the request is serialized.
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


def _type_error(param: str, expected: str, value: Any) -> InvalidArgument:
    return InvalidArgument(f"{param} must be {expected}, got {_json_type(value)}", param=param)


def _json_type(value: Any) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string"}
    names.update({list: "array", dict: "object", type(None): "null"})
    return names.get(type(value), type(value).__name__)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def get_str(body: JsonObject, name: str) -> str | None:
    value = body.get(name)
    if value is None or isinstance(value, str):
        return value
    raise _type_error(name, "a string", value)


def require_str(body: JsonObject, name: str) -> str:
    value = get_str(body, name)
    if not value:
        raise InvalidArgument(f"{name} is required", param=name)
    return value


def get_bool(body: JsonObject, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    raise _type_error(name, "a boolean", value)


def get_int(
    body: JsonObject,
    name: str,
    *,
    low: int | None = None,
    high: int | None = None,
) -> int | None:
    """An optional integer in [low, high]; JSON numbers like 3.0 count as integers."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not _is_int(value):
        raise _type_error(name, "an integer", value)
    if (low is not None and value < low) or (high is not None and value > high):
        raise InvalidArgument(f"{name} must be {_range_text(low, high)}, got {value}", param=name)
    return value


def _range_text(low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f"between {low} and {high}"
    return f">= {low}" if low is not None else f"<= {high}"


def get_number(body: JsonObject, name: str, default: float) -> float:
    """A number; its range is SamplingOptions.validate's job, so the rule lives in one place."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _type_error(name, "a number", value)
    try:
        return float(value)
    except OverflowError:  # an integer literal beyond any float
        raise InvalidArgument(f"{name} is out of range", param=name) from None


def get_stop(body: JsonObject) -> list[str]:
    """`stop`: a string or a list of strings (their count and sizes: request_validator.py)."""
    value = body.get("stop")
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _type_error("stop", "a string or an array of strings", value)
    return stops


def get_token_ids(body: JsonObject, name: str) -> list[int]:
    """A list of non-negative token ids; empty when absent."""
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise _type_error(name, "an array of integers", value)
    return token_id_list(value, name)


def token_id_list(value: list[Any], param: str) -> list[int]:
    if not all(_is_int(t) and 0 <= t <= INT32_MAX for t in value):
        raise InvalidArgument(
            f"{param} must contain only token ids (integers in [0, {INT32_MAX}])", param=param
        )
    return value


def get_object(body: JsonObject, name: str) -> JsonObject:
    """An optional nested object; {} when absent."""
    value = body.get(name)
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    raise _type_error(name, "an object", value)


def reject_if_set(body: JsonObject, name: str, unsupported: bool, what: str) -> None:
    """Refuses a known OpenAI feature the stack lacks, rather than silently ignoring it and
    answering something the client did not ask for."""
    if unsupported:
        raise InvalidArgument(f"{what} is not supported", param=name)

"""The request fields that constrain a chat or completion's output -> one StructuredOutput.

OpenAI's `response_format` (`text`, `json_object`, `json_schema` with name, description,
schema and strict), and the fields vLLM's users send: `guided_json`, `guided_regex`,
`guided_choice`, `guided_grammar`, and vLLM's newer `structured_outputs` object (`json`,
`regex`, `choice`, `grammar`, `json_object`). At most one of them may constrain a request.
Only JSON shapes are checked here; whether the constraint compiles is request_validator's
question (for the gRPC front end too). The schema is always enforced, `strict` or not, as vLLM
does: a client that asked for a shape gets that shape.
"""

from __future__ import annotations

import json
import re
from typing import Any

from services.common.errors import InvalidArgument
from services.common.sampling import StructuredOutput
from services.gateway.openai_fields import JsonObject, get_bool, get_object, get_str

# OpenAI's rule for json_schema.name (and for function names).
NAME_PATTERN = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_VLLM_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
_STRUCTURED_OUTPUTS_KEYS = {
    "json": "json_schema",
    "regex": "regex",
    "choice": "choice",
    "grammar": "grammar",
    "json_object": "json_object",
}


def parse_structured(body: JsonObject) -> tuple[StructuredOutput | None, str]:
    """The request's constraint (None: unconstrained) and the field it came from."""
    found = [
        given
        for given in (
            _response_format(body),
            *(_guided(body, name) for name in _VLLM_FIELDS),
            _structured_outputs(body),
        )
        if given is not None
    ]
    if len(found) > 1:
        names = " and ".join(param for _, param in found)
        raise InvalidArgument(f"{names} both constrain the output: set one", param=found[1][1])
    return found[0] if found else (None, "")


def schema_text(schema: Any, param: str) -> str:
    """A JSON schema (an object, or JSON text of one) as compact JSON text, keys in order
    (the order the model writes properties in)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise InvalidArgument(f"{param} is not valid JSON: {exc}", param=param) from None
        except RecursionError:  # a schema given as text escapes the body's own nesting check
            raise InvalidArgument(f"{param} is nested too deeply", param=param) from None
    if not isinstance(schema, dict):
        raise InvalidArgument(f"{param} must be a JSON schema (an object)", param=param)
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))


def _response_format(body: JsonObject) -> tuple[StructuredOutput, str] | None:
    response_format = get_object(body, "response_format")
    kind = get_str(response_format, "type") or "text"
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object"), "response_format"
    if kind != "json_schema":
        raise InvalidArgument(
            f"response_format.type must be text, json_object or json_schema, got {kind!r}"[:200],
            param="response_format.type",
        )
    param = "response_format.json_schema"
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise InvalidArgument(f"{param} must be an object", param=param)
    name = spec.get("name")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise InvalidArgument(
            f"{param}.name must be 1-64 of a-z, A-Z, 0-9, '_' and '-'", param=f"{param}.name"
        )
    get_str(spec, "description")
    get_bool(spec, "strict", False)
    if spec.get("schema") is None:  # OpenAI lets it out: then any JSON object
        return StructuredOutput("json_object"), f"{param}.schema"
    text = schema_text(spec["schema"], f"{param}.schema")
    return StructuredOutput("json_schema", text), f"{param}.schema"


def _guided(body: JsonObject, name: str) -> tuple[StructuredOutput, str] | None:
    value = body.get(name)
    if value is None:
        return None
    kind = {"guided_json": "json_schema", "guided_choice": "choice"}.get(name, name[7:])
    return _constraint(kind, value, name), name


def _structured_outputs(body: JsonObject) -> tuple[StructuredOutput, str] | None:
    spec = get_object(body, "structured_outputs")
    given = [(key, spec[key]) for key in _STRUCTURED_OUTPUTS_KEYS if spec.get(key) is not None]
    if not given:
        return None
    if len(given) > 1:
        keys = ", ".join(key for key, _ in given)
        raise InvalidArgument(
            f"structured_outputs sets {keys}: set one", param="structured_outputs"
        )
    key, value = given[0]
    param = f"structured_outputs.{key}"
    return _constraint(_STRUCTURED_OUTPUTS_KEYS[key], value, param), param


def _constraint(kind: str, value: Any, param: str) -> StructuredOutput:
    if kind == "json_schema":
        return StructuredOutput(kind, schema_text(value, param))
    if kind == "json_object":
        if value is not True:
            raise InvalidArgument(f"{param} must be true", param=param)
        return StructuredOutput(kind)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise InvalidArgument(f"{param} must be a non-empty array of strings", param=param)
        return StructuredOutput(kind, tuple(value))
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{param} must be a non-empty string", param=param)
    return StructuredOutput(kind, value)

"""Validates JSON against the schemas of OpenAI's OpenAPI document, for unit and e2e tests.

    validate(body, "CreateChatCompletionResponse")  # raises jsonschema.ValidationError

The document (OpenAPI 3.1, with some 3.0-style `nullable: true` left in) is loaded once, its
`nullable` rewritten to "or null", and `#/components/schemas/...` refs resolved through a
referencing Registry. Set LAYERSERVE_OPENAPI_PATH to use another copy of the document.

One schema is derived rather than taken as is: "CreateCompletionStreamResponse". OpenAI says
completion chunks share CreateCompletionResponse's shape, but its chunks carry
`finish_reason: null` (and `usage: null`), which that schema does not allow.
"""

from __future__ import annotations

import copy
import functools
import json
import os
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

# Vendored with its license and provenance (tests/data/openai-openapi/SOURCE.md).
_DEFAULT_PATH = Path(__file__).resolve().parent / "data" / "openai-openapi" / "openapi.json"
_DOCUMENT_URI = "urn:openai:openapi"
COMPLETION_STREAM_SCHEMA = "CreateCompletionStreamResponse"


def openapi_path() -> Path:
    return Path(os.environ.get("LAYERSERVE_OPENAPI_PATH") or _DEFAULT_PATH)


def validate(instance: Any, schema_name: str) -> None:
    """Raises jsonschema.ValidationError (the most relevant error) when instance does not match
    components/schemas/<schema_name>; KeyError when there is no such schema."""
    _validator(schema_name).validate(instance)


@functools.cache
def _validator(schema_name: str) -> Draft202012Validator:
    document = _document()
    if schema_name not in document["components"]["schemas"]:
        raise KeyError(f"no schema {schema_name!r} in {openapi_path()}")
    ref = {"$ref": f"{_DOCUMENT_URI}#/components/schemas/{schema_name}"}
    return Draft202012Validator(ref, registry=_registry())


@functools.cache
def _registry() -> Registry:
    resource = Resource.from_contents(_document(), default_specification=DRAFT202012)
    return Registry().with_resource(_DOCUMENT_URI, resource)


@functools.cache
def _document() -> dict[str, Any]:
    with openapi_path().open(encoding="utf-8") as f:
        document = _allow_nullable(json.load(f))
    schemas = document["components"]["schemas"]
    schemas[COMPLETION_STREAM_SCHEMA] = _completion_stream_schema(schemas)
    return document


def _allow_nullable(node: Any) -> Any:
    """OpenAPI 3.0's `nullable: true` -> anyOf [the schema, null]. Wrapping (rather than adding
    "null" to `type`) also covers enums and bare $refs."""
    if isinstance(node, list):
        return [_allow_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: _allow_nullable(value) for key, value in node.items()}
    if converted.get("nullable") is True:
        del converted["nullable"]
        return {"anyOf": [converted, {"type": "null"}]}
    return converted


def _completion_stream_schema(schemas: dict[str, Any]) -> dict[str, Any]:
    schema = copy.deepcopy(schemas["CreateCompletionResponse"])
    finish = schema["properties"]["choices"]["items"]["properties"]["finish_reason"]
    schema["properties"]["choices"]["items"]["properties"]["finish_reason"] = {
        "anyOf": [finish, {"type": "null"}]
    }
    usage = schema["properties"]["usage"]
    schema["properties"]["usage"] = {"anyOf": [usage, {"type": "null"}]}
    return schema

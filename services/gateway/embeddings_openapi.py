"""POST /v1/embeddings in the gateway's OpenAPI document (openapi.py): its request with the
bounds embeddings_request.py enforces, and OpenAI's response shape."""

from __future__ import annotations

from typing import Any

from services.gateway.embeddings_request import ENCODING_FORMATS, MAX_INPUTS

Schema = dict[str, Any]

_TOKEN_IDS: Schema = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}


def embeddings_schemas() -> dict[str, Schema]:
    """components/schemas entries."""
    text: Schema = {"type": "string", "minLength": 1}
    return {
        "CreateEmbeddingRequest": {
            "type": "object",
            "required": ["model", "input"],
            "properties": {
                "model": {"type": "string", "minLength": 1},
                "input": {
                    "anyOf": [
                        text,
                        {"type": "array", "minItems": 1, "maxItems": MAX_INPUTS, "items": text},
                        _TOKEN_IDS,
                        {
                            "type": "array",
                            "minItems": 1,
                            "maxItems": MAX_INPUTS,
                            "items": _TOKEN_IDS,
                        },
                    ],
                    "description": "Each string or token-id list is embedded on its own.",
                },
                "encoding_format": {"enum": list(ENCODING_FORMATS), "default": "float"},
                "dimensions": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "Only the model's own size (its vectors cannot be cut).",
                },
                "user": {"type": "string", "description": "Ignored."},
            },
        },
        "CreateEmbeddingResponse": {
            "type": "object",
            "required": ["object", "data", "model", "usage"],
            "properties": {
                "object": {"const": "list"},
                "data": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["object", "index", "embedding"],
                        "properties": {
                            "object": {"const": "embedding"},
                            "index": {"type": "integer"},
                            "embedding": {
                                "anyOf": [
                                    {"type": "array", "items": {"type": "number"}},
                                    {"type": "string", "description": "base64 float32 LE"},
                                ]
                            },
                        },
                    },
                },
                "model": {"type": "string"},
                "usage": {
                    "type": "object",
                    "required": ["prompt_tokens", "total_tokens"],
                    "properties": {
                        "prompt_tokens": {"type": "integer"},
                        "total_tokens": {"type": "integer"},
                    },
                },
            },
        },
    }


def embeddings_operation(errors: Schema, headers: Schema) -> Schema:
    """The POST operation; errors and headers: the document's error refs and response headers."""
    return {
        "operationId": "createEmbedding",
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {"$ref": "#/components/schemas/CreateEmbeddingRequest"}
                }
            },
        },
        "responses": {
            "200": {
                "description": "One embedding per input, in order.",
                "headers": headers,
                "content": {
                    "application/json": {
                        "schema": {"$ref": "#/components/schemas/CreateEmbeddingResponse"}
                    }
                },
            },
            **errors,
        },
    }

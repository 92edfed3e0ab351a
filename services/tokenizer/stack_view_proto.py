"""A scheduler's ListModels answer as the tokenizer's StackView (model_catalog.py)."""

from __future__ import annotations

from layerserve.scheduler.v1 import scheduler_pb2
from services.tokenizer.alias_route import AliasRoute, LengthRoute, WeightedRoute
from services.tokenizer.model_catalog import ServedModel, StackView


def route_from_proto(alias: scheduler_pb2.Alias) -> AliasRoute:
    if alias.WhichOneof("route") == "weighted":
        return WeightedRoute([(t.model, t.weight) for t in alias.weighted.targets])
    return LengthRoute(tuple((t.max_prompt_tokens, t.model) for t in alias.by_prompt_length.tiers))


def view_from_proto(response: scheduler_pb2.ListModelsResponse) -> StackView:
    return StackView(
        models={m.id: ServedModel(m.id, m.max_model_len, m.path) for m in response.models},
        aliases={a.name: route_from_proto(a) for a in response.aliases},
    )


def merge_views(views: list[StackView]) -> StackView:
    """What several scheduler replicas serve together: every model any of them serves, and
    their aliases (replicas share one alias table; the first replica's entry wins a clash)."""
    models: dict = {}
    aliases: dict = {}
    for view in views:
        for name, model in view.models.items():
            models.setdefault(name, model)
        for name, route in view.aliases.items():
            aliases.setdefault(name, route)
    return StackView(models=models, aliases=aliases)

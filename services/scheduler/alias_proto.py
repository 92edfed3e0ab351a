"""Aliases to and from scheduler.v1.Alias messages."""

from __future__ import annotations

from layerserve.scheduler.v1 import scheduler_pb2
from services.scheduler.aliases import Alias, LengthTier, WeightedTarget


def alias_to_proto(alias: Alias) -> scheduler_pb2.Alias:
    msg = scheduler_pb2.Alias(name=alias.name)
    if alias.weighted:
        for t in alias.weighted:
            msg.weighted.targets.add(model=t.model, weight=t.weight)
    else:
        for tier in alias.by_prompt_length:
            msg.by_prompt_length.tiers.add(
                model=tier.model, max_prompt_tokens=tier.max_prompt_tokens
            )
    return msg


def alias_from_proto(msg: scheduler_pb2.Alias) -> Alias:
    """The alias a message describes (not validated yet)."""
    return Alias(
        name=msg.name,
        weighted=tuple(WeightedTarget(t.model, t.weight) for t in msg.weighted.targets),
        by_prompt_length=tuple(
            LengthTier(t.model, t.max_prompt_tokens) for t in msg.by_prompt_length.tiers
        ),
    )

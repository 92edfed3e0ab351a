"""Model aliases: a name that routes each request to one of several served models, by weight (a
canary) or by prompt length. The scheduler owns the table (its --aliases file plus the Admin
API) and publishes it in ListModels; the tokenizer service resolves each request's alias, since
only it knows the prompt's length in the target model's tokens.

An alias file is TOML (the stack's config file is one); only its `aliases` table is read:

    [aliases.canary]
    weights = { "model-a" = 90, "model-b" = 10 }

    [aliases.auto]
    by_prompt_length = [
      { max_prompt_tokens = 64, model = "small" },  # up to 64 tokens, counted as `small` does
      { model = "big" },                            # everything longer
    ]
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.common.errors import InvalidArgument, NotFound


@dataclass(frozen=True, slots=True)
class WeightedTarget:
    model: str
    weight: int


@dataclass(frozen=True, slots=True)
class LengthTier:
    model: str
    max_prompt_tokens: int  # 0 = no limit (the last tier only)


@dataclass(frozen=True, slots=True)
class Alias:
    """Exactly one of `weighted` and `by_prompt_length` is non-empty."""

    name: str
    weighted: tuple[WeightedTarget, ...] = ()
    by_prompt_length: tuple[LengthTier, ...] = ()

    @property
    def targets(self) -> list[str]:
        if self.weighted:
            return [t.model for t in self.weighted]
        return [t.model for t in self.by_prompt_length]

    def validate(self) -> None:
        """Raises InvalidArgument when the alias cannot route a request."""
        if not self.name:
            raise InvalidArgument("an alias needs a name", param="name")
        if bool(self.weighted) == bool(self.by_prompt_length):
            raise InvalidArgument(
                f"alias `{self.name}`: give either weights or by_prompt_length", param=self.name
            )
        targets = self.targets
        if any(not t for t in targets) or len(set(targets)) != len(targets):
            raise InvalidArgument(
                f"alias `{self.name}`: targets must be distinct, non-empty model names",
                param=self.name,
            )
        if self.name in targets:
            raise InvalidArgument(f"alias `{self.name}` names itself as a target", param=self.name)
        if any(t.weight <= 0 for t in self.weighted):
            raise InvalidArgument(f"alias `{self.name}`: weights must be positive", param=self.name)
        self._validate_tiers()

    def _validate_tiers(self) -> None:
        tiers = self.by_prompt_length
        if not tiers:
            return
        limits = [t.max_prompt_tokens for t in tiers[:-1]]
        if tiers[-1].max_prompt_tokens != 0 or any(n <= 0 for n in limits):
            raise InvalidArgument(
                f"alias `{self.name}`: every tier but the last needs max_prompt_tokens > 0, "
                "and the last none (it takes every longer prompt)",
                param=self.name,
            )
        if limits != sorted(set(limits)):
            raise InvalidArgument(
                f"alias `{self.name}`: max_prompt_tokens must increase from tier to tier",
                param=self.name,
            )


class AliasTable:
    """The scheduler's aliases by name. Aliases never chain: a target is always a model."""

    def __init__(self, aliases: list[Alias] | None = None) -> None:
        self._aliases: dict[str, Alias] = {}
        for alias in aliases or []:
            self.set(alias)

    def list(self) -> list[Alias]:
        return [self._aliases[name] for name in sorted(self._aliases)]

    def get(self, name: str) -> Alias | None:
        return self._aliases.get(name)

    def check(self, alias: Alias, models: set[str]) -> None:
        """Raises InvalidArgument or NotFound unless `alias` may be set while `models` (the
        names of every known worker's model) are served."""
        alias.validate()
        if alias.name in models:
            raise InvalidArgument(
                f"`{alias.name}` is a served model's name; an alias cannot shadow it",
                param="name",
            )
        missing = [t for t in alias.targets if t not in models]
        if missing:
            raise NotFound(
                f"alias `{alias.name}`: no worker serves {', '.join(map(repr, missing))}",
                param="model",
            )

    def set(self, alias: Alias) -> bool:
        """Creates or replaces `alias`; True if it replaced one. Raises InvalidArgument for a
        malformed alias or one that would chain with another."""
        alias.validate()
        chained = [t for t in alias.targets if t in self._aliases]
        if chained:
            raise InvalidArgument(
                f"alias `{alias.name}`: {', '.join(chained)} is an alias; targets must be models",
                param=alias.name,
            )
        pointing = [a.name for a in self._aliases.values() if alias.name in a.targets]
        if pointing:
            raise InvalidArgument(
                f"`{alias.name}` is a target of alias {', '.join(pointing)}", param=alias.name
            )
        replaced = alias.name in self._aliases
        self._aliases[alias.name] = alias
        return replaced

    def delete(self, name: str) -> None:
        if self._aliases.pop(name, None) is None:
            raise NotFound(f"there is no alias `{name}`", param="name")


def load_alias_file(path: str | Path) -> list[Alias]:
    """The aliases of a TOML file's `aliases` table (none if it has no such table). Raises
    ValueError, naming the file, when the file or an alias is malformed."""
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f).get("aliases", {})
        return aliases_from_table(table)
    except (tomllib.TOMLDecodeError, InvalidArgument, TypeError, ValueError) as err:
        raise ValueError(f"{path}: {err}") from None


def aliases_from_table(table: dict[str, Any]) -> list[Alias]:
    """Aliases from a parsed `[aliases]` table: name -> {weights = {...}} or
    {by_prompt_length = [{max_prompt_tokens = N, model = "..."}, ..., {model = "..."}]}."""
    if not isinstance(table, dict):
        raise ValueError("`aliases` must be a table of alias names")
    aliases = []
    for name, body in table.items():
        if not isinstance(body, dict) or set(body) - {"weights", "by_prompt_length"}:
            raise ValueError(f"alias `{name}`: expected `weights` or `by_prompt_length` only")
        weights = body.get("weights", {})
        tiers = body.get("by_prompt_length", [])
        if not isinstance(weights, dict) or not isinstance(tiers, list):
            raise ValueError(f"alias `{name}`: weights is a table, by_prompt_length a list")
        alias = Alias(
            name=name,
            weighted=tuple(WeightedTarget(model, _int(w, name)) for model, w in weights.items()),
            by_prompt_length=tuple(_tier(t, name) for t in tiers),
        )
        alias.validate()
        aliases.append(alias)
    AliasTable(aliases)  # refuses chains
    return aliases


def _tier(raw: Any, alias: str) -> LengthTier:
    if not isinstance(raw, dict) or set(raw) - {"max_prompt_tokens", "model"}:
        raise ValueError(f"alias `{alias}`: a tier is {{max_prompt_tokens = N, model = NAME}}")
    return LengthTier(str(raw.get("model", "")), _int(raw.get("max_prompt_tokens", 0), alias))


def _int(value: Any, alias: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"alias `{alias}`: expected an integer, got {value!r}")
    return value

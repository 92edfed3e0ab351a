"""The scheduler's alias table: what an operator may set, and the alias file format."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.errors import InvalidArgument, NotFound
from services.scheduler.aliases import (
    Alias,
    AliasTable,
    LengthTier,
    WeightedTarget,
    load_alias_file,
)

MODELS = {"small", "big"}


def canary(name: str = "canary", a: str = "small", b: str = "big") -> Alias:
    return Alias(name, weighted=(WeightedTarget(a, 90), WeightedTarget(b, 10)))


def by_length(name: str = "auto", limit: int = 64) -> Alias:
    return Alias(name, by_prompt_length=(LengthTier("small", limit), LengthTier("big", 0)))


def test_set_replace_delete() -> None:
    table = AliasTable()
    assert table.set(canary()) is False
    assert table.set(canary(a="big", b="small")) is True
    assert table.get("canary") == canary(a="big", b="small")
    table.set(by_length())
    assert [a.name for a in table.list()] == ["auto", "canary"]
    table.delete("canary")
    assert table.get("canary") is None
    with pytest.raises(NotFound):
        table.delete("canary")


@pytest.mark.parametrize(
    "alias",
    [
        Alias("x"),  # no route
        Alias("x", (WeightedTarget("small", 1),), by_length().by_prompt_length),  # both
        Alias("x", weighted=(WeightedTarget("small", 0),)),
        Alias("x", weighted=(WeightedTarget("small", 1), WeightedTarget("small", 2))),
        Alias("x", by_prompt_length=(LengthTier("small", 64),)),  # last tier has a limit
        Alias("x", by_prompt_length=(LengthTier("small", 0), LengthTier("big", 0))),
        Alias("x", by_prompt_length=(
            LengthTier("small", 64), LengthTier("mid", 32), LengthTier("big", 0))),
        Alias("x", weighted=(WeightedTarget("x", 1),)),  # itself
        Alias("", weighted=(WeightedTarget("small", 1),)),
    ],
)  # fmt: skip
def test_malformed_aliases_are_refused(alias: Alias) -> None:
    with pytest.raises(InvalidArgument):
        AliasTable().set(alias)


def test_check_against_served_models() -> None:
    table = AliasTable()
    table.check(canary(), MODELS)
    with pytest.raises(NotFound, match="typo"):
        table.check(canary(b="typo"), MODELS)
    with pytest.raises(InvalidArgument, match="served model"):
        table.check(canary(name="small", a="big", b="other"), MODELS | {"other"})


def test_aliases_never_chain() -> None:
    table = AliasTable([canary()])
    with pytest.raises(InvalidArgument, match="is an alias"):
        table.set(Alias("outer", weighted=(WeightedTarget("canary", 1),)))
    table = AliasTable([Alias("outer", weighted=(WeightedTarget("inner", 1),))])
    with pytest.raises(InvalidArgument, match="target of alias outer"):
        table.set(canary(name="inner"))


def test_alias_file(tmp_path: Path) -> None:
    path = tmp_path / "stack.toml"
    path.write_text(
        """
[[models]]
name = "small"

[aliases.canary]
weights = { "small" = 90, "big" = 10 }

[aliases.auto]
by_prompt_length = [{ max_prompt_tokens = 64, model = "small" }, { model = "big" }]
"""
    )
    assert load_alias_file(path) == [canary(), by_length()]


@pytest.mark.parametrize(
    "body",
    [
        '[aliases.a]\nweights = { "small" = "ninety" }',
        '[aliases.a]\nweights = { "small" = 1 }\nextra = 1',
        '[aliases.a]\nby_prompt_length = [{ max_prompt_tokens = 8, model = "small" }]',
        '[aliases.a]\nby_prompt_length = [{ limit = 8, model = "small" }, { model = "big" }]',
        '[aliases.a]\nweights = { "b" = 1 }\n[aliases.b]\nweights = { "small" = 1 }',
        "[aliases.a\n",
    ],
)
def test_malformed_alias_file_names_the_file(tmp_path: Path, body: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(ValueError, match="bad.toml"):
        load_alias_file(path)


def test_example_config_aliases_load() -> None:
    example = Path(__file__).resolve().parents[3] / "configs" / "two-models.toml"
    names = [a.name for a in load_alias_file(example)]
    assert names == ["smollm2-canary", "smollm2-auto"]

"""`make run ARGS="--schedulers N --workers M"`: N schedulers on their own ports, each model's
workers spread among them (worker j at home on scheduler j mod N, the others its fallbacks,
in an order that spreads a lost scheduler's workers),
the tokenizer given them all."""

from __future__ import annotations

import pytest

from services.launcher import parse_args
from services.stack import Stack

CHAT_ONLY = ["--embedding-model", "off"]  # the chat model's workers alone


def test_schedulers_get_ports_and_workers_spread_among_them() -> None:
    config = parse_args(
        ["--schedulers", "3", "--workers", "4", "--internal-port-base", "51000", *CHAT_ONLY]
    )
    assert config.scheduler_ports == (51001, 51002, 51003)
    assert config.worker_ports == (51004, 51005, 51006, 51007)
    assert config.scheduler_names() == ["scheduler0", "scheduler1", "scheduler2"]
    # Home first; a lost scheduler's two workers fall back to different survivors.
    assert config.scheduler_orders() == [[0, 1, 2], [1, 0, 2], [2, 0, 1], [0, 2, 1]]
    stack = Stack(config)
    assert stack.config.env["LAYERSERVE_ADMIN_KEY"]  # the workers register themselves
    spec = config.model_specs()[0]
    args = stack._worker_args(spec, 51005, [1, 0, 2])
    register = args[args.index("--register-with") + 1]
    assert register == "127.0.0.1:51002,127.0.0.1:51001,127.0.0.1:51003"


def test_one_scheduler_keeps_the_old_layout() -> None:
    config = parse_args(["--workers", "2", "--internal-port-base", "51000", *CHAT_ONLY])
    assert config.scheduler_ports == (51001,)
    assert config.worker_ports == (51002, 51003)
    assert config.scheduler_names() == ["scheduler"]
    assert config.scheduler_orders() == [[0], [0]]
    assert "--register-with" not in Stack(config)._worker_args(config.model_specs()[0], 51002, [0])


def test_no_schedulers_is_refused() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--schedulers", "0"])

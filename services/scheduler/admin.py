"""A command line for the scheduler's Admin API. The key comes from LAYERSERVE_ADMIN_KEY.

python -m services.scheduler.admin workers
python -m services.scheduler.admin add 127.0.0.1:50063
python -m services.scheduler.admin drain 127.0.0.1:50063
python -m services.scheduler.admin remove 127.0.0.1:50063 [--force]
python -m services.scheduler.admin set-alias canary --weights model-a=90 model-b=10
python -m services.scheduler.admin set-alias auto --by-length small:64 big
python -m services.scheduler.admin delete-alias canary
python -m services.scheduler.admin models      # models and aliases (needs no key)
"""

from __future__ import annotations

import argparse
import json
import sys

import grpc
from google.protobuf.json_format import MessageToDict

from layerserve.scheduler.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from services.common.env import env_str
from services.common.grpc_util import new_sync_channel


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m services.scheduler.admin", description=__doc__)
    p.add_argument("--scheduler", default=env_str("SCHEDULER_ADDRESS", "127.0.0.1:50060"))
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("workers", help="list the workers")
    sub.add_parser("models", help="list the served models and the aliases")
    add = sub.add_parser("add", help="add a worker (its model comes from the worker)")
    add.add_argument("address")
    add.add_argument("--timeout", type=float, default=0.0, help="seconds (default 30)")
    drain = sub.add_parser("drain", help="route no new requests to a worker")
    drain.add_argument("address")
    remove = sub.add_parser("remove", help="remove a worker once drained")
    remove.add_argument("address")
    remove.add_argument("--force", action="store_true", help="at once; ends its requests")
    remove.add_argument("--timeout", type=float, default=0.0, help="drain wait (default 60)")
    alias = sub.add_parser("set-alias", help="create or replace an alias")
    alias.add_argument("name")
    route = alias.add_mutually_exclusive_group(required=True)
    route.add_argument("--weights", nargs="+", metavar="MODEL=WEIGHT")
    route.add_argument(
        "--by-length",
        nargs="+",
        metavar="MODEL:MAX_PROMPT_TOKENS",
        help="tiers in order; the last is a bare MODEL that takes every longer prompt",
    )
    delete = sub.add_parser("delete-alias", help="delete an alias")
    delete.add_argument("name")
    return p


def _alias(a: argparse.Namespace) -> scheduler_pb2.Alias:
    alias = scheduler_pb2.Alias(name=a.name)
    for spec in a.weights or []:
        model, _, weight = spec.rpartition("=")
        alias.weighted.targets.add(model=model, weight=int(weight))
    for spec in a.by_length or []:
        model, _, limit = spec.rpartition(":")
        if not model:  # the last tier: no limit
            model, limit = limit, "0"
        alias.by_prompt_length.tiers.add(model=model, max_prompt_tokens=int(limit))
    return alias


def _call(a: argparse.Namespace, channel: grpc.Channel):
    if a.command == "models":
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        return stub.ListModels(scheduler_pb2.ListModelsRequest(), timeout=10)
    admin = admin_pb2_grpc.AdminStub(channel)
    metadata = [("authorization", f"Bearer {env_str('ADMIN_KEY', '')}")]
    calls = {
        "workers": lambda: admin.ListWorkers(admin_pb2.ListWorkersRequest(), metadata=metadata),
        "add": lambda: admin.AddWorker(
            admin_pb2.AddWorkerRequest(address=a.address, timeout_seconds=a.timeout),
            metadata=metadata,
        ),
        "drain": lambda: admin.DrainWorker(
            admin_pb2.DrainWorkerRequest(address=a.address), metadata=metadata
        ),
        "remove": lambda: admin.RemoveWorker(
            admin_pb2.RemoveWorkerRequest(
                address=a.address, force=a.force, drain_timeout_seconds=a.timeout
            ),
            metadata=metadata,
        ),
        "set-alias": lambda: admin.SetAlias(
            admin_pb2.SetAliasRequest(alias=_alias(a)), metadata=metadata
        ),
        "delete-alias": lambda: admin.DeleteAlias(
            admin_pb2.DeleteAliasRequest(name=a.name), metadata=metadata
        ),
    }
    return calls[a.command]()


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    with new_sync_channel(a.scheduler) as channel:
        try:
            response = _call(a, channel)
        except grpc.RpcError as err:
            print(f"{err.code().name}: {err.details()}", file=sys.stderr)
            return 1
        except ValueError as err:  # a weight or limit that is not a number
            print(f"bad argument: {err}", file=sys.stderr)
            return 2
    print(json.dumps(MessageToDict(response), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

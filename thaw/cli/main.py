"""`thaw`: the command line. This module only builds the parser and dispatches: each
command group lives in a module of its own under ``thaw.cli``, each command a thin shell
over a library call.

Exit codes: 0 success, 1 the operation failed, 2 bad usage or invalid input
(config, model directory), 3 the store is not reachable.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version

from thaw.cli.common import CliError
from thaw.cli.config_cmds import cmd_config_check, cmd_config_hash_key
from thaw.cli.pool import (
    cmd_pool_budget_set,
    cmd_pool_budget_show,
    cmd_pool_clock,
    cmd_pool_events,
    cmd_pool_status,
    cmd_status,
)
from thaw.cli.services import cmd_activator, cmd_controller, cmd_up, cmd_worker
from thaw.cli.store import (
    cmd_demo_model,
    cmd_push,
    cmd_store_down,
    cmd_store_ls,
    cmd_store_status,
    cmd_store_up,
)
from thaw.cli.usage import cmd_usage
from thaw.config import DEFAULT_CONFIG_PATH


def _version() -> str:
    try:
        return version("thaw-serve")
    except PackageNotFoundError:
        return "0+unknown"


# -- parser -----------------------------------------------------------------------------

Handler = Callable[[argparse.Namespace], int]
Subparsers = argparse._SubParsersAction  # type: ignore[type-arg]
# add(parent, name, help, handler, with_common=True): a command with its handler and,
# by default, the common options (--config, --log-level).
Add = Callable[..., argparse.ArgumentParser]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="thaw",
        description="Thaw: scale-to-zero serving for open-weight LLMs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"thaw {_version()}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE",
                        help=f"config file (default: $THAW_CONFIG or {DEFAULT_CONFIG_PATH})")
    common.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add = _adder(common)
    # In the order `thaw --help` lists them.
    _add_service_commands(sub, add)
    _add_pool_commands(sub, add)
    _add_config_commands(sub, add)
    _add_store_commands(sub, add)
    _add_tool_commands(sub, add)
    _add_bench_commands(sub, add)
    _add_load_commands(sub, add)
    _add_snapshot_commands(sub, add)
    _add_usage_command(sub, add)
    from thaw.cli import tenants as tenants_cli

    tenants_cli.add_parsers(sub, add)

    from thaw.cli import batches as batches_cli

    batches_cli.add_parsers(sub, add)

    from thaw.cli import admin_keys as admin_keys_cli

    admin_keys_cli.add_parsers(sub, add)

    from thaw.cli import aws as aws_cli

    aws_cli.add_parsers(sub, add)

    from thaw.cli import monitoring as monitoring_cli

    monitoring_cli.add_parsers(sub, add)

    _add_model_commands(sub, add)
    return parser


def _adder(common: argparse.ArgumentParser) -> Add:
    def add(parent: Subparsers, name: str, help_: str, fn: Handler,
            with_common: bool = True) -> argparse.ArgumentParser:
        p = parent.add_parser(name, help=help_, description=help_, parents=[common] if with_common else [])
        p.set_defaults(fn=fn)
        return p

    return add


def _add_service_commands(sub: Subparsers, add: Add) -> None:
    """The services: `thaw up`, its status, and each part run on its own."""
    p = add(sub, "up", "Run the embedded platform: store, control plane, activator, standby workers.", cmd_up)
    p.add_argument("--port", type=int, default=None, help="activator port (default: server.port)")
    p = add(sub, "status", "Show models (replicas, queue, last cold start) and workers of a running `thaw up`.",
            cmd_status)
    p.add_argument("--json", action="store_true")

    p = add(sub, "controller", "Run the controller: the pool manager, its API and the providers.", cmd_controller)
    p.add_argument("--host", default=None, help="listen address (default: controller.host)")
    p.add_argument("--port", type=int, default=None, help="listen port (default: controller.port, 8100)")
    p.add_argument("--stop-local-workers", action="store_true",
                   help="terminate the local pool's workers on exit (`thaw up`); by default they keep "
                        "serving for the next controller to adopt")
    p.add_argument("--url", default=None,
                   help="where the others reach this controller, one of controller.urls when several share "
                        "one PostgreSQL (default: controller.url, else http://HOST:PORT)")
    p = add(sub, "activator", "Run an activator: the OpenAI-compatible API.", cmd_activator)
    p.add_argument("--controller", metavar="URL[,URL]", default=None,
                   help="the controllers (it follows the leader); default: controller.urls or controller.url")
    p.add_argument("--host", default=None, help="listen address (default: server.host)")
    p.add_argument("--port", type=int, default=None, help="listen port (default: server.port)")
    p.add_argument("--id", default=None,
                   help="this activator's name: its reports, its local ledger and keys under "
                        "<data_dir>/activators/ID, its usage segments (default: HOST-PORT, the same on "
                        "every start)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="processes sharing the port (SO_REUSEPORT), one per core; each is activator "
                        "ID.wK and takes 1/N of a local limit (default 1)")
    p.add_argument("--worker-of", type=int, default=None, help=argparse.SUPPRESS)
    from worker.__main__ import add_arguments as worker_arguments

    p = add(sub, "worker", "Run the worker agent of one instance (started by a provider).", cmd_worker)
    worker_arguments(p)


def _add_pool_commands(sub: Subparsers, add: Add) -> None:
    """`thaw pool`: the warm pool at a running controller, and recommendations offline."""
    pool = sub.add_parser("pool", help="The warm pool: workers, shapes, models, and the controller's decisions.")
    pl_sub = pool.add_subparsers(dest="pool_command", metavar="SUBCOMMAND", required=True)
    p = add(pl_sub, "status", "Per shape, model and worker: states, targets, budget and spend.", cmd_pool_status)
    p.add_argument("--controller", metavar="URL", default=None)
    p.add_argument("--json", action="store_true")
    p = add(pl_sub, "events", "Every decision the controller carried out, with its reason and inputs.",
            cmd_pool_events)
    p.add_argument("--controller", metavar="URL", default=None)
    p.add_argument("--since", default="1h", help="epoch seconds, ISO time, or a duration back (default 1h)")
    p.add_argument("--history", action="store_true",
                   help="the decision log in the state database: every leader's events, each with its "
                        "controller and term (default: this controller's recent events)")
    p.add_argument("--json", action="store_true")
    from thaw.cli import simulate as simulate_cli

    p = add(pl_sub, "recommend", "Sweep warm-pool settings on a request trace and print the cheapest config "
            "that meets a TTFT p99 target.", simulate_cli.cmd_recommend, with_common=False)
    simulate_cli.add_recommend_arguments(p)
    budget = pl_sub.add_parser("budget", help="Show or change standby bands and budgets at run time.")
    b_sub = budget.add_subparsers(dest="budget_command", metavar="SUBCOMMAND", required=True)
    p = add(b_sub, "show", "Each pool's standby band and budget, and the budget across all pools.",
            cmd_pool_budget_show)
    p.add_argument("--controller", metavar="URL", default=None)
    p.add_argument("--json", action="store_true")
    p = add(b_sub, "set", "Change a pool's standby band or budget, or the total budget; kept across restarts.",
            cmd_pool_budget_set)
    p.add_argument("shape", metavar="SHAPE", nargs="?", default=None)
    p.add_argument("--standby-min", type=int, default=None)
    p.add_argument("--standby-max", type=int, default=None)
    p.add_argument("--usd-per-hour", type=float, default=None, help="the pool's budget for standby + asleep")
    p.add_argument("--total-usd-per-hour", type=float, default=None, help="the budget across all pools")
    p.add_argument("--controller", metavar="URL", default=None)
    p = add(pl_sub, "clock", "The controller's time; --advance steps it forward (controller.stepped_clock: "
            "tests and rehearsals of a schedule).", cmd_pool_clock)
    p.add_argument("--advance", type=float, default=None, metavar="S",
                   help="move the controller's clock S seconds forward (refused unless stepped_clock is on, "
                        "or when S is longer than a worker's heartbeats outlast)")
    p.add_argument("--controller", metavar="URL", default=None)
    p.add_argument("--json", action="store_true")


def _add_config_commands(sub: Subparsers, add: Add) -> None:
    """`thaw config`: check a config file, hash an API key."""
    cfg = sub.add_parser("config", help="Check a config file or hash an API key.")
    cfg_sub = cfg.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    p = add(cfg_sub, "check", "Validate a config file and print its problems, one per line.",
            cmd_config_check, with_common=False)
    p.add_argument("file", metavar="FILE")
    p.add_argument("--assume-size", action="append", metavar="[NAME=]SIZE", default=None,
                   help="weights size when the store cannot say (e.g. 140GiB, or llama-70b=140GiB); repeatable")
    p = add(cfg_sub, "hash-key", "Print the hash of an API key, as stored in tenants[].api_key_hashes.",
            cmd_config_hash_key, with_common=False)
    p.add_argument("key", metavar="KEY")


def _add_store_commands(sub: Subparsers, add: Add) -> None:
    """`thaw store` (the embedded store) and `thaw demo-model`."""
    store = sub.add_parser("store", help="Start, stop or inspect the embedded S3 store (SeaweedFS).")
    st_sub = store.add_subparsers(dest="store_command", metavar="SUBCOMMAND", required=True)
    add(st_sub, "up", "Start the embedded store on loopback and create the bucket.", cmd_store_up)
    add(st_sub, "down", "Stop the embedded store (waits for a clean shutdown).", cmd_store_down)
    add(st_sub, "status", "Say whether the embedded store is running.", cmd_store_status)
    p = add(st_sub, "ls", "List model prefixes in the store, with their manifests.", cmd_store_ls)
    p.add_argument("--json", action="store_true")

    p = add(sub, "demo-model", "Build the tiny demo Llama (deterministic by seed) as safetensors.",
            cmd_demo_model)
    p.add_argument("out_dir", metavar="OUT_DIR")
    p.add_argument("--size", default="tiny", help="'tiny' (default) or a target size such as 1GiB")
    p.add_argument("--seed", type=int, default=None, help="default 0 (a model), 1 (an adapter)")
    p.add_argument("--adapter-of", metavar="BASE_DIR", default=None,
                   help="build a LoRA adapter (PEFT layout) of the demo model in BASE_DIR instead")
    p.add_argument("--rank", type=int, default=None, help="the adapter's LoRA rank (default 8)")
    p.add_argument("--overwrite", action="store_true", help="replace the files of an earlier build in OUT_DIR")


def _add_tool_commands(sub: Subparsers, add: Add) -> None:
    """`thaw plan`, `thaw push` and `thaw simulate`."""
    from thaw.cli import plan as plan_cli

    p = add(sub, "plan", "Size a deployment: traffic and SLOs in, GPUs, instances, dollars and watts out.",
            plan_cli.run, with_common=False)
    plan_cli.add_arguments(p)

    p = add(sub, "push", "Upload a model directory to the store and write its manifest.", cmd_push)
    p.add_argument("dir", metavar="DIR")
    p.add_argument("uri", metavar="S3_URI", help="s3://bucket/prefix")
    p.add_argument("--concurrency", type=int, default=8, help="parallel parts per file (default 8)")
    p.add_argument("--json", action="store_true", help="JSON lines even on a terminal")

    from thaw.cli import simulate as simulate_cli

    p = add(sub, "simulate", "Replay a request trace against the warm-pool policy: cold starts, TTFT, cost.",
            simulate_cli.run, with_common=False)
    simulate_cli.add_arguments(p)


def _add_bench_commands(sub: Subparsers, add: Add) -> None:
    """`thaw bench`: the benchmarks, each with its arguments beside its code."""
    # Their arguments live with their code (light imports only at parser time).
    from loadtests import (
        bench_activator,
        bench_batch,
        bench_cold_start,
        bench_control_plane,
        bench_conversations,
        bench_netfaults,
        bench_page_faults,
        bench_routes,
        bench_simulate,
        bench_stream,
    )

    bench = sub.add_parser("bench", help="Run a benchmark (baseline and Thaw in one run) and write JSON.")
    b_sub = bench.add_subparsers(dest="bench_command", metavar="SUBCOMMAND", required=True)
    for name, mod, help_ in (
        ("cold-start", bench_cold_start, "Request at zero to first token: plain vLLM from S3 vs Thaw's tiers."),
        ("stream", bench_stream, "Weights from the store: ceiling vs Thaw's streamer vs runai vs boto3+safetensors."),
        ("page-faults", bench_page_faults, "Writing weights into fresh host memory vs huge pages, MAP_POPULATE "
                                           "and reused memory."),
        ("activator", bench_activator, "What the activator adds in front of a replica, with vllm-router as a peer."),
        ("simulate", bench_simulate, "Simulated requests per second on a long many-model trace, fast vs exact mode."),
        ("batch", bench_batch, "Online TTFT with and without a concurrent batch (on a lent standby, on spare "
                               "slots), and batch throughput."),
        ("conversations", bench_conversations, "Continued conversations: Thaw's Responses API and prefix routing "
                                               "vs a round-robin balancer over the same engines."),
        ("control-plane", bench_control_plane, "The controller, route feed and activators at fleet size (models "
                                               "x workers), every worker simulated."),
        ("routes", bench_routes, "The route table at fleet size: its build's time, a whole table's bytes "
                                 "and a one-replica delta's."),
        ("netfaults", bench_netfaults, "A fleet across hosts (network namespaces) under partitions, pauses and "
                                       "slow links; the history checker's verdict per fault (needs root)."),
    ):
        p = add(b_sub, name, help_, mod.run)
        mod.add_arguments(p)


def _add_load_commands(sub: Subparsers, add: Add) -> None:
    """`thaw load`: replay a trace against a running Thaw, report, calibrate."""
    from loadtests import load_calibrate, load_report, load_run

    load = sub.add_parser("load", help="Replay a request trace against a running Thaw and report on it.")
    l_sub = load.add_subparsers(dest="load_command", metavar="SUBCOMMAND", required=True)
    for name, mod, help_ in (
        ("run", load_run, "Replay a trace open loop against an OpenAI endpoint; record every request."),
        ("report", load_report, "TTFT, TPOT, errors and goodput of a `thaw load run` directory, with plots."),
        ("calibrate", load_calibrate, "Measure the cost model on a stack of its own, replay a trace live and "
                                      "simulated, compare them side by side."),
    ):
        p = add(l_sub, name, help_, mod.run, with_common=False)
        mod.add_arguments(p)


def _add_snapshot_commands(sub: Subparsers, add: Add) -> None:
    """`thaw snapshot`: engine snapshots in the store."""
    from thaw.cli import snapshot as snapshot_cli

    snap = sub.add_parser("snapshot", help="Build, list or remove engine snapshots (compile caches) in the store.")
    s_sub = snap.add_subparsers(dest="snapshot_command", metavar="SUBCOMMAND", required=True)
    for name, help_ in snapshot_cli.COMMANDS.items():
        p = add(s_sub, name, help_, getattr(snapshot_cli, f"cmd_{name}"))
        snapshot_cli.add_arguments(name, p)


def _add_usage_command(sub: Subparsers, add: Add) -> None:
    """`thaw usage`: usage per tenant and model across every activator."""
    p = add(sub, "usage", "Usage per tenant and model across every activator: tokens, errors, cold starts, "
            "GPU-seconds, cost.", cmd_usage)
    p.add_argument("--tenant", default=None)
    p.add_argument("--controller", metavar="URL", default=None, help="where the prices are (the model registry)")
    p.add_argument("--since", default=None, help="epoch seconds, ISO time, or a duration back (15m, 2h, 7d)")
    p.add_argument("--until", default=None)
    p.add_argument("--format", choices=["table", "csv", "json"], default="table")


def _add_model_commands(sub: Subparsers, add: Add) -> None:
    """`thaw apply` and `thaw models`: the models served, at the controller."""
    from thaw.cli import models as models_cli

    p = add(sub, "apply", "Make the models and tenants served match a file (prints the plan first; "
            "all or nothing).", models_cli.run_apply)
    models_cli.add_apply_arguments(p)

    models = sub.add_parser("models", help="Deploy, change, roll back, remove and list the models served "
                                           "(at the controller; every activator follows within a second).")
    m_sub = models.add_subparsers(dest="models_command", metavar="SUBCOMMAND", required=True)
    for name, help_ in models_cli.COMMANDS.items():
        p = add(m_sub, name, help_, models_cli.run)
        models_cli.add_arguments(name, p)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.fn(args))
    except CliError as exc:
        print(f"thaw: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

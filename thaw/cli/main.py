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

from thaw.cli.aliases import add_hidden_parser, add_renamed_flag, renamed_command
from thaw.cli.common import NEEDS, CliError, add_controller_argument, add_json_argument
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
# add(parent, name, help, handler, with_common=True, needs="local", hidden_as=None): a
# command with its handler, by default the common options (--config, --log-level), and
# what it needs running said in its description (thaw.cli.common.NEEDS).
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
                        help=f"config file (default: $THAW_CONFIG, else {DEFAULT_CONFIG_PATH} here, else the "
                             "running `thaw up`'s)")
    common.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None,
                        help="what to log (default: the config's log_level)")
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
    def add(parent: Subparsers, name: str, help_: str, fn: Handler, with_common: bool = True,
            needs: str = "local", hidden_as: str | None = None) -> argparse.ArgumentParser:
        """``needs`` (a key of thaw.cli.common.NEEDS) ends the description with what the
        command needs running; ``hidden_as`` ("tenants keys add") makes it an old
        name, not listed, that says the new one first."""
        description = " ".join((help_, *NEEDS[needs]))
        parents = [common] if with_common else []
        if hidden_as is None:
            p = parent.add_parser(name, help=help_, description=description, parents=parents)
        else:
            p = add_hidden_parser(parent, name, description=description, parents=parents)
            path = parent._prog_prefix.removeprefix("thaw").strip()  # the group: "tenants"
            fn = renamed_command(f"{path} {name}".strip(), hidden_as, fn)
        p.set_defaults(fn=fn, needs=needs)
        return p

    return add


def _add_service_commands(sub: Subparsers, add: Add) -> None:
    """The services: `thaw up`, its status, and each part run on its own."""
    p = add(sub, "up", "Run the embedded platform: store, control plane, activator, standby workers.", cmd_up)
    p.add_argument("--port", type=int, default=None, help="activator port (default: server.port)")
    p = add(sub, "status", "Show models (replicas, queue, last cold start) and workers of a running `thaw up`.",
            cmd_status, needs="controller")
    add_controller_argument(p)
    add_json_argument(p)

    p = add(sub, "controller", "Run the controller: the pool manager, its API and the providers.", cmd_controller)
    p.add_argument("--host", default=None, help="listen address (default: controller.host)")
    p.add_argument("--port", type=int, default=None, help="listen port (default: controller.port, 8100)")
    p.add_argument("--stop-local-workers", action="store_true",
                   help="terminate the local pool's workers on exit (`thaw up`); by default they keep "
                        "serving for the next controller to adopt")
    p.add_argument("--url", default=None,
                   help="where the others reach this controller, one of controller.urls when several share "
                        "one PostgreSQL (default: controller.url, else http://HOST:PORT)")
    p = add(sub, "activator", "Run an activator: the OpenAI-compatible API.", cmd_activator, needs="controller")
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
    p = add(pl_sub, "status", "Per shape, model and worker: states, targets, budget and spend.", cmd_pool_status,
            needs="controller")
    add_controller_argument(p)
    add_json_argument(p)
    p = add(pl_sub, "events", "Every decision the controller carried out, with its reason and inputs.",
            cmd_pool_events, needs="controller")
    add_controller_argument(p)
    p.add_argument("--since", default="1h", help="epoch seconds, ISO time, or a duration back (default 1h)")
    p.add_argument("--history", action="store_true",
                   help="the decision log in the state database: every leader's events, each with its "
                        "controller and term (default: this controller's recent events)")
    add_json_argument(p)
    from thaw.cli import simulate as simulate_cli

    p = add(pl_sub, "recommend", "Sweep warm-pool settings on a request trace and print the cheapest config "
            "that meets a TTFT p99 target.", simulate_cli.cmd_recommend, with_common=False)
    simulate_cli.add_recommend_arguments(p)
    budget = pl_sub.add_parser("budget", help="Show or change standby bands and budgets at run time.")
    b_sub = budget.add_subparsers(dest="budget_command", metavar="SUBCOMMAND", required=True)
    p = add(b_sub, "show", "Each pool's standby band and budget, and the budget across all pools.",
            cmd_pool_budget_show, needs="controller")
    add_controller_argument(p)
    add_json_argument(p)
    p = add(b_sub, "set", "Change a pool's standby band or budget, or the total budget; kept across restarts.",
            cmd_pool_budget_set, needs="controller")
    p.add_argument("shape", metavar="SHAPE", nargs="?", default=None, help="the pool's shape (pools[].shape)")
    p.add_argument("--standby-min", type=int, default=None, metavar="N",
                   help="the pool's standby_min: instances kept standing by at the least")
    p.add_argument("--standby-max", type=int, default=None, metavar="N",
                   help="the pool's standby_max: instances standing by at the most")
    # Named like the fields they set (pools[].budget_usd_per_hour, budget_usd_per_hour); the old names.
    add_renamed_flag(p, "--usd-per-hour", "--budget-usd-per-hour", dest="usd_per_hour", type=float)
    add_renamed_flag(p, "--total-usd-per-hour", "--total-budget-usd-per-hour", dest="total_usd_per_hour",
                     type=float)
    p.add_argument("--budget-usd-per-hour", dest="usd_per_hour", type=float, default=None, metavar="USD",
                   help="the pool's budget_usd_per_hour: its standby + asleep spend")
    p.add_argument("--total-budget-usd-per-hour", dest="total_usd_per_hour", type=float, default=None,
                   metavar="USD", help="the config's top-level budget_usd_per_hour: the spend across all pools")
    add_controller_argument(p)
    add_json_argument(p)
    p = add(pl_sub, "clock", "The controller's time; --advance steps it forward (controller.stepped_clock: "
            "tests and rehearsals of a schedule).", cmd_pool_clock, needs="controller")
    p.add_argument("--advance", type=float, default=None, metavar="S",
                   help="move the controller's clock S seconds forward (refused unless stepped_clock is on, "
                        "or when S is longer than a worker's heartbeats outlast)")
    add_controller_argument(p)
    add_json_argument(p)


def _add_config_commands(sub: Subparsers, add: Add) -> None:
    """`thaw config`: check a config file, hash an API key."""
    cfg = sub.add_parser("config", help="Check a config file or hash an API key.")
    cfg_sub = cfg.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    p = add(cfg_sub, "check", "Validate a config file and print its problems, one per line.",
            cmd_config_check, with_common=False)
    p.add_argument("file", metavar="FILE")
    p.add_argument("--assume-size", action="append", metavar="[NAME=]SIZE", default=None,
                   help="weights size when the store cannot say (e.g. 140GiB, or llama-70b=140GiB); repeatable")
    add_json_argument(p, 'print the verdict as one JSON document: {"file", "ok", "problems", "notes", ...}')
    p = add(cfg_sub, "hash-key", "Print the hash of an API key, as stored in tenants[].api_key_hashes.",
            cmd_config_hash_key, with_common=False)
    p.add_argument("key", metavar="KEY")


def _add_store_commands(sub: Subparsers, add: Add) -> None:
    """`thaw store` (the embedded store) and `thaw demo-model`."""
    store = sub.add_parser("store", help="Start, stop or inspect the embedded S3 store (SeaweedFS).")
    st_sub = store.add_subparsers(dest="store_command", metavar="SUBCOMMAND", required=True)
    p = add(st_sub, "up", "Start the embedded store on loopback and create the bucket.", cmd_store_up)
    add_json_argument(p, "print the result as one JSON document (always: its endpoint, bucket, pid and data)")
    p = add(st_sub, "down", "Stop the embedded store (waits for a clean shutdown); refused while a running "
            "`thaw up` uses it.", cmd_store_down)
    p.add_argument("--force", action="store_true",
                   help="stop it even while a running `thaw up` uses it (that stack's services then fail)")
    add_json_argument(p)
    p = add(st_sub, "status", "Say whether the embedded store is running.", cmd_store_status)
    add_json_argument(p, "print the result as one JSON document (always: running, pid, endpoint)")
    p = add(st_sub, "ls", "List model prefixes in the store, with their manifests.", cmd_store_ls, needs="store")
    add_json_argument(p)

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

    p = add(sub, "push", "Upload a model directory to the store and write its manifest.", cmd_push, needs="store")
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
        p = add(s_sub, name, help_, getattr(snapshot_cli, f"cmd_{name}"), needs="store")
        snapshot_cli.add_arguments(name, p)


def _add_usage_command(sub: Subparsers, add: Add) -> None:
    """`thaw usage`: usage per tenant and model across every activator."""
    p = add(sub, "usage", "Usage per tenant and model across every activator: tokens, errors, cold starts, "
            "GPU-seconds, cost (prices from the controller's model registry).", cmd_usage, needs="store+controller")
    p.add_argument("--tenant", default=None, help="only this tenant's usage (default: every tenant's)")
    add_controller_argument(p)
    p.add_argument("--since", default=None, help="epoch seconds, ISO time, or a duration back (15m, 2h, 7d)")
    p.add_argument("--until", default=None, help="the window's end, as --since (default: now)")
    p.add_argument("--format", choices=["table", "csv", "json"], default="table",
                   help="a table (default), CSV (one row per request), or one JSON document")
    p.add_argument("--json", dest="format", action="store_const", const="json", help="the same as --format json")


def _add_model_commands(sub: Subparsers, add: Add) -> None:
    """`thaw apply` and `thaw models`: the models served, at the controller."""
    from thaw.cli import models as models_cli

    p = add(sub, "apply", "Make the models and tenants served match a file (prints the plan first; "
            "all or nothing).", models_cli.run_apply, needs="controller")
    models_cli.add_apply_arguments(p)

    models = sub.add_parser("models", help="Deploy, change, roll back, remove and list the models served "
                                           "(at the controller; every activator follows within a second).")
    m_sub = models.add_subparsers(dest="models_command", metavar="SUBCOMMAND", required=True)
    for name, help_ in models_cli.COMMANDS.items():
        p = add(m_sub, name, help_, models_cli.run, needs="controller")
        models_cli.add_arguments(name, p)
    for old, new in models_cli.RENAMED.items():
        p = add(m_sub, old, models_cli.COMMANDS[new], models_cli.run, needs="controller", hidden_as=f"models {new}")
        models_cli.add_arguments(old, p)


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

"""`thaw monitoring write`: a Prometheus config that scrapes Thaw, and Grafana's
provisioning with Thaw's dashboards (``thaw.dashboards``; docs/OPERATIONS.md,
"Dashboards")."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from thaw.cli.aliases import add_renamed_flag
from thaw.cli.common import _load, add_json_argument


def _urls(values: list[str] | None) -> list[str]:
    return [u.strip().rstrip("/") for v in values or [] for u in v.split(",") if u.strip()]


def run(args: argparse.Namespace) -> int:
    from thaw.auth import TOKEN_FILE
    from thaw.cli.up import endpoint_file
    from thaw.dashboards import write_monitoring

    cfg = _load(args)
    up: dict[str, Any] = {}
    try:
        up = json.loads(endpoint_file(cfg).read_text())
    except (OSError, ValueError):
        pass  # no `thaw up` running here: the config's addresses
    activators = _urls(args.activator) or [str(up.get("base_url", "")).removesuffix("/v1")
                                           or f"http://{cfg.server.host}:{cfg.server.port}"]
    controllers = _urls(args.controller) or _urls([str(up.get("control_url", ""))]) or cfg.controller.resolved_urls
    token_file = Path(args.token_file) if args.token_file else cfg.data_dir / TOKEN_FILE
    if not token_file.exists():
        print(f"thaw monitoring: note: {token_file} does not exist yet; Prometheus reads the cluster token "
              "from it (give --token-file if the token lives elsewhere)", file=sys.stderr)
    out = Path(args.out)
    written = write_monitoring(out, activators, controllers, token_file.resolve(), args.prometheus_url,
                               args.interval_s)
    if args.json:
        print(json.dumps({"wrote": [str(p) for p in written], "prometheus_config": str(out / "prometheus.yml"),
                          "grafana_provisioning": str(out / "grafana" / "provisioning")}, indent=2))
    else:
        for path in written:
            print(path)
    print(f"thaw monitoring: prometheus --config.file {out / 'prometheus.yml'}; Grafana with "
          f"GF_PATHS_PROVISIONING={out / 'grafana' / 'provisioning'}", file=sys.stderr)
    return 0


def add_parsers(sub: argparse._SubParsersAction, add: Any) -> None:  # type: ignore[type-arg]
    mon = sub.add_parser("monitoring", help="Prometheus and Grafana for Thaw: scrape config and dashboards.")
    m_sub = mon.add_subparsers(dest="monitoring_command", metavar="SUBCOMMAND", required=True)
    p = add(m_sub, "write", "Write prometheus.yml (scraping the activators and controllers with the cluster "
                            "token) and Grafana's provisioning with Thaw's dashboards into a folder.", run)
    add_renamed_flag(p, "--out", "--out-dir", dest="out")
    p.add_argument("--out-dir", dest="out", required=True, metavar="DIR", help="the folder to write into")
    p.add_argument("--activator", action="append", metavar="URL[,URL]",
                   help="activators to scrape (default: the running `thaw up`'s, else server.host:port)")
    p.add_argument("--controller", action="append", metavar="URL[,URL]",
                   help="controllers to scrape (default: the running `thaw up`'s, else controller.urls)")
    p.add_argument("--token-file", metavar="FILE", default=None,
                   help="the cluster token, which /metrics asks for (default: <data_dir>/cluster-token)")
    p.add_argument("--prometheus-url", default="http://127.0.0.1:9090",
                   help="where Grafana reaches Prometheus (default http://127.0.0.1:9090)")
    p.add_argument("--interval-s", type=float, default=15.0, help="scrape interval (default 15)")
    add_json_argument(p)

"""The scenarios of `thaw bench control-plane` beyond deploy, idle and burst
(loadtests/bench_control_plane.py): what an activator adds to a hot request, churn under
steady traffic, and a takeover of the leader."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from loadtests.plane_measures import API_KEY, Traffic, Versions, loop_figures, percentile

if TYPE_CHECKING:
    from loadtests.bench_control_plane import Plane


def latency(plane: Plane, pairs: int) -> dict[str, Any]:
    """What the activator adds to a hot request: ``pairs`` streamed completions of one
    ready model, each straight to its replica and then through an activator, one at a
    time on kept-alive connections; the added time is each pair's difference."""
    import httpx

    ready = plane.ready_models()
    if not ready:
        return {"skipped": "no model has a ready replica"}
    model, upstream = next(iter(ready.items()))
    body = {"model": model, "stream": True, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    key = {"Authorization": f"Bearer {API_KEY}"}

    def once(client: httpx.Client, url: str, headers: dict[str, str]) -> float:
        t0 = time.perf_counter()
        with client.stream("POST", url, json=body, headers=headers) as r:
            r.raise_for_status()
            for _ in r.iter_bytes():
                pass
        return time.perf_counter() - t0

    direct, through = [], []
    with httpx.Client(timeout=30) as client:
        for i in range(pairs + 20):  # the first 20 pairs warm both paths and are not counted
            d = once(client, f"{upstream}/v1/chat/completions", {})
            t = once(client, f"{plane.activator_urls[0]}/v1/chat/completions", key)
            if i >= 20:
                direct.append(d)
                through.append(t)
    added = [t - d for d, t in zip(direct, through, strict=True)]
    return {"pairs": pairs, "models_in_tables": plane.models, "direct_p50_s": percentile(direct, 50),
            "through_p50_s": percentile(through, 50), "added_p50_s": percentile(added, 50),
            "added_p99_s": percentile(added, 99)}

def churn(plane: Plane, seconds: float, per_minute: float, traffic_rps: float) -> dict[str, Any]:
    """Deploys, updates and removes in turn, ``per_minute`` of them, for ``seconds``,
    while ``traffic_rps`` requests a second stream to the models that are ready (a long
    tail): each change's time, when every activator had the catalog it made, the loop's
    turns meanwhile and how the traffic fared."""
    import httpx

    gap = 60.0 / per_minute
    took: dict[str, list[float]] = {"deploy": [], "update": [], "remove": []}
    failed: list[str] = []
    deployed: list[str] = []
    versions = Versions(plane, "catalog_version")
    before = plane.scrape()
    with versions, Traffic(plane, traffic_rps) as traffic, \
            httpx.Client(base_url=plane.controller_url, headers=plane.headers, timeout=120) as client:
        start = time.monotonic()
        for k in range(int(seconds / gap)):
            time.sleep(max(start + k * gap - time.monotonic(), 0.0))
            kind = ("deploy", "update", "remove")[k % 3]
            if kind == "remove" and not deployed:
                kind = "deploy"
            t0 = time.perf_counter()
            if kind == "deploy":
                name = f"c{k:05d}"
                r = client.post("/v1/admin/models", json={"name": name, "spec": plane.spec()})
                if r.status_code == 201:
                    deployed.append(name)
            elif kind == "update":
                # A model of the long tail, its keep-alive changed (to a value no
                # change before set: the same settings again are refused): a new
                # revision, no roll.
                name = f"m{(k * 7919) % plane.models:05d}"
                revision = client.get(f"/v1/admin/models/{name}").json()["revision"]
                t0 = time.perf_counter()
                r = client.patch(f"/v1/admin/models/{name}", json={
                    "revision": revision, "spec": {"autoscaling": {"idle_grace_s": 3000 + k}}})
            else:
                name = deployed.pop(0)
                r = client.delete(f"/v1/admin/models/{name}")
            took[kind].append(time.perf_counter() - t0)
            if r.status_code >= 300:
                failed.append(f"{kind} {name}: {r.status_code} {r.text[:200]}")
        wall = time.monotonic() - start
        # The last change's catalog reaching every activator is part of the run.
        newest = plane.health(plane.controller_url)["catalog_version"]
        plane.wait("every activator on the newest catalog", lambda: all(
            (plane.health(u)["catalog_version"] or 0) >= newest for u in plane.activator_urls), 60, every_s=0.05)
    after = plane.scrape()
    changes = sum(len(v) for v in took.values())
    return {"seconds": round(wall, 1), "changes": changes, "per_minute": round(changes / wall * 60, 1),
            "failed": failed[:20],
            **{f"{k}_p50_s": percentile(v, 50) for k, v in took.items()},
            **{f"{k}_p99_s": percentile(v, 99) for k, v in took.items()},
            "catalog_propagation": versions.report(), **loop_figures(before, after),
            "traffic": traffic.report()}

def takeover(plane: Plane, traffic_rps: float) -> dict[str, Any]:
    """The leader is killed (SIGKILL) while ``traffic_rps`` requests a second stream to
    the ready models: on PostgreSQL the follower takes over when the lease runs out;
    on SQLite the controller starts again on its data. How long until the new one
    leads, has adopted the fleet, routes every replica the old one routed and every
    activator follows it; whether any worker was assigned or released because of it."""
    import signal

    def replicas(url: str) -> set[tuple[str, str, str]]:
        table = plane.get(f"{url}/v1/routes")
        return {(name, r["worker_id"], r["assignment_id"]) for name, route in table["models"].items()
                for r in route.get("replicas", [])}

    before = replicas(plane.controller_url)
    fleet_before = plane.get(f"http://127.0.0.1:{plane.fleet_port}/stats")
    old = plane.procs[f"controller-{plane.leader}"]
    with Traffic(plane, traffic_rps) as traffic:
        killed = time.time()
        os.killpg(old.pid, signal.SIGKILL)
        old.wait(30)
        if "b" in plane.controller_urls:
            plane.leader = "b" if plane.leader == "a" else "a"
        else:
            plane.start_controller("a")
        plane.controller_url = plane.controller_urls[plane.leader]
        marks: dict[str, float] = {}

        def health() -> dict[str, Any]:
            try:
                return plane.health(plane.controller_url)
            except Exception:  # noqa: BLE001 - not up yet
                return {}

        def leads() -> bool:
            h = health()
            if h.get("role") == "leader":
                marks.setdefault("leads", time.time())
            return bool(h.get("role") == "leader" and h.get("adopted"))

        plane.wait("a new leader that has adopted the fleet", leads, 300, every_s=0.05)
        marks["adopted"] = time.time()
        plane.wait("the new leader routing every replica the old one routed",
                  lambda: replicas(plane.controller_url) >= before, 300, every_s=0.1)
        marks["routes_kept"] = time.time()
        epoch = plane.health(plane.controller_url)["epoch"]
        plane.wait("every activator on the new leader's route table", lambda: all(
            plane.health(u)["routes_epoch"] == epoch for u in plane.activator_urls), 300, every_s=0.05)
        marks["activators_follow"] = time.time()
    fleet_after = plane.get(f"http://127.0.0.1:{plane.fleet_port}/stats")
    after = replicas(plane.controller_url)
    return {"state": "postgres" if "b" in plane.controller_urls else "sqlite (a restart)",
            "replicas_before": len(before), "replicas_kept": len(before & after),
            **{f"{k}_s": round(t - killed, 2) for k, t in marks.items()},
            "assigns_meanwhile": fleet_after["assigns"] - fleet_before["assigns"],
            "releases_meanwhile": fleet_after["releases"] - fleet_before["releases"],
            "traffic": traffic.report()}

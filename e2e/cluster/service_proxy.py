"""Service addresses for the local cluster's real node: a stand-in for kube-proxy's iptables mode,
limited to one chain of this cluster's own (e2e/cluster/node.sh).

Why not kube-proxy itself: its chains (KUBE-SERVICES, ...) are global to the machine, and the demo's
and the tests' clusters run side by side here, each with its own Services. This program writes only
`-t nat <chain>`, which node.sh jumps to from PREROUTING (traffic of this cluster's bridge) and
OUTPUT (the API server calling a webhook Service, tests on the host), for this cluster's Service
range only:

- the `kubernetes` Service goes to the API server on 127.0.0.1 (the bridge accepts loopback
  destinations: route_localnet);
- every other ClusterIP port goes to its ready endpoints (EndpointSlices), one picked at random per
  connection as kube-proxy does (`statistic --mode random` with probabilities 1/n, 1/(n-1), ...).

A Service without ready endpoints has no rule; node.sh refuses what is still addressed to the
Service range after the nat table, so such a connection fails at once and nothing leaves the
machine. Only endpoints on this machine get a rule: IPv4 addresses in 127.0.0.0/8 (the fake nodes'
pods) or in the real node's pod subnet; any other (a hand-made EndpointSlice naming an outside
address) is left out. The chain is replaced whole with `iptables-restore --noflush` (atomic per
table), and only when its rules change.
"""

from __future__ import annotations

import argparse
import ipaddress
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


def on_this_machine(address: str, pod_subnet: ipaddress.IPv4Network) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return ip.version == 4 and (ip in LOOPBACK or ip in pod_subnet)


def rules(chain: str, services: dict[str, Any], slices: dict[str, Any], kubernetes_ip: str,
          apiserver: str, pod_subnet: ipaddress.IPv4Network) -> list[str]:
    out = [f"-A {chain} -d {kubernetes_ip}/32 -p tcp --dport 443 -j DNAT --to-destination {apiserver}"]
    # Slices indexed by their Service once per sync: matching every Service against every slice made
    # each sync O(Services x slices), which at 600 Services burned a core through a bench run (kube-proxy
    # keeps the same index, pkg/proxy/endpointslicecache.go).
    by_service: dict[tuple[str, str], list[Any]] = {}
    for s in slices.values():
        owner = (s.metadata.labels or {}).get("kubernetes.io/service-name")
        if owner and s.address_type == "IPv4":
            by_service.setdefault((s.metadata.namespace, owner), []).append(s)
    for key in sorted(services):
        svc = services[key]
        ip = svc.spec.cluster_ip
        if not ip or ip == "None" or ip == kubernetes_ip:
            continue
        mine = by_service.get((svc.metadata.namespace, svc.metadata.name), [])
        for port in svc.spec.ports or []:
            if (port.protocol or "TCP") != "TCP":
                continue
            targets = sorted({
                f"{address}:{slice_port.port}"
                for s in mine
                for slice_port in s.ports or []
                if (slice_port.name or "") == (port.name or "") and slice_port.port
                for endpoint in s.endpoints or []
                if endpoint.conditions is None or endpoint.conditions.ready is not False
                for address in endpoint.addresses
                if on_this_machine(address, pod_subnet)
            })
            for i, target in enumerate(targets):
                left = len(targets) - i
                pick = f"-m statistic --mode random --probability {1 / left:.5f} " if left > 1 else ""
                out.append(f"-A {chain} -d {ip}/32 -p tcp --dport {port.port} {pick}-j DNAT --to-destination {target}")
    return out


def apply(chain: str, lines: list[str]) -> None:
    text = "\n".join(["*nat", f":{chain} - [0:0]", *lines, "COMMIT", ""])
    subprocess.run(["iptables-restore", "-w", "--noflush"], input=text, text=True, check=True)


class Mirror:
    """Services and EndpointSlices of every namespace, kept by list + watch; `changed` is set on
    every event so the writer recomputes."""

    def __init__(self, api: client.ApiClient) -> None:
        self.listed: set[int] = set()
        """Which of the two stores have been listed at least once (ready when both)."""
        self.core = client.CoreV1Api(api)
        self.discovery = client.DiscoveryV1Api(api)
        self.services: dict[str, Any] = {}
        self.slices: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.changed = threading.Event()

    def follow(self, lister: Any, store: dict[str, Any]) -> None:
        while True:
            try:
                listed = lister()
                with self.lock:
                    store.clear()
                    for item in listed.items:
                        store[f"{item.metadata.namespace}/{item.metadata.name}"] = item
                    self.listed.add(id(store))
                self.changed.set()
                for event in watch.Watch().stream(lister, resource_version=listed.metadata.resource_version,
                                                  timeout_seconds=300):
                    item = event["object"]
                    key = f"{item.metadata.namespace}/{item.metadata.name}"
                    with self.lock:
                        if event["type"] == "DELETED":
                            store.pop(key, None)
                        else:
                            store[key] = item
                    self.changed.set()
            except Exception as error:  # noqa: BLE001 - the API server restarts in fault tests: list again
                print(f"service-proxy: {type(error).__name__}: {error}; listing again", file=sys.stderr, flush=True)
                time.sleep(1)

    def start(self) -> None:
        for lister, store in ((self.core.list_service_for_all_namespaces, self.services),
                              (self.discovery.list_endpoint_slice_for_all_namespaces, self.slices)):
            threading.Thread(target=self.follow, args=(lister, store), daemon=True).start()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--chain", required=True)
    parser.add_argument("--kubernetes-ip", required=True, help="the `kubernetes` Service's ClusterIP")
    parser.add_argument("--apiserver", required=True, help="HOST:PORT the API server listens on")
    parser.add_argument("--pod-subnet", type=ipaddress.IPv4Network, required=True,
                        help="the real node's pod subnet (endpoints outside it and 127.0.0.0/8 get no rule)")
    parser.add_argument("--ready-file", type=Path, required=True, help="created once the first rules are in")
    args = parser.parse_args()
    mirror = Mirror(config.new_client_from_config(config_file=args.kubeconfig))
    mirror.start()
    written: list[str] | None = None
    while True:
        mirror.changed.wait()
        time.sleep(0.05)  # a burst of events, one write
        mirror.changed.clear()
        with mirror.lock:
            wanted = rules(args.chain, dict(mirror.services), dict(mirror.slices), args.kubernetes_ip,
                           args.apiserver, args.pod_subnet)
            listed = len(mirror.listed) == 2
        if wanted != written:
            try:
                apply(args.chain, wanted)
            except subprocess.CalledProcessError as error:  # the old rules stay; try again at the next event
                print(f"service-proxy: iptables-restore failed: {error}", file=sys.stderr, flush=True)
                continue
            written = wanted
            print(f"service-proxy: {len(wanted)} rules", file=sys.stderr, flush=True)
        if listed:
            args.ready_file.touch()


if __name__ == "__main__":
    main()

"""The real node's Service rules (e2e/cluster/service_proxy.py): what kube-proxy's iptables mode
would send where, for the Services, EndpointSlices and ports the API server serves."""

from __future__ import annotations

import importlib.util
import ipaddress
from pathlib import Path
from typing import Any

from kubernetes import client

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("service_proxy", ROOT / "e2e" / "cluster" / "service_proxy.py")
assert _spec and _spec.loader
service_proxy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(service_proxy)

CHAIN, KUBERNETES_IP, APISERVER = "KIMIK3-SVC-7", "10.103.0.1", "127.0.0.1:16702"
POD_SUBNET = ipaddress.IPv4Network("10.200.7.0/24")


def service(name: str, ip: str, *ports: tuple[str, int, str], namespace: str = "ns") -> client.V1Service:
    return client.V1Service(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        spec=client.V1ServiceSpec(cluster_ip=ip, ports=[client.V1ServicePort(name=n, port=p, protocol=proto)
                                                         for n, p, proto in ports]))


def endpoints(service_name: str, ports: dict[str | None, int], *addresses: tuple[str, bool | None],
              namespace: str = "ns", name: str | None = None, family: str = "IPv4") -> client.V1EndpointSlice:
    return client.V1EndpointSlice(
        address_type=family,
        metadata=client.V1ObjectMeta(name=name or f"{service_name}-x", namespace=namespace,
                                     labels={"kubernetes.io/service-name": service_name}),
        ports=[client.DiscoveryV1EndpointPort(name=n, port=p) for n, p in ports.items()],
        endpoints=[client.V1Endpoint(addresses=[a], conditions=None if ready is None
                                     else client.V1EndpointConditions(ready=ready)) for a, ready in addresses])


def rules(services: list[Any], slices: list[Any]) -> list[str]:
    return service_proxy.rules(CHAIN, {f"{s.metadata.namespace}/{s.metadata.name}": s for s in services},
                               {f"{s.metadata.namespace}/{s.metadata.name}": s for s in slices},
                               KUBERNETES_IP, APISERVER, POD_SUBNET)


def test_the_kubernetes_service_goes_to_the_api_server_on_loopback_and_nothing_else_without_endpoints() -> None:
    out = rules([service("kubernetes", KUBERNETES_IP, ("https", 443, "TCP"), namespace="default"),
                 service("lonely", "10.103.4.4", ("http", 80, "TCP"))], [])
    assert out == [f"-A {CHAIN} -d {KUBERNETES_IP}/32 -p tcp --dport 443 -j DNAT --to-destination {APISERVER}"]


def test_each_port_goes_to_its_ready_endpoints_at_their_target_port_with_even_odds() -> None:
    svc = service("webhook", "10.103.9.9", ("https", 443, "TCP"), ("metrics", 9090, "TCP"))
    eps = endpoints("webhook", {"https": 9443, "metrics": 9090},
                    ("10.200.7.2", True), ("10.200.7.3", None), ("10.200.7.4", False), ("10.200.7.5", True))
    out = rules([svc], [eps])[1:]
    https = [r for r in out if "--dport 443 " in r]
    assert [r.split("--to-destination ")[1] for r in https] == ["10.200.7.2:9443", "10.200.7.3:9443", "10.200.7.5:9443"]
    # 1/3, then 1/2 of the rest, then the rest: each endpoint a third of the connections.
    assert "--probability 0.33333" in https[0] and "--probability 0.50000" in https[1]
    assert "statistic" not in https[2]
    assert [r.split("--to-destination ")[1] for r in out if "--dport 9090 " in r] == [
        "10.200.7.2:9090", "10.200.7.3:9090", "10.200.7.5:9090"]


def test_endpoints_of_another_namespace_or_service_udp_ports_and_headless_services_get_no_rule() -> None:
    services = [service("a", "10.103.1.1", ("http", 80, "TCP"), ("dns", 53, "UDP")),
                service("headless", "None", ("http", 80, "TCP"))]
    slices = [endpoints("a", {"http": 8000, "dns": 53}, ("10.200.7.9", True)),
              endpoints("a", {"http": 8001}, ("10.200.7.8", True), namespace="other"),
              endpoints("headless", {"http": 8000}, ("10.200.7.7", True))]
    out = rules(services, slices)[1:]
    assert out == [f"-A {CHAIN} -d 10.103.1.1/32 -p tcp --dport 80 -j DNAT --to-destination 10.200.7.9:8000"]


def test_only_endpoints_on_this_machine_get_a_rule() -> None:
    """Loopback (the fake nodes' pods) and the real node's pod subnet; never an outside address a
    hand-made EndpointSlice names, nor an IPv6 or FQDN slice (iptables-restore would refuse it)."""
    svc = service("mixed", "10.103.2.2", ("http", 80, "TCP"))
    slices = [endpoints("mixed", {"http": 8000}, ("127.100.0.5", True), ("10.200.7.9", True), ("10.0.0.9", True),
                        ("8.8.8.8", True), ("10.200.8.1", True)),
              endpoints("mixed", {"http": 8000}, ("fd00::1", True), name="mixed-v6", family="IPv6"),
              endpoints("mixed", {"http": 8000}, ("example.com", True), name="mixed-fqdn", family="FQDN")]
    out = rules([svc], slices)[1:]
    assert [r.split("--to-destination ")[1] for r in out] == ["10.200.7.9:8000", "127.100.0.5:8000"]


def test_a_service_with_one_unnamed_port_gets_its_rule() -> None:
    """The API server names a lone port "" in the EndpointSlice and leaves the Service's unset."""
    svc = service("plain", "10.103.3.3", (None, 80, "TCP"))  # type: ignore[arg-type]
    out = rules([svc], [endpoints("plain", {"": 8080}, ("10.200.7.4", True))])[1:]
    assert out == [f"-A {CHAIN} -d 10.103.3.3/32 -p tcp --dport 80 -j DNAT --to-destination 10.200.7.4:8080"]

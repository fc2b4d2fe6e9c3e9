"""The webhook certificate the operator keeps: when to keep, renew or start a new CA (pure), and
what openssl makes of it (a CA, a serving certificate for the hosts that the CA verifies)."""

from __future__ import annotations

import ssl
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from kimik3_operator.webhook_pki import Action, Facts, Material, Policy, bundle, decide, inspect, renewed

NOW = datetime(2026, 12, 1, tzinfo=UTC)
HOSTS = frozenset({"kimik3-webhook", "kimik3-webhook.ns.svc", "127.0.0.1"})
POLICY = Policy()
GOOD = Facts(ca_not_after=NOW + timedelta(days=3000), cert_not_after=NOW + timedelta(days=200), hosts=HOSTS,
             ca_sound=True, cert_sound=True)


@pytest.mark.parametrize(("facts", "action"), [
    (None, Action.NEW_CA),
    (GOOD, Action.KEEP),
    (replace(GOOD, hosts=HOSTS | {"extra"}), Action.KEEP),  # more names than needed: still serves ours
    (replace(GOOD, ca_not_after=NOW + timedelta(days=364)), Action.NEW_CA),
    (replace(GOOD, ca_sound=False), Action.NEW_CA),
    (replace(GOOD, cert_not_after=NOW + timedelta(days=29)), Action.RENEW),
    (replace(GOOD, cert_not_after=NOW - timedelta(days=1)), Action.RENEW),
    (replace(GOOD, cert_sound=False), Action.RENEW),
    (replace(GOOD, hosts=HOSTS - {"127.0.0.1"}), Action.RENEW),
])
def test_decide(facts: Facts | None, action: Action) -> None:
    assert decide(facts, HOSTS, NOW, POLICY) is action


def test_secret_data_round_trip_and_refusals() -> None:
    material = Material(b"ca", b"cakey", b"cert", b"key")
    assert Material.from_secret_data(material.secret_data()) == material
    assert Material.from_secret_data(None) is None
    assert Material.from_secret_data({k: v for k, v in material.secret_data().items() if k != "ca.key"}) is None
    assert Material.from_secret_data({**material.secret_data(), "tls.crt": "not base64!"}) is None


@pytest.fixture(scope="module")
def fresh() -> Material:
    action, material = renewed(None, HOSTS, datetime.now(UTC))
    assert action is Action.NEW_CA and material is not None
    return material


def test_a_new_ca_and_certificate_for_the_hosts(fresh: Material, tmp_path: Path) -> None:
    facts = inspect(fresh)
    assert facts is not None and facts.hosts == HOSTS and facts.ca_sound and facts.cert_sound
    now = datetime.now(UTC)
    assert timedelta(days=3640) < facts.ca_not_after - now < timedelta(days=3651)
    assert timedelta(days=360) < facts.cert_not_after - now < timedelta(days=366)
    assert fresh.ca_bundle == fresh.ca_cert  # no previous CA
    (tmp_path / "tls.crt").write_bytes(fresh.cert)
    (tmp_path / "tls.key").write_bytes(fresh.key)
    ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")


def test_sound_material_is_kept(fresh: Material) -> None:
    assert renewed(fresh, HOSTS, datetime.now(UTC)) == (Action.KEEP, None)


def test_a_new_host_renews_the_certificate_under_the_same_ca(fresh: Material) -> None:
    action, material = renewed(fresh, HOSTS | {"other.ns.svc"}, datetime.now(UTC))
    assert action is Action.RENEW and material is not None
    assert (material.ca_bundle, material.ca_key) == (fresh.ca_bundle, fresh.ca_key)
    facts = inspect(material)
    assert facts is not None and facts.cert_sound and facts.hosts == HOSTS | {"other.ns.svc"}


def test_a_certificate_of_another_ca_is_renewed(fresh: Material) -> None:
    _, other = renewed(None, HOSTS, datetime.now(UTC))
    assert other is not None
    mixed = replace(fresh, cert=other.cert, key=other.key)
    facts = inspect(mixed)
    assert facts is not None and facts.ca_sound and not facts.cert_sound
    assert renewed(mixed, HOSTS, datetime.now(UTC))[0] is Action.RENEW


def test_a_ca_near_its_end_is_replaced_and_stays_trusted_beside_the_new_one(fresh: Material) -> None:
    later = datetime.now(UTC) + timedelta(days=3650 - 300)  # the CA has 300 days left
    action, material = renewed(fresh, HOSTS, later)
    assert action is Action.NEW_CA and material is not None
    assert material.ca_bundle.startswith(material.ca_cert) and material.ca_bundle.endswith(fresh.ca_cert)
    assert material.ca_cert != fresh.ca_cert


def test_an_expired_previous_ca_is_dropped_from_the_bundle(fresh: Material) -> None:
    assert bundle(b"NEW\n", fresh, NOW - timedelta(seconds=1), NOW) == b"NEW\n"
    assert bundle(b"NEW\n", fresh, NOW + timedelta(days=1), NOW) == b"NEW\n" + fresh.ca_cert


def test_garbage_is_no_certificate() -> None:
    assert inspect(Material(b"x", b"y", b"z", b"w")) is None
    action, material = renewed(Material(b"x", b"y", b"z", b"w"), HOSTS, datetime.now(UTC))
    assert action is Action.NEW_CA and material is not None


def test_the_ca_served_as_the_certificate_is_renewed_under_the_same_ca(fresh: Material) -> None:
    """What the e2e test does to the Secret: the CA's own certificate and key in tls.crt/tls.key
    verify and match, but name no host."""
    tampered = replace(fresh, cert=fresh.ca_cert, key=fresh.ca_key)
    facts = inspect(tampered)
    assert facts is not None and facts.hosts == frozenset()
    action, material = renewed(tampered, HOSTS, datetime.now(UTC))
    assert action is Action.RENEW and material is not None and material.ca_bundle == fresh.ca_bundle

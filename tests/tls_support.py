"""A real public-key infrastructure for the TLS tests, made with `cryptography`.

Three CAs, as docs/security.md recommends for a cluster: the agents' CA (signs
the controller's server certificate and every agent's client certificate), the
admin CA (signs operators' client certificates for the admin door), and a CA
nobody trusts (for "wrong CA" cases). Keys are EC P-256: fast to make, and
accepted by gRPC's BoringSSL.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_NAMES = ("agents", "admin", "other")


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


@dataclass
class _Authority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    cert_path: Path
    key_path: Path


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return builder.not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(
        now + dt.timedelta(days=2)
    )


def _make_ca(directory: Path, name: str) -> _Authority:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _validity(x509.CertificateBuilder())
        .subject_name(_name(f"dsched test {name} CA"))
        .issuer_name(_name(f"dsched test {name} CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path = directory / f"{name}-ca.pem"
    key_path = directory / f"{name}-ca.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, key_path)
    return _Authority(cert, key, cert_path, key_path)


@dataclass
class Pki:
    """Paths of PEM files under ``dir``; :meth:`issue` makes more."""

    dir: Path
    ca: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    admin_ca: Path
    admin_cert: Path
    admin_key: Path
    other_ca: Path
    _authorities: dict[str, _Authority] = field(default_factory=dict, repr=False)

    def issue(
        self,
        name: str,
        *,
        ca: str = "agents",
        cn: str,
        dns: tuple[str, ...] | list[str] = (),
        ips: tuple[str, ...] | list[str] = (),
        server: bool = False,
    ) -> tuple[Path, Path]:
        """A certificate and key signed by CA ``ca`` ("agents", "admin" or "other")."""
        if ca not in self._authorities:
            raise ValueError(f"ca must be one of {CA_NAMES}, got {ca!r}")
        authority = self._authorities[ca]
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            _validity(x509.CertificateBuilder())
            .subject_name(_name(cn))
            .issuer_name(authority.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        alt_names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        alt_names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if alt_names:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        cert = builder.sign(authority.key, hashes.SHA256())
        cert_path = self.dir / f"{name}.pem"
        key_path = self.dir / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_path)
        return cert_path, key_path

    def agent(self, node_id: str, *, ca: str = "agents") -> tuple[Path, Path]:
        """An agent's client certificate: CN and DNS SAN are its node id."""
        return self.issue(f"agent-{node_id}-{ca}", ca=ca, cn=node_id, dns=(node_id,))


def make_pki(directory: Path) -> Pki:
    """CAs, the controller's server certificate and one admin certificate under ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    authorities = {name: _make_ca(directory, name) for name in CA_NAMES}
    pki = Pki(
        dir=directory,
        ca=authorities["agents"].cert_path,
        ca_key=authorities["agents"].key_path,
        server_cert=directory / "unset",
        server_key=directory / "unset",
        admin_ca=authorities["admin"].cert_path,
        admin_cert=directory / "unset",
        admin_key=directory / "unset",
        other_ca=authorities["other"].cert_path,
        _authorities=authorities,
    )
    pki.server_cert, pki.server_key = pki.issue(
        "server",
        cn="dsched-controller",
        dns=("localhost",),
        ips=("127.0.0.1", "::1"),
        server=True,
    )
    pki.admin_cert, pki.admin_key = pki.issue("admin", ca="admin", cn="admin")
    return pki

"""TLS material for the gRPC doors, one type for both ends.

The controller serves with ``cert`` + ``key`` and, with ``ca`` set, asks every
agent for a client certificate signed by it (mutual TLS). An agent connects
with ``ca`` (to check the controller) and its own ``cert`` + ``key``. Which
parts each end requires is checked by :meth:`TlsConfig.validate` with the role.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from dsched.config import require


@dataclass
class TlsConfig:
    """``[tls]``: PEM files; all empty means plaintext."""

    # The table's name in the config file, for error messages (a subclass may differ).
    section: ClassVar[str] = "tls"

    # PEM certificate of this end.
    cert: Path | None = None
    # PEM private key of cert.
    key: Path | None = None
    # PEM CA: the server checks clients with it, a client checks the server.
    ca: Path | None = None

    @property
    def enabled(self) -> bool:
        return any(p is not None for p in (self.cert, self.key, self.ca))

    def validate(self, role: str = "server") -> None:
        """Refuse half-configured TLS naming the key. ``role``: "server" or "client"."""
        sec = self.section
        require(
            (self.cert is None) == (self.key is None), f"{sec}.cert", "cert and key go together"
        )
        if role == "server":
            require(
                self.ca is None or self.cert is not None,
                f"{sec}.cert",
                "a client CA needs the server's own cert and key",
            )
        elif role == "client":
            require(
                not self.enabled or self.ca is not None,
                f"{sec}.ca",
                "a CA file is required when TLS is configured",
            )
        else:
            raise ValueError(f"role must be 'server' or 'client', got {role!r}")
        for name in ("cert", "key", "ca"):
            p = getattr(self, name)
            require(p is None or Path(p).is_file(), f"{sec}.{name}", f"file {p} does not exist")

    def missing(self) -> list[str]:
        """Keys of cert, key and ca that are not set (mutual TLS needs all three)."""
        return [f"{self.section}.{n}" for n in ("cert", "key", "ca") if getattr(self, n) is None]

    def read(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """(cert, key, ca) bytes, None where not configured."""
        return tuple(
            None if p is None else Path(p).read_bytes() for p in (self.cert, self.key, self.ca)
        )  # type: ignore[return-value]


_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.DOTALL)


def pem_certificates(path: Path) -> list[bytes]:
    """The DER bytes of every certificate in a PEM file (a CA bundle may hold several)."""
    out = []
    for block in _PEM_CERT.findall(Path(path).read_bytes()):
        try:
            out.append(base64.b64decode(b"".join(block.split()), validate=True))
        except binascii.Error:
            continue
    return out

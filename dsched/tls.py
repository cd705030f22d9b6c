"""TLS material for the gRPC doors, one type for both ends.

The controller serves with ``cert`` + ``key`` and, with ``ca`` set, asks every
agent for a client certificate signed by it (mutual TLS). An agent connects
with ``ca`` (to check the controller) and its own ``cert`` + ``key``. Which
parts each end requires is checked by :meth:`TlsConfig.validate` with the role.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dsched.config import require


@dataclass
class TlsConfig:
    """``[tls]``: PEM files; all empty means plaintext."""

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
        require((self.cert is None) == (self.key is None), "tls.cert", "cert and key go together")
        if role == "server":
            require(
                self.ca is None or self.cert is not None,
                "tls.cert",
                "a client CA needs the server's own cert and key",
            )
        elif role == "client":
            require(
                not self.enabled or self.ca is not None,
                "tls.ca",
                "a CA file is required when TLS is configured",
            )
        else:
            raise ValueError(f"role must be 'server' or 'client', got {role!r}")
        for name in ("cert", "key", "ca"):
            p = getattr(self, name)
            require(p is None or Path(p).is_file(), f"tls.{name}", f"file {p} does not exist")

    def read(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """(cert, key, ca) bytes, None where not configured."""
        return tuple(
            None if p is None else Path(p).read_bytes() for p in (self.cert, self.key, self.ca)
        )  # type: ignore[return-value]

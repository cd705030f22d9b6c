"""Network namespaces on this machine, each joined to a bridge in the host's
namespace by a veth pair: the agents live on their own "hosts" and reach the
controller only over their veth, so a link set down is a real partition.

Interface names carry a short token of the run (Linux allows 15 characters),
so two runs never collide and :meth:`NetLab.close` removes exactly what this
run made, also after a failure half-way through :meth:`NetLab.start`.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

NETNS_DIR = Path("/var/run/netns")


class NetLabError(RuntimeError):
    pass


def netns_available() -> tuple[bool, str]:
    """Whether namespaces and veth pairs can be made here, and if not, why not."""
    if os.geteuid() != 0:
        return False, "network namespaces need root"
    try:
        from pyroute2 import netns  # noqa: F401
    except ImportError as exc:
        return False, f"pyroute2 is not installed: {exc}"
    return True, "root and pyroute2"


@dataclass
class Host:
    """One namespace: ``address`` inside it, ``veth_host`` the end on the bridge."""

    name: str
    netns: str
    address: str
    veth_host: str
    veth_ns: str

    @property
    def netns_path(self) -> str:
        return str(NETNS_DIR / self.netns)

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace. Only the network namespace is entered
        (nsenter --net): `ip netns exec` would also remount /sys, which hides the
        cgroup hierarchy the agent writes to."""
        return ["nsenter", f"--net={self.netns_path}", "--", *argv]


class NetLab:
    """A bridge with ``subnet``'s first address and one namespace per host name."""

    def __init__(self, token: str, hosts: list[str], subnet: str = "10.213.0.0/24"):
        if len(token) > 6:
            raise ValueError(f"token {token!r}: at most 6 characters (interface names)")
        net = ipaddress.ip_network(subnet)
        addresses = list(net.hosts())
        if len(hosts) + 1 > len(addresses):
            raise ValueError(f"{subnet} is too small for {len(hosts)} hosts")
        self.token = token
        self.prefixlen = net.prefixlen
        self.bridge = f"dsbr{token}"
        self.bridge_address = str(addresses[0])
        self.hosts = {
            name: Host(
                name=name,
                netns=f"dsched-{token}-{name}",
                address=str(addresses[k + 1]),
                veth_host=f"dsh{token}{k}",
                veth_ns=f"dsn{token}{k}",
            )
            for k, name in enumerate(hosts)
        }
        self._made_netns: list[str] = []
        self._made_links: list[str] = []

    def start(self) -> NetLab:
        from pyroute2 import IPRoute, NetNS, netns

        try:
            with IPRoute() as ip:
                ip.link("add", ifname=self.bridge, kind="bridge")
                self._made_links.append(self.bridge)
                br = ip.link_lookup(ifname=self.bridge)[0]
                ip.addr("add", index=br, address=self.bridge_address, prefixlen=self.prefixlen)
                ip.link("set", index=br, state="up")
                for host in self.hosts.values():
                    netns.create(host.netns)
                    self._made_netns.append(host.netns)
                    ip.link(
                        "add",
                        ifname=host.veth_host,
                        kind="veth",
                        peer={"ifname": host.veth_ns, "net_ns_fd": host.netns},
                    )
                    self._made_links.append(host.veth_host)
                    idx = ip.link_lookup(ifname=host.veth_host)[0]
                    ip.link("set", index=idx, master=br, state="up")
            for host in self.hosts.values():
                with NetNS(host.netns) as ns:
                    idx = ns.link_lookup(ifname=host.veth_ns)[0]
                    ns.addr("add", index=idx, address=host.address, prefixlen=self.prefixlen)
                    ns.link("set", index=idx, state="up")
                    ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
        except BaseException:
            self.close()
            raise
        return self

    def set_link(self, host: str, up: bool) -> None:
        """The host's veth, on the bridge side: down cuts it off, up joins it again
        (TCP connections survive if neither end gave up meanwhile)."""
        from pyroute2 import IPRoute

        with IPRoute() as ip:
            found = ip.link_lookup(ifname=self.hosts[host].veth_host)
            if not found:
                raise NetLabError(f"{self.hosts[host].veth_host} is gone")
            ip.link("set", index=found[0], state="up" if up else "down")

    def close(self) -> None:
        """Remove every link and namespace this lab made (deleting one end of a veth
        pair removes the other)."""
        from pyroute2 import IPRoute, netns

        errors = []
        with IPRoute() as ip:
            for name in reversed(self._made_links):
                try:
                    found = ip.link_lookup(ifname=name)
                    if found:
                        ip.link("del", index=found[0])
                except Exception as exc:  # keep removing the rest
                    errors.append(f"{name}: {exc}")
        self._made_links.clear()
        for name in reversed(self._made_netns):
            try:
                if name in netns.listnetns():
                    netns.remove(name)
            except Exception as exc:
                errors.append(f"{name}: {exc}")
        self._made_netns.clear()
        if errors:
            raise NetLabError("could not remove " + "; ".join(errors))

    def leftovers(self) -> list[str]:
        """Interfaces and namespaces of this lab still present (after close: none)."""
        from pyroute2 import IPRoute, netns

        left = [n for n in netns.listnetns() if n.startswith(f"dsched-{self.token}-")]
        with IPRoute() as ip:
            names = [link.get_attr("IFLA_IFNAME") for link in ip.get_links()]
        left += [n for n in names if n and self.token in n and n.startswith("ds")]
        return left

    def __enter__(self) -> NetLab:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

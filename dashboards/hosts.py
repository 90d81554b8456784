"""Which `Host:` headers the dashboard answers: a defence against DNS rebinding.

A web page on evil.example can make its name resolve to 127.0.0.1 and then read the dashboard (run
paths, command lines) from the user's own browser; the request it sends carries `Host: evil.example`.
So the server answers only requests whose Host names it: the loopback names by default, plus the
`--host` it listens on. Listening on every interface (`--host 0.0.0.0` or `::`) adds this machine's
name and any IP literal (a rebinding page can only send a DNS name, never an address).

Hand-written rather than Flask's TRUSTED_HOSTS: that setting needs Flask 3.1 (dash allows older) and
its matching cuts an IPv6 literal at the first colon, so `[::1]` can't be listed.

    HostPolicy.for_listen_address(host) -> HostPolicy
    policy.allows(host_header) -> bool
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
_EVERY_INTERFACE = {"", "0.0.0.0", "::", "[::]"}


def _hostname(header: str) -> str:
    """The name of a Host header, port removed and lower-cased: `[::1]:8050` -> `[::1]`."""
    header = header.strip().lower()
    if header.startswith("["):
        if "]" not in header:
            return ""
        name, _, rest = header.partition("]")
        name, port = name + "]", rest[1:] if rest.startswith(":") else rest and None  # "]x": no port
    elif header.count(":") == 1:
        name, _, port = header.partition(":")
    else:
        name, port = header, ""
    # `127.0.0.1:80@evil.com` names no host and port: what follows the name is `:<digits>` or nothing
    if port is None or not (port == "" or (port.isascii() and port.isdigit())):
        return ""
    return name


def _is_ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name[1:-1] if name.startswith("[") else name)
        return True
    except ValueError:
        return False


@dataclass(frozen=True)
class HostPolicy:
    names: frozenset[str] = LOOPBACK_NAMES
    any_ip: bool = False  # also any IP literal (listening on every interface)

    @classmethod
    def for_listen_address(cls, host: str) -> HostPolicy:
        listen = host.strip().lower()
        if listen in _EVERY_INTERFACE:
            return cls(LOOPBACK_NAMES | {socket.gethostname().lower(), socket.getfqdn().lower()}, any_ip=True)
        if ":" in listen and not listen.startswith("["):
            listen = f"[{listen}]"  # an IPv6 address as it appears in a Host header
        return cls(LOOPBACK_NAMES | {listen})

    def allows(self, header: str | None) -> bool:
        name = _hostname(header or "")
        if not name:
            return False
        return name in self.names or (self.any_ip and _is_ip_literal(name))

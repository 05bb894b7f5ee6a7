"""Where model-chosen URLs may go: the rules the web and browser tools share.

Model-chosen URLs are untrusted. A URL is refused when its scheme is not http(s), when it
carries what looks like a secret (an API key or token in its query, or credentials in it), or
when its host is (or resolves to) a loopback, private, link-local, carrier-grade NAT,
multicast, reserved or cloud-metadata address -- unless the host, or one of its addresses, is
on the allowlist (`--web_allow_hosts` / HERMES_WEB_ALLOW_HOSTS: host names, addresses, CIDRs).

    policy = NetPolicy.from_hosts(["127.0.0.1", "docs.internal", "10.1.0.0/16"])
    policy.check(url)            # raises UrlRefused naming the reason; returns the checked addresses
    policy.check_address(ip)     # for each connection a client actually makes (redirects, subrequests)
"""
from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass, field
from typing import Iterable
from urllib.parse import parse_qsl, urlsplit

from hermes.errors import HermesError

ALLOW_ENV = "HERMES_WEB_ALLOW_HOSTS"
SCHEMES = ("http", "https")

# Cloud metadata endpoints, named for clearer errors (they are link-local or private anyway).
METADATA = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"),
            ipaddress.ip_address("100.100.100.200")}
METADATA_HOSTS = {"metadata.google.internal", "metadata", "metadata.azure.internal"}
CGNAT = ipaddress.ip_network("100.64.0.0/10")

# Query parameter names that carry credentials, and values shaped like well-known keys.
SECRET_PARAMS = re.compile(r"^(api[-_]?key|apikey|key|token|access[-_]?token|auth|authorization|secret|"
                           r"client[-_]?secret|password|passwd|pwd|sig|signature|x-amz-signature|session(id)?)$", re.I)
SECRET_VALUES = re.compile(r"(sk-[A-Za-z0-9_-]{16,}|sk-or-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|"
                           r"xox[abpr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{30,}|"
                           r"eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,})")


class UrlRefused(HermesError, ValueError):
    """A URL the policy does not let a tool reach; the message says why."""


def parse_hosts(value: str | Iterable[str] | None) -> list[str]:
    """A comma list (or list) of host names, addresses and CIDRs, normalised."""
    if value is None:
        return []
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(i, str) for i in value):
        items = list(value)
    else:  # a ValueError, so settings validation names the field instead of failing on it
        raise ValueError("expected host names, addresses or CIDRs: a comma-separated string or a list of strings")
    return [i.strip().lower().rstrip(".") for i in items if i and i.strip()]


@dataclass(frozen=True)
class NetPolicy:
    hosts: frozenset[str] = frozenset()
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = field(default=())

    @classmethod
    def from_hosts(cls, allow: str | Iterable[str] | None) -> "NetPolicy":
        hosts, networks = set(), []
        for item in parse_hosts(allow):
            try:
                networks.append(ipaddress.ip_network(item.strip("[]"), strict=False))
            except ValueError:
                hosts.add(item)
        return cls(frozenset(hosts), tuple(networks))

    def host_allowed(self, host: str) -> bool:
        return host.lower().rstrip(".") in self.hosts

    def address_allowed(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return any(address in net for net in self.networks if net.version == address.version)

    def check_address(self, address: str | ipaddress.IPv4Address | ipaddress.IPv6Address, host: str = "") -> None:
        """Refuse a connection to `address` (the host it was resolved from, for the message)."""
        ip = ipaddress.ip_address(address) if isinstance(address, str) else address
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
            ip = ip.ipv4_mapped
        if self.address_allowed(ip) or (host and self.host_allowed(host)):
            return
        kind = blocked_kind(ip)
        if kind:
            shown = f"{host} resolves to {ip}" if host and host != str(ip) else str(ip)
            raise UrlRefused(f"refused: {shown} is a {kind} address (allow it with --web_allow_hosts / "
                             f"{ALLOW_ENV} if it is meant to be reached)")

    def check(self, url: str, *, resolve: bool = True) -> list[str]:
        """Check a URL before fetching it; returns the addresses its host resolved to."""
        try:
            parts = urlsplit(url)
        except ValueError as e:
            raise UrlRefused(f"refused: not a valid URL ({e})") from None
        scheme = (parts.scheme or "").lower()
        if scheme not in SCHEMES:
            raise UrlRefused(f"refused: only http and https URLs may be fetched, not {scheme + ':' if scheme else 'a URL without a scheme'}")
        try:
            host = (parts.hostname or "").rstrip(".")
        except ValueError as e:
            raise UrlRefused(f"refused: bad host in URL ({e})") from None
        if not host:
            raise UrlRefused("refused: the URL has no host")
        if parts.username or parts.password:
            raise UrlRefused("refused: the URL carries credentials (user:password@host)")
        secret = secret_in(url)
        if secret:
            raise UrlRefused(f"refused: the URL carries what looks like a secret ({secret}); tools never send keys in URLs")
        if host.lower() in METADATA_HOSTS and not self.host_allowed(host):
            raise UrlRefused(f"refused: {host} is a cloud metadata service")
        if self.host_allowed(host):
            return []
        try:
            literal = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            literal = None
        if literal is not None:
            self.check_address(literal, host)
            return [str(literal)]
        if not resolve:
            return []
        addresses = resolve_host(host, parts.port or (443 if scheme == "https" else 80))
        for address in addresses:
            self.check_address(address, host)
        return addresses


def blocked_kind(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why an address is off limits to model-chosen URLs, or None for a public one."""
    if ip in METADATA:
        return "cloud metadata"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if isinstance(ip, ipaddress.IPv4Address) and ip in CGNAT:
        return "carrier-grade NAT (shared)"
    if ip.is_private:
        return "private"
    if ip.is_multicast:
        return "multicast"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_reserved or not ip.is_global:
        return "reserved"
    return None


def resolve_host(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UrlRefused(f"refused: cannot resolve {host} ({e.strerror or e})") from None
    seen: list[str] = []
    for info in infos:
        address = str(info[4][0]).split("%", 1)[0]
        if address not in seen:
            seen.append(address)
    return seen


def secret_in(url: str) -> str | None:
    """A short description of a secret-looking part of the URL, or None."""
    parts = urlsplit(url)
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if SECRET_PARAMS.match(name) and value:
            return f"query parameter '{name}'"
    if SECRET_VALUES.search(url):
        return "a key-shaped token"
    return None

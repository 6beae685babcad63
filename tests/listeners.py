"""The TCP listeners of a process tree, read from /proc (Linux): which addresses the processes a test started accept
connections on. A listener on a non-loopback address is reachable from the network, so a single-node run must have
none (docs/security.md)."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

LISTEN = "0A"  # the TCP state code of a listening socket in /proc/net/tcp{,6}


def _address(hex_ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """/proc/net/tcp writes an address as its 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(hex_ip)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def listening_sockets() -> dict[int, tuple[str, int]]:
    """{socket inode: (address, port)} of every listening TCP socket of this network namespace."""
    out: dict[int, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:  # a kernel without IPv6 has no tcp6 table
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], int(fields[9])
            if state == LISTEN:
                hex_ip, hex_port = local.split(":")
                out[inode] = (str(_address(hex_ip)), int(hex_port, 16))
    return out


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def process_tree(root: int) -> list[int]:
    """``root`` and every process descended from it (a process that exits meanwhile is skipped)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        ppid = int(text.rsplit(")", 1)[1].split()[1])  # the command name may hold spaces and parentheses
        children.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


def listeners(root: int | None = None) -> list[tuple[int, str, str, int]]:
    """(pid, command, address, port) of each TCP listener held by a process of ``root``'s tree (this process by
    default)."""
    sockets = listening_sockets()
    out = []
    for pid in process_tree(os.getpid() if root is None else root):
        for inode in socket_inodes(pid) & sockets.keys():
            address, port = sockets[inode]
            out.append((pid, command(pid), address, port))
    return out


def exposed(root: int | None = None) -> list[str]:
    """The listeners of the tree on a non-loopback address, one line each (empty when all are loopback)."""
    return [f"{address}:{port} pid {pid} ({cmd})" for pid, cmd, address, port in listeners(root)
            if not is_loopback(address)]

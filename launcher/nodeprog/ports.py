# mlaunch node program part (facts, mesh): bind a TCP port the way the job will, name
# the process that holds one, and tell whether an address is this machine's own.
# Standard library only; Python >= 3.6.
import os
import socket


def bind(port):
    # Dual-stack like torch's TCPStore; SO_REUSEADDR so a TIME_WAIT leftover is not "in use".
    try:
        s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        addr = ("::", port)
    except OSError:
        s, addr = socket.socket(socket.AF_INET, socket.SOCK_STREAM), ("", port)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(addr)
    except OSError:
        s.close()
        raise
    return s


def holder(port):
    inodes = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add("socket:[%s]" % f[9])
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            links = [os.readlink("/proc/%s/fd/%s" % (pid, fd)) for fd in os.listdir("/proc/%s/fd" % pid)]
            if inodes.intersection(links):
                with open("/proc/%s/comm" % pid) as fh:
                    return {"pid": int(pid), "name": fh.read().strip()}
        except OSError:
            continue
    return {"pid": None, "name": None}


def own_address(name):
    # Where name resolves here, and which of those addresses are this machine's: the kernel
    # lets a socket bind only a local address (EADDRNOTAVAIL otherwise), whatever the interface.
    try:
        infos = socket.getaddrinfo(name, None, 0, socket.SOCK_STREAM)
    except socket.gaierror as e:
        return {"error": e.strerror or str(e)}
    own = []
    for family, _, _, _, sockaddr in infos:
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            s.bind((sockaddr[0], 0) + tuple(sockaddr[2:]))
            own.append(sockaddr[0])
        except OSError:
            pass
        finally:
            s.close()
    return {"addrs": list(dict.fromkeys(i[4][0] for i in infos)), "own": list(dict.fromkeys(own))}

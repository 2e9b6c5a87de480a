# mlaunch preflight mesh: listen where the job will listen, dial what the job will dial.
# Every node runs this at the same time. Listeners greet with "mlaunch-preflight NONCE RANK"
# so a dialer knows whether it reached the node it meant or some other process.
# Standard library only; Python >= 3.6. It binds with the part ports.py (inlined when shipped).
import json
import os
import socket
import sys
import threading
import time

from .ports import bind

P = json.loads(sys.argv[1])
RANK, NONCE = P["rank"], P["nonce"]
DEADLINE = time.time() + P["window"]
GREETING = ("mlaunch-preflight %s %d\n" % (NONCE, RANK)).encode()
OUT = {"listen": {}, "dials": {}, "shared": {}}


def listener(port):
    """A listening socket on port, bound as the job will bind it (ports.bind)."""
    s = bind(port)
    s.listen(256)
    s.settimeout(0.1)
    return s


def readline(conn, timeout):
    conn.settimeout(timeout)
    data = b""
    try:
        while not data.endswith(b"\n") and len(data) < 200:
            chunk = conn.recv(200)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return data.decode("utf-8", "replace").strip()


def serve(spec):
    """Accept until every expected peer said hello, or the window closes."""
    rec = {"ok": False, "got": []}
    OUT["listen"][spec["key"]] = rec
    try:
        s = listener(spec["port"])
    except OSError as e:
        rec["error"] = e.strerror or str(e)
        return
    rec["ok"] = True
    with s:
        while len(rec["got"]) < spec["expect"] and time.time() < DEADLINE + 1.0:
            try:
                conn, _ = s.accept()
            except socket.timeout:
                continue
            with conn:
                conn.sendall(GREETING)
                words = readline(conn, 2.0).split()
                if len(words) == 3 and words[:2] == ["hello", NONCE]:
                    rec["got"].append(int(words[2]))


def dial(spec):
    """Connect until it works or the window closes (the peer's listener may start later)."""
    t0, last = time.time(), "no attempt"
    while time.time() < DEADLINE:
        try:
            conn = socket.create_connection((spec["addr"], spec["port"]),
                                            timeout=max(0.2, min(2.0, DEADLINE - time.time())))
        except socket.timeout:
            last = "timed out"
            continue
        except ConnectionRefusedError:
            last = "connection refused"
            time.sleep(0.05)
            continue
        except OSError as e:
            last = e.strerror or str(e)
            time.sleep(0.1)
            continue
        with conn:
            words = readline(conn, 1.0).split()
            peer = int(words[2]) if len(words) == 3 and words[:2] == ["mlaunch-preflight", NONCE] else None
            if peer is not None:
                conn.sendall(("hello %s %d\n" % (NONCE, RANK)).encode())
            # peer None: something answered that is not our listener (another process holds the port)
            OUT["dials"][spec["key"]] = {"ok": True, "peer": peer, "ms": round((time.time() - t0) * 1000, 1)}
            return
    OUT["dials"][spec["key"]] = {"ok": False, "error": last}


def shared():
    """Which nodes' marker files in shared_dir this node sees (NFS may lag: retry briefly)."""
    files = P["shared"] or {}
    until = time.time() + min(3.0, P["window"])
    while True:
        for rank, path in files.items():
            try:
                with open(path) as fh:
                    ok = fh.read().split() == [NONCE, rank]
                OUT["shared"][rank] = "ok" if ok else "wrong content"
            except OSError as e:
                OUT["shared"][rank] = e.strerror or str(e)
        if all(v == "ok" for v in OUT["shared"].values()) or time.time() > until:
            return
        time.sleep(0.2)


def main():
    threads = [threading.Thread(target=serve, args=(s,), daemon=True) for s in P["listen"]]
    threads += [threading.Thread(target=dial, args=(d,), daemon=True) for d in P["dials"]]
    threads.append(threading.Thread(target=shared, daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, DEADLINE + 2.0 - time.time()))
    sys.stdout.write(P["marker"] + " " + json.dumps(OUT) + "\n")
    sys.stdout.flush()
    os._exit(0)


main()

# mlaunch node program part (mesh, facts): listen where the job will listen, dial what the job
# will dial. Every node runs it at the same time. Listeners greet with "mlaunch-preflight NONCE
# RANK" so a dialer knows whether it reached the node it meant or some other process.
# Standard library only; Python >= 3.6. It binds with the caller's ports.bind (parts import no
# part): run_mesh(P, bind, holder).
import os
import socket
import threading
import time


class _Mesh(object):
    def __init__(self, p, bind, holder):
        self.p, self.bind, self.holder = p, bind, holder
        self.rank, self.nonce = p["rank"], p["nonce"]
        self.deadline = time.time() + p["window"]
        self.greeting = ("mlaunch-preflight %s %d\n" % (self.nonce, self.rank)).encode()
        self.out = {"listen": {}, "dials": {}, "shared": {}}

    def listener(self, port):
        """A listening socket on port, bound as the job will bind it (ports.bind)."""
        s = self.bind(port)
        s.listen(256)
        s.settimeout(0.1)
        return s

    def serve(self, spec):
        """Accept until every expected peer said hello, or the window closes."""
        rec = {"ok": False, "got": []}
        self.out["listen"][spec["key"]] = rec
        try:
            s = self.listener(spec["port"])
        except OSError as e:
            rec["error"] = e.strerror or str(e)
            rec["holder"] = self.holder(spec["port"])   # master_port's: the port-free row names it
            return
        rec["ok"] = True
        with s:
            while len(rec["got"]) < spec["expect"] and time.time() < self.deadline + 1.0:
                try:
                    conn, _ = s.accept()
                except socket.timeout:
                    continue
                with conn:
                    conn.sendall(self.greeting)
                    words = readline(conn, 2.0).split()
                    if len(words) == 3 and words[:2] == ["hello", self.nonce]:
                        rec["got"].append(int(words[2]))

    def dial(self, spec):
        """Connect until it works or the window closes (the peer's listener may start later)."""
        t0, last, pause = time.time(), "no attempt", 0.02
        while time.time() < self.deadline:
            try:
                conn = socket.create_connection((spec["addr"], spec["port"]),
                                                timeout=max(0.2, min(2.0, self.deadline - time.time())))
            except socket.timeout:
                last = "timed out"
                continue
            except ConnectionRefusedError:   # its listener not up yet: back off, a node has many dialers
                last = "connection refused"
                time.sleep(pause)
                pause = min(0.25, pause * 2)
                continue
            except OSError as e:
                last = e.strerror or str(e)
                time.sleep(0.1)
                continue
            with conn:
                ip = conn.getpeername()[0]   # the address reached (spec["addr"] may be a name)
                words = readline(conn, 1.0).split()
                peer = int(words[2]) if len(words) == 3 and words[:2] == ["mlaunch-preflight", self.nonce] else None
                if peer is not None:
                    conn.sendall(("hello %s %d\n" % (self.nonce, self.rank)).encode())
                # peer None: something answered that is not our listener (another process holds the port)
                self.out["dials"][spec["key"]] = {"ok": True, "peer": peer, "ip": ip,
                                                  "ms": round((time.time() - t0) * 1000, 1)}
                return
        self.out["dials"][spec["key"]] = {"ok": False, "error": last}

    def shared(self):
        """Which nodes' marker files in shared_dir this node sees. The facts probes write them
        at the same time as this runs (and NFS may lag): the missing ones are retried for the
        whole window, soon at first (a fixed 0.2 s poll cost a probe up to that after the
        last marker came)."""
        files = dict(self.p["shared"] or {})
        until, pause = time.time() + self.p["window"], 0.01
        while True:
            for rank, path in list(files.items()):
                try:
                    with open(path) as fh:
                        ok = fh.read().split() == [self.nonce, rank]
                    self.out["shared"][rank] = "ok" if ok else "wrong content"
                except OSError as e:
                    self.out["shared"][rank] = e.strerror or str(e)
                if self.out["shared"][rank] == "ok":
                    del files[rank]   # seen: not read again
            if not files or time.time() > until:
                return
            # the last markers come within a moment of each other: look again soon, then less often
            time.sleep(pause)
            pause = min(0.2, pause * 1.5)


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


def run_mesh(p, bind, holder):
    """Every listener and dialer of plan p at once, and the shared_dir markers; what each saw
    (a copy: a thread still stuck past the window changes nothing returned)."""
    m = _Mesh(p, bind, holder)
    threads = [threading.Thread(target=m.serve, args=(s,)) for s in p["listen"]]
    threads += [threading.Thread(target=m.dial, args=(d,)) for d in p["dials"]]
    threads.append(threading.Thread(target=m.shared))
    for t in threads:
        t.daemon = True
        t.start()
    for t in threads:
        t.join(max(0.0, m.deadline + 2.0 - time.time()))
    return {k: dict(v) for k, v in m.out.items()}

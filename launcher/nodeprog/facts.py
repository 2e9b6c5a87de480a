# mlaunch preflight facts: everything cheap about this node, printed as one JSON line.
# Each fact runs in its own thread under one deadline: a hung NFS mount or GPU driver
# costs its own fact, never the whole probe. Standard library only; Python >= 3.6.
# Its port and input checks are the parts ports.py and inputs.py (nodeprog.source inlines them).
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

from .inputs import check_input, full
from .ports import bind, holder, own_address
from .meshnet import run_mesh

P = json.loads(sys.argv[1])
MISSING = sys.argv[2] == "1"   # the job's interpreter is absent: this is a stand-in python3


def python_facts():
    try:
        import pwd
        user = pwd.getpwuid(os.getuid()).pw_name
    except Exception:
        user = str(os.getuid())
    return {"exe": sys.executable, "version": "%d.%d.%d" % tuple(sys.version_info[:3]),
            "missing": MISSING, "user": user}


def torch_facts():
    if MISSING:
        return {"error": "not checked: the job's interpreter is missing"}
    import importlib.util
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return {"error": "torch is not installed"}
    ns = {}
    # torch/version.py is where torch.__version__ comes from; running it alone is
    # instant, while importing torch takes seconds on a CUDA node: never import it here.
    torch_dir = os.path.dirname(spec.origin)
    with open(os.path.join(torch_dir, "version.py")) as fh:
        exec(compile(fh.read(), "torch/version.py", "exec"), ns)
    out = {"version": ns.get("__version__"), "cuda": ns.get("cuda"), "nccl": "none"}
    if out["cuda"]:
        out["nccl"], out["nccl_from"] = nccl_version(torch_dir, out["cuda"])
    return out


def nccl_version(torch_dir, cuda):
    """(version, where it was read) of the NCCL torch loads, without importing torch.

    pip's CUDA torch loads the nvidia-nccl-cu* wheel's library: its version is the wheel's.
    Otherwise the library's own ncclGetVersion() answers (a dlopen, no GPU work). Only a
    torch with NCCL linked in statically needs `import torch`: `mlaunch check` does that,
    the fast checks before submit say so instead of paying seconds per node.
    """
    wheel = nccl_wheel(torch_dir, cuda)
    if wheel:
        return wheel
    import ctypes
    import ctypes.util
    site = os.path.dirname(torch_dir)
    libs = glob.glob(os.path.join(torch_dir, "lib", "libnccl.so*"))
    libs += glob.glob(os.path.join(site, "nvidia", "nccl", "lib", "libnccl.so*"))
    libs += [ctypes.util.find_library("nccl") or "libnccl.so.2"]
    for lib in libs:
        try:
            code = ctypes.c_int()
            if ctypes.CDLL(lib).ncclGetVersion(ctypes.byref(code)) == 0:
                v = code.value   # 2.9+: major*10000 + minor*100 + patch
                return "%d.%d.%d" % (v // 10000, v // 100 % 100, v % 100), lib
        except (OSError, AttributeError):
            continue
    if P.get("import_torch"):
        import torch
        v = torch.cuda.nccl.version()
        return (".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)), "torch"
    return "not read (linked into torch; `mlaunch check` reads it)", "fast check"


def nccl_wheel(torch_dir, cuda):
    """(version, wheel name) of the nvidia-nccl-cu* wheel beside torch (where torch's library
    path leads), else the first along sys.path; of several, the one of torch's CUDA major."""
    major = "nvidia_nccl_cu%s" % str(cuda).split(".")[0]
    for d in [os.path.dirname(torch_dir)] + sys.path:
        found = sorted((name, ver) for name, ver in dist_infos(d) if re.match(r"^nvidia_nccl_cu\d+$", name))
        if found:
            name, ver = next((f for f in found if f[0] == major), found[0])
            return ver, name.replace("_", "-")
    return None


DIST_INFOS = {}


def dist_infos(d):
    """(normalized name, version) of each NAME-VERSION.dist-info folder in folder d (the
    name pip gives it), listed once per probe."""
    if d not in DIST_INFOS:
        try:
            names = os.listdir(d or ".")
        except OSError:
            names = []
        DIST_INFOS[d] = [(dist_key(base), ver)
                         for base, _, ver in (n[:-len(".dist-info")].partition("-")
                                              for n in names if n.endswith(".dist-info") and "-" in n)]
    return DIST_INFOS[d]


def dist_key(name):
    """A distribution's name as pip compares names: case and runs of -_. aside."""
    return re.sub(r"[-_.]+", "_", name).lower()


def dist_version(name):
    """The installed version of distribution `name`, the first along sys.path as
    importlib.metadata finds it: from its NAME-VERSION.dist-info folder's name, one listing
    per folder; importlib.metadata (its import, and reading installed packages' METADATA:
    tens of ms a node) only where no such folder is found (an egg-info, a zip). None where it
    is not installed."""
    want = dist_key(name)
    for d in sys.path:
        for got, ver in dist_infos(d):
            if got == want:
                return ver
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def trainer_facts():
    name = P["trainer_pkg"]
    if not name or MISSING:
        return {"name": name, "version": None}
    out = {"name": name, "version": dist_version(name)}
    if out["version"] is None:
        return {"name": name, "version": None, "error": "%s is not installed" % name}
    # The rendered trainer arguments depend on it (transformers 5.15 dropped warmup_ratio).
    tf = dist_version("transformers")
    if tf is not None:
        out["transformers"] = tf
    import importlib.util
    if P.get("tracker"):   # report_to's package: transformers raises at start without it
        if not any(importlib.util.find_spec(m) for m in P["tracker"]):
            out["tracker_missing"] = P["tracker"][0]
    # liger/unsloth/badam...: the trainer imports their package at start when the option is on
    missing = [[opt, pip] for opt, mod, pip in P.get("features") or () if not importlib.util.find_spec(mod)]
    if missing:
        out["features_missing"] = missing
    return out


def torchrun_facts():
    want = P.get("torchrun")   # None: mlaunch runs torchrun as a module of the interpreter
    if want is None and P["bindir"]:
        return {"wanted": None, "ok": True, "module": True}
    return {"wanted": want, "ok": bool(want and os.access(want, os.X_OK)),
            "on_path": shutil.which("torchrun")}


def pyspy_facts():
    # py-spy dumps every rank's stack on a hang; it needs ptrace rights over the ranks.
    b = P["bindir"]
    beside = os.path.join(b, "py-spy") if b else None
    path = beside if beside and os.access(beside, os.X_OK) else shutil.which("py-spy")
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as fh:
            scope = int(fh.read().strip())
    except (OSError, ValueError):
        scope = None
    return {"path": path, "ptrace_scope": scope, "root": os.geteuid() == 0}


def host_facts():
    name = socket.gethostname()
    conn = os.environ.get("SSH_CONNECTION", "").split()
    out = {"hostname": name, "ssh_ip": conn[2] if len(conn) > 2 else None, "ifaces": ifaces()}
    try:
        infos = socket.getaddrinfo(name, None, 0, socket.SOCK_STREAM)
        out["addrs"] = list(dict.fromkeys(i[4][0] for i in infos))
    except socket.gaierror as e:
        out["error"] = e.strerror or str(e)
    return out


def ifaces():
    import fcntl
    import struct
    out = {name: {"up": False, "addrs": []} for _, name in socket.if_nameindex()}
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for name in out:
        req = struct.pack("256s", name[:15].encode())
        try:  # SIOCGIFFLAGS: IFF_UP
            out[name]["up"] = bool(struct.unpack("H", fcntl.ioctl(s.fileno(), 0x8913, req)[16:18])[0] & 1)
            out[name]["addrs"].append(socket.inet_ntoa(fcntl.ioctl(s.fileno(), 0x8915, req)[20:24]))
        except OSError:
            pass  # no IPv4 address
    s.close()
    try:
        with open("/proc/net/if_inet6") as fh:
            for line in fh:
                f = line.split()
                if len(f) == 6 and f[5] in out and f[3] == "00":  # global scope only
                    out[f[5]]["addrs"].append(socket.inet_ntop(socket.AF_INET6, bytes.fromhex(f[0])))
    except OSError:
        pass
    return out


def mesh_port_facts():
    # A free ephemeral port for the node-to-node reachability test, like NCCL/gloo use.
    s = bind(0)
    port = s.getsockname()[1]
    s.close()
    return {"port": port}


def out_facts():
    path = full(P["out_dir"])
    base = path
    while not os.path.isdir(base) and base != os.path.dirname(base):
        base = os.path.dirname(base)   # mkdir -p at launch needs the nearest existing parent
    st = os.statvfs(base)
    out = {"path": path, "base": base, "free_gb": st.f_bavail * st.f_frsize / 1e9}
    try:
        fd, name = tempfile.mkstemp(prefix=".mlaunch-preflight-", dir=base)
        os.close(fd)
        os.unlink(name)
        out["writable"] = True
    except OSError as e:
        out["writable"], out["error"] = False, e.strerror or str(e)
    return out


def shared_facts():
    f = P["shared_file"]
    if not f:
        return {}
    try:
        # a new file of this run's, never through a link or over a file another user put there
        # first (the name is known from the probe's argv): O_EXCL, O_NOFOLLOW
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write("%s %d\n" % (P["nonce"], P["rank"]))
        return {"ok": True}
    except OSError as e:
        return {"ok": False, "error": e.strerror or str(e)}


def input_facts():
    return [dict(i, **check_input(i)) for i in P["inputs"]]


def shm_facts():
    st = os.statvfs("/dev/shm")
    return {"mb": st.f_blocks * st.f_frsize / 2 ** 20}


def ext_lock_facts():
    # torch's JIT extension builds (DeepSpeed ops) serialise on a `lock` file; a build killed
    # half-way leaves it, and every later rank that needs the op waits on it forever.
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.expanduser("~/.cache/torch_extensions")
    now, locks = time.time(), []
    for pattern in ("*/lock", "*/*/lock"):
        for path in glob.glob(os.path.join(root, pattern)):
            try:
                locks.append([path, round(now - os.stat(path).st_mtime)])
            except OSError:
                pass
    return {"root": root, "locks": locks}


def gpu_facts():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return {"smi": None}
    def q(what):
        return subprocess.run([smi, what, "--format=csv,noheader,nounits"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, universal_newlines=True, timeout=P["budget"])
    g = q("--query-gpu=index,uuid,driver_version,memory.used,memory.total")
    out = {"smi": smi, "code": g.returncode, "gpus": g.stdout}
    if g.returncode == 0:
        a = q("--query-compute-apps=gpu_uuid,pid,process_name,used_memory")
        out["apps"] = a.stdout if a.returncode == 0 else ""
    return out


def model_config_facts():
    # The model's config.json, for mlaunch's memory estimate (batch planning).
    with open(os.path.join(full(P["model_config"]), "config.json")) as fh:
        return {"config": json.load(fh)}


FACTS = {"python": python_facts, "torch": torch_facts, "trainer": trainer_facts,
         "torchrun": torchrun_facts, "host": host_facts, "mesh_port": mesh_port_facts,
         "out": out_facts, "shared": shared_facts, "inputs": input_facts, "shm": shm_facts,
         "gpu": gpu_facts, "ext_locks": ext_lock_facts, "pyspy": pyspy_facts}
if P.get("master_addr"):   # node 0: torchrun's store listens here, so master_addr must lead here
    FACTS["master"] = lambda: own_address(P["master_addr"])
if P.get("model_config"):
    FACTS["model_config"] = model_config_facts
if P.get("mesh"):   # the mesh's first round, in this process (launcher/preflight/network.py)
    FACTS["mesh"] = lambda: run_mesh(P["mesh"], bind, holder)
if P.get("only"):   # cluster.container: the software facts come from a run inside the image
    FACTS = {k: fn for k, fn in FACTS.items() if k in P["only"]}


def run(key, fn, box):
    try:
        box[key] = fn()
    except Exception as e:
        box[key] = {"error": "%s: %s" % (type(e).__name__, e)}


def main():
    box = {}
    if P["workdir"]:
        try:
            os.chdir(full(P["workdir"]))
        except OSError as e:
            box["workdir_error"] = "%s: %s" % (P["workdir"], e.strerror)
    threads = [threading.Thread(target=run, args=(k, fn, box), daemon=True) for k, fn in FACTS.items()]
    for t in threads:
        t.start()
    deadline = time.time() + P["budget"]
    for t in threads:
        t.join(max(0.0, deadline - time.time()))
    snap = dict(box)   # one atomic copy: a late thread must not change what is printed
    for k in FACTS:
        snap.setdefault(k, {"error": "no answer within %gs (hung mount or driver?)" % P["budget"]})
    sys.stdout.write(P["marker"] + " " + json.dumps(snap) + "\n")
    sys.stdout.flush()
    os._exit(0)   # do not wait for a thread stuck in the kernel


main()

"""Content manifests of staged items (issue 54): size and SHA-256 per file, on the node that
holds a copy and on the launcher for its own sources.

Standard library only and no imports from ``launcher``: the launcher ships this program's text
(``nodeprog.script``) and runs it as ``python3 - MODE ARGS``; the launcher also imports it to
make the manifest of a source on its own machine. Modes:

* ``probe JSON``: JSON is {"items": [{"dst": PATH, "src": PATH or null}]}. Prints one JSON
  object: {"rsync": bool, "items": [{"state", "files", "free", "src"}]}, where state is
  ``absent`` (no manifest at DST), ``current`` (every file the stored manifest lists is there
  with its size and mtime) or ``changed``; files is the stored manifest's file map; free the
  bytes free for this user on the filesystem DST would be on; src the manifest of SRC on this
  node (for a node:PATH source), or null, or "missing".
* ``commit TMP DST DIGEST``: the copy at TMP hashed; when its digest is DIGEST, it replaces DST
  (renamed into place) and its manifest is written beside it as DST.mlaunch-manifest; else
  exit 3 with one line, TMP removed, DST untouched.
* ``manifest PATH``: the manifest of PATH, as JSON (a source that a node holds).
* ``seal TMP DST``: the same for a copy this node made itself (tokenize_once): no digest to match.

A manifest: {"digest": sha256 over the sorted (path, size, sha256) lines, "bytes": total,
"files": {relative path: [size, sha256, mtime_ns]}}; a file item has the one path "".
Symbolic links are recorded by their target, never followed.
"""
import hashlib
import json
import os
import shutil
import sys

SUFFIX = ".mlaunch-manifest"
CHUNK = 1 << 20


def file_hash(path):
    """The SHA-256 hex digest of path's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def entries(root, names=None):
    """(relative path, full path) of every regular file or link under root (root itself when
    it is a file), or of names (relative paths) only."""
    if names is not None:
        return [(n, os.path.join(root, n)) for n in sorted(names)]
    if not os.path.isdir(root) or os.path.islink(root):
        return [("", root)]
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for f in files + [x for x in dirs if os.path.islink(os.path.join(d, x))]:
            full = os.path.join(d, f)
            out.append((os.path.relpath(full, root), full))
    return sorted(out)


def manifest(root, names=None, known=None):
    """The manifest of root (or of the listed names under it). known: an earlier manifest's
    files of the same root; a file with the same size and mtime keeps its hash unread."""
    files, known = {}, known or {}
    for rel, full in entries(root, names):
        st = os.lstat(full)
        was = known.get(rel)
        if os.path.islink(full):
            files[rel] = [0, "link:" + os.readlink(full), st.st_mtime_ns]
        elif was and was[0] == st.st_size and was[2] == st.st_mtime_ns and not was[1].startswith("link:"):
            files[rel] = list(was)
        else:
            files[rel] = [st.st_size, file_hash(full), st.st_mtime_ns]
    return {"digest": digest(files), "bytes": sum(v[0] for v in files.values()), "files": files}


def digest(files):
    """The manifest's digest: what two copies agree on (mtimes left out)."""
    h = hashlib.sha256()
    for rel in sorted(files):
        size, sha = files[rel][0], files[rel][1]
        h.update(f"{rel}\0{size}\0{sha}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def stored(dst):
    """The manifest written beside dst by commit, or None."""
    try:
        with open(dst + SUFFIX) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def current(dst, man):
    """Whether every file man lists is at dst with its recorded size and mtime (no hashing:
    a file changed in place keeps neither)."""
    for rel, (size, sha, mtime) in man.get("files", {}).items():
        full = os.path.join(dst, rel) if rel else dst
        try:
            st = os.lstat(full)
        except OSError:
            return False
        if st.st_mtime_ns != mtime or (not sha.startswith("link:") and st.st_size != size):
            return False
    return True


def free_bytes(path):
    """Bytes free for this user on the filesystem path is (or would be) on."""
    p = os.path.abspath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


def probe(items):
    out = []
    for item in items:
        dst, man = item["dst"], stored(item["dst"])
        state = "absent" if man is None or not os.path.lexists(dst) else (
            "current" if current(dst, man) else "changed")
        src = item.get("src")
        out.append({"state": state, "files": {k: v[:2] for k, v in (man or {}).get("files", {}).items()},
                    "digest": (man or {}).get("digest"), "free": free_bytes(dst),
                    "src": None if not src else (manifest(src) if os.path.exists(src) else "missing")})
    return {"rsync": shutil.which("rsync") is not None, "items": out}


def commit(tmp, dst, want=None):
    """tmp into dst's place when its digest is want (None: whatever it holds, for what the node
    made itself); its manifest beside it."""
    man = manifest(tmp)
    if want is not None and man["digest"] != want:
        remove(tmp)
        print(f"mlaunch: the copy of {dst} on this node differs from its source "
              "(changed while it was copied?); submit again", file=sys.stderr)
        return 3
    side = dst + SUFFIX
    if os.path.lexists(side):
        os.unlink(side)
    old = dst + ".mlaunch-old"
    remove(old)   # left by a commit cut short
    if os.path.lexists(dst):
        os.rename(dst, old)
    os.rename(tmp, dst)   # a rename keeps every file's mtime: man holds the copy in place
    remove(old)
    remove(side + ".tmp")   # a new file, never through a link left or planted there
    with os.fdopen(os.open(side + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "w") as f:
        json.dump(man, f)
    os.rename(side + ".tmp", side)
    print(json.dumps({"digest": man["digest"], "bytes": man["bytes"]}))
    return 0


def remove(path):
    """path gone, whether a directory, a file or a link (nothing when absent)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[0] == "probe":
        print(json.dumps(probe(json.loads(argv[1])["items"])))
        return 0
    if argv[0] == "commit":
        return commit(argv[1], argv[2], argv[3])
    if argv[0] == "manifest":
        print(json.dumps(manifest(argv[1])))
        return 0
    if argv[0] == "seal":
        return commit(argv[1], argv[2])
    print(f"mlaunch: manifest: unknown mode {argv[0]!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

# mlaunch node program part (facts): are the job's inputs (model, datasets, script) where
# the job will look for them on this node? Standard library only; Python >= 3.6.
import difflib
import json
import os
import re
import sys

LISTED = 8          # names of dataset_info.json sent back when no name is close
MAX_SIBLINGS = 5000  # a directory larger than this is not searched for close names


def full(path):
    return os.path.abspath(os.path.expanduser(path))


def check_input(i):
    """{"ok": ...} (with "error" or "note") for one input of the job: a module, file, path,
    model or dataset_dir."""
    kind, path = i["kind"], i["path"]
    if kind == "module":
        return module_input(path)
    p = full(path)
    if kind == "file":
        return {"ok": True} if os.path.isfile(p) else missing_path(p, "%s: no such file" % p)
    if kind == "path":
        return {"ok": True} if os.path.exists(p) else missing_path(p, "%s: no such file or directory" % p)
    if kind == "model":
        return model_input(path, p)
    if path == "ONLINE" or path.startswith("REMOTE:"):
        return {"ok": True, "note": "dataset_dir %s is fetched from the hub at start" % path}
    return dataset(p, i["names"], i.get("stage"))


def module_input(name):
    import importlib.util
    sys.path.insert(0, os.getcwd())   # torchrun -m finds modules in the working directory
    try:
        found = importlib.util.find_spec(name) is not None
    except Exception:
        found = False
    return {"ok": True} if found else {"ok": False, "error": "module %s not importable" % name}


def model_input(path, p):
    """A model given as path (p: where it resolves here): a local dir, else maybe a hub id."""
    if os.path.exists(p):
        return {"ok": True}
    if not path.startswith(("/", ".", "~")) and re.match(r"^[\w.-]+/[\w.-]+$", path):
        if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
            return {"ok": False, "error": "%s: not here (%s), and HF_HUB_OFFLINE=1 forbids "
                    "fetching it as a hub id" % (path, p)}
        return {"ok": True, "note": "%s is not a local path (no %s here): a hub id, fetched at "
                "start" % (path, p)}
    if not path.startswith(("/", "~")):
        return {"ok": False, "error": "%s: no such directory (relative to %s), and not a hub id "
                "(those are org/name)" % (p, os.getcwd())}
    return missing_path(p, "%s: no such file or directory" % p)


def missing_path(p, error):
    """The answer for a missing path p, with the close names beside it (a misspelling?)."""
    out = {"ok": False, "error": error}
    parent, name = os.path.split(p)
    try:
        entries = os.listdir(parent)
    except OSError:
        return out
    if len(entries) <= MAX_SIBLINGS:
        close = difflib.get_close_matches(name, entries, n=3, cutoff=0.6)
        if close:
            out["close"] = [os.path.join(parent, c) for c in close]
    return out


def dataset(d, names, stage=None):
    info = os.path.join(d, "dataset_info.json")
    if not os.path.isdir(d):
        return missing_path(d, "dataset_dir %s: no such directory" % d)
    try:
        with open(info) as fh:
            data = json.load(fh)
    except OSError as e:
        return {"ok": False, "error": "%s: %s" % (info, e.strerror)}
    except ValueError as e:
        return {"ok": False, "error": "%s is not valid JSON: %s" % (info, e)}
    unknown = [n for n in names if n not in data]
    if unknown:
        keys = [str(k) for k in data] if isinstance(data, dict) else []
        return {"ok": False, "error": "%s not listed in %s" % (", ".join(unknown), info),
                "unknown": [{"name": n, "close": difflib.get_close_matches(n, keys, n=3, cutoff=0.6)}
                            for n in unknown],
                "listed": keys[:LISTED], "n_listed": len(keys), "info": info}
    wrong = [n for n in names if isinstance(data[n], dict) and form_error(data[n], stage)]
    if wrong:
        return {"ok": False, "error": "; ".join("%s: %s" % (n, form_error(data[n], stage)) for n in wrong)}
    remote = ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url")
    absent = [os.path.join(d, data[n]["file_name"]) for n in names
              if isinstance(data[n], dict) and data[n].get("file_name")
              and not any(k in data[n] for k in remote)
              and not os.path.exists(os.path.join(d, data[n]["file_name"]))]
    return {"ok": False, "error": "missing: " + ", ".join(absent)} if absent else {"ok": True}


def form_error(entry, stage):
    # LLaMA-Factory loads dpo and rm data as pairwise rankings and refuses any mix
    # ("The dataset is not applicable in the current training stage"); KTO needs a tag column.
    ranking = bool(entry.get("ranking"))
    if stage in ("dpo", "rm") and not ranking:
        return "stage %s needs a preference dataset (ranking: true, with chosen/rejected)" % stage
    if stage not in (None, "dpo", "rm") and ranking:
        return "a ranking dataset (ranking: true) cannot train stage %s; use dpo or rm" % stage
    if stage == "kto" and not (entry.get("columns") or {}).get("kto_tag"):
        return "stage kto needs a kto_tag column (columns: {kto_tag: ...}) marking each answer good or bad"
    return None

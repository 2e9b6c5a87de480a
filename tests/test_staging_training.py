"""Must-show of issue 54 on namespace hosts that share no disk, with LLaMA-Factory on CPU: the
tiny model and dataset exist only on the launcher's machine; staging copies them to 3 nodes
(node to node, a manifest on each), the dataset is tokenized once on node 0 and staged, LoRA
trains; a second submit copies and tokenizes nothing; a changed data file is copied again and
tokenized again."""
from __future__ import annotations

import glob
import json
import math
import os
import re
import shutil

import pytest

from .training import build_tiny, lf_spec, require_trainer, submit_timed, trainer_state

pytestmark = [pytest.mark.training, pytest.mark.multihost]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    require_trainer()
    return build_tiny(str(tmp_path_factory.mktemp("tiny")))


def _logs(root: str, pattern: str = "*") -> dict[str, str]:
    out = {}
    for p in glob.glob(os.path.join(root, "**", pattern), recursive=True):
        if os.path.isfile(p):
            out[p] = open(p, errors="replace").read()
    return out


def test_lf_lora_on_three_bare_nodes_staged_and_tokenized_once(make_hostset, tmp_path, tiny):
    with make_hostset(3, private_disk=True) as hs:
        # the launcher's own copies, under the path whose content each host has privately
        here_model, here_data = os.path.join(hs.disk, "src", "model"), os.path.join(hs.disk, "src", "data")
        shutil.copytree(tiny["model"], here_model)
        shutil.copytree(tiny["dataset_dir"], here_data)
        model, data, tok = (os.path.join(hs.disk, p) for p in ("models/tiny", "data/tiny", "tok/tiny"))

        def spec(out: str, steps: int) -> dict:
            s = lf_spec(tiny, [h.ip for h in hs.hosts], 1, os.path.join(hs.disk, out), hs=hs,
                        max_steps=steps, save_steps=steps, name="bare")
            s.update(model=model, dataset_dir=data, tokenize_once=tok)
            s["staging"] = [{"src": here_model, "dst": model}, {"src": here_data, "dst": data}]
            return s

        logs1 = str(tmp_path / "logs1")
        r = submit_timed(tmp_path, spec("out1", 4), "--log-dir", logs1)
        assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
        out = r.stdout
        assert re.search(rf"staging\[0\] {re.escape(model)}: .* to 3 of 3 nodes \(2 from here, 1 node to node\)", out), out
        assert re.search(rf"staging\[1\] {re.escape(data)}: .* to 3 of 3 nodes", out), out
        assert re.search(rf"tokenize_once {re.escape(tok)}: tokenized once on node0 \S+ in [\d.]+ s \(\d+ rows", out), out
        assert re.search(rf"tokenize_once {re.escape(tok)}: .* to 2 of 3 nodes \(0 from \S+, 2 node to node\)", out), out
        for h in hs.hosts:   # every node got the model, the data and the tokens, each with its manifest
            for p in (model, data, tok):
                own = os.path.join(hs.disk_of(h), os.path.relpath(p, hs.disk))
                man = json.load(open(own + ".mlaunch-manifest"))
                assert man["files"] and all(os.path.exists(os.path.join(own, f)) for f in man["files"]), (h.name, p)
        assert not os.path.exists(model)   # the launcher's view of that path: never written
        # tokenized once: in the tokenize step's log, never by a rank
        tokenize_log = _logs(logs1, "tokenize.log")
        assert len(tokenize_log) == 1
        (text,) = tokenize_log.values()
        assert text.count("Tokenized dataset is saved at") == 1, text[-3000:]
        node_logs = {p: t for p, t in _logs(logs1).items() if not p.endswith("tokenize.log")}
        ranks = "\n".join(node_logs.values())
        assert ranks.count(f"Loaded tokenized dataset from {tok}") == 3, ranks[-5000:]
        assert "Running tokenizer on dataset" not in ranks
        state = trainer_state(os.path.join(hs.disk_of(hs.hosts[0]), "out1"))
        assert state["global_step"] == 4
        assert all(math.isfinite(e["loss"]) for e in state["log_history"] if "loss" in e)
        assert os.path.isfile(os.path.join(hs.disk_of(hs.hosts[0]), "out1", "adapter_model.safetensors"))

        r = submit_timed(tmp_path, spec("out2", 2), "--log-dir", str(tmp_path / "logs2"))
        assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
        assert r.stdout.count("in place on all 3 nodes (manifests match), nothing copied") == 3, r.stdout
        assert f"tokenize_once {tok}: in place on node0" in r.stdout

        rows = json.load(open(os.path.join(here_data, f"{tiny['dataset']}.json")))
        with open(os.path.join(here_data, f"{tiny['dataset']}.json"), "w") as f:
            json.dump(rows[: len(rows) // 2], f)   # a changed data file
        r = submit_timed(tmp_path, spec("out3", 2), "--log-dir", str(tmp_path / "logs3"))
        assert r.returncode == 0, r.stdout[-5000:] + r.stderr[-2000:]
        assert f"staging[0] {model}: in place on all 3 nodes" in r.stdout
        assert re.search(rf"staging\[1\] {re.escape(data)}: .* to 3 of 3 nodes", r.stdout), r.stdout
        assert re.search(rf"tokenize_once {re.escape(tok)}: tokenized once on node0 \S+ in [\d.]+ s \({len(rows) // 2} rows", r.stdout) \
            or re.search(rf"tokenize_once {re.escape(tok)}: tokenized once", r.stdout), r.stdout
        for h in hs.hosts:
            own = os.path.join(hs.disk_of(h), "data", "tiny", f"{tiny['dataset']}.json")
            assert len(json.load(open(own))) == len(rows) // 2

"""Real ms-swift DPO with LoRA through `mlaunch submit`: 2 namespace hosts x 2 ranks, CPU, gloo.

The preference data is synthetic (the tiny model's instructions; chosen = the right answer,
rejected = a wrong one), in ms-swift's own format: messages + rejected_response.
"""
from __future__ import annotations

import json
import math
import os

import pytest

from .test_swift_training import checkpoint, state_of, swift_spec, tiny  # noqa: F401 (fixture)
from .training import losses, submit_timed

pytestmark = [pytest.mark.multihost, pytest.mark.training]


def preference_file(tiny_info: dict, dest: str) -> str:
    """messages (user, chosen assistant answer) + rejected_response, one JSON object a line."""
    with open(os.path.join(tiny_info["dataset_dir"], "tiny_alpaca.json")) as fh:
        examples = json.load(fh)
    path = os.path.join(dest, "tiny_pref.jsonl")
    with open(path, "w") as out:
        for i, ex in enumerate(examples):
            user = ex["instruction"] + ("\n" + ex["input"] if ex["input"] else "")
            wrong = examples[(i + 1) % len(examples)]["output"]
            if wrong == ex["output"]:
                wrong = ex["output"] + " no"
            out.write(json.dumps({"messages": [{"role": "user", "content": user},
                                               {"role": "assistant", "content": ex["output"]}],
                                  "rejected_response": wrong}) + "\n")
    return path


def test_swift_dpo_lora_trains(make_hostset, tmp_path, tiny):  # noqa: F811 (fixture)
    out = str(tmp_path / "out")
    with make_hostset(2) as hs:
        spec = swift_spec(tiny, [h.ip for h in hs.hosts], 1, out, hs=hs, max_steps=4, save_steps=4,
                          stage="rlhf", rlhf_type="dpo", passthrough={"beta": 0.1})
        spec["dataset"] = preference_file(tiny, str(tmp_path))
        r = submit_timed(tmp_path, spec)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    ckpt = checkpoint(out, 4)
    state = state_of(ckpt)
    assert state["global_step"] == 4
    got = losses(state)
    assert sorted(got) == [1, 2, 3, 4] and all(math.isfinite(v) for v in got.values()), got
    # DPO's own metrics were logged: it really ran the preference loss, not sft.
    assert any("rewards/chosen" in e for e in state["log_history"]), state["log_history"][:2]
    assert "adapter_model.safetensors" in os.listdir(ckpt)

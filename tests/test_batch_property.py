"""Property: the batch check accepts exactly the specs whose global batch is consistent."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.errors import SpecError
from launcher.plan.launch_plan import build_plan
from launcher.spec import validate

from .helpers import seed000


def spec(nodes: int, gpus: int, per_device: int, accum: int, global_: int | None) -> dict:
    data = seed000()
    data["cluster"]["hosts"] = [f"10.1.0.{i + 1}" for i in range(nodes)]
    data["cluster"]["master_addr"] = "10.1.0.1"
    data["cluster"]["gpus_per_node"] = gpus
    data["batch"] = {"per_device": per_device, "grad_accum": accum}
    if global_ is not None:
        data["batch"]["global"] = global_
    return data


small = st.integers(min_value=1, max_value=16)


@settings(max_examples=150, deadline=None)
@given(small, small, small, small, st.one_of(st.none(), st.integers(min_value=1, max_value=70000)))
def test_accepts_exactly_consistent(nodes, gpus, per_device, accum, global_):
    product = nodes * gpus * per_device * accum
    data = spec(nodes, gpus, per_device, accum, global_)
    try:
        job = validate(data)
        accepted = True
    except SpecError as e:
        accepted = False
        assert [str(p) for p in e.problems] == [
            f"batch.global: {global_} ≠ {nodes} node{'s' * (nodes != 1)} × {gpus} GPU{'s' * (gpus != 1)}"
            f" × {per_device} per device × "
            f"{accum} accumulation = {product}; set global to {product}, change per_device/"
            "grad_accum, or omit global"]
    assert accepted == (global_ is None or global_ == product)
    if accepted:
        # Whatever was accepted renders one consistent set of numbers into the DeepSpeed config.
        import json
        plan = build_plan(job, run_id="prop")
        ds = json.loads(next(f.content for f in plan.files if f.path.endswith("ds_config.json")))
        assert ds["train_batch_size"] == product
        assert ds["train_micro_batch_size_per_gpu"] == per_device
        assert ds["gradient_accumulation_steps"] == accum


@settings(max_examples=50, deadline=None)
@given(small, small, small, small)
def test_consistent_global_always_accepted(nodes, gpus, per_device, accum):
    product = nodes * gpus * per_device * accum
    assert validate(spec(nodes, gpus, per_device, accum, product)).batch.global_ == product


@settings(max_examples=80, deadline=None)
@given(st.lists(small, min_size=1, max_size=6), small, small, st.booleans())
def test_per_node_counts_sum_everywhere(counts, per_device, accum, consistent):
    """One count per node: global, ds_config and each node's --nproc-per-node follow Σ counts."""
    import json
    product = sum(counts) * per_device * accum
    data = spec(len(counts), 1, per_device, accum, product if consistent else product + 1)
    data["cluster"]["gpus_per_node"] = counts
    if not consistent:
        try:
            validate(data)
        except SpecError as e:
            assert str(e.problems[0]).endswith(f"= {product}; set global to {product}, change "
                                               "per_device/grad_accum, or omit global")
            return
        raise AssertionError("an inconsistent global batch was accepted")
    plan = build_plan(validate(data), run_id="prop")
    ds = json.loads(next(f.content for f in plan.files if f.path.endswith("ds_config.json")))
    assert ds["train_batch_size"] == product
    assert [int(n.argv[n.argv.index("--nproc-per-node") + 1]) for n in plan.nodes] == counts

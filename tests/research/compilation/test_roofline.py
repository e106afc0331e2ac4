"""The roofline check of modeled TPU step times, and the page that explains it from the probe's JSON."""

import json

import pytest

from lra_jax.research.compilation import modeled_loops, roofline
from lra_jax.research.reports import modeled_time_doc

# This package's own Python over its files, no jax computation: CI runs it on one stack.
pytestmark = pytest.mark.one_stack("oldest")


def row(**changes):
    base = {"variant": "softmax", "task": "table2:4096", "target": "tpu-v5e:1x1", "mode": "train", "result": "ok",
            "global_batch": 8, "per_device_batch": 8, "device_memory": 16 * 2**30, "kernel_calls": 0, "loops": 0,
            "modeled_seconds": 0.12, "modeled_note": None, "roofline_seconds": 0.1, "memory": {"total": 2**30}}
    return {**base, **changes}


def test_a_modeled_time_is_printed_only_within_its_roofline_band():
    assert roofline.check(row())["modeled_seconds"] == 0.12 and roofline.check(row())["reason"] is None
    slow = roofline.check(row(modeled_seconds=1.12))  # a whole second too many
    assert slow["modeled_seconds"] is None and "11.20x its roofline" in slow["reason"]
    fast = roofline.check(row(modeled_seconds=0.09))  # faster than the chip can do the counted work
    assert fast["modeled_seconds"] is None and "outside 1-2x" in fast["reason"]


def test_every_time_not_printed_has_its_reason():
    negative = roofline.check(row(modeled_seconds=None, modeled_note="not modeled: the TPU cost model gave -50.76"))
    assert negative["raw_modeled_seconds"] == pytest.approx(-50.76) and "51 whole seconds below zero" in negative["reason"]
    assert "2 loop(s)" in roofline.check(row(loops=2))["reason"]
    assert "Mosaic" in roofline.check(row(kernel_calls=4))["reason"]
    unfit = roofline.check(row(result="does not fit", memory={"temp": 20 * 2**30}))
    assert unfit["reason"] == "does not fit a device of 16 GiB (the compiler asked for 20.0 GiB)"
    assert roofline.check(row(roofline_seconds=None))["reason"].startswith("no roofline")


def test_band_evidence_takes_negative_times_above_their_whole_seconds():
    rows = [row(modeled_seconds=0.15), row(modeled_seconds=None, modeled_note="gave -2.88"), row(loops=1)]
    evidence = roofline.band_evidence(rows)
    assert evidence["positive"] == {"count": 1, "min": pytest.approx(1.5), "max": pytest.approx(1.5)}
    assert evidence["negative_fraction"]["min"] == pytest.approx(1.2)


def compiled(trips, layout, modeled, flops, roofline_seconds, loops=0, grad=False):
    return modeled_loops.Compiled(trips, layout, grad, modeled, flops, 1e9, loops, roofline_seconds, 1.0)


def test_probe_pairs_and_page_come_from_the_json(tmp_path):
    """Scans that lost a whole second are found, their time with it added back lies on the positive scans' line."""
    results = []
    for trips, modeled in ((2, -0.998), (8, 0.0026), (16, 0.0034)):
        results.append(compiled(trips, "unrolled", 0.0011 * trips, 1e11 * trips, 0.001 * trips))
        results.append(compiled(trips, "scanned", modeled, 1e11, 0.001, loops=1))
    pairs = modeled_loops.pairs(results)
    assert [p["scanned_whole_seconds_off"] for p in pairs] == [1, 0, 0]
    assert pairs[0]["scanned_corrected_seconds"] == pytest.approx(0.002)
    slope, intercept, distance = modeled_time_doc.line_through_positive(pairs)
    assert slope == pytest.approx(0.0001) and intercept == pytest.approx(0.0018) and distance == pytest.approx(0, abs=1e-12)
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps(modeled_loops.document("tpu-v5e:2x2", results, 4096, {"commit": "abc1234"})))
    table2 = tmp_path / "table2-tpu-v3-4x4.json"
    table2.write_text(json.dumps({"rows": [row(), row(variant="local", modeled_seconds=None,
                                                       modeled_note="not modeled: the TPU cost model gave -3.9")]}))
    page = modeled_time_doc.render(str(probe), [str(table2)], "python -m lra_jax.tools.docs", str(tmp_path))
    assert "commit abc1234" in page and "| forward | 2 | +0.002200 |" in page
    assert "Of the 2 TPU rows in the compile JSONs above, 1 have a negative modeled time" in page
    assert "1 of the 3 forward scans with a loop are negative" in page

"""GPU identity from the device: recorded NVML / torch / CUDA-runtime answers of each
product (tests/data/gpus, values from the public spec sheets) resolve to the right table
entry, with bandwidth from the memory clock x bus width and each field's source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from characterize.hardware import devices as hardware
from characterize.hardware.devices import device_from_dump, devices, throttle_names
from characterize.hardware.specs import GPUS
from tests.conftest import HAS_GPU

DUMPS = sorted((Path(__file__).parent / "data" / "gpus").glob("*.json"))


def _device(path: Path):
    d = json.loads(path.read_text())
    return d, device_from_dump(0, d["nvml"], d["torch"], d["cuda"], driver="550.54.15", runtime="13.0")


@pytest.mark.parametrize("path", DUMPS, ids=[p.stem for p in DUMPS])
def test_each_recorded_gpu_resolves_to_its_own_entry_with_device_numbers(path):
    d, dev = _device(path)
    spec, where = dev.spec(), dev.provenance()
    assert where["table_entry"] == d["expect"]["table_entry"]
    # bandwidth from NVML: 2 x memory clock x bus width, within 3% of the datasheet figure
    assert spec.hbm_GBps == pytest.approx(d["expect"]["datasheet_GBps"], rel=0.03)
    assert where["hbm_GBps"].startswith("nvml")
    assert spec.sm_count == d["torch"]["multi_processor_count"] and where["sm_count"].startswith("cuda runtime")
    assert spec.l2_bytes == d["torch"]["L2_cache_size"] and spec.memory_bytes == d["torch"]["total_memory"]
    assert spec.boost_clock_MHz == d["nvml"]["max_sm_clock_MHz"]
    if d["cuda"]:
        assert spec.max_persisting_l2_bytes == d["cuda"]["max_persisting_l2_bytes"]
        assert "cudaDevAttrMaxPersistingL2CacheSize" in where["max_persisting_l2_bytes"]
    else:  # not answered: the table's value, and the run says so
        assert spec.max_persisting_l2_bytes == GPUS[where["table_entry"]].max_persisting_l2_bytes
        assert where["max_persisting_l2_bytes"] == f"spec table ({where['table_entry']})"
    assert where["base_clock_MHz"].startswith("spec table")


def test_the_recorded_products_are_told_apart():
    entries = {p.stem: _device(p)[1].provenance()["table_entry"] for p in DUMPS}
    assert len(set(entries.values())) == len(DUMPS) == 11
    bw = {p.stem: _device(p)[1].spec().hbm_GBps for p in DUMPS}
    # the PCIe H100 is not the SXM part: 2.0 TB/s, not 3.35
    assert bw["h100-pcie"] == pytest.approx(2039, rel=0.01) and bw["h100-sxm"] == pytest.approx(3352, rel=0.01)
    assert bw["a100-pcie-80gb"] < bw["a100-sxm4-80gb"] and bw["a100-sxm4-40gb"] == bw["a100-pcie-40gb"]


def test_without_nvml_the_table_gives_bandwidth_and_says_so():
    d, _ = _device(Path(__file__).parent / "data" / "gpus" / "h100-nvl.json")
    dev = device_from_dump(0, {}, d["torch"], {})
    assert dev.spec().hbm_GBps == GPUS["h100-nvl"].hbm_GBps
    assert dev.provenance()["hbm_GBps"] == "spec table (h100-nvl)" and dev.source == "torch"


def test_throttle_reasons_are_named():
    assert throttle_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"] and throttle_names(0) == []


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_the_live_device_answers_every_identity_field():
    dev = devices()[0]
    where = dev.provenance()
    for f in ("sm_count", "l2_bytes", "max_persisting_l2_bytes", "hbm_GBps"):
        assert not where[f].startswith("spec table"), (f, where[f])


# NVML samples around a point, as sample_clocks records them (values from an H100 SXM
# under a sustained load: idle before, power-capped after; violation counters in ns)
COOL = {"sm_clock_MHz": 1980, "temperature_C": 41, "throttle_reasons": ["gpu_idle"],
        "power_violation_ns": 5_000_000, "thermal_violation_ns": 0}
CAPPED = {"sm_clock_MHz": 1755, "temperature_C": 67, "throttle_reasons": ["sw_power_cap"],
          "power_violation_ns": 5_000_000, "thermal_violation_ns": 0}
HIDDEN = {"sm_clock_MHz": 1980, "temperature_C": 83, "throttle_reasons": [],
          "power_violation_ns": 5_000_000, "thermal_violation_ns": 12_500_000}


@pytest.mark.parametrize("clocks, throttled, reasons, violation", [
    ({"before": COOL, "after": COOL}, False, [], {}),
    ({"before": COOL, "after": CAPPED}, True, ["sw_power_cap"], {}),
    # clocks look normal at both samples, but the thermal limit held them down in between
    ({"before": COOL, "after": HIDDEN}, True, [], {"thermal": 12.5}),
    ({"before": {}, "after": {}}, None, [], {}),
])
def test_throttle_verdict_from_recorded_nvml_samples(clocks, throttled, reasons, violation):
    v = hardware.throttle_verdict(clocks)
    assert v["throttled"] is throttled and v["reasons"] == reasons and v["violation_ms"] == violation
    if throttled is not None:
        assert v["max_temperature_C"] == max(c["temperature_C"] for c in clocks.values())

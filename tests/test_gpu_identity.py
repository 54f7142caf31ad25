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


# a GPU or driver that answers clocks and temperature but not the throttle reasons or violation counters
UNSUPPORTED = {"sm_clock_MHz": 1410, "temperature_C": 50}


@pytest.mark.parametrize("clocks, throttled, reasons, violation", [
    ({"before": COOL, "after": COOL}, False, [], {}),
    ({"before": COOL, "after": CAPPED}, True, ["sw_power_cap"], {}),
    # clocks look normal at both samples, but the thermal limit held them down in between
    ({"before": COOL, "after": HIDDEN}, True, [], {"thermal": 12.5}),
    ({"before": {}, "after": {}}, None, [], {}),
    # counters that are not supported say nothing: unknown, never "not throttled"
    ({"before": UNSUPPORTED, "after": UNSUPPORTED}, None, [], {}),
    ({"before": UNSUPPORTED, "after": CAPPED}, True, ["sw_power_cap"], {}),
])
def test_throttle_verdict_from_recorded_nvml_samples(clocks, throttled, reasons, violation):
    v = hardware.throttle_verdict(clocks)
    assert v["throttled"] is throttled and v["reasons"] == reasons and v["violation_ms"] == violation
    if throttled is not None:
        assert v["max_temperature_C"] == max(c["temperature_C"] for c in clocks.values())


def test_unsupported_counters_are_named():
    v = hardware.throttle_verdict({"before": UNSUPPORTED, "after": UNSUPPORTED})
    assert v["throttled"] is None
    assert v["unsupported"] == ["throttle_reasons", "power_violation_ns", "thermal_violation_ns"]
    assert hardware.throttle_verdict({"before": COOL, "after": COOL})["unsupported"] == []


class NVMLError(Exception):
    pass


class FakeNvml:
    """pynvml on a machine of three GPUs where GPU 1 cannot be opened and GPU 2 cannot be
    named (lost off the bus, or no permission): NVML needs a GPU, so it is stood in for."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2

    def nvmlInit(self): pass
    def nvmlShutdown(self): pass
    def nvmlSystemGetDriverVersion(self): return b"535.104.05"
    def nvmlSystemGetCudaDriverVersion(self): return 12020
    def nvmlDeviceGetCount(self): return 3

    def nvmlDeviceGetHandleByIndex(self, i):
        if i == 1:
            raise NVMLError("GPU is lost")
        return i

    def nvmlDeviceGetName(self, h):
        if h == 2:
            raise NVMLError("Insufficient Permissions")
        return b"NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetUUID(self, h): return f"GPU-0000000{h}-aaaa-bbbb-cccc-dddddddddddd"

    def __getattr__(self, name):   # every other query: not supported on this GPU
        def unsupported(*args):
            raise NVMLError(f"{name}: Not Supported")
        return unsupported


def test_nvml_failures_leave_the_gpu_out_and_never_escape(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    nvml, driver = hardware._nvml_devices()
    assert list(nvml) == [0] and driver == "535.104.05" and nvml[0]["uuid"].startswith("GPU-00000000")
    if not HAS_GPU:   # no CUDA device through torch: NVML's GPUs as they are, the two that fail left out
        found = devices()
        assert [(d.index, d.nvml_index, d.name) for d in found] == [(0, 0, "NVIDIA A100-SXM4-80GB")]
    assert hardware.driver_cuda_version() == ("535.104.05", (12, 2))


def test_cuda_devices_take_nvmls_answers_for_the_gpu_with_their_uuid():
    nvml = {0: {"uuid": "GPU-aaaa1111"}, 1: {"uuid": "GPU-bbbb2222"}, 2: {"uuid": "GPU-cccc3333"}}
    # CUDA_VISIBLE_DEVICES=2,0: CUDA device 0 is NVML's 2; the UUIDs say so
    assert hardware.match_nvml({0: "cccc3333", 1: "aaaa1111"}, nvml, "2,0") == {0: 2, 1: 0}
    # no UUID from the runtime: the visible list, by UUID prefix, or by index in PCI order only
    assert hardware.match_nvml({0: None}, nvml, "GPU-bbbb") == {0: 1}
    assert hardware.match_nvml({0: None, 1: None}, nvml, "2,0", "PCI_BUS_ID") == {0: 2, 1: 0}
    assert hardware.match_nvml({0: None, 1: None}, nvml, "2,0") == {0: None, 1: None}   # CUDA's own order
    assert hardware.match_nvml({0: None}, {5: {"uuid": "GPU-x"}}) == {0: 5}             # the only GPU

"""Hardware stage, devices: what the driver reports about the GPUs present (NVML, the CUDA
runtime through torch), and the clock and throttle samples taken around a measurement.

Nothing here is needed without a GPU: `devices()` answers [] and `require_gpu()`
raises NoCudaDevice naming what works without one. `DeviceInfo.spec()` overlays what a
device reports on its entry in hardware.specs, and `provenance()` says which API
answered each field.
"""

from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from characterize.errors import ConfigError, NoCudaDevice
from characterize.hardware.specs import ARCHS, DEFAULT_GPU, GPUS, GpuSpec, gpu_spec


@dataclass(frozen=True)
class DeviceInfo:
    """What the driver reports about one visible GPU."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    l2_bytes: int
    memory_bytes: int
    max_persisting_l2_bytes: int | None
    sm_clock_MHz: int | None
    max_sm_clock_MHz: int | None
    memory_clock_MHz: int | None
    driver: str | None
    cuda_runtime: str | None
    source: str  # which APIs answered: "nvml+torch", "torch", "nvml"
    max_memory_clock_MHz: int | None = None   # NVML: the memory clock's top (HBM: the bus clock, x2 per transfer)
    memory_bus_width_bits: int | None = None  # NVML (or torch's device properties)
    nvml_index: int | None = None             # the same GPU in NVML's numbering (matched by UUID), for clock samples

    @property
    def arch(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    @property
    def hbm_GBps(self) -> float | None:
        """Peak DRAM bandwidth from the device: 2 transfers per memory clock x bus width
        (A100 80 GB SXM: 2 x 1593 MHz x 5120 bits = 2039 GB/s)."""
        if not self.max_memory_clock_MHz or not self.memory_bus_width_bits:
            return None
        return 2 * self.max_memory_clock_MHz * 1e6 * self.memory_bus_width_bits / 8 / 1e9

    def _table_entry(self) -> GpuSpec:
        try:
            return gpu_spec(self.name)
        except ConfigError:
            return GPUS[DEFAULT_GPU.get(self.arch, "h100-sxm")]

    def _measured(self) -> dict[str, tuple[object, str]]:
        """GpuSpec fields the device answered, with the API that answered."""
        rt = "torch" if "torch" in self.source else "nvml"
        found: dict[str, tuple[object, str]] = {"name": (self.name, rt)}
        if self.arch in ARCHS:
            found["arch"] = (self.arch, rt)
        for key, value, api in (("sm_count", self.sm_count, "cuda runtime (torch)"),
                                ("l2_bytes", self.l2_bytes, "cuda runtime (torch)"),
                                ("memory_bytes", self.memory_bytes, rt),
                                ("max_persisting_l2_bytes", self.max_persisting_l2_bytes,
                                 "cuda runtime (cudaDevAttrMaxPersistingL2CacheSize)"),
                                ("hbm_GBps", self.hbm_GBps, "nvml (max memory clock x bus width)"),
                                ("boost_clock_MHz", self.max_sm_clock_MHz, "nvml (max SM clock)")):
            if value:
                found[key] = (value, api)
        return found

    def spec(self) -> GpuSpec:
        """The table entry for this GPU with the device's own numbers overlaid."""
        return dataclasses.replace(self._table_entry(), **{k: v for k, (v, _) in self._measured().items()})

    def provenance(self) -> dict[str, str]:
        """Where each identity field of spec() came from: the API that answered, or the
        spec table entry it fell back to."""
        entry = self._table_entry()
        found = self._measured()
        fields = ("name", "arch", "sm_count", "l2_bytes", "memory_bytes", "max_persisting_l2_bytes", "hbm_GBps",
                  "boost_clock_MHz", "base_clock_MHz", "l2_GBps")
        return {"table_entry": entry.key,
                **{f: found[f][1] if f in found else f"spec table ({entry.key})" for f in fields}}


#: NVML's clock-throttle reason bits (nvml.h, nvmlClocksEventReasons), named
THROTTLE_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}


def throttle_names(mask: int) -> list[str]:
    """The reasons set in an NVML throttle mask (idle is not a slowdown of a running kernel)."""
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


#: the reasons that slow a running kernel (idle, application clocks, sync boost and the
#: display clock do not)
SLOWDOWN_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                    "hw_power_brake_slowdown")


def throttle_verdict(clocks: Mapping[str, Any]) -> dict:
    """Whether a point ran throttled, from the NVML samples taken around it
    (`{"before": {...}, "after": {...}}`): a slowdown reason in any sample, or power or
    thermal violation time that grew between the first and the last sample. Clocks
    sampled only around a point can miss a short slowdown; the violation counters
    cannot, which is why both are read. `throttled` is True on any evidence; False only
    when every check could be made (reasons in every sample, both violation counters in
    two); None, unknown, otherwise: nothing sampled, or what the GPU or driver does not
    support, listed in `unsupported`."""
    samples = [v for v in clocks.values() if isinstance(v, Mapping) and v]
    reasons = sorted({r for v in samples for r in v.get("throttle_reasons", ()) if r in SLOWDOWN_REASONS})
    grown, unsupported = {}, []
    if not samples or any("throttle_reasons" not in v for v in samples):
        unsupported.append("throttle_reasons")
    for key, name in (("power_violation_ns", "power"), ("thermal_violation_ns", "thermal")):
        vals = [v[key] for v in samples if isinstance(v.get(key), (int, float))]
        if len(vals) >= 2 and vals[-1] > vals[0]:
            grown[name] = (vals[-1] - vals[0]) / 1e6
        if len(vals) < 2:
            unsupported.append(key)
    temps = [v["temperature_C"] for v in samples if isinstance(v.get("temperature_C"), (int, float))]
    throttled = True if (reasons or grown) else (None if unsupported else False)
    return {"throttled": throttled, "reasons": reasons, "violation_ms": grown,
            "max_temperature_C": max(temps) if temps else None, "unsupported": unsupported}


def _nvml_query(h: object, calls: dict[str, object]) -> dict:
    """Each NVML call that answers (older GPUs and drivers lack some)."""
    out: dict = {}
    for key, call in calls.items():
        try:
            out[key] = call(h)  # type: ignore[operator]
        except Exception:
            pass
    return out


def _nvml_devices() -> tuple[dict[int, dict], str | None]:
    """What NVML says of each GPU it sees (its own numbering, every GPU of the machine),
    and the driver version. A GPU NVML cannot open or name (lost, no permission, in
    reset) is left out; nothing NVML raises escapes."""
    try:
        import pynvml
    except ImportError:
        return {}, None
    try:
        pynvml.nvmlInit()
    except Exception:
        return {}, None
    out: dict[int, dict] = {}
    n = pynvml
    driver = None
    try:
        try:
            driver = n.nvmlSystemGetDriverVersion()
            driver = driver.decode() if isinstance(driver, bytes) else driver
        except Exception:
            driver = None
        try:
            count = int(n.nvmlDeviceGetCount())
        except Exception:
            count = 0
        for i in range(count):
            try:
                h = n.nvmlDeviceGetHandleByIndex(i)
                name = n.nvmlDeviceGetName(h)
            except Exception:
                continue
            info: dict = {"name": name.decode() if isinstance(name, bytes) else str(name)}
            info.update(_nvml_query(h, {
                "uuid": lambda h: _text(n.nvmlDeviceGetUUID(h)),
                "memory_bytes": lambda h: int(n.nvmlDeviceGetMemoryInfo(h).total),
                "sm_clock_MHz": lambda h: int(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
                "memory_clock_MHz": lambda h: int(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
                "max_sm_clock_MHz": lambda h: int(n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_SM)),
                "max_memory_clock_MHz": lambda h: int(n.nvmlDeviceGetMaxClockInfo(h, n.NVML_CLOCK_MEM)),
                "memory_bus_width_bits": lambda h: int(n.nvmlDeviceGetMemoryBusWidth(h)),
                "compute_capability": lambda h: list(n.nvmlDeviceGetCudaComputeCapability(h)),
            }))
            out[i] = info
    finally:
        try:
            n.nvmlShutdown()
        except Exception:
            pass
    return out, driver


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _uuid_key(uuid: object) -> str:
    """A GPU UUID as NVML ('GPU-8f6c...') and the CUDA runtime ('8f6c...') both spell it."""
    return str(uuid).strip().lower().removeprefix("gpu-")


def match_nvml(cuda_uuids: Mapping[int, str | None], nvml: Mapping[int, Mapping], visible: str | None = None,
               order: str | None = None) -> dict[int, int | None]:
    """NVML's index of each CUDA device. By UUID where both answered; else through
    CUDA_VISIBLE_DEVICES (`visible`: UUIDs or UUID prefixes, or indices, which follow
    NVML's PCI order only with CUDA_DEVICE_ORDER=PCI_BUS_ID, `order`); else the same
    index when the two see the same GPUs in PCI order, or the only GPU. None: unknown
    (clock samples are then not taken rather than taken from another GPU)."""
    by_uuid = {_uuid_key(info["uuid"]): j for j, info in nvml.items() if info.get("uuid")}
    entries = [e.strip() for e in visible.split(",")] if visible else None
    pci = (order or "").upper() == "PCI_BUS_ID"
    out: dict[int, int | None] = {}
    for i, uuid in cuda_uuids.items():
        found = by_uuid.get(_uuid_key(uuid)) if uuid else None
        if found is None and entries is not None and i < len(entries):
            e = entries[i]
            if e.isdigit():
                found = int(e) if pci and int(e) in nvml else None
            elif e.lower().startswith("gpu-"):
                hits = [j for key, j in by_uuid.items() if key.startswith(_uuid_key(e))]
                found = hits[0] if len(hits) == 1 else None
        if found is None and entries is None:
            if len(nvml) == 1 and len(cuda_uuids) == 1:
                found = next(iter(nvml))
            elif pci and i in nvml:
                found = i
        out[i] = found
    return out


def driver_cuda_version() -> tuple[str | None, tuple[int, int] | None]:
    """(driver version, highest CUDA version it supports), from NVML
    (nvmlSystemGetCudaDriverVersion) or, without it, the driver library itself
    (libcuda's cuDriverGetVersion); (None, None) where there is no driver."""
    driver, cuda = None, None
    try:
        import pynvml as n

        n.nvmlInit()
        try:
            driver = _text(n.nvmlSystemGetDriverVersion())
            v = int(n.nvmlSystemGetCudaDriverVersion())
            cuda = (v // 1000, (v % 1000) // 10)
        finally:
            n.nvmlShutdown()
    except Exception:
        pass
    if cuda is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            v = ctypes.c_int()
            if lib.cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value > 0:
                cuda = (v.value // 1000, (v.value % 1000) // 10)
        except (OSError, AttributeError):
            pass
    return driver, cuda


def sample_clocks(index: int | None) -> dict:
    """SM and memory clocks, temperature and throttle reasons of GPU `index` now (NVML);
    {} without NVML or a GPU. Recorded around each measured point (one clock policy:
    unlocked clocks, sampled)."""
    if index is None:
        return {}
    try:
        import pynvml as n
    except ImportError:
        return {}
    try:
        n.nvmlInit()
    except Exception:
        return {}
    try:
        h = n.nvmlDeviceGetHandleByIndex(index)
        out = _nvml_query(h, {
            "sm_clock_MHz": lambda h: int(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
            "memory_clock_MHz": lambda h: int(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
            "temperature_C": lambda h: int(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
            "throttle_mask": lambda h: int(n.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
            # cumulative time the clocks were held down by the power or thermal limit since
            # the driver loaded: what grows between two samples happened during the point
            "power_violation_ns": lambda h: int(n.nvmlDeviceGetViolationStatus(
                h, n.NVML_PERF_POLICY_POWER).violationTime),
            "thermal_violation_ns": lambda h: int(n.nvmlDeviceGetViolationStatus(
                h, n.NVML_PERF_POLICY_THERMAL).violationTime),
        })
    except Exception:
        out = {}
    finally:
        try:
            n.nvmlShutdown()
        except Exception:
            pass
    if "throttle_mask" in out:
        out["throttle_reasons"] = throttle_names(out["throttle_mask"])
    return out


#: cudaDeviceAttr values (driver_types.h) read through the CUDA runtime
CUDA_ATTR_MAX_PERSISTING_L2 = 108   # cudaDevAttrMaxPersistingL2CacheSize


def _cuda_attribute(index: int, attr: int) -> int | None:
    """cudaDeviceGetAttribute through the CUDA runtime torch has loaded (found in
    /proc/self/maps, so the same library and context); None when it cannot be asked."""
    try:
        maps = open("/proc/self/maps", encoding="utf-8").read()
    except OSError:
        return None
    paths = sorted({line.split()[-1] for line in maps.splitlines() if "libcudart" in line and "/" in line})
    for path in paths:
        try:
            value = ctypes.c_int()
            if ctypes.CDLL(path).cudaDeviceGetAttribute(ctypes.byref(value), attr, index) == 0:
                return int(value.value)
        except (OSError, AttributeError):
            continue
    return None


def device_from_dump(index: int, nvml: dict, props: dict | None, cuda: dict | None = None,
                     driver: str | None = None, runtime: str | None = None,
                     nvml_index: int | None = None) -> DeviceInfo:
    """A DeviceInfo from what NVML, torch's device properties and the CUDA runtime
    answered (dicts, as recorded in tests/data/gpus/*.json or queried live)."""
    p, n, c = props or {}, nvml or {}, cuda or {}
    cc = (p["major"], p["minor"]) if "major" in p else tuple(n.get("compute_capability", (0, 0)))
    return DeviceInfo(
        index=index,
        name=p.get("name") or n.get("name", "unknown GPU"),
        compute_capability=(int(cc[0]), int(cc[1])),
        sm_count=int(p.get("multi_processor_count", 0) or 0),
        l2_bytes=int(p.get("L2_cache_size", 0) or 0),
        memory_bytes=int(p.get("total_memory", 0) or n.get("memory_bytes", 0)),
        max_persisting_l2_bytes=c.get("max_persisting_l2_bytes"),
        sm_clock_MHz=n.get("sm_clock_MHz"),
        max_sm_clock_MHz=n.get("max_sm_clock_MHz"),
        memory_clock_MHz=n.get("memory_clock_MHz"),
        driver=driver,
        cuda_runtime=runtime,
        source="+".join(s for s, ok in (("nvml", bool(n)), ("torch", bool(p))) if ok),
        max_memory_clock_MHz=n.get("max_memory_clock_MHz"),
        memory_bus_width_bits=n.get("memory_bus_width_bits") or p.get("memory_bus_width"),
        nvml_index=nvml_index if nvml_index is not None else (index if n else None),
    )


_PROPS = ("name", "major", "minor", "multi_processor_count", "L2_cache_size", "total_memory", "memory_bus_width")


def devices() -> list[DeviceInfo]:
    """Every visible CUDA GPU, from NVML, torch and the CUDA runtime together; [] when
    there is none. CUDA's index i and NVML's numbering differ (CUDA_VISIBLE_DEVICES,
    CUDA's own order): each CUDA device takes NVML's answers for the GPU with its UUID
    (match_nvml), never simply NVML's device i."""
    import os

    nvml, driver = _nvml_devices()
    torch_props: dict[int, dict] = {}
    cuda: dict[int, dict] = {}
    uuids: dict[int, str | None] = {}
    runtime = None
    try:
        import torch

        if torch.cuda.is_available():
            runtime = torch.version.cuda
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                torch_props[i] = {k: getattr(p, k) for k in _PROPS if hasattr(p, k)}
                uuids[i] = str(p.uuid) if getattr(p, "uuid", None) else None
                persisting = _cuda_attribute(i, CUDA_ATTR_MAX_PERSISTING_L2)
                cuda[i] = {"max_persisting_l2_bytes": persisting} if persisting else {}
    except Exception:
        pass
    if not torch_props:   # no CUDA device through torch: what NVML sees, as CUDA would number it
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = sorted(nvml) if visible is None else [int(e) for e in visible.split(",") if e.strip().isdigit()]
        return [device_from_dump(k, nvml[j], None, None, driver, runtime, nvml_index=j)
                for k, j in enumerate(j for j in ids if j in nvml)]
    where = match_nvml(uuids, nvml, os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("CUDA_DEVICE_ORDER"))
    return [device_from_dump(i, nvml.get(where[i], {}) if where[i] is not None else {}, torch_props[i], cuda.get(i),
                             driver, runtime, nvml_index=where[i])
            for i in sorted(torch_props)]


def require_gpu() -> DeviceInfo:
    """The first GPU, or NoCudaDevice pointing to what works without one."""
    found = [d for d in devices() if d.sm_count > 0]
    if not found:
        raise NoCudaDevice(
            "no CUDA device is visible (torch.cuda.is_available() is False). Commands that "
            "work without a GPU: `characterize build` (static registers/occupancy), "
            "`characterize workload stats`, `characterize predict`, `characterize check` "
            "(kernel logic on the CPU), `characterize import`, `characterize report`.")
    return found[0]

import pytest

from characterize.errors import ConfigError, NoCudaDevice
from characterize.hardware.devices import devices, require_gpu
from characterize.hardware.specs import ARCHS, DEFAULT_GPU, GPUS, gpu_spec, normalize_arch, parse_archs
from tests.conftest import HAS_GPU


@pytest.mark.parametrize("text", ["sm_80", "80", "8.0", "sm80", "compute_80", " SM_80 "])
def test_normalize_arch(text):
    assert normalize_arch(text) == "sm_80"


@pytest.mark.parametrize("text", ["sm_100", "100", "10.0", "sm100", "compute_100"])
def test_normalize_blackwell_arch(text):
    assert normalize_arch(text) == "sm_100"


def test_unknown_arch():
    with pytest.raises(ConfigError, match="sm_75"):
        normalize_arch("sm_75")
    with pytest.raises(ConfigError):
        normalize_arch("hopper")


def test_gpu_lookup_by_key_alias_arch_and_driver_name():
    assert gpu_spec("h200").hbm_GBps == 4800
    assert gpu_spec("sm_90").key == "h100-sxm"
    assert gpu_spec("NVIDIA A100-PCIE-40GB").key == "a100-pcie-40gb"
    assert gpu_spec("NVIDIA H100 PCIe").key == "h100-pcie" and gpu_spec("NVIDIA H100 PCIe").hbm_GBps < 2100
    b200 = gpu_spec("NVIDIA B200")
    assert b200.key == "b200" and gpu_spec("sm_100") is b200 and (b200.sm_count, b200.hbm_GBps) == (148, 8000)
    with pytest.raises(ConfigError, match="unknown GPU"):
        gpu_spec("voodoo2")


def test_table_is_complete():
    for arch in ("sm_80", "sm_86", "sm_89", "sm_90", "sm_100"):
        assert arch in ARCHS and arch in DEFAULT_GPU
    for spec in GPUS.values():
        persisting = spec.max_persisting_l2_bytes > 0 or ARCHS[spec.arch].compute_capability < (8, 0)
        assert spec.arch in ARCHS and spec.l2_bytes > spec.max_persisting_l2_bytes >= 0 and persisting
        assert spec.hbm_GBps > 0 and spec.sources


def test_parse_archs():
    assert parse_archs("sm_80, 90,sm_80") == ["sm_80", "sm_90"]


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU path")
def test_no_gpu_is_reported_clearly():
    assert devices() == []
    with pytest.raises(NoCudaDevice, match="characterize build"):
        require_gpu()


@pytest.mark.parametrize("name", ["h100", "H100", "a100", "NVIDIA H100"])
def test_a_name_that_stands_for_products_of_different_speed_is_asked_not_guessed(name):
    with pytest.raises(ConfigError, match="ambiguous.*h100-sxm|ambiguous.*a100-80gb"):
        gpu_spec(name)
    assert gpu_spec("NVIDIA H100 80GB HBM3").key == "h100-sxm" and gpu_spec("NVIDIA H100 PCIe").key == "h100-pcie"


def test_the_gpus_the_public_measurements_ran_on_are_in_the_table():
    for name, key, sms in (("Tesla V100-SXM2-32GB", "v100", 80), ("NVIDIA L40S", "l40s", 142), ("NVIDIA H20", "h20", 78),
                           ("NVIDIA H20-3e", "h20-3e", 78)):
        spec = gpu_spec(name)
        assert spec.key == key and spec.sm_count == sms and spec.sources
    assert gpu_spec("v100").max_persisting_l2_bytes == 0   # Volta has no persisting L2

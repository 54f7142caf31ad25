import pytest

from characterize.config import ExperimentConfig, Pooling, WorkloadConfig
from characterize.errors import ConfigError, GpuMemoryError, UnsupportedShape
from characterize.hardware.specs import gpu_spec
from characterize.pipeline import check_experiment, load_experiment


def test_default_is_the_paper():
    c = WorkloadConfig()
    assert (c.T, c.E, c.D, c.B, int(c.L.mean), c.dtype, c.mode) == (12, 500_000, 128, 2048, 150, "fp32", "sum")
    assert c.row_bytes == 512 and c.table_bytes == 500_000 * 512
    assert c.lookups_per_batch == 2048 * 150


def test_tiny_preset_has_odd_sizes_and_empty_bags():
    t = WorkloadConfig.tiny().validate()
    assert t.B == 127 and t.E == 1009 and t.D % 32 != 0 and t.L.low == 0


@pytest.mark.parametrize("field,value", [("T", 0), ("E", -5), ("D", 0), ("B", 0), ("batches", 0), ("E", 2.5)])
def test_non_positive_sizes_are_refused(field, value):
    with pytest.raises(ConfigError, match=field):
        WorkloadConfig().replace(**{field: value}).validate()


def test_bad_mode_and_dtype():
    with pytest.raises(ConfigError, match="mode"):
        WorkloadConfig(mode="max").validate()
    with pytest.raises(ConfigError, match="dtype"):
        WorkloadConfig(dtype="fp4").validate()


@pytest.mark.parametrize("spec,kind,mean", [("150", "fixed", 150), ("uniform:0:20", "uniform", 10),
                                            ("poisson:30", "poisson", 30)])
def test_pooling_parse(spec, kind, mean):
    p = Pooling.parse(spec)
    assert p.kind == kind and p.mean == mean and str(p) == spec


@pytest.mark.parametrize("spec", ["0", "uniform:5:2", "poisson:-1", "many", "uniform:0:0"])
def test_pooling_parse_errors(spec):
    with pytest.raises(ConfigError):
        Pooling.parse(spec)


def test_variant_shape_refusal_named():
    with pytest.raises(UnsupportedShape, match="warp.*multiple of 4"):
        check_experiment(ExperimentConfig(workload=WorkloadConfig(D=33), variants=("base", "warp")))
    check_experiment(ExperimentConfig(workload=WorkloadConfig(D=33), variants=("base", "rpf")))


def test_memory_beyond_gpu():
    big = WorkloadConfig(E=50_000_000)  # 12 tables x 25.6 GB
    with pytest.raises(GpuMemoryError, match="GiB"):
        big.validate(gpu=gpu_spec("h100-sxm"))
    WorkloadConfig().validate(gpu=gpu_spec("h100-sxm"))


def test_round_trip_and_unknown_fields():
    c = WorkloadConfig(L=Pooling.parse("uniform:1:9"))
    assert WorkloadConfig.from_dict(c.to_dict()) == c
    with pytest.raises(ConfigError, match="unknown workload field"):
        WorkloadConfig.from_dict({"X": 1})


def test_experiment_files_load_and_validate():
    for name in ("paper", "quick"):
        e = load_experiment(name).validate()
        assert e.name == name and e.variants and e.datasets
    with pytest.raises(ConfigError, match="no experiment"):
        load_experiment("nope")


def test_experiment_rejects_bad_values(tmp_path):
    p = tmp_path / "x.toml"
    p.write_text('name = "x"\nvariants = ["base", "bogus"]\n')
    with pytest.raises(ConfigError, match="bogus"):
        load_experiment(str(p)).validate()
    p.write_text('name = "x"\n[params.rpf]\nP = 12\n')
    with pytest.raises(ConfigError, match="P must be"):
        load_experiment(str(p)).validate()
    p.write_text("name = \n")
    with pytest.raises(ConfigError, match="TOML"):
        load_experiment(str(p))
    assert ExperimentConfig().validate()

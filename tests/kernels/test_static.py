import json

from click.testing import CliRunner

from characterize.cli import main
from characterize.kernels.build import nvcc_archs
from characterize.kernels.registry import VARIANTS
from characterize.kernels.static import (
    LIGHT_SPILL_BYTES,
    default_register_cap,
    static_characterization,
)

KEYS = {"variant", "arch", "maxrregcount", "registers", "spill_stores", "spill_loads", "shared_mem", "block_size",
        "theoretical_occupancy_pct", "limiter"}


def test_sm80_base_is_register_limited_and_optmt_raises_occupancy():
    rows = {(r.variant, r.role): r for r in static_characterization(["base", "optmt"], ["sm_80"])}
    base, optmt = rows[("base", "lookup")], rows[("optmt", "lookup")]
    assert base.limiter == "registers" and base.theoretical_occupancy_pct < 100
    assert optmt.theoretical_occupancy_pct > base.theoretical_occupancy_pct
    assert optmt.maxrregcount == default_register_cap("sm_80")
    assert optmt.spill_stores + optmt.spill_loads <= LIGHT_SPILL_BYTES


def test_every_variant_for_two_archs_with_sweep():
    rows = static_characterization(None, ["sm_80", "sm_90"], [32, 48])
    public = {n for n, v in VARIANTS.items() if v.compiled and not v.test_only}
    assert {r.variant for r in rows} == public
    assert {r.arch for r in rows} == {"sm_80", "sm_90"}
    prepass = [r for r in rows if r.role == "prepass"]
    assert {r.variant for r in prepass} == {"l2p", "combined"}
    sweep = [r for r in rows if r.sweep and r.variant == "base"]
    assert {(r.arch, r.maxrregcount) for r in sweep} == {("sm_80", 32), ("sm_80", 48), ("sm_90", 32), ("sm_90", 48)}
    assert all(r.registers <= r.maxrregcount for r in sweep)
    assert not any(r.sweep for r in rows if r.variant == "warp")  # __launch_bounds__ wins over the cap


def test_build_command_json():
    res = CliRunner().invoke(main, ["build", "--arch", "sm_80,sm_90", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data and all(KEYS <= set(d) for d in data)
    names = {d["variant"] for d in data}
    assert {"base", "optmt", "rpf", "l2p", "l2w", "combined", "warp"} <= names


def test_build_command_table_and_bad_arch():
    r = CliRunner().invoke(main, ["build", "--arch", "sm_80", "--variants", "base,rpf", "--maxrregcount", "40,64"])
    assert r.exit_code == 0 and "register sweep" in r.output and "register caps of the capped variants" in r.output
    bad = CliRunner().invoke(main, ["build", "--arch", "sm_75"])   # not in the spec table
    assert bad.exit_code == 2 and "sm_75" in bad.output and "Traceback" not in bad.output
    # in the table (V100) but no longer built by CUDA 13's nvcc: said, with what the model reads instead
    old = CliRunner().invoke(main, ["build", "--arch", "sm_70", "--variants", "base"])
    if "sm_70" not in nvcc_archs():
        assert old.exit_code == 3 and "does not build sm_70" in old.output and "sm_80" in old.output
        assert "Traceback" not in old.output

"""Report stage, the panel lists: which panels a stored run, an imported Nsight Compute file
and a comparison show, in order. The panels live in one module per section (overview,
locality, static, timing, nsight, model, host, imports, compare), which never import each
other; only this list brings them together.
"""

from __future__ import annotations

from characterize.report.layout import Panel
from characterize.report.panels import host, imports, locality, model, nsight, overview, static, timing
from characterize.report.panels.compare import COMPARE_PANELS, VS_BASE_PANELS

#: a stored run: overview, locality, static, timing, Nsight Compute (one row per point, then each
#: technique against base), model, failures
RUN_PANELS: tuple[Panel, ...] = (*overview.PANELS, *locality.PANELS, *static.PANELS, *timing.PANELS,
                                 *nsight.ncu_panels(nsight.POINTS), *VS_BASE_PANELS, *model.PANELS, *host.PANELS,
                                 *overview.FAILURE_PANELS)
#: an imported .ncu-rep or CSV export: the file, where its time goes, Nsight Compute (one row per kernel)
IMPORT_PANELS: tuple[Panel, ...] = (*imports.PANELS, *nsight.ncu_panels(nsight.KERNELS))
#: a report inside a run directory, whose profile points say the tables each launch covered: per table
IMPORT_TABLE_PANELS: tuple[Panel, ...] = (*imports.PANELS, *nsight.ncu_panels(nsight.KERNELS_PER_TABLE))

__all__ = ["RUN_PANELS", "IMPORT_PANELS", "IMPORT_TABLE_PANELS", "COMPARE_PANELS"]

#!/usr/bin/env bash
# Passes and wall time of ncu's collections on one paper-shaped kernel: today's default set, the
# default plus the sections the report's panels read, the full set, and the cache counters
# under application replay.
o=$1; mkdir -p $o; NCU=${NCU:-/usr/local/cuda/bin/ncu}
$NCU --list-sections > $o/sections.txt 2>&1
$NCU --query-metrics --chip gh100 > $o/metrics-gh100.txt 2>&1
DEF=$(python3 -c "from characterize.measure.ncu import METRIC_SETS; print(','.join(METRIC_SETS['default'].metrics_for(90)))")
CACHE=$(python3 -c "from characterize.measure.ncu import CACHE_METRICS, CLOCK_METRICS; print(','.join(CACHE_METRICS + CLOCK_METRICS))")
S=""; for s in LaunchStats Occupancy WarpStateStats MemoryWorkloadAnalysis SpeedOfLight; do S="$S --section $s"; done
X=""; for s in MemoryWorkloadAnalysis_Chart MemoryWorkloadAnalysis_Tables ComputeWorkloadAnalysis InstructionStats SpeedOfLight_RooflineChart SpeedOfLight_HierarchicalSingleRooflineChart SchedulerStats SourceCounters; do
  grep -q "^ *$s " $o/sections.txt && X="$X --section $s"; done
common="--config-file off --cache-control none --clock-control none --nvtx --nvtx-include probe/ --target-processes all -k regex:EmbeddingBag"
run() { name=$1; shift; s=$(date +%s.%N); timeout 25 $NCU --export $o/$name --force-overwrite $common "$@" python3 .gpu/probe.py > $o/$name.log 2>&1; echo "$name rc=$? $(python3 -c "print(round($(date +%s.%N)-$s,1))") s $(grep -o '[0-9]* passes' $o/$name.log | tr '\n' ' ')" | tee -a $o/summary.txt; }
run plain --metrics gpu__time_duration.sum
run default $S --metrics $DEF
run panels $S $X --metrics $DEF
run cache --replay-mode application --metrics $CACHE
run full --set full

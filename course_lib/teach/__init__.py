"""Teaching helpers, one idea per module: the idea's computation and its picture together
(gradsync: verify gradient sync and draw it; placement: diagnose device placement and draw
it; sync_batchnorm: a readable CPU SyncBatchNorm and its picture), plus `observe`, with
which a cell records the symptom it measured. Figures of telemetry tables are in plots/."""

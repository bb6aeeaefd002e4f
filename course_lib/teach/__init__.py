"""Teaching helpers, one lesson's helpers per module, of three kinds (CONTRIBUTING.md, "Where
a figure goes"):
- an idea's computation with its picture (gradsync: verify gradient sync and draw it;
  placement: diagnose device placement and draw it; sync_batchnorm: a CPU SyncBatchNorm).
  The ranks may import these, so they import the plotting stack inside drawing functions;
- pictures only, `*_views.py` (scaling_views, batchnorm_views...): imported by no module of
  the package, so they import the plotting stack at the top;
- lesson material: cases/, faults.py.
Plus `observe`, with which a cell records the symptom it measured. Figures of telemetry
tables and generic charts are in plots/; tests/test_teach_layout.py checks the rule."""

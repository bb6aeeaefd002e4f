"""Telemetry: record what every rank does while it trains, and get it back as tables.

    rec = telemetry.Recorder()
    rec.watch_ddp(ddp_model)              # all-reduces, gradients before/after them
    with rec.step(step):
        with rec.span("forward"):
            loss = loss_fn(ddp_model(x), y)
        rec.scalar("loss", loss)

In the notebook, `launch(...)` returns the records of every rank as `run.telemetry`.
"""

from course_lib.telemetry.chrome import chrome_trace, merge_traces
from course_lib.telemetry.recorder import Recorder
from course_lib.telemetry.run_telemetry import Telemetry, load
from course_lib.telemetry.table import Table
from course_lib.telemetry.transport import COLLECTOR as COLLECTOR  # the key Run.telemetry reads
from course_lib.telemetry.transport import ENV_DIR

load_profiler_traces = Telemetry.from_profiler_traces

__all__ = ["Recorder", "Telemetry", "Table", "load", "load_profiler_traces", "chrome_trace",
           "merge_traces", "ENV_DIR"]

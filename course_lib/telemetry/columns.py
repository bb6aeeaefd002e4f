"""The tables a recorder fills and their columns; a Telemetry adds `rank` in front."""

COLUMNS: dict[str, tuple[str, ...]] = {
    "scalars": ("step", "name", "value"),
    "spans": ("step", "name", "start", "end"),
    "grads": ("step", "when", "bucket", "param", "index", "norm", "values"),
    "comms": ("step", "op", "bucket", "bytes", "start", "end"),
    "batchnorm": ("step", "layer", "batch_mean", "batch_var", "running_mean", "running_var"),
    "samples": ("epoch", "position", "index"),
}

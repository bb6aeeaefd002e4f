import cloudpickle
import pytest
from procs import forkserver_processes, leftover_workers  # tests/ is on pythonpath (pyproject)


@pytest.fixture(autouse=True)
def send_functions_by_value(request):
    """Test functions travel to workers by value, as functions from a notebook cell do."""
    cloudpickle.register_pickle_by_value(request.module)


@pytest.fixture(autouse=True)
def no_leftover_workers():
    """Every test must leave no worker (nor a worker's child) running."""
    before = forkserver_processes()
    yield
    extra = leftover_workers(before)
    assert not extra, f"worker processes left behind: {sorted(extra)}"

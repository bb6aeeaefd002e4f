"""course_lib: run, watch and check real DDP workers from a Jupyter notebook."""

from course_lib.launch import DistributedError, Run, launch
from course_lib.teach.devices import rank_device
from course_lib.teach.observe import observe

__all__ = ["launch", "DistributedError", "Run", "observe", "rank_device"]


def load_ipython_extension(ipython):  # noqa: ANN001 - IPython's hook
    """`%load_ext course_lib` registers the %%ddp cell magic."""
    from course_lib.launch.magic import DDPMagics

    ipython.register_magics(DDPMagics)

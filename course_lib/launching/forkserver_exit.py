"""Imported by the forkserver alone (the last of forkserver.PRELOAD): when its kernel has
gone, the forkserver ends at once instead of tearing torch down, which took seconds under
load and left an orphan of a dead kernel holding its memory meanwhile. Its forks (the
ranks, which end with os._exit) never run atexit handlers."""

import atexit
import os

atexit.register(os._exit, 0)

"""How every cetlab command ends when its reader left (`cetlab-agent doctor | head -3`): quietly, with 141.

Python ignores SIGPIPE, so a write to a closed pipe raises BrokenPipeError, mid-command or in the interpreter's last
flush of stdout ("Exception ignored ... BrokenPipeError"). Each entry point is wrapped here, once: the error ends the
command with the shell's code for a writer whose reader left, and stdout is pointed at /dev/null so that the last flush
has nowhere to fail.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import ParamSpec

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE
Args = ParamSpec("Args")


def quiet_pipe(main: Callable[Args, int | None]) -> Callable[Args, int]:
    """An entry point that exits quietly (141) when its output's reader has gone, whatever it was printing."""

    @functools.wraps(main)
    def entry(*args: Args.args, **kwargs: Args.kwargs) -> int:
        try:
            try:
                return main(*args, **kwargs) or 0
            finally:  # what is buffered (argparse's --help and usage text too) is written here, not in the last flush
                sys.stdout.flush()
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            return EXIT_BROKEN_PIPE

    return entry

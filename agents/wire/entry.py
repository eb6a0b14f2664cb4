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
                code = main(*args, **kwargs) or 0
            except SystemExit as exc:  # argparse's --help and usage errors: their text is flushed here, as it would be at exit
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
                if not isinstance(exc.code, int | None):
                    print(exc.code, file=sys.stderr)
            sys.stdout.flush()
            return code
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            return EXIT_BROKEN_PIPE

    return entry

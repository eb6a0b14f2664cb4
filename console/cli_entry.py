"""The `cetlab` command's entry point: a one-shot process, started cold each time.

Two costs of a cold start are not the work's: the cyclic garbage collector runs dozens of
times while pydantic builds the wire and lab.yaml models at import (none of that is
garbage), and the interpreter's teardown frees every module and object one by one before
the process exits. The collector is paused for the imports only (a long verb such as
`cetlab demo` or `logs --follow` runs with it as usual), and once `main` has returned
(every connection closed, every task ended) the process flushes its output and exits
without the teardown. `bench/bench_cli.py` measures the difference.
"""

from __future__ import annotations

import gc
import os
import sys


def entry() -> None:
    gc.disable()
    try:
        from console.cli import main
    finally:
        gc.enable()
    gc.freeze()  # what the imports built lives as long as the process: later collections skip it
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):  # `cetlab status | head -1`, or a closed stream: nothing more to say
        pass
    os._exit(code or 0)

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

from agents.wire.entry import EXIT_BROKEN_PIPE  # what a shell reports for a writer whose reader left

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as `main` answers a Ctrl-C during a verb


def entry() -> None:
    try:
        code = _run()
    except KeyboardInterrupt:  # a Ctrl-C before a verb runs (importing, parsing): no traceback
        code = EXIT_INTERRUPTED
    except BrokenPipeError:  # `cetlab logs -f JOB | head -1`: the reader left mid-verb (its links closed on the way out)
        code = EXIT_BROKEN_PIPE
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:  # `cetlab status | head -1`: the rest is not read
            code = EXIT_BROKEN_PIPE
        except ValueError:  # a closed stream: nothing more to say
            pass
    os._exit(code or 0)


def _run() -> int:
    gc.disable()
    try:
        from console.cli.main import main
    finally:
        gc.enable()
    gc.freeze()  # what the imports built lives as long as the process: later collections skip it
    return main()

"""The runner's entry point: read the job, confine this process, then play the job's role."""

import builtins
import os
import sys

from .confine import _SetupError, _setup
from .job import SETUP_FAILED, SETUP_FAILED_LINE, _read_job
from .judge import _tests_main
from .solution import _run_script, _serve


class _Quit:
    """`exit()`/`quit()` as the site module would define them (the interpreter runs with -S)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Use {self.name}() or Ctrl-D (i.e. EOF) to exit"

    def __call__(self, code=None):
        raise SystemExit(code)


def main():
    builtins.exit, builtins.quit = _Quit("exit"), _Quit("quit")
    job_fd, marker_fd, in_fd, out_fd = (int(a) for a in sys.argv[1:5])
    job = _read_job(job_fd)
    try:
        _setup(job)
    except Exception as e:  # fail closed: never run the program half-confined
        layer, error = (e.layer, e.error) if isinstance(e, _SetupError) else ("unknown", repr(e))
        os.write(2, f"{SETUP_FAILED_LINE}{layer}:{error}\n".encode("utf-8", "replace"))
        os._exit(SETUP_FAILED)
    if job["role"] == "tests":
        _tests_main(job, in_fd, out_fd, marker_fd)
    elif job["role"] == "serve":  # no nonce and no marker fd exist in this process
        _serve(job.pop("program"), in_fd, out_fd)
    else:
        _run_script(job.pop("program"))


if __name__ == "__main__":
    main()

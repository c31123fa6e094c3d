"""What the parent (`sandbox.py`) and the runner say to each other, outside the runner's own pipes.

The parent starts `python -S -s [-P] -c <bundle> JOB_FD MARKER_FD IN_FD OUT_FD` (-1 for an fd the role
has none of). JOB_FD is an unlinked file holding the job, a marshalled dict (`dump_job`, written by the
trusted parent; the runner imports marshal faster than json): role, program or tests and entry point,
nonce (tests role only), uid, layers, landlock_abi, machine, read_paths, hidden_paths, packages and limits. The
runner answers with its exit status and, on failure, one line on stderr:

- SETUP_FAILED (121) with `sandbox_setup_failed:<layer>:<error>`: a layer could not be applied, and
  nothing of the program ran;
- PEER_GONE (122) with `sandbox_call_failed: <reason>`: the tests' process saw the solution's process
  end (or close its end) before the tests finished; 1 with such a line for any other failed call;
- CPU_LIMIT_EXIT (152): RLIMIT_CPU's SIGXCPU, as an exit status.

Runs on both sides: `sandbox.py` imports it, and it is the first module of the runner's bundle.
"""

import marshal
import os

SETUP_FAILED = 121
PEER_GONE = 122  # tests role: the solution's process ended, or closed its end, before the tests finished
CPU_LIMIT_EXIT = 152  # 128 + SIGXCPU: reported as an exit code because `unshare --fork` (util-linux
# 2.38) fails to re-raise SIGXCPU/SIGKILL in itself and would turn them into a plain exit status 1
SETUP_FAILED_LINE = "sandbox_setup_failed:"  # then `<layer>:<error>`
CALL_FAILED_LINE = "sandbox_call_failed: "  # then the reason


def dump_job(job):
    """The job as the runner reads it (parent side)."""
    return marshal.dumps(job)


def _read_job(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return marshal.loads(b"".join(chunks))  # written by sandbox.py (trusted); cheaper to import than json

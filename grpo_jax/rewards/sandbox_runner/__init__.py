"""The trusted harness that runs *inside* the sandbox process; its modules are never imported by the trainer
(`sandbox.py` imports only `job`, the contract both sides share, and `bundle`, which reads the others as text).

`sandbox.py` starts `python -S -s [-P] -c <bundle()> JOB_FD MARKER_FD IN_FD OUT_FD` (under `unshare` when
available; -1 for an fd the role has none of). The harness reads the job (role, program or tests, limits,
isolation layers) from JOB_FD, applies the limits and isolation to its own process, then plays one of
three roles:

- `script`: runs the program as `__main__` (stdin/stdout tests; the parent compares the output);
- `serve`: the solution's process. Runs the program (a main block ends without failing it: see
  `_compile_solution`), reports the names it defines, then answers calls `name(*args, **kwargs)` that
  arrive on IN_FD with their results on OUT_FD, as plain data only;
- `tests`: the tests' process, a fresh interpreter that never loads the solution. The tests run here,
  with every name the solution defines bound to a stub that asks the solution's process over the pipes
  (a builtin's name only for the function under test: see `_shadowing`). It writes the per-run nonce
  (which only this role is given) to MARKER_FD after the tests and `check(entry_point)` returned
  normally, no call failed and at least one was made.

So the verdict is computed from plain data (None, bool, numbers, str, bytes, Fraction, Decimal, range
and the builtin and `collections` containers of them; see `_Encoder`), rebuilt by this harness in a
process the solution cannot reach: patched builtins, import hooks, frame walking, gc and objects with
rigged comparisons all act inside the solution's own process, where nothing the verdict depends on
lives, and a reply that process forges is checked as strictly as any other. Where the separation
would show, the protocol carries what one interpreter would share: containers are numbered, so
aliasing survives and a result that is (or holds) an argument is the caller's own object; the
arguments a call changed in place are sent back and written into the caller's objects; an iterator
stays in the solution's process and is read as the tests iterate; a call's prints, stdin reads,
files, random draws and warnings reach the tests as in one interpreter; an exception keeps its builtin
class, except those that would act as control flow in the tests' process (StopIteration) and
BaseExceptions, which are recorded failures. Setup failures exit with status 121 and a line on stderr
naming the layer, so the parent can tell a broken sandbox from a broken program and never runs code
unconfined.

The harness uses only the standard library. The interpreter runs without site-packages; the program
may import the third-party packages the parent allows (numpy), found by `_PinnedPackages`.

The modules, in the order the bundle concatenates them (each imports only from those before it):

- `job`: the parent-runner contract: the job (marshalled, read from JOB_FD), the exit codes and the
  failure lines on stderr;
- `wire`: the plain-data encoding and the length-prefixed JSON framing between the two processes of a
  tests run, with their size and depth limits;
- `context`: what one interpreter shares between the tests and a call besides its values (stdout,
  stdin, files in the working directory, `random`, the recursion limit, warnings), carried with it;
- `confine`: rlimits, the allowed packages, no_new_privs, Landlock, the uid drop, seccomp, not dumpable;
- `solution`: the solution's process (the `script` and `serve` roles);
- `judge`: the tests' process (the `tests` role), which alone can pass a run;
- `entry`: `main()`: read the job, confine, play the role.
"""

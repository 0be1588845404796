"""A warm interpreter for the test suite's script runs (`train.py`, `generate.py`, `evaluate.py`, `compare.py`,
`bench/*.py`): started once per test process, it imports torch and torchmetrics (about 4 of the 6 s of imports of
every fresh train.py process on a 2-core CPU) and forks one child per run. The child is a new process that runs
the script as `__main__` with its own argv, working directory, environment and standard streams, exits with the
script's code and runs its atexit hooks, as `python script.py ...` does; `tests/scripts.py` is the side a test
calls.

Only third-party modules are imported before the fork, and nothing is run with them: no torch thread pool exists
to be copied, and the repository's own modules (whose import reads $ARCHSWEEP_CONFIG_PATH) load in the child.

Protocol, over the Unix packet socket whose descriptor is the server's argument: a request is one JSON message
{argv, cwd, env} sent with three file descriptors (the child's stdin, stdout, stderr); the server answers
{"pid": N} once the child is forked, then {"returncode": C} when it has ended (negative: killed by that signal, as
subprocess reports). The end of the socket ends the server.
"""

from __future__ import annotations

import json
import os
import socket
import sys


def warm_up() -> None:
    """What Lightning imports that takes time: torch and torchmetrics (with transformers and scipy). Not dynamo (a
    private module of torch's, which Lightning imports itself); not Lightning, which gives its loggers a console
    handler of their own when it loads before the run has set up logging (a fresh train.py process loads it after);
    not W&B, whose import makes temporary folders that the first child's exit would delete under the next."""
    import torch  # noqa: F401
    import torchmetrics  # noqa: F401


def python_path(env) -> list[str]:
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def child(request: dict, fds: list[int], sock: socket.socket) -> None:
    """In the forked child: become `python <argv>` and run the script; its SystemExit ends the interpreter."""
    sock.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    ours = python_path(os.environ)
    os.environ.clear()
    os.environ.update(request["env"])
    script = os.path.abspath(request["argv"][0])
    sys.argv = list(request["argv"])
    # as `python script.py` has it: the script's folder (the server's own was there), then the run's PYTHONPATH
    sys.path[:1 + len(ours)] = [os.path.dirname(script), *python_path(os.environ)]
    import runpy

    try:
        runpy.run_path(script, run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:  # noqa: BLE001  the traceback a fresh process prints: from the script's frame on
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next
        e.with_traceback(tb or e.__traceback__)  # the hook prints the exception's own traceback
        sys.excepthook(type(e), e, e.__traceback__)
        sys.exit(1)


def serve(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    while True:
        message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        if not message:
            return  # the test process has gone
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            child(request, fds, sock)
            sys.exit(0)  # the script ended without exiting: as a fresh process would, exit 0
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())
        _, status = os.waitpid(pid, 0)
        sock.send(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())


if __name__ == "__main__":
    warm_up()
    serve(int(sys.argv[1]))

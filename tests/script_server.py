"""A warm interpreter for the test suite's script processes (`train.py`, `generate.py`, `evaluate.py`,
`compare.py`, `bench/*.py`): started once per test process, it imports torch, torchmetrics, dynamo and Lightning
(about 6 of the 10 s of a fresh tiny train.py run on a 2-core CPU) and forks one child per run. The
child is a new process that runs the script as `__main__` with its own argv, working directory, environment,
standard streams and (when asked) session, exits with the script's code and runs its atexit hooks, as
`python script.py ...` does; `tests/scripts.py` is the side a test calls.

Only third-party modules are imported before the fork, and nothing is computed with them: no torch thread pool or
other thread exists to be copied, and the repository's own modules (whose import reads $ARCHSWEEP_CONFIG_PATH)
load in the child.

Protocol, over the Unix packet socket whose descriptor is the server's argument: a request is one JSON message
{id, argv, cwd, env, new_session} sent with three file descriptors (the child's stdin, stdout, stderr); the
server answers {"id", "pid"} once the child is forked, then {"id", "returncode"} when it has ended (negative:
killed by that signal, as subprocess reports). Several runs may be going at once (a test that starts two launches
side by side). The end of the socket ends the server; children still running go on, as a fresh process outlives
the test that started it.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import socket
import sys


def warm_up() -> dict[str, str]:
    """What a train.py process imports that takes time (about 6 of its 10 s on a 2-core CPU): torch, torchmetrics
    (with transformers and scipy), dynamo (through torch.compiler's public API: the first `torch.compiler.disable`
    imports it) and Lightning. Lightning is imported with a handler on the root logger, as in a run, whose Hydra
    has set up logging before Lightning loads: else it would give its loggers a console handler of their own. Not
    W&B, whose import makes temporary folders that the first child's exit would delete under the next.

    The variables these imports set in the environment (Lightning's PYTORCH_NVML_BASED_CUDA_CHECK, inductor's
    cache folder), which a child applies over the run's own environment, as the same imports in a fresh process
    would."""
    import logging

    before = dict(os.environ)
    import torch
    import torchmetrics  # noqa: F401

    torch.compiler.disable(lambda: None)
    root, placeholder = logging.getLogger(), logging.NullHandler()
    root.addHandler(placeholder)
    try:
        import lightning  # noqa: F401
    finally:
        root.removeHandler(placeholder)
    return {k: v for k, v in os.environ.items() if before.get(k) != v}


def python_path(env) -> list[str]:
    return [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def child(request: dict, fds: list[int], imported_env: dict[str, str]) -> None:
    """In the forked child: become `python <argv>` and run the script; its SystemExit ends the interpreter."""
    if request.get("new_session"):
        os.setsid()  # its pid is its process group's, as Popen(start_new_session=True) gives
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    ours = python_path(os.environ)
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.update({k: v for k, v in imported_env.items() if k not in request["env"]})
    script = os.path.abspath(request["argv"][0])
    sys.argv = list(request["argv"])
    # as `python script.py` has it: the script's folder (the server's own was there), then the run's PYTHONPATH
    sys.path[:1 + len(ours)] = [os.path.dirname(script), *python_path(os.environ)]
    import runpy

    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001  the traceback a fresh process prints: from the script's frame on
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next
        e.with_traceback(tb or e.__traceback__)  # the hook prints the exception's own traceback
        sys.excepthook(type(e), e, e.__traceback__)
        if isinstance(e, KeyboardInterrupt):
            INTERRUPTED.append(True)  # end by SIGINT after the atexit hooks, as Python does
        sys.exit(1)


INTERRUPTED: list[bool] = []


@atexit.register  # before any script's: the last hook to run in a child
def end_by_sigint() -> None:
    """A KeyboardInterrupt the script did not catch ends a fresh Python by SIGINT (exit -2), after its atexit
    hooks: the same for a child."""
    if INTERRUPTED:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


def serve(fd: int, imported_env: dict[str, str]) -> None:
    sock = socket.socket(fileno=fd)
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    running: dict[int, tuple[int, int]] = {}  # a child's pidfd -> (request id, pid)
    while True:
        for key, _ in selector.select():
            if key.fileobj is not sock:  # a child has ended
                run_id, pid = running.pop(key.fd)
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                sock.send(json.dumps({"id": run_id, "returncode": os.waitstatus_to_exitcode(status)}).encode())
                continue
            message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
            if not message:
                return  # the test process has gone
            request = json.loads(message)
            pid = os.fork()
            if pid == 0:
                selector.close()
                sock.close()
                for pidfd in running:
                    os.close(pidfd)
                child(request, fds, imported_env)
                sys.exit(0)  # the script ended without exiting: as a fresh process would, exit 0
            for f in fds:
                os.close(f)
            pidfd = os.pidfd_open(pid)
            running[pidfd] = (request["id"], pid)
            selector.register(pidfd, selectors.EVENT_READ)
            sock.send(json.dumps({"id": request["id"], "pid": pid}).encode())


if __name__ == "__main__":
    serve(int(sys.argv[1]), warm_up())

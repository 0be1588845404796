"""`run(cmd, ...)`: `subprocess.run` for the suite's script processes (`[sys.executable, "train.py", ...]`), served
by a warm interpreter that has imported torch and what Lightning imports once (`script_server.py`) and forks a
child per run.
About 250 train/generate/evaluate/compare processes each paid ~6 s of imports on a 2-core CPU; the child starts
with them done and is otherwise the process `python train.py ...` is: its own pid, argv, working directory,
environment, standard streams, exit code and atexit hooks, and the repository's modules imported afresh.

It takes the fresh-process path (`subprocess.run` itself) when the command is not `python <script>.py ...`, when
the call asks for something the server does not do (input, file handles), when the server is busy (two runs at
once), and for every run when ARCHSWEEP_TEST_FRESH=1. Tests that signal or kill a run keep `subprocess.Popen`.

One server per test process, started with its environment. A run's environment may differ from it only in the
variables read at run time (RUNTIME_PREFIXES) and PYTHONPATH; a run with another OMP_NUM_THREADS or
PYTHONPROFILEIMPORTTIME, which the interpreter, torch and its libraries read at start-up, is a fresh process.
"""

from __future__ import annotations

import atexit
import io
import json
import locale
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

SERVER = Path(__file__).with_name("script_server.py")
FRESH_ENV = "ARCHSWEEP_TEST_FRESH"
# read when a run reads them, not at the interpreter's start or the server's imports: a run may differ from it here
RUNTIME_PREFIXES = ("ARCHSWEEP_", "WANDB_", "HYDRA_", "PYTEST_", "SUBMITIT_")
START_TIMEOUT = 300  # seconds for a server's imports on a loaded machine


def import_env(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """What of an environment the server's start-up read: all but RUNTIME_PREFIXES, and PYTHONPATH (the child puts
    a run's own in its sys.path where a fresh interpreter has it; the server imported nothing from there)."""
    return tuple(sorted((k, v) for k, v in env.items() if not k.startswith(RUNTIME_PREFIXES) and k != "PYTHONPATH"))


class Server:
    def __init__(self, env: dict[str, str]) -> None:
        self.key = import_env(env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        self.lock = threading.Lock()
        self.proc = subprocess.Popen([sys.executable, str(SERVER), str(theirs.fileno())], cwd=SERVER.parent, env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=(theirs.fileno(),))
        theirs.close()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        self.sock.close()  # the server reads the end of its socket and exits
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def start(self, cmd: list[str], cwd: str, env: dict[str, str], fds: list[int]) -> int:
        """Fork a run with these stdin, stdout, stderr (the caller closes its copies); its pid."""
        message = json.dumps({"argv": cmd[1:], "cwd": cwd, "env": env}).encode()
        socket.send_fds(self.sock, [message], fds)
        self.sock.settimeout(START_TIMEOUT)  # the first answer waits for the server's imports
        try:
            return self.answer()["pid"]
        finally:
            self.sock.settimeout(None)

    def answer(self) -> dict:
        message = self.sock.recv(1 << 16)
        if not message:
            raise RuntimeError(f"the script server ended (exit {self.proc.wait()}); ARCHSWEEP_TEST_FRESH=1 runs "
                               f"every script as a fresh process")
        return json.loads(message)


SERVER_NOW: list[Server] = []  # this test process's server, once a run has started it
SERVER_LOCK = threading.Lock()


@atexit.register
def close_server() -> None:
    for server in SERVER_NOW:
        server.close()
    SERVER_NOW.clear()


def server_for(env: dict[str, str]) -> Server | None:
    """The idle server whose imports this environment would have made; None when it is busy or the environment
    differs from this process's in what is read at import (PYTHONPATH, OMP_NUM_THREADS, ...)."""
    key = import_env(env)
    with SERVER_LOCK:
        if SERVER_NOW and (not SERVER_NOW[0].alive() or SERVER_NOW[0].key != import_env(dict(os.environ))):
            SERVER_NOW.pop().close()
        if key != import_env(dict(os.environ)):
            return None
        if not SERVER_NOW:
            SERVER_NOW.append(Server(dict(os.environ)))
        server = SERVER_NOW[0]
    return server if server.lock.acquire(blocking=False) else None


def servable(cmd, kwargs: dict) -> bool:
    return (os.environ.get(FRESH_ENV) != "1" and isinstance(cmd, (list, tuple)) and len(cmd) >= 2
            and cmd[0] == sys.executable and str(cmd[1]).endswith(".py") and kwargs.get("input") is None
            and kwargs.get("stdin") in (None, subprocess.DEVNULL)
            and kwargs.get("stdout") in (None, subprocess.PIPE) and kwargs.get("stderr") in (None, subprocess.PIPE,
                                                                                              subprocess.STDOUT)
            and set(kwargs) <= {"cwd", "env", "timeout", "capture_output", "text", "check", "stdin", "stdout",
                                "stderr"})


def decode(data: bytes, text: bool) -> str | bytes:
    if not text:
        return data
    return io.TextIOWrapper(io.BytesIO(data), encoding=locale.getpreferredencoding(False)).read()


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, **kwargs)`, served warm when it can be (the module docstring says when)."""
    if not servable(cmd, kwargs):
        return subprocess.run(cmd, **kwargs)
    env = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
    server = server_for(env)
    if server is None:
        return subprocess.run(cmd, **kwargs)
    try:
        return serve(server, [str(c) for c in cmd], env, kwargs)
    except (subprocess.TimeoutExpired, subprocess.CalledProcessError):
        raise
    except BaseException:  # stopped between its messages (an interrupt, a broken server): not to be asked again
        with SERVER_LOCK:
            if server in SERVER_NOW:
                SERVER_NOW.remove(server)
        server.close()
        raise
    finally:
        server.lock.release()


def serve(server: Server, cmd: list[str], env: dict[str, str], kwargs: dict) -> subprocess.CompletedProcess:
    capture = kwargs.get("capture_output", False)
    pipe_out = capture or kwargs.get("stdout") == subprocess.PIPE
    pipe_err = capture or kwargs.get("stderr") == subprocess.PIPE
    merged = kwargs.get("stderr") == subprocess.STDOUT
    pipes: dict[int, bytearray] = {}
    out_r, out_w = os.pipe() if pipe_out else (None, os.dup(1))
    err_r, err_w = os.pipe() if pipe_err else (None, os.dup(out_w) if merged else os.dup(2))
    stdin = os.open(os.devnull, os.O_RDONLY)
    cwd = str(kwargs.get("cwd") or os.getcwd())
    timeout = kwargs.get("timeout")
    try:
        pid = server.start(cmd, cwd, env, [stdin, out_w, err_w])
    finally:
        for fd in (stdin, out_w, err_w):
            os.close(fd)
    deadline = None if timeout is None else time.monotonic() + timeout
    selector = selectors.DefaultSelector()
    for fd in (out_r, err_r):
        if fd is not None:
            pipes[fd] = bytearray()
            selector.register(fd, selectors.EVENT_READ)
    selector.register(server.sock, selectors.EVENT_READ)
    returncode, reading = None, set(pipes)
    try:
        while returncode is None or reading:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                if returncode is None:  # else the run has ended (and its pid may be another's) and left a pipe open
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass  # it ended meanwhile; its code is on the way
                    server.answer()
                raise subprocess.TimeoutExpired(cmd, timeout, bytes(pipes.get(out_r, b"")),
                                                bytes(pipes.get(err_r, b"")))
            for key, _ in selector.select(left):
                if key.fileobj is server.sock:
                    returncode = server.answer()["returncode"]
                    selector.unregister(server.sock)
                    continue
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    pipes[key.fd] += chunk
                else:
                    selector.unregister(key.fd)
                    reading.discard(key.fd)
    finally:
        selector.close()
        for fd in pipes:
            os.close(fd)
    text = kwargs.get("text", False)
    stdout = decode(bytes(pipes[out_r]), text) if pipe_out else None
    stderr = decode(bytes(pipes[err_r]), text) if pipe_err else None
    done = subprocess.CompletedProcess(cmd, returncode, stdout, stderr)
    if kwargs.get("check"):
        done.check_returncode()
    return done

"""`run(cmd, ...)` and `popen(cmd, ...)`: `subprocess.run` and `subprocess.Popen` for the suite's script processes
(`[sys.executable, "train.py", ...]`), served by a warm interpreter that has imported torch and what Lightning
imports once (`script_server.py`) and forks a child per run.
About 300 train/generate/evaluate/compare processes each paid ~6 s of imports on a 2-core CPU; the child starts
with them done and is otherwise the process `python train.py ...` is: its own pid (to signal, or with
`start_new_session=True` its own process group to kill), argv, working directory, environment, standard streams,
exit code and atexit hooks, and the repository's modules imported afresh.

A run is a fresh process (`subprocess` itself) when the command is not `python <script>.py ...`, when the call asks
for something the server does not do (input, stdin, an encoding), where the platform has no pidfd (not Linux), and
for every run when ARCHSWEEP_TEST_FRESH=1.

One server per test process, started with its environment; it runs any number of children at once. A run's
environment may differ from it only in the variables read at run time (RUNTIME_PREFIXES) and PYTHONPATH; a run
with another OMP_NUM_THREADS or PYTHONPROFILEIMPORTTIME, which the interpreter, torch and its libraries read at
start-up, is a fresh process.

A served run (`Forked`) has what the tests use of Popen: pid, args, returncode, poll, wait, communicate,
send_signal, terminate, kill; its output is read through communicate (there are no stdout/stderr file objects).
"""

from __future__ import annotations

import atexit
import io
import itertools
import json
import locale
import os
import queue
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
POPEN_KWARGS = {"cwd", "env", "stdin", "stdout", "stderr", "text", "start_new_session"}


def import_env(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """What of an environment the server's start-up read: all but RUNTIME_PREFIXES, and PYTHONPATH (the child puts
    a run's own in its sys.path where a fresh interpreter has it; the server imported nothing from there)."""
    return tuple(sorted((k, v) for k, v in env.items() if not k.startswith(RUNTIME_PREFIXES) and k != "PYTHONPATH"))


class ServerEnded(RuntimeError):
    pass


class Server:
    """The test process's side of one script server: requests go out on the socket; a reader thread hands each
    answer to the run it names."""

    def __init__(self, env: dict[str, str]) -> None:
        self.key = import_env(env)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        self.send_lock = threading.Lock()
        self.ids = itertools.count()
        self.answers: dict[int, queue.SimpleQueue] = {}
        self.ended = False
        self.proc = subprocess.Popen([sys.executable, str(SERVER), str(theirs.fileno())], cwd=SERVER.parent, env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, pass_fds=(theirs.fileno(),))
        theirs.close()
        self.reader = threading.Thread(target=self.read, name="script-server-answers", daemon=True)
        self.reader.start()

    def read(self) -> None:
        while True:
            try:
                message = self.sock.recv(1 << 16)
            except OSError:
                message = b""
            if not message:
                self.ended = True
                for answers in list(self.answers.values()):
                    answers.put(None)
                return
            answer = json.loads(message)
            self.answers[answer["id"]].put(answer)

    def alive(self) -> bool:
        return not self.ended and self.proc.poll() is None

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # the server reads the end of its socket and exits; so does our reader
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout=10)
        self.sock.close()

    def start(self, request: dict, fds: list[int]) -> tuple[int, queue.SimpleQueue]:
        """Fork a run with these stdin, stdout, stderr (the caller closes its copies): its pid, and the queue its
        exit code will arrive on."""
        run_id = next(self.ids)
        answers = queue.SimpleQueue()
        self.answers[run_id] = answers
        if self.ended:
            raise ServerEnded(self.gone())
        with self.send_lock:
            socket.send_fds(self.sock, [json.dumps({"id": run_id, **request}).encode()], fds)
        try:
            answer = answers.get(timeout=START_TIMEOUT)  # the first answer waits for the server's imports
        except queue.Empty:
            raise ServerEnded(f"the script server did not fork a run in {START_TIMEOUT} s") from None
        if answer is None:
            raise ServerEnded(self.gone())
        return answer["pid"], answers

    def gone(self) -> str:
        return (f"the script server ended (exit {self.proc.poll()}); ARCHSWEEP_TEST_FRESH=1 runs every script as a "
                f"fresh process")


SERVER_NOW: list[Server] = []  # this test process's server, once a run has started it
SERVER_LOCK = threading.Lock()


@atexit.register
def close_server() -> None:
    for server in SERVER_NOW:
        server.close()
    SERVER_NOW.clear()


def server_for(env: dict[str, str]) -> Server | None:
    """The server whose imports this environment would have made; None when the environment differs from this
    process's in what is read at start-up (OMP_NUM_THREADS, PYTHONPROFILEIMPORTTIME, ...)."""
    ours = import_env(dict(os.environ))
    if import_env(env) != ours:
        return None
    with SERVER_LOCK:
        if SERVER_NOW and not (SERVER_NOW[0].alive() and SERVER_NOW[0].key == ours):
            SERVER_NOW.pop().close()
        if not SERVER_NOW:
            SERVER_NOW.append(Server(dict(os.environ)))
        return SERVER_NOW[0]


def servable(cmd, kwargs: dict) -> bool:
    return (os.environ.get(FRESH_ENV) != "1" and hasattr(os, "pidfd_open") and isinstance(cmd, (list, tuple))
            and len(cmd) >= 2 and cmd[0] == sys.executable and str(cmd[1]).endswith(".py")
            and set(kwargs) <= POPEN_KWARGS and kwargs.get("stdin") in (None, subprocess.DEVNULL))


def decode(data: bytes, text: bool) -> str | bytes:
    if not text:
        return data
    return io.TextIOWrapper(io.BytesIO(data), encoding=locale.getpreferredencoding(False)).read()


def child_end(spec, default: int) -> tuple[int | None, int]:
    """(our read end or None, the child's write end) for a Popen stdout/stderr argument."""
    if spec == subprocess.PIPE:
        return os.pipe()
    if spec == subprocess.DEVNULL:
        return None, os.open(os.devnull, os.O_WRONLY)
    if spec is None:
        return None, os.dup(default)
    return None, os.dup(spec if isinstance(spec, int) else spec.fileno())


class Forked:
    """A served run, as subprocess.Popen has one."""

    def __init__(self, server: Server, cmd: list[str], *, cwd=None, env: dict[str, str], stdout=None, stderr=None,
                 text: bool = False, start_new_session: bool = False, stdin=None) -> None:
        self.args, self.returncode, self.text = cmd, None, text
        out_r, out_w = child_end(stdout, 1)
        if stderr == subprocess.STDOUT:
            err_r, err_w = None, os.dup(out_w)
        else:
            err_r, err_w = child_end(stderr, 2)
        devnull = os.open(os.devnull, os.O_RDONLY)
        self.pipes = {name: fd for name, fd in (("stdout", out_r), ("stderr", err_r)) if fd is not None}
        self.output = {fd: bytearray() for fd in self.pipes.values()}
        self.open = set(self.output)
        request = {"argv": cmd[1:], "cwd": str(cwd or os.getcwd()), "env": env, "new_session": start_new_session}
        try:
            self.pid, self.answers = server.start(request, [devnull, out_w, err_w])
        except BaseException:
            self.close()
            raise
        finally:
            for fd in (devnull, out_w, err_w):
                os.close(fd)

    def settle(self, answer: dict | None) -> None:
        if answer is None:
            raise ServerEnded(f"the script server ended while run {self.pid} was going")
        self.returncode = answer["returncode"]

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.settle(self.answers.get_nowait())
            except queue.Empty:
                pass
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            try:
                self.settle(self.answers.get(timeout=timeout))
            except queue.Empty:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
        return self.returncode

    def collected(self, name: str) -> str | bytes | None:
        fd = self.pipes.get(name)
        return None if fd is None else decode(bytes(self.output[fd]), self.text)

    def communicate(self, timeout: float | None = None) -> tuple:
        """Read the pipes to their end and wait for the exit; on a timeout, what was read so far stays for the next
        call (as subprocess has it)."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def expired() -> subprocess.TimeoutExpired:
            return subprocess.TimeoutExpired(self.args, timeout, self.collected("stdout"), self.collected("stderr"))

        with selectors.DefaultSelector() as selector:
            for fd in self.open:
                selector.register(fd, selectors.EVENT_READ)
            while self.open:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise expired()
                for key, _ in selector.select(left):
                    chunk = os.read(key.fd, 1 << 16)
                    if chunk:
                        self.output[key.fd] += chunk
                    else:
                        selector.unregister(key.fd)
                        self.open.discard(key.fd)
                        os.close(key.fd)
        try:
            self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise expired() from None
        return self.collected("stdout"), self.collected("stderr")

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:  # never to a pid the run no longer has
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def close(self) -> None:
        for fd in getattr(self, "open", ()):
            os.close(fd)
        self.open = set()

    def __enter__(self) -> Forked:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        self.wait()

    def __del__(self) -> None:
        self.close()


def popen(cmd, **kwargs) -> Forked | subprocess.Popen:
    """`subprocess.Popen(cmd, **kwargs)`, served warm when it can be (the module docstring says when)."""
    if not servable(cmd, kwargs):
        return subprocess.Popen(cmd, **kwargs)
    env = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
    server = server_for(env)
    if server is None:
        return subprocess.Popen(cmd, **kwargs)
    return Forked(server, [str(c) for c in cmd], **{**kwargs, "env": env, "text": bool(kwargs.get("text"))})


def run(cmd, *, input=None, capture_output: bool = False, timeout: float | None = None, check: bool = False,
        **kwargs) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, **kwargs)`, served warm when it can be (the module docstring says when)."""
    if input is not None:
        return subprocess.run(cmd, input=input, capture_output=capture_output, timeout=timeout, check=check, **kwargs)
    if capture_output:
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with popen(cmd, **kwargs) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        except BaseException:
            proc.kill()
            raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    if check:
        done.check_returncode()
    return done

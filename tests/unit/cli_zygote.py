"""One warm interpreter that forks a process per ``vgpuvirt`` command a test's shell runs.

The documentation examples run each line through ``bash -c`` with ``vgpuvirt`` on PATH: 86 command lines in the
inner loop, each a whole Python start and import of the CLI (benchmarks/bench_doc_examples.py measures both ways:
0.45x the machine CPU forked). Here ``vgpuvirt`` on PATH is a small client (stdlib only, ``python -I -S``): it
hands its stdin, stdout and stderr, its argv, environment and working directory to a server that imported the
CLI once; the server forks, and the child runs ``vgpuvirt.cli.main(argv)`` in that environment as ``python -m vgpuvirt``
would (SystemExit and an uncaught exception as the interpreter ends them: its code, or a traceback and 1;
non-daemon threads joined, atexit run, streams flushed) and sends back the exit status, which the client exits
with. The shell, its quoting, pipes and redirections are the user's own; only the interpreter start is shared.
What a forked child cannot see: a module that read the environment at import (vgpuvirt reads none there;
``test_cli_zygote.py`` checks a variable set for one command only reaches that command).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CLIENT = '''\
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect({sock!r})
req = json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
socket.send_fds(s, [len(req).to_bytes(8, "big") + req], [0, 1, 2])
data = b""
while True:
    chunk = s.recv(64)
    if not chunk:
        break
    data += chunk
if not data:
    sys.stderr.write("vgpuvirt (test zygote): the command's process ended without an exit status\\n")
    sys.exit(70)
sys.exit(int(data))
'''


def _recv_request(conn: socket.socket) -> tuple[dict[str, object], list[int]]:
    msg, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    size = int.from_bytes(msg[:8], "big")
    body = msg[8:]
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            raise ConnectionError("short request")
        body += more
    return json.loads(body), list(fds)


def _child(conn: socket.socket, req: dict[str, object], fds: list[int]) -> None:
    """In the forked child: become the command's process, run the CLI, report its status, never return."""
    code = 1
    try:
        for target, fd in zip((0, 1, 2), fds, strict=True):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(str(req["cwd"]))
        env = req["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update(env)
        sys.stdin = open(0, closefd=False)                   # noqa: SIM115 -- the process's own fds
        sys.stdout = open(1, "w", closefd=False)             # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)             # noqa: SIM115
        argv = req["argv"]
        assert isinstance(argv, list)
        sys.argv = ["vgpuvirt", *argv]
        # as a fresh interpreter has them: the server's SIGCHLD=SIG_IGN would make every waitpid of a
        # command's own subprocess (mdevctl, virsh, ssh) fail with ECHILD
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        from vgpuvirt.cli import main
        try:
            result = main(argv)
            code = 0 if result is None else int(result)
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        import atexit
        import threading
        threading._shutdown()  # type: ignore[attr-defined]  # as the interpreter does at exit
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed pipe: the status still goes back
                pass
        try:
            conn.sendall(str(code).encode())
        finally:
            os._exit(code)


def serve(path: str) -> None:
    """The server: import the CLI and every verb once, then fork a child per request (never threads)."""
    import importlib

    import vgpuvirt.cli as cli
    for _verb, module, _help in cli.SUBCOMMANDS:
        try:
            importlib.import_module(module)
        except ImportError:         # a verb whose module is not there is not offered (cli's own rule)
            pass
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)            # children are reaped by the kernel
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(16)
    srv.settimeout(5)
    parent = os.getppid()
    print("ready", flush=True)
    while True:
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            if os.getppid() != parent:      # the test process is gone (killed run): do not outlive it
                return
            continue
        conn.settimeout(None)
        try:
            req, fds = _recv_request(conn)
        except (OSError, ValueError, ConnectionError):
            conn.close()
            continue
        if os.fork() == 0:
            srv.close()
            _child(conn, req, fds)
        for fd in fds:
            os.close(fd)
        conn.close()


class Zygote:
    """A running server and a ``vgpuvirt`` client for PATH, in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.bindir = directory / "bin"
        self.bindir.mkdir(parents=True, exist_ok=True)
        self.socket = str(directory / "zygote.sock")
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{Path(__file__).parent}"}
        self.proc = subprocess.Popen([sys.executable, "-c", f"import cli_zygote; cli_zygote.serve({self.socket!r})"],
                                     env=env, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"the CLI zygote did not start: {line!r}")
        exe = self.bindir / "vgpuvirt"
        exe.write_text(f"#!{sys.executable} -IS\n" + CLIENT.format(sock=self.socket))
        exe.chmod(0o755)

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

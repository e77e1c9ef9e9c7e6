"""Warm starts: one process imports the heavy libraries once, and each local DAG job is forked from it.

Importing torch, Fabric, MLflow, lm-eval and transformers is most of a small job's cost
(benchmarks/records/2026-12-03-warm-starts.md). For a local run the Snakefile's ``onstart`` starts a
server (:func:`start`) on the Unix socket ``$STATELOOP_WARM``; a ``stateloop`` command
(:func:`delegate`, first thing in the console script) sends it its argv, directory, environment
and standard streams; the server forks a child that runs the command as a fresh process would. The
command's process stays the job's: it forwards its signals to the child and exits with its status.

The server serves only requests that cannot tell the difference, and refuses the rest (the command
then runs in its own process): the same interpreter, path, directory and environment (but
:data:`PER_JOB`, applied in the child, and :data:`PER_TASK`), the same cgroup and CPU affinity (a
real ``srun`` task is refused); the project's modules are imported afresh in every child.
[choice] Left as the server has them: numpy's BLAS on one thread and the string-hash seed. A
process with threads cannot be forked safely, so the server refuses to serve if importing left any.
``STATELOOP_WARM=off`` turns it off; SLURM runs never start one.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV = "STATELOOP_WARM"
# [choice] The Snakefile starts a server for a call that runs at least this many jobs: the server's
# imports cost about two jobs' worth, and the first jobs start before it listens.
MIN_JOBS = 4
SOCKET_DIR = "stateloop-warm-"  # the prefix of start()'s temporary folder for the socket
OFF = ("", "0", "off", "false", "no")
# Set per job by Snakemake (threads, resources' tmpdir) or by the shell that runs the job line
# (a non-interactive bash drops the prompts). None is read when a library is imported.
PER_JOB = frozenset({"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                     "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "TMPDIR", "TEMP", "TMP", "TEMPDIR",
                     "PWD", "OLDPWD", "SHLVL", "_", "PS1", "PS2", "PS4", ENV})
# Set per task by srun (or by the rehearsals' stand-in for it) and read by Fabric and torch.distributed
# when a training starts, never on import: served where the placement is the server's (_refusal).
PER_TASK = frozenset({"MASTER_ADDR", "MASTER_PORT"})
PER_TASK_PREFIX = "SLURM_"
# What the server adds to its own environment so that importing starts no thread.
SERVER_ENV = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}
PRELOAD = ("numpy", "yaml", "torch", "lightning_fabric", "mlflow", "mlflow.tracking",
           "mlflow.store.tracking.sqlalchemy_store", "alembic.migration", "safetensors.torch", "tokenizers",
           "transformers", "datasets", "lm_eval.api.model", "lm_eval.evaluator", "pandas", "matplotlib")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


# ---- messages: a 4-byte length, then JSON ---------------------------------------------------------

def _send(conn: socket.socket, obj: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(obj).encode()
    frame = struct.pack("!I", len(data)) + data
    if fds:
        socket.send_fds(conn, [frame], fds)
    else:
        conn.sendall(frame)


def _recv_exact(conn: socket.socket, n: int, fds: list[int] | None = None) -> bytes:
    buf = b""
    while len(buf) < n:
        if fds is not None and not buf:
            chunk, got, _, _ = socket.recv_fds(conn, n, 3)
            fds.extend(got)
        else:
            chunk = conn.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed")
        buf += chunk
    return buf


def _recv(conn: socket.socket, fds: list[int] | None = None) -> dict:
    head = _recv_exact(conn, 4, fds)
    return json.loads(_recv_exact(conn, struct.unpack("!I", head)[0]))


# ---- the command's side ---------------------------------------------------------------------------

def delegate() -> int | None:
    """Run this ``stateloop`` command (``sys.argv``) in a child of the warm server named by
    ``$STATELOOP_WARM`` and return its exit status; None where there is no server, or it refuses."""
    path = os.environ.get(ENV, "")
    if path.lower() in OFF:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        _send(conn, {"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ), "interpreter": interpreter(),
                     "path": sys.path, "placement": placement()}, [0, 1, 2])
        reply = _recv(conn)
    except (OSError, EOFError, ValueError):
        conn.close()
        return None
    if "pid" not in reply:
        conn.close()
        return None
    child = reply["pid"]

    def forward(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    try:
        status = _recv(conn)
    except (OSError, EOFError, ValueError):
        print(f"stateloop: the warm server ({path}) exited during the job", file=sys.stderr)
        return 1
    finally:
        conn.close()
    if "signal" in status:  # die as the child died, so that the shell and Snakemake see the same
        sig = status["signal"]
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        return 128 + sig
    return status["exit"]


def interpreter() -> list[str]:
    """This interpreter's executable and prefix, links resolved (a venv and its base Python differ)."""
    return [os.path.realpath(sys.executable), os.path.realpath(sys.prefix)]


def placement() -> dict:
    """Where this process runs: its cgroup (/proc/self/cgroup) and the CPUs it may use."""
    try:
        cgroup = Path("/proc/self/cgroup").read_text()
    except OSError:
        cgroup = ""
    return {"cgroup": cgroup, "cpus": sorted(os.sched_getaffinity(0))}


# ---- the server ----------------------------------------------------------------------------------

def _refusal(req: dict, base_env: dict, base_path: list[str], cwd: str, where: dict) -> str | None:
    """Why the child could not stand for a fresh process of this request (None: it can)."""
    if req.get("interpreter") != interpreter():
        return f"interpreter {req.get('interpreter')}"
    if [os.path.realpath(p) for p in req["path"][1:]] != [os.path.realpath(p) for p in base_path]:
        return "module search path"
    if os.path.realpath(req["cwd"]) != os.path.realpath(cwd):
        return f"working directory {req['cwd']}"
    if req.get("placement") != where:
        return "placement (cgroup or CPU affinity) differs"
    env = req["env"]
    differ = sorted(k for k in set(env) | set(base_env)
                    if k not in PER_JOB and k not in PER_TASK and not k.startswith(PER_TASK_PREFIX)
                    and env.get(k) != base_env.get(k))
    return f"environment differs in {', '.join(differ)}" if differ else None


def _stdio() -> None:
    """New sys.std* on descriptors 0-2, buffered as a fresh interpreter buffers them."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    enc = sys.stdout.encoding if sys.stdout else "utf-8"
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding=enc)
    for fd, name, errors in ((1, "stdout", "strict"), (2, "stderr", "backslashreplace")):
        stream = io.TextIOWrapper(io.BufferedWriter(io.FileIO(fd, "w", closefd=False)), encoding=enc, errors=errors,
                                  line_buffering=fd == 2 or os.isatty(fd), write_through=unbuffered)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _watch_command(conn: socket.socket) -> None:
    """In the child: when the command's process dies silently (SIGKILL), stop as the job would have."""
    import threading

    def watch():
        try:
            while conn.recv(1):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="stateloop-warm-watch", daemon=True).start()


def _child(req: dict, fds: list[int], conn: socket.socket, listener: socket.socket) -> None:
    """In the forked child: become the command's process, run the command, exit with its status."""
    listener.close()
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.argv[:] = req["argv"]
    sys.path[:] = req["path"]
    tempfile.tempdir = None  # $TMPDIR is read again
    _stdio()
    for name in [m for m in sys.modules if m == "stateloop" or m.startswith("stateloop.")]:
        del sys.modules[name]  # the project's code is read afresh, as a new process reads it
    import numpy
    import torch

    numpy.random.seed()
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    _watch_command(conn)
    import traceback

    try:
        # by name: the server imports none of the project's modules, each child imports them afresh
        code = importlib.import_module("stateloop.commands").run_command(None)
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - as the interpreter reports an uncaught exception
        traceback.print_exc()
        code = 1
    _exit(0 if code is None else code if isinstance(code, int) else _message(code))


def _message(code) -> int:
    print(code, file=sys.stderr)  # sys.exit("text"), as the interpreter reports it
    return 1


def _exit(code: int) -> None:
    """End the child as the interpreter ends a process, in its order: wait for non-daemon threads,
    run the atexit handlers (MLflow's, logging's, weakref finalizers), flush the standard streams;
    then leave without tearing down the modules imported before the fork (2-3 CPU-s a job, spent
    copying the server's pages). [choice] Objects still alive are not finalized: a file a command
    leaves open and unflushed loses its buffer (the project's writers close their files)."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def serve(path: str, parent: int, base_env: dict, log) -> int:
    """Import :data:`PRELOAD`, listen on ``path`` and fork a child per request until ``parent`` is
    gone or SIGTERM arrives."""

    t0 = time.process_time()
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    gc.freeze()  # a child's collections leave the imported objects (and their pages) alone
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if threads != 1:
        print(f"not serving: importing left {threads} threads (a process with threads cannot be forked safely)",
              file=log, flush=True)
        return 1
    cwd, base_path, me, where = os.getcwd(), list(sys.path), os.getpid(), placement()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    os.replace(path + ".tmp", path)  # clients connect only once everything is imported
    listener.listen(64)
    accepting = True
    print(f"serving on {path} (imports took {time.process_time() - t0:.1f} CPU-s)", file=log, flush=True)
    jobs: dict[int, socket.socket] = {}
    import select

    try:
        while accepting or jobs:  # after a stop, the jobs running are waited for, so that each command gets its status
            try:
                ready, _, _ = select.select([wake_r] + ([listener] if accepting else []), [], [], 1.0)
            except InterruptedError:
                ready = []
            if wake_r in ready:
                os.read(wake_r, 4096)
            _reap(jobs, log)
            if accepting and (stop or not _alive(parent)):
                accepting = False  # no new job: the socket goes, a command started now runs in its own process
                listener.close()
                with contextlib.suppress(OSError):
                    os.unlink(path)
                why = "stopped" if stop else f"parent {parent} is gone"
                print(f"{why}: stopping after the {len(jobs)} jobs running", file=log, flush=True)
            if not accepting or listener not in ready:
                continue
            conn, _ = listener.accept()
            fds: list[int] = []
            try:
                req = _recv(conn, fds)
            except (OSError, EOFError, ValueError):
                for fd in fds:
                    os.close(fd)
                conn.close()
                continue
            reason = _refusal(req, base_env, base_path, cwd, where)
            if reason or len(fds) != 3:
                print(f"refused ({reason or 'no standard streams'}): {' '.join(req['argv'][1:])}", file=log, flush=True)
                _send(conn, {"refused": reason})
                for fd in fds:
                    os.close(fd)
                conn.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(req, fds, conn, listener)  # never returns
            for fd in fds:
                os.close(fd)
            jobs[pid] = conn
            _send(conn, {"pid": pid})
            print(f"job {pid} started: {' '.join(req['argv'][1:])}", file=log, flush=True)
    finally:
        if os.getpid() == me:
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
            if os.path.basename(os.path.dirname(path)).startswith(SOCKET_DIR):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.dirname(path))  # start()'s folder for the socket
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap(jobs: dict[int, socket.socket], log) -> None:
    while jobs:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = jobs.pop(pid, None)
        if conn is None:
            continue
        msg = {"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else {"exit": os.waitstatus_to_exitcode(status)}
        print(f"job {pid} ended: {json.dumps(msg)}, {usage.ru_utime + usage.ru_stime:.2f} CPU-s", file=log, flush=True)
        with contextlib.suppress(OSError):
            _send(conn, msg)
        conn.close()


# ---- starting and stopping (the Snakefile's onstart / onsuccess / onerror) ------------------------

def start(log_path: str | os.PathLike, ready_s: float = 120.0) -> subprocess.Popen | None:
    """Start a server for this process's (Snakemake's) jobs and point ``$STATELOOP_WARM`` at it; None
    where that says off. [choice] Returns once the server listens (or fails, or after ``ready_s``):
    a job started before would import beside the server, and the timed decoding benchmark with it."""
    if os.environ.get(ENV, "on").lower() in OFF or not sys.platform.startswith("linux"):
        return None  # [choice] Linux only: forking a process that has loaded torch is unsafe on macOS
    sock = os.path.join(tempfile.mkdtemp(prefix=SOCKET_DIR), "socket")  # short: a socket path has ~100 bytes
    base_env = {k: v for k, v in os.environ.items() if k != ENV}
    env = {**os.environ, **SERVER_ENV, "STATELOOP_WARM_BASE_ENV": json.dumps(base_env)}
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        # not `python -m`, whose sys.path[0] would be this folder: the children's is the command's own
        code = "import sys; del sys.path[0]; from stateloop.ops.warm import main; sys.exit(main())"
        proc = subprocess.Popen([sys.executable, "-c", code, sock, str(os.getpid())], env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    os.environ[ENV] = sock
    deadline = time.monotonic() + ready_s
    while not os.path.exists(sock) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc


def stop(proc: subprocess.Popen | None, wait_s: float = 30.0) -> None:
    """Stop :func:`start`'s server: no new job; killed after ``wait_s`` (running jobs go on alone)."""
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    os.environ.pop(ENV, None)


def main() -> int:
    path, parent = sys.argv[1], int(sys.argv[2])
    base_env = json.loads(os.environ.pop("STATELOOP_WARM_BASE_ENV"))
    return serve(path, parent, base_env, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())

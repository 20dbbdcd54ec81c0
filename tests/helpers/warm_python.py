"""`python -m MODULE ARGS`, `python -c CODE ARGS` and `python SCRIPT ARGS` without paying the big libraries'
import for each (tests only): subprocess.run stand-ins.

    proc = warm_python.run_module("hookrun", ["experiment=resnet_layer1"], cwd=tmp_path, env=env, timeout=600)
    proc = warm_python.run_code("import hookrun; print(hookrun.compose())", [], cwd=tmp_path, env=env)
    proc = warm_python.run_script(tmp_path / "job.py", ["--fast"], cwd=tmp_path, env=env)
    proc = warm_python.python(["-m", "hookrun.inspect", "run.h5"], cwd=tmp_path, check=True)  # subprocess.run's way

A server process (per test process) imports torch and the third-party modules nearly every run
imports after it (SHARED: torchvision's models, which import torch._dynamo; transformers' GPT-2,
which tiny_lm is; hydra, h5py), and nothing of hookrun's, then forks one child per command. Those
imports are the bulk of a start-up: a tiny_lm or ResNet run from a torch-only server still spent
about half its import time on them. The child takes the command's working directory, environment,
sys.path (as Python builds it from PYTHONPATH) and sys.argv, and runs the module as `python -m` does
(runpy, as __main__), the code as `-c` does (sys.path[0] '', sys.argv[0] '-c', "<string>" in tracebacks)
or the script as Python does (its folder first on sys.path, its file as __main__); hookrun and
everything else it imports is imported fresh in each child, so an import error or import-order fault
of hookrun's still shows, and a check of which of hookrun's modules a command imports still holds (not
one of the shared modules': those are loaded already). Its stdout and stderr go to files read back
into a CompletedProcess; its exit status is the process's, as Python would have exited (SystemExit's
code, 1 and the traceback by sys.excepthook for an uncaught exception, -N for a signal N).

A server is started with the command's variables read at interpreter start-up or by those imports
(PYTHON*, OMP_*, MKL_*, CUDA*, TORCH*, LD_*, HF_*, TRANSFORMERS_*, HDF5_*, ...; PYTHONPATH and
PYTHONUNBUFFERED are set per command): a command with other such variables gets a server of its
own. Standard input is empty (/dev/null): a command that reads input, or that a test signals, times or
inspects as a process (a CompletedProcess has no pid), needs a real one. Without fork, a real subprocess runs.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import select
import subprocess
import sys
import tempfile
import threading

# variables read when the interpreter or torch starts: a command that sets them otherwise needs its own process
STARTUP = ("PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "CUDA", "TORCH", "PYTORCH", "LD_", "NVIDIA", "HIP_", "ROCM",
           "HF_", "HUGGINGFACE", "TRANSFORMERS", "TOKENIZERS", "HDF5_")
# imported by the server after torch (third-party only: hookrun is imported fresh by each command)
SHARED = ("torchvision", "torchvision.models", "transformers", "transformers.models.gpt2.modeling_gpt2", "hydra", "h5py")
PER_COMMAND = ("PYTHONPATH", "PYTHONUNBUFFERED")
_servers: dict[tuple, subprocess.Popen] = {}  # one a set of start-up variables, the last used last
_lock = threading.Lock()


def _startup_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(STARTUP) and k not in PER_COMMAND}


def _get_server(env: dict[str, str]) -> subprocess.Popen:
    """The server started with `env`'s start-up variables (a new one for a new set; at most 3 kept)."""
    key = tuple(sorted(_startup_env(env).items()))
    server = _servers.pop(key, None)
    if server is None or server.poll() is not None:
        while len(_servers) >= 3:
            _stop(_servers.pop(next(iter(_servers))))
        server = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  env={k: v for k, v in env.items() if k != "PYTHONPATH"}, bufsize=0)
        atexit.register(_stop, server)
    _servers[key] = server
    return server


def _stop(server: subprocess.Popen) -> None:
    if server.stdin.closed:
        return
    server.stdin.close()  # the server ends at the end of its input
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    server.stdout.close()


def _readline(fd: int) -> str:
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            raise RuntimeError("the warm_python server ended")
        line += byte
    return line.decode()


def run_module(module: str, args: list[str], cwd, env: dict[str, str], timeout: float | None = None) -> subprocess.CompletedProcess:
    """subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True,
    text=True, timeout=timeout), its start-up's torch import shared (see the module's docstring)."""
    return _run("module", module, [sys.executable, "-m", module, *args], args, cwd, env, timeout)


def run_code(code: str, args: list[str], cwd, env: dict[str, str], timeout: float | None = None) -> subprocess.CompletedProcess:
    """subprocess.run([sys.executable, "-c", code, *args], ...) as run_module's."""
    return _run("code", code, [sys.executable, "-c", code, *args], args, cwd, env, timeout)


def run_script(path, args: list[str], cwd, env: dict[str, str], timeout: float | None = None) -> subprocess.CompletedProcess:
    """subprocess.run([sys.executable, path, *args], ...) as run_module's (path relative to cwd or absolute)."""
    return _run("script", str(path), [sys.executable, str(path), *args], args, cwd, env, timeout)


def python(args: list[str], cwd=None, env: dict[str, str] | None = None, timeout: float | None = None,
           check: bool = False) -> subprocess.CompletedProcess:
    """subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    check=check) for args `-m MODULE ...`, `-c CODE ...` or `SCRIPT ...` (no other options), as the run_* above."""
    cwd, env = os.getcwd() if cwd is None else cwd, dict(os.environ) if env is None else env
    if args[0] == "-m":
        proc = run_module(args[1], args[2:], cwd, env, timeout)
    elif args[0] == "-c":
        proc = run_code(args[1], args[2:], cwd, env, timeout)
    elif args[0].startswith("-"):
        raise ValueError(f"warm_python runs -m, -c or a script, not {args[0]}")
    else:
        proc = run_script(args[0], args[1:], cwd, env, timeout)
    if check:
        proc.check_returncode()
    return proc


def _run(kind: str, target: str, argv: list[str], args: list[str], cwd, env: dict[str, str],
         timeout: float | None) -> subprocess.CompletedProcess:
    if not hasattr(os, "fork"):
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    with _lock, tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        server = _get_server(env)
        server.stdin.write((json.dumps({kind: target, "args": list(args), "cwd": str(cwd), "env": env,
                                        "out": out, "err": err}) + "\n").encode())
        fd = server.stdout.fileno()
        pid = int(_readline(fd))
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            os.kill(pid, 9)
            _readline(fd)
            raise subprocess.TimeoutExpired(argv, timeout, _read(out), _read(err))
        code = int(_readline(fd))
        return subprocess.CompletedProcess(argv, code, _read(out), _read(err))


def _read(path: str) -> str:
    with open(path, errors="replace") as f:  # (subprocess.run's text=True: the locale's encoding)
        return f.read()


# ---- the server (this file run as a script) ----

def _child(req: dict, base_path: list[str]) -> None:
    import runpy
    import traceback

    code = 1
    try:
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (2, req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            os.dup2(os.open(path, flags, 0o644), fd)
        # the standard streams as a new interpreter makes them on these files (PYTHONUNBUFFERED: unbuffered)
        unbuffered = bool(req["env"].get("PYTHONUNBUFFERED"))
        for name, fd in (("stdout", 1), ("stderr", 2)):
            old = getattr(sys, name)
            raw = io.FileIO(fd, "w", closefd=False)
            stream = io.TextIOWrapper(raw if unbuffered else io.BufferedWriter(raw), encoding=old.encoding,
                                      errors=old.errors, line_buffering=name == "stderr" and not unbuffered,
                                      write_through=unbuffered)
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
        # sys.path as Python builds it here: the working directory ('' for -c, the script's folder for a
        # script), PYTHONPATH's entries, then the installation's
        script = os.path.abspath(req["script"]) if "script" in req else None
        first = "" if "code" in req else os.path.dirname(os.path.realpath(script)) if script else os.getcwd()
        extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        seen, path = set(), []
        for p in [first, *(os.path.abspath(p) for p in extra), *base_path]:
            if p not in seen:
                seen.add(p)
                path.append(p)
        sys.path[:] = path
        try:
            if "module" in req:
                sys.argv = ["-m", *req["args"]]  # runpy sets argv[0] to the module's file, as -m does
                runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
            else:
                sys.argv = ["-c" if script is None else req["script"], *req["args"]]
                _run_main(req.get("code"), script)
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException as exc:  # as the interpreter reports it: sys.excepthook, without this file's frames
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
                tb = tb.tb_next
            sys.excepthook(type(exc), exc.with_traceback(tb), tb)
            code = 1
        threading._shutdown()  # as the interpreter's exit: wait for the run's non-daemon threads
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _run_main(code: str | None, script: str | None) -> None:
    """Run `code` (-c) or the file `script` as a new __main__ module, as the interpreter does."""
    import builtins
    import importlib.machinery
    import types

    main = types.ModuleType("__main__")
    main.__builtins__, main.__annotations__ = builtins, {}
    if script is None:
        main.__loader__, source, filename = importlib.machinery.BuiltinImporter, code, "<string>"
    else:
        main.__file__, main.__cached__ = script, None
        main.__loader__ = importlib.machinery.SourceFileLoader("__main__", script)
        with open(script, "rb") as f:
            source, filename = f.read(), script
    sys.modules["__main__"] = main
    exec(compile(source, filename, "exec"), vars(main))


def _serve() -> None:
    import importlib

    import torch  # noqa: F401  (the import every child shares; no torch op runs here, so fork is safe)

    for name in SHARED:
        try:
            importlib.import_module(name)
        except ImportError:  # (a child that needs it fails as a fresh process would)
            pass

    extra = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    base_path = [p for p in sys.path[1:] if p not in extra]  # (sys.path[0]: this file's folder)
    requests, answers = sys.stdin.buffer, sys.stdout.buffer
    for line in requests:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(req, base_path)
        answers.write(f"{pid}\n".encode())
        answers.flush()
        _, status = os.waitpid(pid, 0)
        answers.write(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        answers.flush()


if __name__ == "__main__":
    _serve()

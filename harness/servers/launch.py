"""Start a server from a recipe, wait until it serves, and always stop its whole process group.

The server runs in a new session (its own process group), so stopping it also stops the
workers it spawned (tensor-parallel ranks, tokenizer processes). Its output goes to a log file
beside the run (results/logs/ by default); when it dies or does not become ready in time, the
error shows the log's last lines.

A sweep gets a `ServerHandle` from `open_server`, the same for a launched server and an attached
one (a URL), and asks it whether the server has died (`died()`, `exit_status()`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from k2bench.errors import ServerError, UserError
from k2bench.harness import redact
from k2bench.harness.plan.settings import API_KEY_ENV
from k2bench.harness.servers import pdeathsig, recipes
from k2bench.harness.servers.model_list import served_models
from k2bench.net import free_port, normalize_base_url

MODELS_ENV = "K2BENCH_MODELS"  # overrides the folder of cached models (tests share one trained model)
TINY_MODEL = "tiny-arith"  # the bundled engine's default model, under models_dir()
LOG_TAIL_LINES = 25
STOP_GRACE_S = 15.0


def describe_exit(code: int) -> str:
    """'exited with code 1' or 'was killed by signal 9 (SIGKILL)', from a Popen return code."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = f" ({signal.Signals(-code).name})"
    except ValueError:
        name = ""
    return f"was killed by signal {-code}{name}"


def log_tail(path: Path, lines: int = LOG_TAIL_LINES, secrets: redact.Secrets | None = None) -> str:
    """The log's last lines, indented, with ``secrets`` (and every secret shape) masked."""
    try:
        text = (secrets or redact.Secrets()).scrub(path.read_text(errors="replace"))
    except OSError:
        return "(no log)"
    tail = text.rstrip().splitlines()[-lines:]
    return "\n".join("    " + line for line in tail) if tail else "    (log is empty)"


def _get(url: str, timeout: float, api_key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as resp:
            resp.read()
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return 0


class Server:
    """A launched server. Use as a context manager: the process group dies on exit, always."""

    live: set[Server] = set()  # started and not yet stopped (also stopped at interpreter exit)

    def __init__(self, argv: list[str], *, env: dict[str, str] | None = None, host: str, port: int,
                 log_path: Path, ready_timeout_s: float, flags: list[str] | None = None,
                 version_argv: list[str] | None = None, name: str = "server", api_key: str | None = None,
                 cwd: str | Path | None = None) -> None:
        self.argv = argv
        self.env = dict(env or {})
        self.host, self.port = host, port
        self.log_path = log_path
        self.ready_timeout_s = ready_timeout_s
        self.flags = list(flags or [])
        self.version_argv = version_argv
        self.name = name
        self.api_key = api_key
        self.cwd = cwd  # a backfilled commit's worktree: the server runs from there
        self.proc: subprocess.Popen | None = None
        self.version: str | None = None
        self.exit_code: int | None = None  # once the process has exited: its code, or -signal
        # what this server was handed that is secret: masked in its log, its command line as printed
        self.secrets = (redact.Secrets([api_key]).add_argv(argv).add_env(self.env)
                        .add_env({k: v for k, v in os.environ.items() if redact.is_secret_name(k)}))

    def poll(self) -> int | None:
        """The process's exit code (negative: killed by that signal) once it has exited, else None."""
        if self.proc is not None and self.exit_code is None:
            self.exit_code = self.proc.poll()
        return self.exit_code

    def wait_exit(self, timeout_s: float) -> int | None:
        """Like poll, but give an exit already under way up to ``timeout_s`` to become visible."""
        if self.proc is not None and self.exit_code is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.exit_code = self.proc.wait(timeout_s)
        return self.exit_code

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def command(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + shlex.join(self.argv)

    @property
    def shown_command(self) -> str:
        """`command` as it may be printed or written to the log: its secrets masked."""
        return self.secrets.scrub(redact.command(self.command) or "")

    def start(self) -> Server:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # owner-only: until the server stops (and scrub_log runs), its own lines may hold a secret
        log = os.fdopen(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")
        log.write(f"# k2bench launch {datetime.now(timezone.utc).isoformat()}: {self.shown_command}\n".encode())
        log.flush()
        try:
            self.proc = subprocess.Popen(self.argv, env={**os.environ, **self.env}, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, cwd=self.cwd,
                                         preexec_fn=pdeathsig.die_with_parent())  # dies with a SIGKILLed sweep
        except OSError as exc:
            raise ServerError(f"cannot start {self.name} ({self.argv[0]}): {exc.strerror or exc}") from None
        finally:
            log.close()
        atexit.register(self.stop)
        Server.live.add(self)
        return self

    def wait_ready(self) -> None:
        """Poll /health, then /v1/models, until both answer 200 or the deadline passes."""
        assert self.proc is not None
        deadline = time.monotonic() + self.ready_timeout_s
        stage = "/health"
        while True:
            code = self.poll()
            if code is not None:
                raise ServerError(f"{self.name} {describe_exit(code)} before it was ready; "
                                  f"last lines of {self.log_path}:\n{log_tail(self.log_path, secrets=self.secrets)}")
            status = _get(self.base_url + stage, timeout=5.0, api_key=self.api_key)
            if status == 200:
                if stage == "/v1/models":
                    break
                stage = "/v1/models"
                continue
            if status in (401, 403):
                self.stop()
                raise ServerError(f"{self.name} answered HTTP {status} on {stage}: it wants an API key "
                                  f"(--api-key or env {API_KEY_ENV})")
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(f"{self.name} was not ready ({stage} did not answer 200) within "
                                  f"{self.ready_timeout_s:g} s; last lines of {self.log_path}:\n"
                                  f"{log_tail(self.log_path, secrets=self.secrets)}")
            time.sleep(0.25)
        self.version = self._probe_version()

    def _probe_version(self) -> str | None:
        if self.version_argv:
            try:
                out = subprocess.run(self.version_argv, capture_output=True, text=True, timeout=60,
                                     env={**os.environ, **self.env})
                if out.returncode == 0 and out.stdout.strip():
                    return out.stdout.strip().splitlines()[-1][:200]
            except (OSError, subprocess.TimeoutExpired):
                pass
        try:  # vLLM and others answer GET /version
            with urllib.request.urlopen(self.base_url + "/version", timeout=5) as resp:
                import json

                return str(json.loads(resp.read()).get("version"))[:200]
        except (OSError, ValueError, AttributeError):
            return None

    def stop(self) -> None:
        """SIGTERM the process group, wait, then SIGKILL it. Safe to call more than once."""
        proc = self.proc
        if proc is None:
            return
        self.proc = None
        atexit.unregister(self.stop)
        Server.live.discard(self)
        try:
            pgid = os.getpgid(proc.pid)
        except ProcessLookupError:
            pgid = proc.pid
        for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
            if not _group_alive(pgid):
                break
            # the leader is gone but children of the group may linger: give them the grace, then kill
            time.sleep(0.2)
        if self.exit_code is None:
            self.exit_code = proc.poll()
        redact.scrub_file(self.log_path, self.secrets)  # what the server itself printed of its secrets

    def __enter__(self) -> Server:
        if self.proc is None:
            self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def from_recipe(name: str | recipes.Recipe, *, model: str, tp: int = 1, port: int | None = None, host: str = "127.0.0.1",
                extra_args: str | list[str] | None = None, log_dir: str | Path = "results/logs",
                ready_timeout_s: float | None = None, api_key: str | None = None,
                cwd: str | Path | None = None) -> Server:
    """A Server (not yet started) for recipe ``name`` (or a Recipe, e.g. from --server-cmd); its log is
    named by time, recipe and port."""
    recipe = name if isinstance(name, recipes.Recipe) else recipes.get(name)
    port = port or free_port(host)
    argv, flags = recipes.render(recipe, model=model, tp=tp, port=port, host=host, extra_args=extra_args)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    log_path = Path(log_dir) / f"{stamp}-{recipe.name}-{port}.log"
    return Server(argv, env=recipe.env, host=host, port=port, log_path=log_path,
                  ready_timeout_s=ready_timeout_s or recipe.ready_timeout_s, flags=flags,
                  version_argv=recipes.version_command(recipe), name=f"{recipe.name} server", api_key=api_key,
                  cwd=cwd)


@dataclass
class ServerHandle:
    """The server under test as a sweep holds it: launched (we own and watch its process) or
    attached (someone else's server at a URL; no process to watch)."""

    url: str
    engine: str  # the recipe's name, or "external" when attached
    served: list[dict]  # the entries of its /v1/models
    launched: Server | None = None
    model_dir: Path | None = None  # the local model folder, when there is one
    precision: str | None = None  # as the recipe states it

    @property
    def served_models(self) -> list[str]:
        return [m["id"] for m in self.served]

    def model_root(self, model_id: str) -> Path | None:
        """The local folder the server says it loaded ``model_id`` from (vLLM's "root"), if it is here."""
        root = next((m.get("root") for m in self.served if m["id"] == model_id), None)
        if isinstance(root, str) and (Path(root) / "config.json").is_file():
            return Path(root)
        return None

    @property
    def process(self) -> subprocess.Popen | None:
        return self.launched.proc if self.launched else None

    @property
    def log_path(self) -> Path | None:
        return self.launched.log_path if self.launched else None

    @property
    def command(self) -> str | None:
        return self.launched.command if self.launched else None

    @property
    def version(self) -> str | None:
        return self.launched.version if self.launched else None

    @property
    def flags(self) -> list[str] | None:
        return self.launched.flags if self.launched else None

    def exit_status(self) -> int | None:
        """The launched process's exit code (negative: the signal that killed it), or None while it
        runs or when the server is attached."""
        return self.launched.poll() if self.launched else None

    def died(self) -> bool:
        return self.exit_status() is not None

    def death_note(self, wait_s: float = 0.0) -> str | None:
        """How the launched server ended, with its log's last lines; None while it runs (after waiting up
        to ``wait_s`` for it to end) or when it is attached."""
        if self.launched is None:
            return None
        code = self.launched.wait_exit(wait_s) if wait_s > 0 else self.launched.poll()
        if code is None:
            return None
        return (f"the server {describe_exit(code)}; last lines of {self.launched.log_path}:\n"
                f"{log_tail(self.launched.log_path, secrets=self.launched.secrets)}")

    def stop(self) -> None:
        if self.launched:
            self.launched.stop()


@contextlib.contextmanager
def open_server(*, url: str | None = None, engine: str | None = None, model: str | None = None, tp: int = 1,
                server_args: str | list[str] | None = None, log_dir: str | Path = "results/logs",
                ready_timeout_s: float | None = None, api_key: str | None = None,
                server_cmd: str | None = None, cwd: str | Path | None = None,
                say: Callable[[str], None] = lambda text: None) -> Iterator[ServerHandle]:
    """Attach to ``url``, or launch recipe ``engine`` (default: the bundled engine on its tiny model) or
    the ``server_cmd`` command line (the custom recipe; run in ``cwd`` when given), wait until it
    serves, yield its handle, and stop what was launched on the way out."""
    if url:
        base = normalize_base_url(url)
        yield ServerHandle(url=base, engine=engine or "external", served=served_models(base, api_key=api_key))
        return
    if server_cmd:
        recipe = recipes.custom(server_cmd)
        name = recipe.name
    else:
        name = engine or "bundled"
        recipe = recipes.get(name)
    model = model or recipe.default_model
    if model is None:
        if name != "bundled":
            raise UserError(f"--engine {name} needs --model (a model path or hub id)")
        model = str(ensure_tiny_model(say=say))
    server = from_recipe(recipe, model=model, tp=tp, extra_args=server_args, log_dir=log_dir,
                         ready_timeout_s=ready_timeout_s, api_key=api_key, cwd=cwd)
    say(f"starting {name}: {server.shown_command}  (log: {server.log_path})")
    with server:
        handle = ServerHandle(url=server.base_url, engine=name,
                              served=served_models(server.base_url, api_key=api_key), launched=server,
                              model_dir=Path(model) if Path(model).is_dir() else None, precision=recipe.precision)
        try:
            yield handle
        finally:
            handle.stop()


def models_dir() -> Path:
    """Where generated and trained models are cached: $K2BENCH_MODELS, else results/models."""
    return Path(os.environ.get(MODELS_ENV) or "results/models")


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """One trainer at a time per cache folder (parallel sweeps or test workers wait for the first)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, the trainer's own tmp-and-rename still keeps the folder whole
        yield
        return
    with open(lock_path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_tiny_model(path: Path | None = None, say: Callable[[str], None] | None = None) -> Path:
    """The bundled engine's default model: the tiny model trained on tiny-arith, trained once and cached.

    A trained model, not random weights, so that every default sweep can carry an accuracy figure.
    The engine's own CLI decides in a child process (the harness never imports the engine) whether
    the cached folder was trained by the current trainer with the same settings, and trains it
    again when not; its progress lines are passed on through `say`."""
    path = path or models_dir() / TINY_MODEL
    path.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "k2bench.harness.cli", "engine", "tiny", "--task", "tiny-arith", "--out",
            str(path), "--reuse"]
    tail: list[str] = []
    with _exclusive(path.parent / f".{path.name}.lock"):
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = [*tail[-4:], line.rstrip()]
            if say and line.startswith("step    0 "):  # the cache missed: training has begun
                say(f"training the bundled tiny model on tiny-arith into {path} (once: about 2-3 minutes on "
                    f"2 CPU cores; later sweeps reuse it)")
            if say and line.startswith(("step", "trained")):
                say(f"  {line.rstrip()}")
        code = proc.wait()
    if code != 0 or not (path / "config.json").is_file():
        raise UserError(f"could not train the tiny model ({' '.join(argv[2:])}): {' | '.join(tail)}")
    return path

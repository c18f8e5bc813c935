"""Client for the trtcache daemon (standard library only; ``Artifact.session()`` needs
``onnxruntime``).

    from trtcache_client import Client
    art = Client("/run/trtcache/trtcache.sock").acquire("resnet50")
    sess = art.session()            # onnxruntime.InferenceSession, providers of art's backend
    print(art.metadata["key"])

Wire format (docs/protocol.md): frames of a 4-byte big-endian length and a JSON object;
artifact files arrive as read-only descriptors (SCM_RIGHTS) with the ``artifact`` frame.
Every error is a :class:`TrtcacheError` with a ``.code``; each code has its own subclass
(:class:`NotFound`, :class:`BuildFailed`, :class:`Busy`, ...; see ``trtcache_client.errors``).
Long-running consumers hear about new versions: :meth:`Client.watch` yields a model's
:class:`WatchEvent` s, :meth:`Client.watch_session` keeps a session of its current artifact
(``trtcache_client.watch``).
The typed API is documented in docs/clients.md.
"""

from __future__ import annotations

import os
import struct
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

# The exceptions (``trtcache_client.errors``, 25 classes: a quarter of this module's import
# time, which every consumer's first inference pays) are loaded when one is first raised or
# named: ``trtcache_client.NotFound``, ``from trtcache_client import NotFound`` and
# ``except trtcache_client.TrtcacheError`` work as ever (module ``__getattr__`` below), and a
# consumer whose calls succeed never builds them.
if TYPE_CHECKING:
    from .errors import (
        BY_CODE,
        BadFrame,
        BadName,
        BadRequest,
        BuildFailed,
        Busy,
        Cancelled,
        ConnectionFailed,
        ConnectionTimeout,
        DescriptorsTruncated,
        FrameTooLarge,
        IdleTimeout,
        Internal,
        NotAnEngine,
        NotFound,
        NotReady,
        PermissionDenied,
        ProviderUnavailable,
        ResponseTooLarge,
        ShuttingDown,
        Timeout,
        TrtcacheError,
        UnexpectedResponse,
        UnknownRequest,
        UnsupportedVersion,
        error_for,
    )


def _err() -> Any:
    """The ``errors`` module (imported on first use)."""
    from . import errors

    return errors


# The socket layer is CPython's C module `_socket`, which the standard `socket` module wraps:
# importing `socket` costs ~2.5 ms (its enum conversions and `selectors`), a third of a small
# model's time to first inference, for helpers this client does not use (BENCHMARKS.md).
try:
    import _socket as _net
except ImportError:  # pragma: no cover - a Python without CPython's _socket
    import socket as _net  # type: ignore[no-redef]

if TYPE_CHECKING:
    # onnxruntime is optional: only Artifact.session() imports it. The watch module (and the
    # threading and dataclasses it needs) is loaded on first use, by Client.watch* or by
    # naming one of its classes (module __getattr__ below): a consumer that only acquires
    # does not pay for it.
    import onnxruntime  # type: ignore[import-not-found, import-untyped, unused-ignore]

    from .watch import WATCH_REASONS, SessionHandle, Watcher, WatchEvent

# JSON through CPython's C accelerator `_json`, which the `json` package wraps: `import json`
# compiles a dozen regular expressions for pure-Python fall-backs this client never runs
# (~1.5 ms, a fifth of a small model's time to first inference here). The frames this
# client writes are objects of strings, integers, booleans, None and lists of them.
try:
    import _json
except ImportError:  # pragma: no cover - a Python without CPython's _json
    _json = None  # type: ignore[assignment]

if _json is not None:

    class _ScanContext:
        """What ``_json.make_scanner`` reads: ``json.JSONDecoder``'s defaults."""

        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int

        @staticmethod
        def parse_constant(name: str) -> float:
            return {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}[name]

    _scan = _json.make_scanner(_ScanContext())
    _quote = _json.encode_basestring_ascii

    def _loads(text: str) -> Any:
        """``json.loads(text)``: one JSON value, whitespace around it, nothing else."""
        start = len(text) - len(text.lstrip(" \t\n\r"))
        try:
            value, end = _scan(text, start)
        except StopIteration as e:
            raise ValueError("malformed JSON at character %s" % e.value) from None
        if text[end:].strip(" \t\n\r"):
            raise ValueError("extra data after the JSON value at character %d" % end)
        return value

    def _dumps(v: Any) -> str:
        """``json.dumps(v)`` for what requests hold."""
        if isinstance(v, str):
            return str(_quote(v))
        if v is None:
            return "null"
        if v is True:
            return "true"
        if v is False:
            return "false"
        if isinstance(v, int):
            return int.__repr__(v)
        if isinstance(v, float) and v - v == 0.0:  # finite
            return float.__repr__(v)
        if isinstance(v, dict):
            return "{" + ",".join(_dumps(str(k)) + ":" + _dumps(x) for k, x in v.items()) + "}"
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(_dumps(x) for x in v) + "]"
        raise TypeError("a request holds a %s, which this client does not encode" % type(v).__name__)

else:  # pragma: no cover
    import json

    _loads = json.loads
    _dumps = json.dumps

_WATCH_NAMES = ("Watcher", "WatchEvent", "SessionHandle", "WATCH_REASONS")


# What ``errors.__all__`` lists (a test keeps the two in step).
_ERROR_NAMES = (
    "BY_CODE",
    "BadFrame",
    "BadName",
    "BadRequest",
    "BuildFailed",
    "Busy",
    "Cancelled",
    "ConnectionFailed",
    "ConnectionTimeout",
    "DescriptorsTruncated",
    "FrameTooLarge",
    "IdleTimeout",
    "Internal",
    "NotAnEngine",
    "NotFound",
    "NotReady",
    "PermissionDenied",
    "ProviderUnavailable",
    "ResponseTooLarge",
    "ShuttingDown",
    "Timeout",
    "TrtcacheError",
    "UnexpectedResponse",
    "UnknownRequest",
    "UnsupportedVersion",
    "error_for",
)


def __getattr__(name: str) -> Any:
    if name in _WATCH_NAMES:
        from . import watch

        return getattr(watch, name)
    if name in _ERROR_NAMES:
        return getattr(_err(), name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Artifact",
    "PROTOCOL_VERSION",
    "DEFAULT_SOCKET",
    "DEFAULT_MAX_RESPONSE",
    "MAX_FDS",
    "BACKEND_PROVIDERS",
    "Watcher",
    "WatchEvent",
    "SessionHandle",
    "WATCH_REASONS",
] + list(_ERROR_NAMES)

PROTOCOL_VERSION = 1
DEFAULT_SOCKET = "/run/trtcache/trtcache.sock"
DEFAULT_MAX_RESPONSE = 64 << 20
"""Largest response frame accepted by default (the Rust client's limit too)."""
MAX_FDS = 32
"""Most descriptors one frame may carry (the protocol's limit)."""
_CMSG_ROOM = _net.CMSG_SPACE(MAX_FDS * 4)  # ancillary room for MAX_FDS descriptors (C ints)

BACKEND_PROVIDERS: Dict[str, List[str]] = {
    "ort-cpu": ["CPUExecutionProvider"],
    "ort-cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "ort-tensorrt": [
        "TensorrtExecutionProvider",
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ],
}
"""The ONNX Runtime providers ``Artifact.session()`` asks for, per backend, unless the caller
passes ``providers``: the first is the backend's own (checked to be available), the rest
take the nodes it does not."""

# Codes after which the daemon closes the connection: the next call connects again.
_CLOSING_CODES = frozenset(("frame_too_large", "idle_timeout", "busy", "shutting_down"))

Json = Dict[str, Any]


class Artifact:
    """An acquired artifact: ``.metadata`` (the ``artifact`` frame's metadata, see
    docs/protocol.md), ``.fds`` (open read-only descriptors, graph first, in the order of
    ``metadata["files"]``) and ``.dir_fd`` (a read-only descriptor of the artifact's
    directory, or None when the daemon sent none). Close it (or use ``with``) to close the
    descriptors; a session made from it does not need them."""

    def __init__(self, metadata: Json, fds: List[int], dir_fd: Optional[int] = None) -> None:
        self.metadata: Json = metadata
        self.fds: List[int] = fds
        self.dir_fd: Optional[int] = dir_fd

    @property
    def backend(self) -> str:
        """The backend that built it (``ort-cpu``, ``ort-cuda``, ``ort-tensorrt``, ``trt``)."""
        return str(self.metadata.get("backend", ""))

    @property
    def key(self) -> str:
        """The cache key (64 hex digits)."""
        return str(self.metadata.get("key", ""))

    def providers(self) -> List[str]:
        """The providers ``session()`` uses by default for this artifact's backend
        (:data:`BACKEND_PROVIDERS`). Raises :class:`ProviderUnavailable` for a backend ONNX
        Runtime cannot run (``trt`` plans, an unknown backend)."""
        if self.backend == "trt":
            raise _err().ProviderUnavailable(
                "a `trt` artifact is a TensorRT plan, not an ONNX model: load it with the "
                "TensorRT runtime (or acquire an ort-* backend)"
            )
        p = BACKEND_PROVIDERS.get(self.backend)
        if p is None:
            raise _err().ProviderUnavailable(
                "backend %r is unknown to this client: pass providers= to session()" % self.backend
            )
        return list(p)

    def dir_graph_path(self) -> Optional[str]:
        """``/proc/self/fd/D/<graph name>`` when the daemon sent the directory and every
        file opens there as the very file whose descriptor was sent (same device and inode);
        None otherwise (no directory, not searchable by this uid, a file gone)."""
        files = self.metadata.get("files", [])
        if self.dir_fd is None or not files or len(files) != len(self.fds):
            return None
        d = "/proc/self/fd/%d" % self.dir_fd
        for i, (meta, fd) in enumerate(zip(files, self.fds)):
            name = meta.get("name", "")
            parts = name.split("/")
            if not name or os.path.isabs(name) or any(p in ("", ".", "..") for p in parts):
                return None
            if i == 0 and len(parts) != 1:
                return None
            try:
                h = os.open(os.path.join(d, name), os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None  # e.g. EACCES: the directory is not searchable by this uid
            try:
                here = os.fstat(h)
            finally:
                os.close(h)
            sent = os.fstat(fd)
            if (here.st_dev, here.st_ino) != (sent.st_dev, sent.st_ino):
                return None
        return os.path.join(d, files[0]["name"])

    def graph_bytes(self) -> bytes:
        """The graph file's bytes (a ``trt`` artifact's engine)."""
        if not self.fds:
            raise _err().UnexpectedResponse("artifact has no files")
        return _read_fd(self.fds[0])

    def _engine_fd(self, name: str) -> int:
        if self.backend != "trt":
            raise _err().NotAnEngine(
                "artifact %s of %r was built by %s: an ONNX model, not a TensorRT engine "
                "(acquire backend=\"trt\" for one, or use session())"
                % (self.key[:12], self.metadata.get("model", "?"), self.backend)
            )
        for meta, fd in zip(self.metadata.get("files", []), self.fds):
            if meta.get("name") == name:
                return fd
        raise _err().UnexpectedResponse("trt artifact has no %s" % name)

    def engine_path(self) -> str:
        """``/proc/self/fd/N`` of a ``trt`` artifact's serialized engine (``engine.plan``),
        for tools that take a path (``trtexec --loadEngine=...``). Valid while this artifact
        is open. Raises :class:`NotAnEngine` for an ``ort-*`` artifact."""
        return "/proc/self/fd/%d" % self._engine_fd("engine.plan")

    def engine_bytes(self) -> bytes:
        """A ``trt`` artifact's serialized engine, for
        ``tensorrt.Runtime(logger).deserialize_cuda_engine(artifact.engine_bytes())``. Raises
        :class:`NotAnEngine` for an ``ort-*`` artifact."""
        return _read_fd(self._engine_fd("engine.plan"))

    def engine_meta(self) -> Json:
        """A ``trt`` artifact's ``engine.json``: TensorRT version, GPU and compute
        capability, hardware-compatibility level, precision flags, the optimization
        profiles in engine order, and the I/O tensors (name, dtype, shape with -1 for dynamic
        dimensions). See docs/trt.md."""
        meta: Json = _loads(_read_fd(self._engine_fd("engine.json")).decode("utf-8"))
        return meta

    def session(self, **ort_kwargs: Any) -> "onnxruntime.InferenceSession":
        """An ``onnxruntime.InferenceSession`` over this artifact.

        Providers: unless ``providers`` is given, the artifact's backend's
        (:meth:`providers`): an ``ort-cpu`` artifact runs on ``CPUExecutionProvider`` only,
        even under ``onnxruntime-gpu``; an ``ort-cuda``/``ort-tensorrt`` artifact asks for
        CUDA/TensorRT (then CPU for the nodes they do not take) and raises
        :class:`ProviderUnavailable` when this ``onnxruntime`` lacks that provider, instead
        of ONNX Runtime's silent fall-back to CPU.

        Files: with the directory descriptor (and ``dir_graph_path()`` usable) the graph is
        opened in place as /proc/self/fd/D/<name>, external data found next to it; otherwise
        through /proc/self/fd/N, a graph with external data through a private temp folder of
        symlinks to /proc/self/fd/N named as the graph expects (removed once the session
        exists). ONNX Runtime reads or maps the files while it creates the session, so the
        session does not need the descriptors afterwards.

        Options: an ``ort-cpu`` artifact is already optimized for this machine, so unless
        ``sess_options`` is given it is opened with graph optimizations off (re-optimizing it
        gives the same graph, only slower); see ``_ort_defaults``."""
        import onnxruntime  # type: ignore[import-not-found, import-untyped, unused-ignore]

        ort_kwargs = self._ort_defaults(ort_kwargs)
        graph = self.dir_graph_path()
        if graph is not None:
            try:
                return onnxruntime.InferenceSession(graph, **ort_kwargs)
            except Exception:
                pass  # e.g. the blob was collected in between: the descriptors still work
        return self._session_from_files(ort_kwargs)

    def free_dims(self) -> bool:
        """Whether any input of the artifact has a dimension without a fixed size: a name,
        an unknown (``"?"``, None) or a negative size (``dim_value: -1``, which ONNX Runtime
        treats as dynamic, as old exporters and skl2onnx/onnxmltools write a free batch)."""
        return any(
            not isinstance(d, int) or d < 0
            for t in self.metadata.get("inputs", [])
            for d in (t.get("shape") or [None])
        )

    def _ort_defaults(self, ort_kwargs: Dict[str, Any]) -> Dict[str, Any]:
        """The keyword arguments ``session()`` passes to ONNX Runtime.

        ``providers``: the backend's (see ``session()``) unless given.

        ``sess_options`` unless given: for an ``ort-cpu`` artifact, graph optimizations off
        (it is optimized already); for every artifact, weights packed on the session's
        threads (``session.prepack.enable_parallel``); and where an input has a free
        dimension, ONNX Runtime's memory-reuse planning off (``enable_mem_reuse``): its
        planner is quadratic in tensors of symbolic shape (a 7,570-node artifact: 13.3 s to
        plan, 0.38 s without; the arena still recycles freed buffers, same peak memory in
        BENCHMARKS.md). ONNX Runtime's C API has no switch for the latter, so only this
        client does it. And the metadata's ``session_hints`` (``intra_op_num_threads``: 1
        when the build timed the artifact no slower on one thread than on ONNX Runtime's
        default pool, on inputs a consumer feeds: docs/protocol.md)."""
        import onnxruntime  # type: ignore[import-not-found, import-untyped, unused-ignore]

        out = dict(ort_kwargs)
        if "providers" not in out:
            wanted = self.providers()
            available = onnxruntime.get_available_providers()
            if wanted[0] not in available:
                raise _err().ProviderUnavailable(
                    "artifact %s of %r was built by %s and needs %s, which this onnxruntime "
                    "(%s) lacks (available: %s); install onnxruntime-gpu with CUDA/TensorRT "
                    "(docs/daemon.md, GPU host), or pass providers= to choose"
                    % (
                        self.key[:12],
                        self.metadata.get("model", "?"),
                        self.backend,
                        wanted[0],
                        getattr(onnxruntime, "__version__", "?"),
                        ", ".join(available),
                    )
                )
            out["providers"] = wanted
        if "sess_options" not in out:
            so = onnxruntime.SessionOptions()
            if self.backend == "ort-cpu":
                so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
            so.add_session_config_entry("session.prepack.enable_parallel", "1")
            if self.free_dims():
                so.enable_mem_reuse = False
            threads = (self.metadata.get("session_hints") or {}).get("intra_op_num_threads")
            if isinstance(threads, int) and threads > 0:
                so.intra_op_num_threads = threads
            out["sess_options"] = so
        return out

    def session_from_files(self, **ort_kwargs: Any) -> "onnxruntime.InferenceSession":
        """Like ``session()``, through the per-file descriptors only (ignores the directory)."""
        return self._session_from_files(self._ort_defaults(ort_kwargs))

    def _session_from_files(self, ort_kwargs: Dict[str, Any]) -> "onnxruntime.InferenceSession":
        import onnxruntime  # type: ignore[import-not-found, import-untyped, unused-ignore]

        files = self.metadata.get("files", [])
        if len(self.fds) == 1:
            # ONNX Runtime opens the descriptor through /proc: no copy into Python.
            return onnxruntime.InferenceSession("/proc/self/fd/%d" % self.fds[0], **ort_kwargs)
        if not self.fds:
            raise _err().UnexpectedResponse("artifact has no files")
        # Imported here, not with the module: only this fall-back needs them, and they are
        # a third of the client's import time, which every consumer's first inference pays.
        import shutil
        import tempfile

        d = tempfile.mkdtemp(prefix="trtcache-artifact-")
        try:
            graph = os.path.join(d, "model.onnx")
            for i, (meta, fd) in enumerate(zip(files, self.fds)):
                if i == 0:
                    link = graph
                else:
                    name = meta["name"]
                    if os.path.isabs(name) or ".." in name.split("/"):
                        raise _err().BadName("external data name %r" % name)
                    link = os.path.join(d, name)
                    os.makedirs(os.path.dirname(link), exist_ok=True)
                os.symlink("/proc/self/fd/%d" % fd, link)
            return onnxruntime.InferenceSession(graph, **ort_kwargs)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def close(self) -> None:
        """Closes the descriptors."""
        for fd in self.fds + ([self.dir_fd] if self.dir_fd is not None else []):
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []
        self.dir_fd = None

    def __enter__(self) -> "Artifact":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def _read_fd(fd: int) -> bytes:
    """Every byte of an open file, read with ``pread`` (the descriptor's offset is left)."""
    size = os.fstat(fd).st_size
    chunks, off = [], 0
    while off < size:
        b = os.pread(fd, min(size - off, 1 << 24), off)
        if not b:
            break
        chunks.append(b)
        off += len(b)
    return b"".join(chunks)


def _close_all(fds: Iterable[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _nofile_limit() -> str:
    try:
        import resource

        soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        return str(soft)
    except (ImportError, OSError, ValueError):
        return "unknown"


class Client:
    """One connection to the daemon; ``hello`` is sent on construction and its answer read
    with the first request's (one round trip instead of two before a first ``acquire``): a
    daemon that cannot be reached raises :class:`ConnectionFailed` here, one that refuses the
    ``hello`` (:class:`Busy`, :class:`UnsupportedVersion`) at the first call.

    ``socket_path``: the daemon's socket (else ``$TRTCACHE_SOCKET``, else
    :data:`DEFAULT_SOCKET`). ``timeout``: seconds each send or receive may take (None: wait
    for ever); when it passes, the call raises :class:`ConnectionTimeout` and the connection
    is reset: the late answer and its descriptors are dropped with the old socket, and the
    next call connects (and says ``hello``) again. The same reset follows any error that
    leaves the connection mid-frame and the error codes after which the daemon closes it
    (``busy``, ``idle_timeout``, ``frame_too_large``, ``shutting_down``).
    ``max_response``: the largest response frame accepted (:class:`ResponseTooLarge`)."""

    def __init__(
        self,
        socket_path: Optional[Union[str, "os.PathLike[str]"]] = None,
        timeout: Optional[float] = None,
        max_response: int = DEFAULT_MAX_RESPONSE,
    ) -> None:
        self.path: str = os.fspath(
            socket_path or os.environ.get("TRTCACHE_SOCKET") or DEFAULT_SOCKET
        )
        self.timeout: Optional[float] = timeout
        self.max_response: int = int(max_response)
        self._server: Optional[str] = None
        self._max_frame: Optional[int] = None
        self._hello_pending = False
        self.resets: int = 0
        """How many times the connection was reset (after a timeout or a broken frame)."""
        self._sock: Optional[Any] = None
        self._connect()

    @property
    def server(self) -> Optional[str]:
        """The daemon's name and version, from its ``hello`` answer."""
        self._finish_hello()
        return self._server

    @property
    def max_frame(self) -> Optional[int]:
        """The largest request frame the daemon takes, from its ``hello`` answer."""
        self._finish_hello()
        return self._max_frame

    # -- connection ----------------------------------------------------------------
    def _connect(self) -> None:
        s = _net.socket(_net.AF_UNIX, _net.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.path)
        except _net.timeout as e:
            s.close()
            raise _err().ConnectionTimeout("no connection to %s within %s s" % (self.path, self.timeout)) from e
        except OSError as e:
            s.close()
            raise _err().ConnectionFailed("cannot connect to %s: %s" % (self.path, e)) from e
        self._sock = s
        # `hello` goes out now and its answer is read before the first request's: the first
        # request follows it without waiting, one round trip instead of two. A daemon that
        # refuses the hello (version, connection limit) is heard at the first call.
        self._hello_pending = True
        try:
            self._send(
                {"op": "hello", "version": PROTOCOL_VERSION, "client": "trtcache_client.py/" + __version__}
            )
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon answered and closed (`busy`): the first call reads why

    def _finish_hello(self) -> None:
        """Reads the pending ``hello`` answer (raising the daemon's refusal)."""
        if self._hello_pending and self._sock is not None:
            self._hello_pending = False
            hello = self._recv_frame()[0]
            self._server = hello.get("server")
            self._max_frame = hello.get("max_frame")

    def _reset(self) -> None:
        """Drops the connection; the next call connects again."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            self._hello_pending = False
            self.resets += 1

    def _socket(self) -> Any:
        if self._sock is None:
            self._connect()
        assert self._sock is not None
        return self._sock

    # -- framing -------------------------------------------------------------------
    def _send(self, obj: Json) -> None:
        body = _dumps(obj).encode()
        sock = self._socket()
        try:
            sock.sendall(struct.pack(">I", len(body)) + body)
        except _net.timeout as e:
            self._reset()
            raise _err().ConnectionTimeout(
                "the daemon took no request within %s s; the connection was reset" % self.timeout
            ) from e

    def _recv_exact(self, sock: Any, n: int, fds: List[int]) -> Tuple[bytes, bool]:
        buf = bytearray()
        truncated = False
        while len(buf) < n:
            data, ancillary, flags, _addr = sock.recvmsg(
                n - len(buf), _CMSG_ROOM, _net.MSG_CMSG_CLOEXEC
            )
            for level, kind, blob in ancillary:
                if level == _net.SOL_SOCKET and kind == _net.SCM_RIGHTS:
                    whole = len(blob) - len(blob) % 4
                    fds.extend(struct.unpack("%di" % (whole // 4), blob[:whole]))
            if flags & _net.MSG_CTRUNC:
                truncated = True
            if not data:
                raise _err().ConnectionFailed("daemon closed the connection")
            buf += data
        return bytes(buf), truncated

    def _recv(self) -> Tuple[Json, List[int]]:
        self._finish_hello()
        return self._recv_frame()

    def _recv_frame(self) -> Tuple[Json, List[int]]:
        sock = self._socket()
        fds: List[int] = []
        try:
            head, t1 = self._recv_exact(sock, 4, fds)
            (n,) = struct.unpack(">I", head)
            if n > self.max_response:
                raise _err().ResponseTooLarge(
                    "the daemon announced a %d-byte response; the limit is %d (max_response)"
                    % (n, self.max_response)
                )
            body, t2 = self._recv_exact(sock, n, fds)
            msg = _loads(body.decode("utf-8"))
            if not isinstance(msg, dict):
                raise _err().UnexpectedResponse("response is not a JSON object")
        except _net.timeout as e:
            _close_all(fds)
            self._reset()
            raise _err().ConnectionTimeout(
                "no answer from the daemon within %s s; the connection was reset (the late "
                "answer is dropped)" % self.timeout
            ) from e
        except _err().TrtcacheError:
            _close_all(fds)
            self._reset()
            raise
        except ValueError as e:  # json.JSONDecodeError, UnicodeDecodeError
            _close_all(fds)
            self._reset()
            raise _err().UnexpectedResponse("malformed response frame: %s" % e) from e
        except OSError as e:
            _close_all(fds)
            self._reset()
            raise _err().ConnectionFailed("socket error: %s" % e) from e
        except BaseException:
            _close_all(fds)
            self._reset()
            raise
        if t1 or t2:
            # The frame itself arrived whole, so the connection stays in step.
            _close_all(fds)
            raise _err().DescriptorsTruncated(
                "the kernel dropped descriptors of the daemon's %r answer (MSG_CTRUNC, %d "
                "arrived and were closed): this process is at its open-files limit "
                "(RLIMIT_NOFILE soft limit %s); close descriptors or raise the limit"
                % (msg.get("kind"), len(fds), _nofile_limit())
            )
        if msg.get("kind") == "error":
            _close_all(fds)
            code = str(msg.get("code", "internal"))
            if code in _CLOSING_CODES:
                self._reset()
            raise _err().error_for(code, str(msg.get("message", "")))
        return msg, fds

    def _call(self, obj: Json) -> Tuple[Json, List[int]]:
        self._socket()
        return self._call_connected(obj)

    def _call_connected(self, obj: Json) -> Tuple[Json, List[int]]:
        try:
            self._send(obj)
        except (BrokenPipeError, ConnectionResetError) as broken:
            # The daemon may have answered and closed before reading (`busy` at its
            # connection limit): its error frame says why, the broken pipe does not.
            try:
                self._recv()
            except _err().TrtcacheError as answer:
                if answer.code != "connection":
                    self._reset()
                    raise answer from broken
            except OSError:
                pass
            self._reset()
            raise _err().ConnectionFailed("the daemon closed the connection: %s" % broken) from broken
        except OSError as e:
            self._reset()
            raise _err().ConnectionFailed("socket error: %s" % e) from e
        return self._recv()

    @staticmethod
    def _expect(msg: Json, kind: str, field: str) -> Any:
        if msg.get("kind") != kind or field not in msg:
            raise _err().UnexpectedResponse("expected %r with %r, got %r" % (kind, field, msg.get("kind")))
        return msg[field]

    # -- requests ------------------------------------------------------------------
    def list(self) -> List[Json]:
        """Every model with versions and per-variant state."""
        return list(self._expect(self._call({"op": "list"})[0], "models", "models"))

    def status(self, model: str) -> Json:
        """One model's state."""
        return dict(self._expect(self._call({"op": "status", "model": model})[0], "status", "model"))

    def acquire(
        self,
        model: str,
        profile: Optional[str] = None,
        backend: Optional[str] = None,
        wait: bool = True,
        timeout: Optional[float] = None,
        version: Optional[int] = None,
    ) -> Artifact:
        """A ready artifact; waits for a build when ``wait`` (up to ``timeout`` seconds on
        the daemon's side, then :class:`Timeout`). Set the client's own ``timeout`` above
        this one, or a long wait ends as :class:`ConnectionTimeout`."""
        req: Json = {"op": "acquire", "model": model, "wait": bool(wait), "dir_fd": True}
        if profile is not None:
            req["profile"] = profile
        if backend is not None:
            req["backend"] = backend
        if version is not None:
            req["version"] = int(version)
        if timeout is not None:
            req["timeout_ms"] = int(timeout * 1000)
        msg, fds = self._call(req)
        meta = msg.get("metadata") or {}
        n = len(meta.get("files", []))
        di = meta.get("dir_fd_index")
        if msg.get("kind") != "artifact" or di not in (None, n) or len(fds) != n + (di is not None):
            _close_all(fds)
            raise _err().UnexpectedResponse(
                "expected an artifact with %d descriptors, got %r with %d" % (n, msg.get("kind"), len(fds))
            )
        dir_fd = fds.pop() if di is not None else None
        return Artifact(meta, fds, dir_fd)

    def build(
        self,
        models: Optional[Sequence[str]] = None,
        backend: Optional[str] = None,
        timeout: Optional[float] = None,
        on_progress: Optional[Callable[[Json], None]] = None,
        paths: Optional[Sequence[Union[str, "os.PathLike[str]"]]] = None,
    ) -> List[Json]:
        """Builds models (all when None and no paths); calls ``on_progress(event)`` per
        event; returns the results. ``paths``: model files outside the repository, by
        absolute path (admin only: root or the daemon's user)."""
        req: Json = {"op": "build", "models": list(models or [])}
        if paths:
            req["paths"] = [os.fspath(p) for p in paths]
        if backend is not None:
            req["backend"] = backend
        if timeout is not None:
            req["timeout_ms"] = int(timeout * 1000)
        msg, _ = self._call(req)
        while msg.get("kind") == "progress":
            if on_progress:
                on_progress(msg)
            msg, _ = self._recv()
        return list(self._expect(msg, "built", "results"))

    def stats(self, prometheus: bool = False) -> Any:
        """Counters as a dict, or Prometheus text (a str) with ``prometheus=True``."""
        msg = self._call({"op": "stats", "format": "prometheus" if prometheus else "json"})[0]
        if prometheus:
            return str(self._expect(msg, "stats_text", "text"))
        return dict(self._expect(msg, "stats", "stats"))

    def rescan(self) -> Json:
        """Has the daemon scan its repository now: ``root``, ``settle_ms``, every model found
        in ``models`` (``settled`` once the daemon serves exactly its files) and every entry
        it skips in ``skipped``, with the reason."""
        msg = self._call({"op": "rescan"})[0]
        self._expect(msg, "rescanned", "models")
        return {k: v for k, v in msg.items() if k != "kind"}

    def evict(self, model: Optional[str] = None, key: Optional[str] = None) -> int:
        """Admin: evicts a model's artifacts or one key; returns the number removed."""
        return int(self._expect(self._call({"op": "evict", "model": model, "key": key})[0], "evicted", "removed"))

    def watch(self, model: str) -> "Watcher":
        """Subscribes to ``model`` on a new connection (this client stays free for other
        requests), with this client's ``timeout`` and ``max_response``: a :class:`Watcher`
        whose ``.status`` is the model's state now and which yields a :class:`WatchEvent`
        for every change of its ready artifacts after it. Raises :class:`NotFound` for a
        model not in the repository, :class:`Busy` at the daemon's ``limits.max_watchers``,
        :class:`UnknownRequest` from a daemon older than ``watch``."""
        from .watch import Watcher

        return Watcher(Client(self.path, timeout=self.timeout, max_response=self.max_response), model)

    def watch_session(
        self,
        model: str,
        profile: Optional[str] = None,
        backend: Optional[str] = None,
        timeout: Optional[float] = None,
        **ort_kwargs: Any,
    ) -> "SessionHandle":
        """A :class:`SessionHandle` following ``model``: the session of its current artifact
        (``profile``/``backend`` as for :meth:`acquire`, ``timeout`` each acquire's wait for
        a build; ``ort_kwargs`` as for :meth:`Artifact.session`), reopened on a background
        thread and swapped atomically on every change. The first session is opened before
        this returns (its errors are raised here)."""
        from .watch import SessionHandle

        return SessionHandle(self, model, profile=profile, backend=backend, timeout=timeout, **ort_kwargs)

    def shutdown(self) -> None:
        """Admin: stops the daemon."""
        self._call({"op": "shutdown"})

    def close(self) -> None:
        """Closes the connection (a later call connects again)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._hello_pending = False

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

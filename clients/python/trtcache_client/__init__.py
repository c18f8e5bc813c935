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
from typing import TYPE_CHECKING

# The typing names are for annotations only (strings under ``from __future__ import
# annotations``): a consumer's first inference pays this module's import, and building a
# generic alias such as ``Dict[str, Any]`` at import costs more than the rest of the module's
# top-level statements together (~45 us of ~0.1 ms in a fresh process).
if TYPE_CHECKING:
    from typing import (
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

    Json = Dict[str, Any]

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
        RuntimeUnavailable,
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


if TYPE_CHECKING:
    # onnxruntime is optional: only Artifact.session() imports it. The watch module (and the
    # threading and dataclasses it needs) is loaded on first use, by Client.watch* or by
    # naming one of its classes (module __getattr__ below): a consumer that only acquires
    # does not pay for it.
    import onnxruntime  # type: ignore[import-not-found, import-untyped, unused-ignore]

    from ._wire import Channel
    from .watch import WATCH_REASONS, SessionHandle, Watcher, WatchEvent

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
    "RuntimeUnavailable",
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

READY_MAGIC = "trtcache-ready 1"
"""The first line of a ready-index pointer this client reads (docs/protocol.md)."""

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



class Artifact:
    """An acquired artifact: ``.metadata`` (the ``artifact`` frame's metadata, see
    docs/protocol.md), ``.fds`` (open read-only descriptors, graph first, in the order of
    ``metadata["files"]``) and ``.dir_fd`` (a read-only descriptor of the artifact's
    directory, or None when the daemon sent none). Close it (or use ``with``) to close the
    descriptors; a session made from it does not need them. ``from_index`` says whether it
    was opened through the daemon's ready index rather than sent over the socket (the same
    files and metadata either way)."""

    def __init__(
        self,
        metadata: Optional[Json],
        fds: List[int],
        dir_fd: Optional[int] = None,
        _ready: Optional["_Ready"] = None,
    ) -> None:
        self._metadata: Optional[Json] = metadata
        self._ready = _ready
        self.fds: List[int] = fds
        self.dir_fd: Optional[int] = dir_fd

    @property
    def metadata(self) -> Json:
        """The metadata (docs/protocol.md); from the ready index it is parsed on first use."""
        if self._metadata is None:
            meta = _loads(self._ready.meta) if self._ready is not None else {}
            self._metadata = meta if isinstance(meta, dict) else {}
            if self._ready is not None and self.dir_fd is not None:
                # As an acquire over the socket reports it: the directory after the files.
                self._metadata["dir_fd_index"] = len(self.fds)
        return self._metadata

    @metadata.setter
    def metadata(self, value: Json) -> None:
        self._metadata = value
        self._ready = None

    @property
    def from_index(self) -> bool:
        """Whether this artifact came through the ready index (no socket round trip)."""
        return self._ready is not None

    @property
    def backend(self) -> str:
        """The backend that built it (``ort-cpu``, ``ort-cuda``, ``ort-tensorrt``, ``trt``)."""
        if self._ready is not None:
            return self._ready.fields.get("backend", "")
        return str(self.metadata.get("backend", ""))

    @property
    def key(self) -> str:
        """The cache key (64 hex digits)."""
        if self._ready is not None:
            return self._ready.fields.get("key", "")
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
        """``/proc/self/fd/D/<graph name>`` when the artifact's directory came with it and
        every file opens there as the very file whose descriptor came (same device and
        inode); None otherwise (no directory, not searchable by this uid, a file gone)."""
        if self._ready is not None and self.dir_fd is not None:
            st = os.fstat(self.dir_fd)
            if (st.st_dev, st.st_ino) == self._ready.dir_id:
                # The files were opened by name in this very directory and checked then.
                return "/proc/self/fd/%d/%s" % (self.dir_fd, self._ready.names[0])
        from ._files import dir_graph_path

        return dir_graph_path(self)

    def graph_bytes(self) -> bytes:
        """The graph file's bytes (a ``trt`` artifact's engine)."""
        from ._files import graph_bytes

        return graph_bytes(self)

    def engine_path(self) -> str:
        """``/proc/self/fd/N`` of a ``trt`` artifact's serialized engine (``engine.plan``),
        for tools that take a path (``trtexec --loadEngine=...``). Valid while this artifact
        is open. Raises :class:`NotAnEngine` for an ``ort-*`` artifact."""
        from ._files import engine_fd

        return "/proc/self/fd/%d" % engine_fd(self, "engine.plan")

    def engine_bytes(self) -> bytes:
        """A ``trt`` artifact's serialized engine, for
        ``tensorrt.Runtime(logger).deserialize_cuda_engine(artifact.engine_bytes())``. Raises
        :class:`NotAnEngine` for an ``ort-*`` artifact."""
        from ._files import engine_fd, read_fd

        return read_fd(engine_fd(self, "engine.plan"))

    def engine_meta(self) -> Json:
        """A ``trt`` artifact's ``engine.json``: TensorRT version, GPU and compute
        capability, hardware-compatibility level, precision flags, the optimization
        profiles in engine order, and the I/O tensors (docs/trt.md)."""
        from ._files import engine_fd, read_fd

        meta: Json = _loads(read_fd(engine_fd(self, "engine.json")).decode("utf-8"))
        return meta

    def session(self, **ort_kwargs: Any) -> "onnxruntime.InferenceSession":
        """An ``onnxruntime.InferenceSession`` over this artifact (docs/clients.md).

        Providers, unless given: the backend's (:meth:`providers`); a GPU backend whose
        provider this ``onnxruntime`` lacks raises :class:`ProviderUnavailable` instead of
        ONNX Runtime's silent fall-back to CPU. Files: the graph opened in place in the
        artifact's directory (external data found next to it), else through the
        descriptors. Options, unless ``sess_options`` is given: see ``_ort_defaults``."""
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
        """Whether any input has a dimension without a fixed size (a name, an unknown, or a
        negative size, which ONNX Runtime treats as dynamic)."""
        if self._ready is not None:
            return self._ready.fields.get("free_dims") == "1"
        return any(
            not isinstance(d, int) or d < 0
            for t in self.metadata.get("inputs", [])
            for d in (t.get("shape") or [None])
        )

    def _threads_hint(self) -> Optional[int]:
        """``session_hints.intra_op_num_threads``, when the build measured one."""
        if self._ready is not None:
            t = self._ready.fields.get("threads")
            return int(t) if t is not None and t.isdigit() else None
        threads = (self.metadata.get("session_hints") or {}).get("intra_op_num_threads")
        return threads if isinstance(threads, int) else None

    def _prepack_hint(self) -> bool:
        """``session_hints.disable_prepacking``: the build found the artifact's runs no
        slower without prepacked weights, and its session faster."""
        if self._ready is not None:
            return self._ready.fields.get("prepack") == "0"
        return (self.metadata.get("session_hints") or {}).get("disable_prepacking") is True

    def _ort_defaults(self, ort_kwargs: Dict[str, Any]) -> Dict[str, Any]:
        """The keyword arguments ``session()`` passes to ONNX Runtime (docs/clients.md):
        ``providers`` the backend's unless given (for an fp32 artifact the CUDA provider with
        ``use_tf32 = 0``: fp32 means fp32); ``sess_options`` unless given: graph
        optimizations off for an ``ort-cpu`` artifact (it is optimized already), weights
        packed on the session's threads (``session.prepack.enable_parallel``), memory-reuse
        planning off where an input has a free dimension (ONNX Runtime's planner is
        quadratic in tensors of symbolic shape), and the metadata's ``session_hints``
        (one intra-op thread; no prepacking)."""
        import onnxruntime  # type: ignore[import-not-found, import-untyped, unused-ignore]

        out = dict(ort_kwargs)
        if "providers" not in out:
            wanted = self.providers()
            # Every onnxruntime has the CPU provider: no need to ask (13 us a session).
            own = wanted[0]
            if own != "CPUExecutionProvider" and own not in onnxruntime.get_available_providers():
                from ._files import provider_unavailable

                raise provider_unavailable(self, own, onnxruntime)
            providers: List[Any] = list(wanted)
            if "CUDAExecutionProvider" in providers and self.metadata.get("precision") == "fp32":
                # fp32 means fp32: the CUDA provider's TF32 (on by default) misses the fp32
                # tolerance the artifact was validated at (docs/trt.md, "TF32").
                i = providers.index("CUDAExecutionProvider")
                providers[i] = ("CUDAExecutionProvider", {"use_tf32": "0"})
            out["providers"] = providers
        if "sess_options" not in out:
            so = onnxruntime.SessionOptions()
            if self.backend == "ort-cpu":
                so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
            so.add_session_config_entry("session.prepack.enable_parallel", "1")
            if self._prepack_hint():
                so.add_session_config_entry("session.disable_prepacking", "1")
            if self.free_dims():
                so.enable_mem_reuse = False
            threads = self._threads_hint()
            if threads is not None and threads > 0:
                so.intra_op_num_threads = threads
            out["sess_options"] = so
        return out

    def session_options(self) -> "onnxruntime.SessionOptions":
        """A new copy of the ``onnxruntime.SessionOptions`` that ``session()`` uses unless
        given ``sess_options``, for a caller that changes one setting:
        ``so = art.session_options(); so.add_session_config_entry("session.disable_prepacking",
        "1"); art.session(sess_options=so)`` (docs/clients.md)."""
        options: "onnxruntime.SessionOptions" = self._ort_defaults({"providers": []})["sess_options"]
        return options

    def session_from_files(self, **ort_kwargs: Any) -> "onnxruntime.InferenceSession":
        """Like ``session()``, through the per-file descriptors only (ignores the directory)."""
        return self._session_from_files(self._ort_defaults(ort_kwargs))

    def _session_from_files(self, ort_kwargs: Dict[str, Any]) -> "onnxruntime.InferenceSession":
        from ._files import session_from_files

        return session_from_files(self, ort_kwargs)

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


class _Ready:
    """What a ready-index pointer says beyond the files: its fields (``key``, ``backend``,
    ``free_dims``, ``threads``, ...), the file names (graph first) and the metadata's JSON
    text, parsed only when ``Artifact.metadata`` is read."""

    __slots__ = ("fields", "names", "meta", "dir_id")

    def __init__(self, fields: Dict[str, str], names: List[str], meta: str, dir_id: Tuple[int, int]) -> None:
        self.fields = fields
        self.names = names
        self.meta = meta
        self.dir_id = dir_id  # (st_dev, st_ino) of the directory the files were opened in


def _plain_name(name: str) -> bool:
    """A relative path inside the artifact's folder (no ``..``, not absolute, not empty)."""
    return bool(name) and not name.startswith("/") and all(p not in ("", ".", "..") for p in name.split("/"))


READY_LOCK = ".lock"
"""The file in the ready index on which the running daemon holds a write lock: pointers are
trusted only while it is held (a killed daemon's, or one left by a daemon started with
``ready_index = false``, never are)."""


def _daemon_owned(st: "os.stat_result", owner: int) -> bool:
    """Owned by the daemon's user (the socket's owner) and writable by nobody else."""
    return st.st_uid == owner and st.st_mode & 0o022 == 0


def _trusted_index(socket_path: str) -> Optional[Tuple[int, int]]:
    """The ready index folder, opened, and the socket owner's uid, when a consumer may trust
    it (docs/protocol.md, "Who may write the ready index"): the socket is a socket; the folder
    is a real folder owned by the socket's owner and writable by nobody else; the daemon that
    made it still runs (it holds a write lock on :data:`READY_LOCK`). None otherwise."""
    try:
        sock = os.stat(socket_path)
    except (OSError, ValueError):
        return None
    if sock.st_mode & 0o170000 != 0o140000:  # S_IFSOCK
        return None
    owner = sock.st_uid
    try:
        d = os.open(socket_path + ".ready", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        if not _daemon_owned(os.fstat(d), owner):
            raise ValueError("not the daemon's")
        lock = os.open(READY_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=d)
        try:
            os.lockf(lock, os.F_TEST, 0)
        except OSError:
            return d, owner  # locked by another process: the daemon runs
        finally:
            os.close(lock)
        raise ValueError("no daemon holds the index")
    except (OSError, ValueError):
        os.close(d)
        return None


def _read_version(init: str) -> Optional[str]:
    """The ``__version__ = "..."`` line of a package's ``__init__.py`` (OSError when the file
    is not there)."""
    with open(init, encoding="utf-8") as f:
        for line in f:
            if line.startswith("__version__"):
                return line.split("=", 1)[1].strip().strip("\"'") or None
    return None


def _onnxruntime_version() -> Optional[str]:
    """The version of the ``onnxruntime`` this process imported, else of the one an import
    would find, read from its ``__init__.py`` without importing it: the first
    ``sys.path`` folder holding the package, as the import system looks (0.09 ms), then
    ``importlib.util.find_spec`` for other layouts (0.65 ms; ``importlib.metadata`` takes
    ~170 ms). None when there is none."""
    import sys

    mod = sys.modules.get("onnxruntime")
    v = getattr(mod, "__version__", None) if mod is not None else None
    if isinstance(v, str) and v:
        return v

    read = _read_version
    for entry in sys.path:
        init = os.path.join(entry or ".", "onnxruntime", "__init__.py")
        try:
            return read(init)
        except OSError:
            continue
        except (ValueError, IndexError):
            return None
    try:
        import importlib.util

        spec = importlib.util.find_spec("onnxruntime")
        if spec is None or not spec.origin:
            return None
        return read(spec.origin)
    except (OSError, ImportError, ValueError, IndexError):
        return None


def _tensorrt_release(v: str) -> Optional[str]:
    """``MAJOR.MINOR.PATCH`` of a ``tensorrt`` package version (``10.17.0.5`` → ``10.17.0``),
    as TensorRT's library reports itself (``getInferLibVersion``) and keys name it."""
    parts = []
    for p in v.split(".")[:3]:
        digits = ""
        for c in p:
            if not c.isdigit():
                break
            digits += c
        if not digits:
            return None
        parts.append(str(int(digits)))
    return ".".join(parts) if len(parts) == 3 else None


def _tensorrt_version() -> Optional[str]:
    """The version of the ``tensorrt`` this process imported, else of the one an import would
    find, read without importing it (the first ``sys.path`` folder holding ``tensorrt`` or
    ``tensorrt_bindings``, whose ``__init__.py`` the PyPI wheels put the version in), as
    ``MAJOR.MINOR.PATCH``. None when there is none (no ``find_spec`` fallback: most
    consumers have no TensorRT, and they should not pay for looking)."""
    import sys

    names = ("tensorrt", "tensorrt_bindings")
    for name in names:
        mod = sys.modules.get(name)
        v = getattr(mod, "__version__", None) if mod is not None else None
        if isinstance(v, str) and v:
            return _tensorrt_release(v)
    for entry in sys.path:
        for name in names:
            try:
                v = _read_version(os.path.join(entry or ".", name, "__init__.py"))
            except OSError:
                continue
            except (ValueError, IndexError):
                return None
            if v:
                return _tensorrt_release(v)
    return None


def _from_index(socket_path: str, model: str, runtime: Optional[Dict[str, str]] = None) -> Optional[Artifact]:
    """The artifact the daemon's ready index (``<socket>.ready/<model>``) names, its files
    opened and checked; None when there is no pointer or any check fails, and the caller asks
    over the socket. Checks (docs/protocol.md, "The ready index"): the folder, the pointer,
    the artifact's folder and files belong to the socket's owner and nobody else may write
    them, and the daemon that wrote the pointer still runs; the model's files the pointer
    lists still have the size, mtime and ctime the daemon scanned and its absent sidecar is
    still absent; each artifact file, opened by name in the artifact's folder, has the device,
    inode, size, mtime and ctime the daemon verified."""
    if not model or model.startswith(".") or "/" in model or "\x00" in model:
        return None
    trusted = _trusted_index(socket_path)
    if trusted is None:
        return None
    index, owner = trusted
    try:
        fd = os.open(model, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=index)
    except (OSError, ValueError):
        return None
    finally:
        os.close(index)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o170000 != 0o100000 or not _daemon_owned(st, owner):
            return None
        chunks = []
        while True:
            b = os.read(fd, 1 << 16)
            if not b:
                break
            chunks.append(b)
        text = b"".join(chunks).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)
    lines = text.split("\n")
    if lines[0] != READY_MAGIC:
        return None
    fields: Dict[str, str] = {}
    files: List[Tuple[Tuple[int, ...], str]] = []  # ((dev, ino, size, mtime_ns, ctime_ns), name)
    meta: Optional[str] = None
    try:
        for line in lines[1:]:
            k, _, v = line.partition("\t")
            if k == "file":
                f = v.split("\t", 5)
                want = tuple(int(x) for x in f[:5])
                if len(want) != 5 or not _plain_name(f[5]):
                    return None
                files.append((want, f[5]))
            elif k == "source":
                size, mtime, ctime, path = v.split("\t", 3)
                st = os.stat(path)
                if (st.st_size, st.st_mtime_ns, st.st_ctime_ns) != (int(size), int(mtime), int(ctime)):
                    return None
            elif k == "absent":
                if os.path.lexists(v):  # a sidecar written since: a new configuration
                    return None
            elif k == "meta":
                meta = v
            elif k:
                fields[k] = v
    except (OSError, ValueError, IndexError):
        return None
    if not files or meta is None or "dir" not in fields:
        return None
    if runtime and "runtime" in fields:
        # Built for another runtime than this consumer's: ask the socket, which serves (or
        # builds) the artifact for ours. A pointer without the line predates runtimes. The
        # line names every library the artifact's backend builds with; one it does not name
        # (TensorRT for ort-cpu, ONNX Runtime for trt) cannot differ, as the daemon judges.
        have = dict(p.split("=", 1) for p in fields["runtime"].split(",") if "=" in p)
        if any(k in have and have[k] != v for k, v in runtime.items()):
            return None
    try:
        d = os.open(fields["dir"], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    fds: List[int] = []
    try:
        if not _daemon_owned(os.fstat(d), owner):
            raise ValueError("the artifact's folder is not the daemon's")
        for want, name in files:
            h = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=d)
            fds.append(h)
            st = os.fstat(h)
            if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) != want:
                raise ValueError("changed since it was verified")
            if st.st_mode & 0o170000 != 0o100000 or not _daemon_owned(st, owner):
                raise ValueError("not the daemon's file")
    except (OSError, ValueError):
        _close_all(fds + [d])
        return None
    st = os.fstat(d)
    return Artifact(None, fds, d, _Ready(fields, [name for _, name in files], meta, (st.st_dev, st.st_ino)))


def _close_all(fds: Iterable[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _loads(text: str) -> Any:
    """``json.loads(text)`` through the client's codec (``trtcache_client._codec``)."""
    from ._codec import loads

    return loads(text)


def _dumps(v: Any) -> str:
    """``json.dumps(v)`` for what requests hold, through the client's codec."""
    from ._codec import dumps

    return str(dumps(v))


class Client:
    """A client of the daemon at ``socket_path`` (else ``$TRTCACHE_SOCKET``, else
    :data:`DEFAULT_SOCKET`).

    ``acquire`` of a model's default variant (no ``profile``, ``backend`` or ``version``)
    first looks in the daemon's ready index (``<socket>.ready/``, docs/protocol.md): when the
    daemon published the artifact there, and the model's files and the artifact's are still
    what it verified, the files are opened directly, with no round trip and without loading
    the socket layer. Everything else goes over one connection, made when a call first needs
    it (``hello`` goes out then, its answer read with the first request's): a daemon that
    cannot be reached raises :class:`ConnectionFailed` at that call, one that refuses the
    ``hello`` (:class:`Busy`, :class:`UnsupportedVersion`) too; :meth:`connect` connects now.
    ``ready_index=False``: every acquire asks the socket.

    ``timeout``: seconds each send or receive may take (None: wait for ever); when it
    passes, the call raises :class:`ConnectionTimeout` and the connection is reset: the late
    answer and its descriptors are dropped with the old socket, and the next call connects
    (and says ``hello``) again. The same reset follows any error that leaves the connection
    mid-frame and the error codes after which the daemon closes it (``busy``,
    ``idle_timeout``, ``frame_too_large``, ``shutting_down``). ``max_response``: the largest
    response frame accepted (:class:`ResponseTooLarge`)."""

    def __init__(
        self,
        socket_path: Optional[Union[str, "os.PathLike[str]"]] = None,
        timeout: Optional[float] = None,
        max_response: int = DEFAULT_MAX_RESPONSE,
        ready_index: bool = True,
        runtime: Union[str, Dict[str, str], None] = "auto",
    ) -> None:
        self.path: str = os.fspath(socket_path or os.environ.get("TRTCACHE_SOCKET") or DEFAULT_SOCKET)
        self.timeout: Optional[float] = timeout
        self.max_response: int = int(max_response)
        self.ready_index: bool = bool(ready_index)
        self._runtime_arg = runtime
        self._runtime: Optional[Dict[str, str]] = None
        self._runtime_known = False
        self._ch: Optional["Channel"] = None

    @property
    def runtime(self) -> Optional[Dict[str, str]]:
        """The runtime ``acquire`` asks artifacts for (``{"onnxruntime": "1.31.1"}``), or None
        for the daemon's current runtime. ``runtime="auto"`` (the default) is the
        ``onnxruntime`` this process imported, else the one it would import (found without
        importing it), and likewise the ``tensorrt`` (``MAJOR.MINOR.PATCH``) when there is
        one; a version string names ONNX Runtime's; a dict names each library;
        None sends nothing (what clients before this option did)."""
        if not self._runtime_known:
            arg = self._runtime_arg
            if arg == "auto":
                found = {"onnxruntime": _onnxruntime_version(), "tensorrt": _tensorrt_version()}
                self._runtime = {k: v for k, v in found.items() if v} or None
            elif isinstance(arg, str):
                self._runtime = {"onnxruntime": arg} if arg else None
            elif isinstance(arg, dict):
                self._runtime = {str(k): str(v) for k, v in arg.items()} or None
            else:
                self._runtime = None
            self._runtime_known = True
        return self._runtime

    def _channel(self) -> "Channel":
        """The socket side (``trtcache_client._wire``), loaded on first use."""
        if self._ch is None:
            from ._wire import Channel

            self._ch = Channel(self)
        return self._ch

    @property
    def resets(self) -> int:
        """How many times the connection was reset (after a timeout or a broken frame)."""
        return self._ch.resets if self._ch is not None else 0

    def connect(self) -> "Client":
        """Connects now (a no-op when connected) and reads the daemon's ``hello`` answer:
        raises :class:`ConnectionFailed` when no daemon answers, :class:`Busy` or
        :class:`UnsupportedVersion` when it refuses. Returns the client."""
        self._channel().connect()
        return self

    @property
    def server(self) -> Optional[str]:
        """The daemon's name and version, from its ``hello`` answer (connects if needed)."""
        return self._channel().server

    @property
    def max_frame(self) -> Optional[int]:
        """The largest request frame the daemon takes, from its ``hello`` answer (connects
        if needed)."""
        return self._channel().max_frame

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
        this one, or a long wait ends as :class:`ConnectionTimeout`. The default variant
        comes from the ready index when the daemon published it there
        (``Artifact.from_index``)."""
        runtime = self.runtime
        if self.ready_index and profile is None and backend is None and version is None:
            art = _from_index(self.path, model, runtime)
            if art is not None:
                return art
        return self._channel().acquire(model, profile, backend, wait, timeout, version, runtime)

    def list(self) -> List[Json]:
        """Every model with versions and per-variant state."""
        return self._channel().list()

    def status(self, model: str) -> Json:
        """One model's state."""
        return self._channel().status(model)

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
        return self._channel().build(models, backend, timeout, on_progress, paths)

    def stats(self, prometheus: bool = False) -> Any:
        """Counters as a dict, or Prometheus text (a str) with ``prometheus=True``."""
        return self._channel().stats(prometheus)

    def rescan(self) -> Json:
        """Has the daemon scan its repository now: ``root``, ``settle_ms``, every model found
        in ``models`` (``settled`` once the daemon serves exactly its files) and every entry
        it skips in ``skipped``, with the reason."""
        return self._channel().rescan()

    def evict(self, model: Optional[str] = None, key: Optional[str] = None) -> int:
        """Admin: evicts a model's artifacts or one key; returns the number removed."""
        return self._channel().evict(model, key)

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
        self._channel().shutdown()

    def close(self) -> None:
        """Closes the connection (a later call connects again)."""
        if self._ch is not None:
            self._ch.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Client for the trtcache daemon (standard library only).

    from trtcache_client import Client
    art = Client("/run/trtcache/trtcache.sock").acquire("resnet50")
    sess = art.session()            # onnxruntime.InferenceSession
    print(art.metadata["key"])

Wire format (docs/protocol.md): frames of a 4-byte big-endian length and a JSON object;
artifact files arrive as read-only descriptors (SCM_RIGHTS) with the `artifact` frame.
Errors raise TrtcacheError with a `.code` string (`not_found`, `bad_name`, ...).
"""

import json
import os
import shutil
import socket
import struct
import tempfile

__all__ = ["Client", "Artifact", "TrtcacheError", "PROTOCOL_VERSION", "DEFAULT_SOCKET"]

PROTOCOL_VERSION = 1
DEFAULT_SOCKET = "/run/trtcache/trtcache.sock"
MAX_FDS = 32


class TrtcacheError(Exception):
    """A typed error from the daemon (`.code`) or the connection (`code="connection"`)."""

    def __init__(self, code, message):
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message


class Artifact:
    """An acquired artifact: `.metadata` (dict), `.fds` (open read-only descriptors,
    graph first, in the order of `metadata["files"]`) and `.dir_fd` (a read-only descriptor
    of the artifact's directory, or None when the daemon sent none)."""

    def __init__(self, metadata, fds, dir_fd=None):
        self.metadata = metadata
        self.fds = fds
        self.dir_fd = dir_fd

    def dir_graph_path(self):
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

    def graph_bytes(self):
        """The graph file's bytes."""
        fd = self.fds[0]
        size = os.fstat(fd).st_size
        chunks, off = [], 0
        while off < size:
            b = os.pread(fd, min(size - off, 1 << 24), off)
            if not b:
                break
            chunks.append(b)
            off += len(b)
        return b"".join(chunks)

    def session(self, **ort_kwargs):
        """An onnxruntime.InferenceSession over this artifact. With the directory descriptor
        (and `dir_graph_path()` usable) the graph is opened in place as
        /proc/self/fd/D/<name>, external data found next to it; otherwise through
        /proc/self/fd/N, a graph with external data through a private temp folder of
        symlinks to /proc/self/fd/N named as the graph expects (removed once the session
        exists). ONNX Runtime reads or maps the files while it creates the session, so the
        session does not need the descriptors afterwards. An ``ort-cpu`` artifact
        is already optimized for this machine, so unless ``sess_options`` is given it is opened
        with graph optimizations off (re-optimizing it gives the same graph, only slower)."""
        import onnxruntime

        ort_kwargs = self._ort_defaults(ort_kwargs)
        graph = self.dir_graph_path()
        if graph is not None:
            try:
                return onnxruntime.InferenceSession(graph, **ort_kwargs)
            except Exception:
                pass  # e.g. the blob was collected in between: the descriptors still work
        return self.session_from_files(**ort_kwargs)

    def free_dims(self):
        """Whether any input of the artifact has a dimension without a fixed size."""
        return any(
            not isinstance(d, int)
            for t in self.metadata.get("inputs", [])
            for d in (t.get("shape") or [None])
        )

    def _ort_defaults(self, ort_kwargs):
        """The session options ``session()`` uses unless ``sess_options`` is given: for an
        ``ort-cpu`` artifact, graph optimizations off (it is optimized already); for every
        artifact, weights packed on the session's threads
        (``session.prepack.enable_parallel``); and where an input has a free dimension,
        ONNX Runtime's memory-reuse planning off (``enable_mem_reuse``): its planner is
        quadratic in tensors of symbolic shape (a 7,570-node artifact: 13.3 s to plan, 0.38 s
        without; the arena still recycles freed buffers, same peak memory in
        BENCHMARKS.md). ONNX Runtime's C API has no switch for the latter, so only this
        client does it."""
        import onnxruntime

        if "sess_options" in ort_kwargs:
            return ort_kwargs
        so = onnxruntime.SessionOptions()
        if self.metadata.get("backend") == "ort-cpu":
            so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.add_session_config_entry("session.prepack.enable_parallel", "1")
        if self.free_dims():
            so.enable_mem_reuse = False
        return dict(ort_kwargs, sess_options=so)

    def session_from_files(self, **ort_kwargs):
        """Like `session()`, through the per-file descriptors only (ignores the directory)."""
        import onnxruntime

        ort_kwargs = self._ort_defaults(ort_kwargs)
        files = self.metadata.get("files", [])
        if len(self.fds) == 1:
            # ONNX Runtime opens the descriptor through /proc: no copy into Python.
            return onnxruntime.InferenceSession("/proc/self/fd/%d" % self.fds[0], **ort_kwargs)
        if not self.fds:
            raise TrtcacheError("internal", "artifact has no files")
        d = tempfile.mkdtemp(prefix="trtcache-artifact-")
        try:
            graph = os.path.join(d, "model.onnx")
            for i, (meta, fd) in enumerate(zip(files, self.fds)):
                if i == 0:
                    link = graph
                else:
                    name = meta["name"]
                    if os.path.isabs(name) or ".." in name.split("/"):
                        raise TrtcacheError("bad_name", "external data name %r" % name)
                    link = os.path.join(d, name)
                    os.makedirs(os.path.dirname(link), exist_ok=True)
                os.symlink("/proc/self/fd/%d" % fd, link)
            return onnxruntime.InferenceSession(graph, **ort_kwargs)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def close(self):
        """Closes the descriptors."""
        for fd in self.fds + ([self.dir_fd] if self.dir_fd is not None else []):
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []
        self.dir_fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


class Client:
    """One connection to the daemon; `hello` is sent on construction."""

    def __init__(self, socket_path=None, timeout=None):
        path = socket_path or os.environ.get("TRTCACHE_SOCKET") or DEFAULT_SOCKET
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(path)
        except OSError as e:
            self._sock.close()
            raise TrtcacheError("connection", "cannot connect to %s: %s" % (path, e)) from e
        hello = self._call({"op": "hello", "version": PROTOCOL_VERSION, "client": "trtcache_client.py/0.1"})[0]
        self.server = hello.get("server")
        self.max_frame = hello.get("max_frame")

    # -- framing -----------------------------------------------------------------
    def _send(self, obj):
        body = json.dumps(obj).encode()
        self._sock.sendall(struct.pack(">I", len(body)) + body)

    def _recv_exact(self, n, fds):
        buf = bytearray()
        while len(buf) < n:
            data, got, _flags, _addr = socket.recv_fds(self._sock, n - len(buf), MAX_FDS)
            fds.extend(got)
            if not data:
                raise TrtcacheError("connection", "daemon closed the connection")
            buf += data
        return bytes(buf)

    def _recv(self):
        fds = []
        try:
            (n,) = struct.unpack(">I", self._recv_exact(4, fds))
            msg = json.loads(self._recv_exact(n, fds))
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        if msg.get("kind") == "error":
            for fd in fds:
                os.close(fd)
            raise TrtcacheError(msg.get("code", "internal"), msg.get("message", ""))
        return msg, fds

    def _call(self, obj):
        try:
            self._send(obj)
        except (BrokenPipeError, ConnectionResetError) as broken:
            # The daemon may have answered and closed before reading (`busy` at its
            # connection limit): its error frame says why, the broken pipe does not.
            try:
                self._recv()
            except TrtcacheError as answer:
                if answer.code != "connection":
                    raise answer from broken
            except OSError:
                pass
            raise
        return self._recv()

    # -- requests ----------------------------------------------------------------
    def list(self):
        """Every model with versions and per-variant state."""
        return self._call({"op": "list"})[0]["models"]

    def status(self, model):
        """One model's state."""
        return self._call({"op": "status", "model": model})[0]["model"]

    def acquire(self, model, profile=None, backend=None, wait=True, timeout=None, version=None):
        """A ready artifact; waits for a build when `wait` (up to `timeout` seconds)."""
        req = {"op": "acquire", "model": model, "wait": bool(wait), "dir_fd": True}
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
            for fd in fds:
                os.close(fd)
            raise TrtcacheError("internal", "unexpected response %r (%d descriptors)" % (msg.get("kind"), len(fds)))
        dir_fd = fds.pop() if di is not None else None
        return Artifact(meta, fds, dir_fd)

    def build(self, models=None, backend=None, timeout=None, on_progress=None, paths=None):
        """Builds models (all when None and no paths); calls on_progress(event) per event;
        returns results. paths: model files outside the repository, by absolute path (admin
        only: root or the daemon's user)."""
        req = {"op": "build", "models": list(models or [])}
        if paths:
            req["paths"] = [str(p) for p in paths]
        if backend is not None:
            req["backend"] = backend
        if timeout is not None:
            req["timeout_ms"] = int(timeout * 1000)
        self._send(req)
        while True:
            msg, _ = self._recv()
            if msg.get("kind") == "progress":
                if on_progress:
                    on_progress(msg)
            else:
                return msg["results"]

    def stats(self, prometheus=False):
        """Counters as a dict, or Prometheus text."""
        msg = self._call({"op": "stats", "format": "prometheus" if prometheus else "json"})[0]
        return msg["text"] if prometheus else msg["stats"]

    def evict(self, model=None, key=None):
        """Admin: evict a model's artifacts or one key; returns the number removed."""
        return self._call({"op": "evict", "model": model, "key": key})[0]["removed"]

    def shutdown(self):
        """Admin: stop the daemon."""
        self._call({"op": "shutdown"})

    def close(self):
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

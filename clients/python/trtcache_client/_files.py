"""The artifact's colder paths, loaded on first use: checking a directory sent over the
socket, reading a ``trt`` engine, and the fall-back session through per-file descriptors.
A consumer on the common path (an ``ort-*`` artifact opened in its directory) never loads
this module."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, Optional

from . import _err

if TYPE_CHECKING:
    import onnxruntime  # type: ignore[import-not-found, import-untyped, unused-ignore]

    from . import Artifact


def read_fd(fd: int) -> bytes:
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


def dir_graph_path(art: "Artifact") -> Optional[str]:
    """``Artifact.dir_graph_path`` for an artifact sent over the socket: every file must open
    in the sent directory as the very file whose descriptor was sent."""
    files = art.metadata.get("files", [])
    if art.dir_fd is None or not files or len(files) != len(art.fds):
        return None
    d = "/proc/self/fd/%d" % art.dir_fd
    for i, (meta, fd) in enumerate(zip(files, art.fds)):
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


def graph_bytes(art: "Artifact") -> bytes:
    if not art.fds:
        raise _err().UnexpectedResponse("artifact has no files")
    return read_fd(art.fds[0])


def engine_fd(art: "Artifact", name: str) -> int:
    """The descriptor of a ``trt`` artifact's file ``name``."""
    if art.backend != "trt":
        raise _err().NotAnEngine(
            "artifact %s of %r was built by %s: an ONNX model, not a TensorRT engine "
            "(acquire backend=\"trt\" for one, or use session())"
            % (art.key[:12], art.metadata.get("model", "?"), art.backend)
        )
    for meta, fd in zip(art.metadata.get("files", []), art.fds):
        if meta.get("name") == name:
            return fd
    raise _err().UnexpectedResponse("trt artifact has no %s" % name)


def provider_unavailable(art: "Artifact", provider: str, ort: Any) -> Exception:
    """The error for an artifact whose backend's provider this ``onnxruntime`` lacks."""
    e: Exception = _err().ProviderUnavailable(
        "artifact %s of %r was built by %s and needs %s, which this onnxruntime "
        "(%s) lacks (available: %s); install onnxruntime-gpu with CUDA/TensorRT "
        "(docs/daemon.md, GPU host), or pass providers= to choose"
        % (
            art.key[:12],
            art.metadata.get("model", "?"),
            art.backend,
            provider,
            getattr(ort, "__version__", "?"),
            ", ".join(ort.get_available_providers()),
        )
    )
    return e


def _any_removed(art: "Artifact") -> bool:
    """Whether a file of the artifact has no name left (``st_nlink`` 0: evicted, removed)."""
    try:
        return any(os.fstat(fd).st_nlink == 0 for fd in art.fds)
    except OSError:
        return True


def _copy_fd(fd: int, to: str) -> None:
    """Copies the whole file behind ``fd`` to a new file ``to`` (the descriptor's offset is
    left as it was: a fresh open through /proc, which works for a removed file too)."""
    src = os.open("/proc/self/fd/%d" % fd, os.O_RDONLY | os.O_CLOEXEC)
    try:
        dst = os.open(to, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            size, off = os.fstat(src).st_size, 0
            while off < size:
                try:
                    n = os.sendfile(dst, src, off, min(size - off, 1 << 30))
                except OSError:
                    b = os.pread(src, min(size - off, 1 << 24), off)
                    n = os.write(dst, b) if b else 0
                if n <= 0:
                    break
                off += n
        finally:
            os.close(dst)
    finally:
        os.close(src)


def _private_view(art: "Artifact", copy: bool, ort_kwargs: Dict[str, Any]) -> "onnxruntime.InferenceSession":
    """A session from a private temp folder holding the graph as ``model.onnx`` and each
    external file under its name: symlinks to ``/proc/self/fd/N``, or (``copy``) copies read
    from the descriptors. The folder is removed once the session exists."""
    import shutil
    import tempfile

    import onnxruntime  # type: ignore[import-not-found, import-untyped, unused-ignore]

    files = art.metadata.get("files", [])
    d = tempfile.mkdtemp(prefix="trtcache-artifact-")
    try:
        graph = os.path.join(d, "model.onnx")
        for i, (meta, fd) in enumerate(zip(files, art.fds)):
            if i == 0:
                at = graph
            else:
                name = meta["name"]
                if os.path.isabs(name) or ".." in name.split("/"):
                    raise _err().BadName("external data name %r" % name)
                at = os.path.join(d, name)
                os.makedirs(os.path.dirname(at), exist_ok=True)
            if copy:
                _copy_fd(fd, at)
            else:
                os.symlink("/proc/self/fd/%d" % fd, at)
        return onnxruntime.InferenceSession(graph, **ort_kwargs)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def session_from_files(art: "Artifact", ort_kwargs: Dict[str, Any]) -> "onnxruntime.InferenceSession":
    """A session through the per-file descriptors: ``/proc/self/fd/N`` for a lone graph; for a
    graph with external data, a private temp folder of symlinks named as the graph expects,
    or, when a file was removed since it was opened (the artifact evicted: ONNX Runtime
    resolves each external file's real path, which a removed file no longer has), of copies
    read from the descriptors. The folder is removed once the session exists (ONNX Runtime
    has read or mapped the files by then)."""
    import onnxruntime  # type: ignore[import-not-found, import-untyped, unused-ignore]

    if len(art.fds) == 1:
        # ONNX Runtime opens the descriptor through /proc: no copy into Python.
        return onnxruntime.InferenceSession("/proc/self/fd/%d" % art.fds[0], **ort_kwargs)
    if not art.fds:
        raise _err().UnexpectedResponse("artifact has no files")
    if not _any_removed(art):
        try:
            return _private_view(art, False, ort_kwargs)
        except Exception:
            if not _any_removed(art):
                raise
            # Evicted while ONNX Runtime read it: copies next.
    return _private_view(art, True, ort_kwargs)

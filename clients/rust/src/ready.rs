//! The ready index: the daemon's published list of artifacts that a plain acquire would hand
//! out right now, one small file per model in a folder next to the socket
//! (`<socket>.ready/<model>`, [`ready_dir`]). A local consumer that can read it opens the
//! artifact's files itself and skips the socket round trip (and, in Python, importing the
//! socket module): about 0.7 ms of a small model's time to first inference (BENCHMARKS.md).
//!
//! The daemon stays the authority: it writes a pointer only for an artifact that is ready and
//! validated, replaces it atomically (rename) when that changes, removes it when the model
//! changes, is removed or evicted, and empties the folder when it starts and stops. A
//! consumer trusts a pointer only when every check holds, and otherwise asks over the socket
//! as before (docs/protocol.md, "Who may write the ready index"):
//! - the socket path is a socket; the folder (not a link) and the pointer (a regular file, not
//!   a link) belong to the socket's owner, the daemon's user, and nobody else may write them
//!   ([`daemon_owned`]); and the daemon that made the folder still runs (it holds a write lock
//!   on [`READY_LOCK`]), so a killed daemon's pointers are never read;
//! - the model's files the pointer lists still have the size, mtime and ctime the daemon's
//!   scan recorded ([`ReadyPointer::sources`]: a bounded set, the graph, its sidecar or the
//!   sidecar's absence, its folder; the daemon watches every other file of the model and
//!   takes the pointer away when one changes), so a model edited since is never served from
//!   its old artifact;
//! - [`ReadyPointer::dir`] and every artifact file opened by name in it belong to the socket's
//!   owner with nobody else allowed to write them, and each file has the device, inode, size,
//!   mtime and ctime the daemon last verified ([`ReadyPointer::files`]), as the daemon checks
//!   the descriptors it hands out.
//!
//! Uses are still counted: the daemon watches the folder with inotify and counts each open of
//! a pointer as a hit of its artifact (`hits`, `fast_hits`, and the LRU's `last_used`).
//!
//! The format is lines of tab-separated fields, a path or JSON text last, so a consumer parses
//! it with string splits (no JSON module in the common path):
//!
//! ```text
//! trtcache-ready 1
//! key     <64 hex digits>
//! model   <name>
//! version <n>
//! backend <ort-cpu|…>
//! free_dims       <0|1>
//! threads <n>                      (only with session_hints.intra_op_num_threads)
//! prepack 0                        (only with session_hints.disable_prepacking)
//! dir     <absolute path of the artifact's folder>
//! file    <dev> <ino> <size> <mtime_ns> <ctime_ns> <name>      (graph first)
//! source  <size> <mtime_ns> <ctime_ns> <absolute path>        (the graph, sidecar, folder)
//! absent  <absolute path>                                     (must not exist)
//! meta    <the acquire's ArtifactMeta as JSON, dir_fd_index unset>
//! ```

use std::path::{Path, PathBuf};

use crate::protocol::ArtifactMeta;

/// The first line of every pointer; a consumer ignores a pointer with any other.
pub const READY_MAGIC: &str = "trtcache-ready 1";

/// The ready index folder of the daemon listening at `socket`: `<socket>.ready`.
pub fn ready_dir(socket: &Path) -> PathBuf {
    let mut s = socket.as_os_str().to_owned();
    s.push(".ready");
    PathBuf::from(s)
}

/// One artifact file as the daemon last verified it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadyFile {
    /// Its name in [`ReadyPointer::dir`] (the metadata's `files[i].name`).
    pub name: String,
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
    /// Bytes.
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// Status-change time, nanoseconds since the epoch.
    pub ctime_ns: i128,
}

/// One file the model is made of, as the daemon's repository scan recorded it; `stamp` is
/// `None` for a path that must not exist (a sidecar the model does not have yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadySource {
    /// Absolute path.
    pub path: PathBuf,
    /// `(size, mtime_ns, ctime_ns)`, or `None`: absent.
    pub stamp: Option<(u64, i128, i128)>,
}

/// A published pointer: what a plain `acquire(model)` would return now.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadyPointer {
    /// The acquire's metadata (`dir_fd_index` unset).
    pub metadata: ArtifactMeta,
    /// The folder holding every file of the artifact.
    pub dir: PathBuf,
    /// The artifact's files, graph first (the metadata's `files` order).
    pub files: Vec<ReadyFile>,
    /// The model's files a consumer checks (the graph, a sidecar, Triton's `config.pbtxt`,
    /// the model's folder) and paths that must stay absent.
    pub sources: Vec<ReadySource>,
}

/// Why a pointer could not be read.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadyError {
    /// Not a pointer of this format version.
    Magic(String),
    /// A line that does not parse.
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        why: String,
    },
    /// A field the pointer must have is missing, or disagrees with the metadata.
    Incomplete(String),
}

impl std::fmt::Display for ReadyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadyError::Magic(first) => {
                write!(f, "not a trtcache ready pointer (first line {first:?})")
            }
            ReadyError::Line { line, why } => write!(f, "ready pointer line {line}: {why}"),
            ReadyError::Incomplete(why) => write!(f, "ready pointer: {why}"),
        }
    }
}

impl std::error::Error for ReadyError {}

/// Whether `files` are the metadata's files, in order, by name (and not none).
fn files_match(files: &[ReadyFile], meta: &ArtifactMeta) -> bool {
    !files.is_empty()
        && files.len() == meta.files.len()
        && files.iter().zip(&meta.files).all(|(f, m)| f.name == m.name)
}

/// Whether `s` can be a field of a pointer (no tab or line break).
fn plain(s: &str) -> bool {
    !s.contains(['\t', '\n', '\r'])
}

impl ReadyPointer {
    /// Whether an input of the artifact has a dimension without a fixed size (a name, an
    /// unknown, a negative size): the Python client then turns ONNX Runtime's memory-reuse
    /// planning off (docs/clients.md).
    pub fn free_dims(&self) -> bool {
        self.metadata
            .inputs
            .iter()
            .any(|t| t.shape.is_empty() || t.shape.iter().any(|d| d.as_i64().is_none_or(|n| n < 0)))
    }

    /// The pointer's text, or `None` when a path or name cannot be written in it (a tab or
    /// line break in it: such an artifact is served over the socket only).
    pub fn render(&self) -> Option<String> {
        use std::fmt::Write;
        let m = &self.metadata;
        if !files_match(&self.files, m) {
            return None;
        }
        let dir = self.dir.to_str()?;
        let names = [m.key.as_str(), &m.model, &m.backend, dir];
        if !names.iter().all(|s| plain(s)) || !self.files.iter().all(|f| plain(&f.name)) {
            return None;
        }
        let mut meta = m.clone();
        meta.dir_fd_index = None;
        let json = serde_json::to_string(&meta).ok()?;
        let mut out = String::with_capacity(json.len() + 512);
        let _ = writeln!(out, "{READY_MAGIC}");
        let _ = writeln!(out, "key\t{}", m.key);
        let _ = writeln!(out, "model\t{}", m.model);
        let _ = writeln!(out, "version\t{}", m.version);
        let _ = writeln!(out, "backend\t{}", m.backend);
        let _ = writeln!(out, "free_dims\t{}", u8::from(self.free_dims()));
        if let Some(t) = m
            .session_hints
            .as_ref()
            .and_then(|h| h.intra_op_num_threads)
        {
            let _ = writeln!(out, "threads\t{t}");
        }
        if m.session_hints.as_ref().and_then(|h| h.disable_prepacking) == Some(true) {
            let _ = writeln!(out, "prepack\t0");
        }
        if !m.runtime.is_empty() {
            // `lib=version` pairs, sorted: a consumer checks its runtime without parsing JSON.
            let pairs: Vec<String> = m.runtime.iter().map(|(k, v)| format!("{k}={v}")).collect();
            if pairs.iter().any(|p| !plain(p) || p.contains(',')) {
                return None;
            }
            let _ = writeln!(out, "runtime\t{}", pairs.join(","));
        }
        let _ = writeln!(out, "dir\t{dir}");
        for f in &self.files {
            let _ = writeln!(
                out,
                "file\t{}\t{}\t{}\t{}\t{}\t{}",
                f.dev, f.ino, f.size, f.mtime_ns, f.ctime_ns, f.name
            );
        }
        for s in &self.sources {
            let p = s.path.to_str().filter(|p| plain(p))?;
            match s.stamp {
                Some((size, mtime, ctime)) => {
                    let _ = writeln!(out, "source\t{size}\t{mtime}\t{ctime}\t{p}");
                }
                None => {
                    let _ = writeln!(out, "absent\t{p}");
                }
            }
        }
        let _ = writeln!(out, "meta\t{json}");
        Some(out)
    }

    /// Reads a pointer's text (what [`ReadyPointer::render`] wrote).
    pub fn parse(text: &str) -> Result<ReadyPointer, ReadyError> {
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, READY_MAGIC)) => {}
            first => return Err(ReadyError::Magic(first.map_or("", |(_, l)| l).into())),
        }
        let mut metadata = None;
        let mut dir = None;
        let mut files = Vec::new();
        let mut sources = Vec::new();
        let mut key = None;
        for (i, line) in lines {
            let bad = |why: &str| ReadyError::Line {
                line: i + 1,
                why: why.into(),
            };
            let (field, rest) = line.split_once('\t').ok_or_else(|| bad("no tab"))?;
            match field {
                "meta" => {
                    metadata = Some(
                        serde_json::from_str::<ArtifactMeta>(rest)
                            .map_err(|e| bad(&format!("metadata: {e}")))?,
                    )
                }
                "dir" => dir = Some(PathBuf::from(rest)),
                "key" => key = Some(rest.to_string()),
                "file" => {
                    let f: Vec<&str> = rest.splitn(6, '\t').collect();
                    if f.len() != 6 {
                        return Err(bad("a file line has 6 fields"));
                    }
                    let n = |s: &str| s.parse::<u64>().map_err(|_| bad("not a number"));
                    let t = |s: &str| s.parse::<i128>().map_err(|_| bad("not a number"));
                    files.push(ReadyFile {
                        dev: n(f[0])?,
                        ino: n(f[1])?,
                        size: n(f[2])?,
                        mtime_ns: t(f[3])?,
                        ctime_ns: t(f[4])?,
                        name: f[5].to_string(),
                    });
                }
                "source" => {
                    let f: Vec<&str> = rest.splitn(4, '\t').collect();
                    if f.len() != 4 {
                        return Err(bad("a source line has 4 fields"));
                    }
                    let size = f[0].parse::<u64>().map_err(|_| bad("not a number"))?;
                    let mtime = f[1].parse::<i128>().map_err(|_| bad("not a number"))?;
                    let ctime = f[2].parse::<i128>().map_err(|_| bad("not a number"))?;
                    sources.push(ReadySource {
                        path: PathBuf::from(f[3]),
                        stamp: Some((size, mtime, ctime)),
                    });
                }
                "absent" => sources.push(ReadySource {
                    path: PathBuf::from(rest),
                    stamp: None,
                }),
                // The rest repeat the metadata for consumers without a JSON parser at hand;
                // a field this version does not know is skipped (a later format may add one).
                _ => {}
            }
        }
        let metadata = metadata.ok_or_else(|| ReadyError::Incomplete("no meta line".into()))?;
        let dir = dir.ok_or_else(|| ReadyError::Incomplete("no dir line".into()))?;
        if key.as_deref() != Some(metadata.key.as_str()) {
            return Err(ReadyError::Incomplete(
                "the key line disagrees with the metadata".into(),
            ));
        }
        if !files_match(&files, &metadata) {
            return Err(ReadyError::Incomplete(
                "the file lines disagree with the metadata's files".into(),
            ));
        }
        Ok(ReadyPointer {
            metadata,
            dir,
            files,
            sources,
        })
    }
}

/// The file in the index folder on which the running daemon holds a write lock (an open
/// file description lock, taken when it made the folder and held until it exits): a pointer
/// is trusted only while that lock is held, so the pointers of a daemon that was killed, or
/// that a daemon started with `ready_index = false` left behind, are never read.
pub const READY_LOCK: &str = ".lock";

/// Whether `m` belongs to `owner` and nobody else may write it (no group or other write
/// bit): what a consumer asks of the index folder, its pointers, the artifact's folder and
/// its files, with `owner` the socket's owner (the daemon's user).
pub fn daemon_owned(m: &std::fs::Metadata, owner: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    m.uid() == owner && m.mode() & 0o022 == 0
}

/// Whether some process holds a write lock on `f` (`F_GETLK`; any error reads as "no").
fn write_locked(f: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed `flock` is a valid value of the plain C struct.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = libc::F_RDLCK as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: a valid descriptor and a valid, exclusively borrowed `flock`.
    let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETLK, &mut l) };
    r == 0 && l.l_type != libc::F_UNLCK as libc::c_short
}

/// The index folder of the daemon at `socket`, opened, when a consumer may trust it: the
/// socket is a socket, the folder is a real folder (not a link) owned by the socket's owner
/// and writable by nobody else, and the daemon that made it still runs (it holds
/// [`READY_LOCK`]). Returns the folder and the owner's uid.
fn trusted_index(socket: &Path) -> Option<(std::fs::File, u32)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
    let sock = std::fs::metadata(socket).ok()?;
    if !sock.file_type().is_socket() {
        return None;
    }
    let owner = sock.uid();
    let index = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(ready_dir(socket))
        .ok()?;
    if !daemon_owned(&index.metadata().ok()?, owner) {
        return None;
    }
    let lock = open_at(&index, READY_LOCK, libc::O_NOFOLLOW)?;
    write_locked(&lock).then_some((index, owner))
}

/// The artifact the ready index of the daemon at `socket` names for `model` (its default
/// variant), its files opened and checked as the module docs say; `None` when there is no
/// pointer or any check fails: then ask over the socket ([`crate::Client::acquire_model`]
/// does both).
pub fn acquire(socket: &Path, model: &str) -> Option<crate::Artifact> {
    acquire_for(socket, model, None)
}

/// [`acquire`] for a consumer on `runtime`: `None` also when the pointer's artifact was
/// built for another runtime ([`crate::protocol::Runtime::matches`]), so the caller asks the
/// socket, which serves the artifact built for `runtime`.
pub fn acquire_for(
    socket: &Path,
    model: &str,
    runtime: Option<&crate::protocol::Runtime>,
) -> Option<crate::Artifact> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    if !crate::protocol::valid_model_name(model) {
        return None;
    }
    let (index, owner) = trusted_index(socket)?;
    let mut f = open_at(&index, model, libc::O_NOFOLLOW)?;
    let m = f.metadata().ok()?;
    if !m.is_file() || !daemon_owned(&m, owner) {
        return None;
    }
    let mut text = String::new();
    f.read_to_string(&mut text).ok()?;
    drop(f);
    let p = ReadyPointer::parse(&text).ok()?;
    if let Some(rt) = runtime {
        if !p.metadata.runtime.is_empty() && !rt.matches(&p.metadata.runtime) {
            return None;
        }
    }
    let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
    for s in &p.sources {
        match s.stamp {
            Some((size, mtime, ctime)) => {
                let m = std::fs::metadata(&s.path).ok()?;
                if (
                    m.size(),
                    ns(m.mtime(), m.mtime_nsec()),
                    ns(m.ctime(), m.ctime_nsec()),
                ) != (size, mtime, ctime)
                {
                    return None;
                }
            }
            None => {
                if std::fs::symlink_metadata(&s.path).is_ok() {
                    return None;
                }
            }
        }
    }
    let dir = open_dir(&p.dir)?;
    if !daemon_owned(&dir.metadata().ok()?, owner) {
        return None;
    }
    let mut files = Vec::with_capacity(p.files.len());
    for f in &p.files {
        if f.name.is_empty()
            || f.name.starts_with('/')
            || f.name
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return None;
        }
        let file = open_at(&dir, &f.name, 0)?;
        let m = file.metadata().ok()?;
        let have = (
            m.dev(),
            m.ino(),
            m.size(),
            ns(m.mtime(), m.mtime_nsec()),
            ns(m.ctime(), m.ctime_nsec()),
        );
        if have != (f.dev, f.ino, f.size, f.mtime_ns, f.ctime_ns)
            || !m.is_file()
            || !daemon_owned(&m, owner)
        {
            return None;
        }
        files.push(file);
    }
    let mut metadata = p.metadata;
    // As an acquire with `dir_fd` reports it: the directory comes after the files.
    metadata.dir_fd_index = u32::try_from(files.len()).ok();
    Some(crate::Artifact {
        metadata,
        files,
        dir: Some(dir),
    })
}

/// Opens the folder `path` read-only.
fn open_dir(path: &Path) -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(path)
        .ok()
}

/// Opens `name` read-only relative to the directory `dir` (`openat`), with `flags` added.
fn open_at(dir: &std::fs::File, name: &str, flags: libc::c_int) -> Option<std::fs::File> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: a valid directory descriptor and NUL-terminated path; the result is checked
    // and owned by the returned File.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC | flags,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Some(unsafe { std::fs::File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pointer() -> ReadyPointer {
        let meta: ArtifactMeta = serde_json::from_value(serde_json::json!({
            "model": "m", "version": 0, "key": "ab".repeat(32), "backend": "ort-cpu",
            "profile": "default", "precision": "fp32",
            "inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 4]}],
            "outputs": [], "providers": ["CPUExecutionProvider"],
            "validation": {"passed": true, "method": "m"},
            "files": [{"role": "graph", "name": "model.onnx", "bytes": 3},
                      {"role": "external", "name": "model.onnx.data", "bytes": 5}],
            "session_hints": {"intra_op_num_threads": 1, "disable_prepacking": true}
        }))
        .unwrap();
        ReadyPointer {
            metadata: meta,
            dir: PathBuf::from("/cache/blobs/k"),
            files: vec![
                ReadyFile {
                    name: "model.onnx".into(),
                    dev: 1,
                    ino: 2,
                    size: 3,
                    mtime_ns: -4,
                    ctime_ns: 5,
                },
                ReadyFile {
                    name: "model.onnx.data".into(),
                    dev: 1,
                    ino: 7,
                    size: 5,
                    mtime_ns: 8,
                    ctime_ns: 9,
                },
            ],
            sources: vec![
                ReadySource {
                    path: "/models/m.onnx".into(),
                    stamp: Some((10, 11, 12)),
                },
                ReadySource {
                    path: "/models/m trtcache.toml".into(),
                    stamp: None,
                },
            ],
        }
    }

    #[test]
    fn a_pointer_round_trips() {
        let p = pointer();
        let text = p.render().unwrap();
        assert!(text.starts_with("trtcache-ready 1\n"), "{text}");
        assert!(
            text.contains("\nfree_dims\t1\n")
                && text.contains("\nthreads\t1\n")
                && text.contains("\nprepack\t0\n"),
            "{text}"
        );
        assert_eq!(ReadyPointer::parse(&text).unwrap(), p);
        // Without the hint, no line: a consumer reading fields keeps ONNX Runtime's default.
        let mut q = pointer();
        q.metadata.session_hints = None;
        let text = q.render().unwrap();
        assert!(
            !text.contains("\nprepack\t") && !text.contains("\nthreads\t"),
            "{text}"
        );
    }

    #[test]
    fn what_cannot_be_written_is_not_published() {
        let mut p = pointer();
        p.dir = PathBuf::from("/cache/a\tb");
        assert!(p.render().is_none());
        let mut p = pointer();
        p.sources[0].path = PathBuf::from("/models/m\n.onnx");
        assert!(p.render().is_none());
        let mut p = pointer();
        p.files.pop();
        assert!(p.render().is_none(), "files must match the metadata's");
    }

    #[test]
    fn damaged_pointers_are_refused() {
        let text = pointer().render().unwrap();
        assert!(matches!(
            ReadyPointer::parse("trtcache-ready 2\n"),
            Err(ReadyError::Magic(_))
        ));
        let no_meta: String = text
            .lines()
            .filter(|l| !l.starts_with("meta\t"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert!(matches!(
            ReadyPointer::parse(&no_meta),
            Err(ReadyError::Incomplete(_))
        ));
        let other_key = text.replacen(
            &format!("key\t{}", "ab".repeat(32)),
            &format!("key\t{}", "cd".repeat(32)),
            1,
        );
        assert!(matches!(
            ReadyPointer::parse(&other_key),
            Err(ReadyError::Incomplete(_))
        ));
        let short_file = text.replacen("file\t1\t2\t3\t", "file\t1\t2\t", 1);
        assert!(ReadyPointer::parse(&short_file).is_err());
        assert!(ReadyPointer::parse(&text[..text.len() / 2]).is_err());
    }

    #[test]
    fn the_index_sits_next_to_the_socket() {
        assert_eq!(
            ready_dir(Path::new("/run/trtcache/trtcache.sock")),
            PathBuf::from("/run/trtcache/trtcache.sock.ready")
        );
    }
}

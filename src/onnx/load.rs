//! Memory-mapped, zero-copy model loading and external-data resolution.
//!
//! The file is mapped read-only and wrapped in `Bytes::from_owner`, then decoded with prost
//! from that `Bytes`: every `raw_data` field is a slice of the map. External-data locations are
//! resolved relative to the model's folder; absolute paths, `..` escapes and symlinks leading
//! out of the folder are rejected, and each offset/length is checked against the file's size.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use prost::Message;

use super::proto::{DataLocation, GraphProto, ModelProto, NodeProto, TensorProto};
use super::{ElemType, OnnxError};

/// Limits applied while loading.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Largest model file accepted, in bytes (external data not counted).
    pub max_model_bytes: u64,
    /// What decoding may allocate (nodes, attributes, tensors, bytes; see `onnx::budget`).
    pub decode: super::budget::DecodeLimits,
}

impl Default for LoadOptions {
    fn default() -> Self {
        // Protobuf itself cannot exceed 2 GiB; anything larger is not a valid ONNX file.
        Self {
            max_model_bytes: 2 << 30,
            decode: super::budget::DecodeLimits::default(),
        }
    }
}

/// One external-data file a model refers to, resolved and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExternalFile {
    /// The `location` as written in the model (relative, `/`-separated).
    pub location: String,
    /// Resolved path inside the model's folder.
    pub path: PathBuf,
    /// Size of the file in bytes.
    pub size: u64,
}

/// A decoded model whose weights still live in the memory map.
#[derive(Debug)]
pub struct Model {
    /// Path the model was loaded from.
    pub path: PathBuf,
    /// The model's folder: external data resolves relative to it.
    pub dir: PathBuf,
    /// The whole file, mapped (zero-copy).
    pub bytes: Bytes,
    /// The decoded protobuf; `raw_data` fields are slices of `bytes`.
    pub proto: ModelProto,
    /// External-data files, sorted by location, each listed once.
    pub external_files: Vec<ExternalFile>,
}

/// Refuses bytes whose decode would allocate past `opts.decode`, before decoding them.
fn budget_check(path: &Path, bytes: &[u8], opts: &LoadOptions) -> Result<(), OnnxError> {
    super::budget::check(bytes, &opts.decode)
        .map(drop)
        .map_err(|why| OnnxError::TooCostly {
            path: path.to_path_buf(),
            why,
        })
}

/// Only regular files are read (symlinks to them included): a FIFO would block the reader
/// forever, a device such as `/dev/zero` would never end.
pub(crate) fn check_regular(path: &Path, meta: &std::fs::Metadata) -> Result<(), OnnxError> {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        return Err(OnnxError::IsDirectory {
            path: path.to_path_buf(),
        });
    }
    if t.is_file() {
        return Ok(());
    }
    let kind = if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_char_device() || t.is_block_device() {
        "device"
    } else {
        "special file"
    };
    Err(OnnxError::NotRegular {
        path: path.to_path_buf(),
        kind,
    })
}

/// Opens `path` for reading only if it is a regular file: `O_NONBLOCK`, so that a FIFO
/// (even one swapped in after a check) never blocks the open, then `fstat` of what was opened.
pub(crate) fn open_regular(path: &Path) -> Result<File, OnnxError> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |err| OnnxError::Open {
        path: path.to_path_buf(),
        err,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(open)?;
    check_regular(path, &file.metadata().map_err(open)?)?;
    Ok(file)
}

impl Model {
    /// Loads a model with default limits.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, OnnxError> {
        Self::load_with(path, &LoadOptions::default())
    }

    /// Loads a model: map, decode, check it is a model, resolve external data.
    #[tracing::instrument(skip(opts), fields(path = %path.as_ref().display()))]
    pub fn load_with(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<Self, OnnxError> {
        let path = path.as_ref().to_path_buf();
        let bytes = map_file(&path, opts)?;
        budget_check(&path, &bytes, opts)?;
        let proto = ModelProto::decode(bytes.clone()).map_err(|e| OnnxError::Decode {
            path: path.clone(),
            message: e.to_string(),
        })?;
        Self::from_parts(path, bytes, proto)
    }

    /// Loads a model by reading the file into memory instead of mapping it: for a file that
    /// another process may truncate or rewrite in place while it is in use (a watched
    /// repository), where reading a shrunken map would kill the process with SIGBUS. A
    /// file that shrinks while it is read gives a decode error, like any truncated file.
    pub fn read(path: impl AsRef<Path>) -> Result<Self, OnnxError> {
        let path = path.as_ref().to_path_buf();
        let opts = LoadOptions::default();
        let open = |err| OnnxError::Open {
            path: path.clone(),
            err,
        };
        let mut file = open_regular(&path)?;
        let meta = file.metadata().map_err(open)?;
        if meta.len() > opts.max_model_bytes {
            return Err(OnnxError::TooLarge {
                path,
                size: meta.len(),
                limit: opts.max_model_bytes,
            });
        }
        let size = meta.len() as usize;
        if size == 0 {
            return Err(OnnxError::Empty { path });
        }
        // Into an anonymous map, not the heap: a model is tens to thousands of MiB, and the
        // allocator keeps freed blocks that large in its arenas (the daemon's RSS grew by
        // hundreds of MiB over a few builds); a map goes back to the system when dropped.
        let mut buf = memmap2::MmapMut::map_anon(size).map_err(open)?;
        let mut got = 0;
        while got < size {
            match std::io::Read::read(&mut file, &mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(open(e)),
            }
        }
        // A file that shrank since its size was taken decodes as the truncated file it is.
        let bytes = Bytes::from_owner(buf.make_read_only().map_err(open)?).slice(..got);
        Self::from_bytes(path, bytes)
    }

    /// Builds a model from bytes already in memory (tests, fuzzing, sockets). External data
    /// resolves relative to `path`'s folder.
    pub fn from_bytes(path: impl AsRef<Path>, bytes: Bytes) -> Result<Self, OnnxError> {
        let path = path.as_ref().to_path_buf();
        budget_check(&path, &bytes, &LoadOptions::default())?;
        let proto = ModelProto::decode(bytes.clone()).map_err(|e| OnnxError::Decode {
            path: path.clone(),
            message: e.to_string(),
        })?;
        Self::from_parts(path, bytes, proto)
    }

    fn from_parts(path: PathBuf, bytes: Bytes, proto: ModelProto) -> Result<Self, OnnxError> {
        if proto.ir_version <= 0 {
            return Err(OnnxError::NotAModel {
                path,
                why: "no ir_version (a protobuf, but not a ModelProto)".into(),
            });
        }
        if proto.graph.is_none() {
            return Err(OnnxError::NotAModel {
                path,
                why: "no graph".into(),
            });
        }
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let external_files = resolve_external(&path, &dir, &proto)?;
        Ok(Self {
            path,
            dir,
            bytes,
            proto,
            external_files,
        })
    }

    /// The top-level graph (present by construction).
    pub fn graph(&self) -> &GraphProto {
        self.proto
            .graph
            .as_ref()
            .expect("Model::from_parts rejects models without a graph")
    }

    /// Opset version of `domain` (`""` and `"ai.onnx"` both mean the default domain).
    pub fn opset(&self, domain: &str) -> Option<i64> {
        let norm = |d: &str| if d == "ai.onnx" { "" } else { d }.to_string();
        let want = norm(domain);
        self.proto
            .opset_import
            .iter()
            .filter(|o| norm(&o.domain) == want)
            .map(|o| o.version)
            .max()
    }
}

fn map_file(path: &Path, opts: &LoadOptions) -> Result<Bytes, OnnxError> {
    let file = open_regular(path)?;
    let meta = file.metadata().map_err(|err| OnnxError::Open {
        path: path.to_path_buf(),
        err,
    })?;
    let size = meta.len();
    if size == 0 {
        return Err(OnnxError::Empty {
            path: path.to_path_buf(),
        });
    }
    if size > opts.max_model_bytes {
        return Err(OnnxError::TooLarge {
            path: path.to_path_buf(),
            size,
            limit: opts.max_model_bytes,
        });
    }
    // SAFETY: the map is read-only. A file truncated by another process while mapped would
    // fault on access; models are written elsewhere and renamed into place (see docs).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|err| OnnxError::Open {
        path: path.to_path_buf(),
        err,
    })?;
    Ok(Bytes::from_owner(map))
}

/// Visits every tensor that may hold data: initializers, Constant/attribute tensors, sparse
/// initializers, in the top graph, every subgraph and every model-local function.
pub fn for_each_tensor<'a>(model: &'a ModelProto, f: &mut dyn FnMut(&'a TensorProto)) {
    fn nodes<'a>(nodes: &'a [NodeProto], f: &mut dyn FnMut(&'a TensorProto)) {
        for n in nodes {
            for a in &n.attribute {
                if let Some(t) = &a.t {
                    f(t);
                }
                for t in &a.tensors {
                    f(t);
                }
                for s in a.sparse_tensor.iter().chain(&a.sparse_tensors) {
                    s.values.iter().chain(&s.indices).for_each(&mut *f);
                }
                if let Some(g) = &a.g {
                    graph(g, f);
                }
                for g in &a.graphs {
                    graph(g, f);
                }
            }
        }
    }
    fn graph<'a>(g: &'a GraphProto, f: &mut dyn FnMut(&'a TensorProto)) {
        g.initializer.iter().for_each(&mut *f);
        for s in &g.sparse_initializer {
            s.values.iter().chain(&s.indices).for_each(&mut *f);
        }
        nodes(&g.node, f);
    }
    if let Some(g) = &model.graph {
        graph(g, f);
    }
    for func in &model.functions {
        nodes(&func.node, f);
    }
}

/// Parsed `external_data` entries of one tensor.
#[derive(Clone, Debug, Default)]
pub struct ExternalRef {
    pub location: String,
    pub offset: u64,
    pub length: Option<u64>,
}

/// Reads a tensor's `external_data` entries; `Ok(None)` when the data is inline.
pub fn external_ref(t: &TensorProto) -> Result<Option<ExternalRef>, String> {
    if t.data_location != DataLocation::External as i32 {
        return Ok(None);
    }
    let mut r = ExternalRef::default();
    for e in &t.external_data {
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("has a non-numeric {} `{v}`", e.key))
        };
        match e.key.as_str() {
            "location" => r.location = e.value.clone(),
            "offset" => r.offset = num(&e.value)?,
            "length" => r.length = Some(num(&e.value)?),
            _ => {}
        }
    }
    if r.location.is_empty() {
        return Err("has no `location`".into());
    }
    Ok(Some(r))
}

/// Number of elements of a tensor with these dims, `None` on overflow or negative dims.
pub fn numel(dims: &[i64]) -> Option<u64> {
    dims.iter().try_fold(1u64, |acc, &d| {
        u64::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    })
}

fn resolve_external(
    path: &Path,
    dir: &Path,
    proto: &ModelProto,
) -> Result<Vec<ExternalFile>, OnnxError> {
    let mut files: BTreeMap<String, ExternalFile> = BTreeMap::new();
    let mut first_err = None;
    let canon_dir = dir.canonicalize().ok();
    for_each_tensor(proto, &mut |t| {
        if first_err.is_some() {
            return;
        }
        let err = |why: String| OnnxError::ExternalData {
            path: path.to_path_buf(),
            tensor: t.name.clone(),
            why,
        };
        let r = match external_ref(t) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(why) => return first_err = Some(err(why)),
        };
        let file = match files.get(&r.location) {
            Some(f) => f.clone(),
            None => match resolve_location(dir, canon_dir.as_deref(), &r.location) {
                Ok(f) => {
                    files.insert(r.location.clone(), f.clone());
                    f
                }
                Err(why) => return first_err = Some(err(why)),
            },
        };
        let end = match r.length {
            Some(len) => r.offset.checked_add(len),
            None => Some(file.size),
        };
        match end {
            Some(end) if end <= file.size && r.offset <= file.size => {}
            _ => {
                return first_err = Some(err(format!(
                    "range offset {} length {} is beyond the end of {} ({} bytes)",
                    r.offset,
                    r.length.map_or("(to end)".into(), |l| l.to_string()),
                    file.path.display(),
                    file.size
                )))
            }
        }
        let expected = numel(&t.dims).and_then(|n| ElemType::from_code(t.data_type).bytes_for(n));
        if let (Some(len), Some(exp)) = (r.length, expected) {
            if len != exp {
                first_err = Some(err(format!(
                    "length {len} does not match its shape {:?} of {} ({exp} bytes)",
                    t.dims,
                    ElemType::from_code(t.data_type)
                )));
            }
        }
    });
    match first_err {
        Some(e) => Err(e),
        None => Ok(files.into_values().collect()),
    }
}

fn resolve_location(
    dir: &Path,
    canon_dir: Option<&Path>,
    location: &str,
) -> Result<ExternalFile, String> {
    let rel = Path::new(location);
    if rel.is_absolute() || location.starts_with('\\') || location.contains(':') {
        return Err(format!(
            "location `{location}` is absolute; it must be relative to the model's folder"
        ));
    }
    if rel
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!(
            "location `{location}` leaves the model's folder; only paths inside it are allowed"
        ));
    }
    let joined = dir.join(rel);
    let meta = std::fs::metadata(&joined)
        .map_err(|e| format!("file {} cannot be read: {e}", joined.display()))?;
    if !meta.is_file() {
        return Err(format!(
            "location {} is not a regular file",
            joined.display()
        ));
    }
    // A symlink inside the folder may still point out of it.
    if let (Some(cdir), Ok(cfile)) = (canon_dir, joined.canonicalize()) {
        if !cfile.starts_with(cdir) {
            return Err(format!(
                "location `{location}` resolves to {} outside the model's folder",
                cfile.display()
            ));
        }
    }
    Ok(ExternalFile {
        location: location.to_string(),
        path: joined,
        size: meta.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_escaping_locations() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["/etc/passwd", "../x.bin", "a/../../x.bin", "C:x"] {
            let e = resolve_location(dir.path(), None, bad).unwrap_err();
            assert!(e.contains("absolute") || e.contains("leaves"), "{bad}: {e}");
        }
        let e = resolve_location(dir.path(), None, "missing.bin").unwrap_err();
        assert!(e.contains("missing.bin"), "{e}");
    }

    #[test]
    fn numel_overflow_is_none() {
        assert_eq!(numel(&[2, 3]), Some(6));
        assert_eq!(numel(&[]), Some(1));
        assert_eq!(numel(&[-1, 3]), None);
        assert_eq!(numel(&[i64::MAX, i64::MAX]), None);
    }
}

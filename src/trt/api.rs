//! The safe wrapper over the shim: [`Trt`] (a loaded shim), [`Network`] (a parsed model) and
//! [`Engine`] (a deserialized plan). The plain data that crosses the boundary is in
//! `types`.
//!
//! Every call that touches CUDA names its device (a CUDA ordinal, `--device` /
//! `TRTCACHE_DEVICE`): [`Trt::parse`], [`Trt::supports`], [`Trt::load_engine`] and
//! [`Trt::combine_timing_caches`] take it, and a [`Network`] or [`Engine`] runs every later call
//! on the device it was made on (the shim selects it, `include/trtcache_trt.h`).
//!
//! Every call copies what the shim returns into Rust-owned values and frees the shim's
//! memory with the matching `*_free` before returning; errors carry the calling thread's
//! `trtcache_trt_last_error()` read right after the failing call.

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use super::error::{Status, TrtError};
use super::ffi;
use super::loader::{self, LoaderConfig, Opened};
use super::types::{
    BuildOptions, Built, DType, HostTensor, IoInfo, RawIo, SupportReport, TrtVersion,
};
use crate::plan::ShapeProfile;

/// A loaded shim. Cheap to clone; the libraries stay open while any clone (or a network or
/// engine made from it) lives.
#[derive(Clone)]
pub struct Trt {
    inner: Arc<Opened>,
}

impl std::fmt::Debug for Trt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trt")
            .field("shim", &self.inner.path)
            .field("version", &self.version())
            .finish()
    }
}

struct ShimBytes<'a> {
    api: &'a ffi::TrtShim,
    raw: ffi::trtcache_trt_bytes,
}

impl<'a> ShimBytes<'a> {
    fn new(api: &'a ffi::TrtShim) -> Self {
        Self {
            api,
            raw: ffi::trtcache_trt_bytes {
                data: ptr::null_mut(),
                len: 0,
            },
        }
    }

    fn to_vec(&self) -> Vec<u8> {
        if self.raw.data.is_null() || self.raw.len == 0 {
            return Vec::new();
        }
        // SAFETY: the shim returned `len` bytes at `data`, alive until freed in Drop.
        unsafe { std::slice::from_raw_parts(self.raw.data, self.raw.len) }.to_vec()
    }
}

impl Drop for ShimBytes<'_> {
    fn drop(&mut self) {
        // SAFETY: bytes the shim allocated (or null), freed once.
        unsafe { (self.api.trtcache_trt_bytes_free)(&mut self.raw) }
    }
}

fn cstring(what: &str, s: &str) -> Result<CString, TrtError> {
    CString::new(s).map_err(|_| TrtError::InvalidArgument(format!("{what} `{s}` contains a NUL")))
}

fn dir_cstring(dir: Option<&Path>) -> Result<Option<CString>, TrtError> {
    dir.map(|d| {
        CString::new(d.as_os_str().as_bytes())
            .map_err(|_| TrtError::InvalidArgument(format!("{} contains a NUL", d.display())))
    })
    .transpose()
}

impl Trt {
    /// Loads the shim (and TensorRT) as [`LoaderConfig`] says; `Unavailable` names what is
    /// missing and how to install it.
    pub fn load(cfg: &LoaderConfig) -> Result<Trt, TrtError> {
        loader::open(cfg).map(|o| Trt { inner: Arc::new(o) })
    }

    /// [`Trt::load`] once per process and configuration: later calls with the same
    /// configuration get the loaded shim (opening TensorRT costs seconds). A failure is not
    /// remembered, so a shim installed while a daemon runs is found on the next call.
    pub fn shared(cfg: &LoaderConfig) -> Result<Trt, TrtError> {
        static SHARED: std::sync::Mutex<Option<(LoaderConfig, Trt)>> = std::sync::Mutex::new(None);
        let mut g = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((c, t)) = g.as_ref() {
            if c == cfg {
                return Ok(t.clone());
            }
        }
        let t = Trt::load(cfg)?;
        *g = Some((cfg.clone(), t.clone()));
        Ok(t)
    }

    fn api(&self) -> &ffi::TrtShim {
        &self.inner.api
    }

    fn check(&self, call: &'static str, st: ffi::trtcache_trt_status) -> Result<(), TrtError> {
        match Status::from_raw(st) {
            None => Ok(()),
            Some(status) => Err(TrtError::Call {
                call,
                status,
                message: self.last_error(),
            }),
        }
    }

    fn last_error(&self) -> String {
        // SAFETY: a NUL-terminated thread-local string owned by the shim.
        let p = unsafe { (self.api().trtcache_trt_last_error)() };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: non-null, NUL-terminated, valid until the next call on this thread.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// The shim's path.
    pub fn shim_path(&self) -> &Path {
        &self.inner.path
    }

    /// The TensorRT libraries opened for the shim.
    pub fn libraries(&self) -> Vec<&Path> {
        self.inner
            .libraries
            .iter()
            .map(|(p, _)| p.as_path())
            .collect()
    }

    /// The loaded TensorRT's version (`getInferLibVersion`, through the shim).
    pub fn version(&self) -> TrtVersion {
        // SAFETY: no arguments.
        TrtVersion::from_raw(unsafe { (self.api().trtcache_trt_library_version)() })
    }

    /// The TensorRT headers the shim was compiled against (the loader checked that
    /// [`Trt::version`] is of the same major and no older).
    pub fn compiled_version(&self) -> TrtVersion {
        // SAFETY: no arguments.
        TrtVersion::from_raw(unsafe { (self.api().trtcache_trt_compiled_version)() })
    }

    /// The TensorRT major version the shim was compiled against.
    pub fn compiled_major(&self) -> u32 {
        self.compiled_version().major
    }

    /// A status's name as the shim spells it.
    pub fn status_name(&self, raw: i32) -> String {
        // SAFETY: returns a static string.
        let p = unsafe { (self.api().trtcache_trt_status_name)(raw) };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: static, NUL-terminated.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn json<T: serde::de::DeserializeOwned>(call: &'static str, b: &[u8]) -> Result<T, TrtError> {
        serde_json::from_slice(b).map_err(|source| TrtError::Json { call, source })
    }

    /// Parses an ONNX model on CUDA device `device` (its builds run there); `external_dir` is
    /// the folder external-data locations are relative to.
    pub fn parse(
        &self,
        model: &[u8],
        external_dir: Option<&Path>,
        device: i32,
    ) -> Result<Network, TrtError> {
        let dir = dir_cstring(external_dir)?;
        let mut out = ptr::null_mut();
        // SAFETY: `model` and `dir` outlive the call; `out` receives an owned handle.
        let st = unsafe {
            (self.api().trtcache_trt_parse)(
                model.as_ptr(),
                model.len(),
                dir.as_ref().map_or(ptr::null(), |d| d.as_ptr()),
                device,
                &mut out,
            )
        };
        self.check("parse", st)?;
        let ptr = NonNull::new(out).ok_or_else(|| TrtError::Call {
            call: "parse",
            status: Status::Internal,
            message: "the shim returned no network".into(),
        })?;
        Ok(Network {
            trt: self.clone(),
            ptr,
        })
    }

    /// The parser's support query over a model, on CUDA device `device`.
    pub fn supports(
        &self,
        model: &[u8],
        external_dir: Option<&Path>,
        device: i32,
    ) -> Result<SupportReport, TrtError> {
        let dir = dir_cstring(external_dir)?;
        let mut b = ShimBytes::new(self.api());
        // SAFETY: inputs outlive the call; `b` receives shim-owned bytes.
        let st = unsafe {
            (self.api().trtcache_trt_supports)(
                model.as_ptr(),
                model.len(),
                dir.as_ref().map_or(ptr::null(), |d| d.as_ptr()),
                device,
                &mut b.raw,
            )
        };
        self.check("supports", st)?;
        Self::json("supports", &b.to_vec())
    }

    /// Merges two serialized timing caches (either may be empty) on CUDA device `device`.
    pub fn combine_timing_caches(
        &self,
        device: i32,
        a: &[u8],
        b: &[u8],
    ) -> Result<Vec<u8>, TrtError> {
        let mut out = ShimBytes::new(self.api());
        // SAFETY: inputs outlive the call.
        let st = unsafe {
            (self.api().trtcache_trt_timing_cache_combine)(
                device,
                a.as_ptr(),
                a.len(),
                b.as_ptr(),
                b.len(),
                &mut out.raw,
            )
        };
        self.check("timing_cache_combine", st)?;
        Ok(out.to_vec())
    }

    /// Deserializes a plan on CUDA device `device` (every call on the engine runs there).
    pub fn load_engine(&self, plan: &[u8], device: i32) -> Result<Engine, TrtError> {
        let mut out = ptr::null_mut();
        // SAFETY: `plan` outlives the call.
        let st = unsafe {
            (self.api().trtcache_trt_engine_load)(plan.as_ptr(), plan.len(), device, &mut out)
        };
        self.check("engine_load", st)?;
        let ptr = NonNull::new(out).ok_or_else(|| TrtError::Call {
            call: "engine_load",
            status: Status::Internal,
            message: "the shim returned no engine".into(),
        })?;
        Ok(Engine {
            trt: self.clone(),
            ptr,
        })
    }
}

/// A parsed model, ready to build.
pub struct Network {
    trt: Trt,
    ptr: NonNull<ffi::trtcache_trt_network>,
}

// SAFETY: the handle is used by one thread at a time (&mut self for builds); TensorRT's
// builder objects may move between threads.
unsafe impl Send for Network {}

impl Drop for Network {
    fn drop(&mut self) {
        // SAFETY: an owned handle, freed once.
        unsafe { (self.trt.api().trtcache_trt_network_free)(self.ptr.as_ptr()) }
    }
}

/// Shapes of one profile, in the C layout, with the names they point to kept alive.
struct RawProfile {
    _names: Vec<CString>,
    shapes: Vec<ffi::trtcache_trt_profile_shape>,
}

fn raw_profile(p: &ShapeProfile) -> Result<RawProfile, TrtError> {
    let max_dims = ffi::TRTCACHE_TRT_MAX_DIMS as usize;
    let mut names = Vec::new();
    let mut shapes = Vec::new();
    for (input, min) in &p.min {
        let bad = |what: &str| {
            TrtError::InvalidArgument(format!("profile `{}`, input `{input}`: {what}", p.name))
        };
        let opt = p.opt.get(input).ok_or_else(|| bad("no opt shape"))?;
        let max = p.max.get(input).ok_or_else(|| bad("no max shape"))?;
        if opt.len() != min.len() || max.len() != min.len() {
            return Err(bad("min, opt and max have different ranks"));
        }
        if min.len() > max_dims {
            return Err(bad(&format!("rank {} is over {max_dims}", min.len())));
        }
        let name = cstring("input name", input)?;
        let mut s = ffi::trtcache_trt_profile_shape {
            input: name.as_ptr(),
            nb_dims: min.len() as i32,
            ..Default::default()
        };
        s.min[..min.len()].copy_from_slice(min);
        s.opt[..opt.len()].copy_from_slice(opt);
        s.max[..max.len()].copy_from_slice(max);
        names.push(name);
        shapes.push(s);
    }
    for input in p.opt.keys().chain(p.max.keys()) {
        if !p.min.contains_key(input) {
            return Err(TrtError::InvalidArgument(format!(
                "profile `{}`, input `{input}`: no min shape",
                p.name
            )));
        }
    }
    Ok(RawProfile {
        _names: names,
        shapes,
    })
}

impl Network {
    /// The network's inputs and outputs.
    pub fn io(&mut self) -> Result<IoInfo, TrtError> {
        let mut b = ShimBytes::new(self.trt.api());
        // SAFETY: a live handle.
        let st =
            unsafe { (self.trt.api().trtcache_trt_network_io_json)(self.ptr.as_ptr(), &mut b.raw) };
        self.trt.check("network_io_json", st)?;
        Trt::json::<RawIo>("network_io_json", &b.to_vec()).map(IoInfo::from)
    }

    /// Builds a serialized engine.
    pub fn build(&mut self, opts: &BuildOptions) -> Result<Built, TrtError> {
        if let Some(l) = opts.builder_optimization_level {
            if l > 5 {
                return Err(TrtError::InvalidArgument(format!(
                    "builder optimization level {l} is outside 0..=5"
                )));
            }
        }
        let profiles = opts
            .profiles
            .iter()
            .map(raw_profile)
            .collect::<Result<Vec<_>, _>>()?;
        let raw_profiles: Vec<ffi::trtcache_trt_profile> = profiles
            .iter()
            .map(|p| ffi::trtcache_trt_profile {
                shapes: p.shapes.as_ptr(),
                nb_shapes: p.shapes.len(),
            })
            .collect();
        let raw = ffi::trtcache_trt_build_options {
            precision_flags: opts.precision.flags(),
            workspace_bytes: opts.workspace_bytes.unwrap_or(0),
            builder_optimization_level: opts.builder_optimization_level.map_or(-1, i32::from),
            hardware_compatibility_level: opts.hardware_compatibility.raw(),
            profiles: if raw_profiles.is_empty() {
                ptr::null()
            } else {
                raw_profiles.as_ptr()
            },
            nb_profiles: raw_profiles.len(),
            timing_cache: if opts.timing_cache.is_empty() {
                ptr::null()
            } else {
                opts.timing_cache.as_ptr()
            },
            timing_cache_len: opts.timing_cache.len(),
        };
        let api = self.trt.api();
        let mut plan = ShimBytes::new(api);
        let mut cache = ShimBytes::new(api);
        // SAFETY: `raw` and everything it points to (profiles, names, cache) outlive the call.
        let st = unsafe {
            (api.trtcache_trt_build)(self.ptr.as_ptr(), &raw, &mut plan.raw, &mut cache.raw)
        };
        self.trt.check("build", st)?;
        Ok(Built {
            plan: plan.to_vec(),
            timing_cache: cache.to_vec(),
        })
    }
}

/// A deserialized engine with its execution context.
pub struct Engine {
    trt: Trt,
    ptr: NonNull<ffi::trtcache_trt_engine>,
}

// SAFETY: as for Network: one thread at a time (&mut self for every call).
unsafe impl Send for Engine {}

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: an owned handle, freed once.
        unsafe { (self.trt.api().trtcache_trt_engine_free)(self.ptr.as_ptr()) }
    }
}

struct ShimOutputs<'a> {
    api: &'a ffi::TrtShim,
    ptr: *mut ffi::trtcache_trt_outputs,
}

impl Drop for ShimOutputs<'_> {
    fn drop(&mut self) {
        // SAFETY: an owned handle (or null), freed once.
        unsafe { (self.api.trtcache_trt_outputs_free)(self.ptr) }
    }
}

impl Engine {
    /// The engine's I/O tensors and number of profiles.
    pub fn io(&mut self) -> Result<IoInfo, TrtError> {
        let mut b = ShimBytes::new(self.trt.api());
        // SAFETY: a live handle.
        let st =
            unsafe { (self.trt.api().trtcache_trt_engine_io_json)(self.ptr.as_ptr(), &mut b.raw) };
        self.trt.check("engine_io_json", st)?;
        Trt::json::<RawIo>("engine_io_json", &b.to_vec()).map(IoInfo::from)
    }

    /// The engine inspector's layer information.
    pub fn inspect(&mut self) -> Result<serde_json::Value, TrtError> {
        let mut b = ShimBytes::new(self.trt.api());
        // SAFETY: a live handle.
        let st = unsafe {
            (self.trt.api().trtcache_trt_engine_inspect_json)(self.ptr.as_ptr(), &mut b.raw)
        };
        self.trt.check("engine_inspect_json", st)?;
        Trt::json("engine_inspect_json", &b.to_vec())
    }

    /// Runs once on host tensors with optimization profile `profile`.
    pub fn run(
        &mut self,
        profile: u32,
        inputs: &[HostTensor],
    ) -> Result<Vec<HostTensor>, TrtError> {
        let max_dims = ffi::TRTCACHE_TRT_MAX_DIMS as usize;
        let names = inputs
            .iter()
            .map(|t| cstring("input name", &t.name))
            .collect::<Result<Vec<_>, _>>()?;
        let mut raw = Vec::with_capacity(inputs.len());
        for (t, name) in inputs.iter().zip(&names) {
            if t.shape.len() > max_dims {
                return Err(TrtError::InvalidArgument(format!(
                    "input `{}`: rank {} is over {max_dims}",
                    t.name,
                    t.shape.len()
                )));
            }
            let mut r = ffi::trtcache_trt_tensor {
                name: name.as_ptr(),
                dtype: t.dtype.code() as i32,
                nb_dims: t.shape.len() as i32,
                data: t.data.as_ptr().cast(),
                bytes: t.data.len(),
                ..Default::default()
            };
            r.dims[..t.shape.len()].copy_from_slice(&t.shape);
            raw.push(r);
        }
        let profile = i32::try_from(profile)
            .map_err(|_| TrtError::InvalidArgument(format!("profile {profile} is too large")))?;
        let api = self.trt.api();
        let mut out = ShimOutputs {
            api,
            ptr: ptr::null_mut(),
        };
        // SAFETY: `raw`, the names and the data it points to outlive the call.
        let st = unsafe {
            (api.trtcache_trt_engine_run)(
                self.ptr.as_ptr(),
                profile,
                raw.as_ptr(),
                raw.len(),
                &mut out.ptr,
            )
        };
        self.trt.check("engine_run", st)?;
        // SAFETY: a live outputs handle.
        let n = unsafe { (api.trtcache_trt_outputs_count)(out.ptr) };
        let mut res = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: i < count; the tensor lives until `out` is dropped (after this loop).
            let t = unsafe { (api.trtcache_trt_outputs_get)(out.ptr, i).as_ref() }.ok_or_else(
                || TrtError::Call {
                    call: "outputs_get",
                    status: Status::Internal,
                    message: format!("output {i} of {n} missing"),
                },
            )?;
            let rank = usize::try_from(t.nb_dims).unwrap_or(usize::MAX);
            if rank > max_dims || t.name.is_null() || (t.data.is_null() && t.bytes > 0) {
                return Err(TrtError::Call {
                    call: "outputs_get",
                    status: Status::Internal,
                    message: format!("output {i}: malformed tensor from the shim"),
                });
            }
            // SAFETY: checked non-null above; NUL-terminated names and `bytes` bytes of data
            // owned by `out`.
            let name = unsafe { CStr::from_ptr(t.name) }
                .to_string_lossy()
                .into_owned();
            let data = if t.bytes == 0 {
                Vec::new()
            } else {
                // SAFETY: as above.
                unsafe { std::slice::from_raw_parts(t.data.cast::<u8>(), t.bytes) }.to_vec()
            };
            res.push(HostTensor {
                name,
                dtype: DType::from_code(t.dtype as u32),
                shape: t.dims[..rank].to_vec(),
                data,
            });
        }
        Ok(res)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_are_checked_before_the_boundary() {
        let mut p = ShapeProfile::default();
        p.min.insert("x".into(), vec![1, 4]);
        p.opt.insert("x".into(), vec![2, 4]);
        assert!(raw_profile(&p).is_err(), "no max");
        p.max.insert("x".into(), vec![8, 4, 1]);
        assert!(raw_profile(&p).is_err(), "rank mismatch");
        p.max.insert("x".into(), vec![8, 4]);
        let r = raw_profile(&p).unwrap();
        assert_eq!(r.shapes[0].nb_dims, 2);
        assert_eq!(&r.shapes[0].max[..2], &[8, 4]);
        p.opt.insert("y".into(), vec![1]);
        assert!(raw_profile(&p).is_err(), "y has no min");
    }
}

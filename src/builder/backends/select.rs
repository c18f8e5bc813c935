//! Which implementation serves a [`Backend`]: the one place that names them all.

use super::backend::BackendImpl;
use super::{ort_cpu, ort_gpu, trt};
use crate::spec::Backend;

impl crate::builder::BuildOptions {
    /// The options that go into the key for `backend`, as canonical strings: the single
    /// source of a key's `options` for `trtcache key`, `trtcache build` and the daemon: the
    /// user's `extra` ones and the backend's own ([`BackendImpl::key_options`]). Precision and
    /// profile are key parts of their own. (Here, beside the selection it needs, so that the
    /// options import no backend.)
    pub fn key_options(&self, b: Backend) -> std::collections::BTreeMap<String, String> {
        let mut m = self.extra.clone();
        m.extend(backend(b).key_options(self));
        m
    }
}

/// The implementation of `backend`.
pub fn backend(backend: Backend) -> Box<dyn BackendImpl> {
    match backend {
        Backend::OrtCpu => Box::new(ort_cpu::OrtCpu),
        Backend::OrtCuda => Box::new(ort_gpu::OrtCuda),
        Backend::OrtTensorRt => Box::new(ort_gpu::OrtTensorRt),
        Backend::Trt => Box::new(trt::NativeTrt),
    }
}

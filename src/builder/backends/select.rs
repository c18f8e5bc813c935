//! Which implementation serves a [`Backend`]: the one place that names them all.

use super::BackendImpl;
use crate::builder::{cpu, gpu, trt};
use crate::spec::Backend;

/// The implementation of `backend`.
pub fn backend(backend: Backend) -> Box<dyn BackendImpl> {
    match backend {
        Backend::OrtCpu => Box::new(cpu::OrtCpu),
        Backend::OrtCuda => Box::new(gpu::OrtCuda),
        Backend::OrtTensorRt => Box::new(gpu::OrtTensorRt),
        Backend::Trt => Box::new(trt::NativeTrt),
    }
}

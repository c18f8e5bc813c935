//! Which implementation serves a [`Backend`]: the one place that names them all.

use super::backend::BackendImpl;
use super::{ort_cpu, ort_gpu, trt};
use crate::spec::Backend;

/// The implementation of `backend`.
pub fn backend(backend: Backend) -> Box<dyn BackendImpl> {
    match backend {
        Backend::OrtCpu => Box::new(ort_cpu::OrtCpu),
        Backend::OrtCuda => Box::new(ort_gpu::OrtCuda),
        Backend::OrtTensorRt => Box::new(ort_gpu::OrtTensorRt),
        Backend::Trt => Box::new(trt::NativeTrt),
    }
}

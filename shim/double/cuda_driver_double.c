/*
 * A TEST DOUBLE of the few CUDA driver API calls trtcache's GPU detection makes
 * (src/device/gpu.rs: cuInit, cuDriverGetVersion, cuDeviceGetCount, cuDeviceGet,
 * cuDeviceGetName, cuDeviceGetAttribute, cuDeviceTotalMem_v2, cuDeviceGetUuid), built as a
 * `libcuda.so` that tests/it/trt.rs puts first on LD_LIBRARY_PATH. It reports DOUBLE_GPU_COUNT
 * GPUs (default 1): ordinal 0 is DOUBLE_GPU_NAME with compute capability
 * DOUBLE_CC_MAJOR.DOUBLE_CC_MINOR, ordinal 1 DOUBLE_GPU1_NAME (compute capability 8.0), so the `trt`
 * backend's key, SKU and timing-cache file can be exercised end to end (with the TensorRT
 * shim double) on a machine without a GPU. It proves nothing about CUDA.
 */
#include <stddef.h>
#include <string.h>

#ifndef DOUBLE_GPU_NAME
#define DOUBLE_GPU_NAME "NVIDIA H200 (trtcache double)"
#endif
#ifndef DOUBLE_CC_MAJOR
#define DOUBLE_CC_MAJOR 9
#endif
#ifndef DOUBLE_CC_MINOR
#define DOUBLE_CC_MINOR 0
#endif
#ifndef DOUBLE_GPU_COUNT
#define DOUBLE_GPU_COUNT 1
#endif
#ifndef DOUBLE_GPU1_NAME
#define DOUBLE_GPU1_NAME "NVIDIA A100-SXM4-80GB (trtcache double)"
#endif

typedef int CUresult;
typedef int CUdevice;
typedef struct { char bytes[16]; } CUuuid;

enum { OK = 0, INVALID_VALUE = 1, INVALID_DEVICE = 101 };
/* CUdevice_attribute values used by the detection. */
enum { ATTR_SM_COUNT = 16, ATTR_CC_MAJOR = 75, ATTR_CC_MINOR = 76 };

CUresult cuInit(unsigned flags) { (void)flags; return OK; }
CUresult cuDriverGetVersion(int *v) { if (!v) return INVALID_VALUE; *v = 12080; return OK; }
CUresult cuDeviceGetCount(int *n) { if (!n) return INVALID_VALUE; *n = DOUBLE_GPU_COUNT; return OK; }
static int bad(CUdevice d) { return d < 0 || d >= DOUBLE_GPU_COUNT; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (!d) return INVALID_VALUE;
    if (bad(ordinal)) return INVALID_DEVICE;
    *d = ordinal;
    return OK;
}
CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    if (!name || len <= 0) return INVALID_VALUE;
    if (bad(d)) return INVALID_DEVICE;
    strncpy(name, d == 0 ? DOUBLE_GPU_NAME : DOUBLE_GPU1_NAME, (size_t)len - 1);
    name[len - 1] = 0;
    return OK;
}
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
    if (!v) return INVALID_VALUE;
    if (bad(d)) return INVALID_DEVICE;
    switch (attr) {
    case ATTR_CC_MAJOR: *v = d == 0 ? DOUBLE_CC_MAJOR : 8; break;
    case ATTR_CC_MINOR: *v = d == 0 ? DOUBLE_CC_MINOR : 0; break;
    case ATTR_SM_COUNT: *v = 132; break;
    default: *v = 0;
    }
    return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    if (!bytes) return INVALID_VALUE;
    if (bad(d)) return INVALID_DEVICE;
    *bytes = (size_t)141 << 30;
    return OK;
}
static CUresult uuid(CUuuid *u, CUdevice d) {
    if (!u) return INVALID_VALUE;
    if (bad(d)) return INVALID_DEVICE;
    memset(u->bytes, 0xd0 + d, sizeof u->bytes);
    return OK;
}
CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) { return uuid(u, d); }
CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return uuid(u, d); }
CUresult cuGetErrorString(CUresult e, const char **s) { (void)e; if (s) *s = "double: error"; return OK; }
CUresult cuGetErrorName(CUresult e, const char **s) { (void)e; if (s) *s = "CUDA_ERROR_DOUBLE"; return OK; }

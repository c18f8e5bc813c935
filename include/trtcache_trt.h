/*
 * trtcache_trt.h: the project's C API over TensorRT's C++ builder, ONNX parser and runtime.
 *
 * trtcache never links TensorRT. It loads a shared library that implements this header
 * (`libtrtcache_trt.so`, built from `shim/trtcache_trt.cpp` against TensorRT's headers) at run
 * time, so one trtcache binary runs on hosts with and without TensorRT. `build.rs` runs
 * bindgen over this file on every build; the Rust side (`src/trt/`) loads every function
 * declared here by name, so the header and the Rust declarations cannot drift apart.
 *
 * Rules of the boundary:
 *  - only C types cross it; no C++ exception escapes it (every entry point catches);
 *  - every fallible function returns a `trtcache_trt_status`; on anything but
 *    TRTCACHE_TRT_OK, `trtcache_trt_last_error()` holds a message for the calling thread
 *    (TensorRT's and the ONNX parser's own errors included) until the next call on it;
 *  - memory the shim returns (`trtcache_trt_bytes`, handles, outputs) is freed only with the
 *    matching `*_free` function; inputs are borrowed for the duration of the call.
 *
 * Version: TRTCACHE_TRT_ABI_VERSION changes whenever a declaration here changes; the loader
 * refuses a library whose `trtcache_trt_abi_version()` differs.
 */
#ifndef TRTCACHE_TRT_H
#define TRTCACHE_TRT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TRTCACHE_TRT_ABI_VERSION 2u
/* Most dimensions a tensor shape may have (TensorRT's Dims::MAX_DIMS). */
#define TRTCACHE_TRT_MAX_DIMS 8

/* Outcome of a call. */
typedef enum trtcache_trt_status {
    TRTCACHE_TRT_OK = 0,
    /* A null pointer, an out-of-range value, a malformed profile. */
    TRTCACHE_TRT_INVALID_ARGUMENT = 1,
    /* The ONNX parser rejected the model. */
    TRTCACHE_TRT_PARSE_FAILED = 2,
    /* The builder produced no engine. */
    TRTCACHE_TRT_BUILD_FAILED = 3,
    /* A serialized engine or timing cache could not be deserialized. */
    TRTCACHE_TRT_DESERIALIZE_FAILED = 4,
    /* Running the engine failed (shapes, enqueue). */
    TRTCACHE_TRT_RUN_FAILED = 5,
    /* A CUDA runtime call failed (no device, out of device memory, copy). */
    TRTCACHE_TRT_CUDA_FAILED = 6,
    /* The loaded TensorRT cannot do what was asked (e.g. precision flags on TensorRT 11). */
    TRTCACHE_TRT_UNSUPPORTED = 7,
    /* Host allocation failed. */
    TRTCACHE_TRT_OUT_OF_MEMORY = 8,
    /* Anything else (an exception caught at the boundary). */
    TRTCACHE_TRT_INTERNAL = 9
} trtcache_trt_status;

/* Element types, numbered as TensorRT's nvinfer1::DataType. */
typedef enum trtcache_trt_dtype {
    TRTCACHE_TRT_FLOAT = 0,
    TRTCACHE_TRT_HALF = 1,
    TRTCACHE_TRT_INT8 = 2,
    TRTCACHE_TRT_INT32 = 3,
    TRTCACHE_TRT_BOOL = 4,
    TRTCACHE_TRT_UINT8 = 5,
    TRTCACHE_TRT_FP8 = 6,
    TRTCACHE_TRT_BF16 = 7,
    TRTCACHE_TRT_INT64 = 8,
    TRTCACHE_TRT_INT4 = 9,
    TRTCACHE_TRT_FP4 = 10,
    /* A type this header does not name. */
    TRTCACHE_TRT_DTYPE_OTHER = 255
} trtcache_trt_dtype;

/* Precision flags for trtcache_trt_build_options.precision_flags (TensorRT 10's weakly typed
 * builder flags; TensorRT 11 builds strongly typed networks only and reports
 * TRTCACHE_TRT_UNSUPPORTED for any of them). */
#define TRTCACHE_TRT_PRECISION_FP16 1u
#define TRTCACHE_TRT_PRECISION_BF16 2u
#define TRTCACHE_TRT_PRECISION_INT8 4u
#define TRTCACHE_TRT_PRECISION_FP8 8u
/* Disallow TF32 for FP32 layers (TensorRT allows it by default). */
#define TRTCACHE_TRT_PRECISION_NO_TF32 16u

/* Hardware-compatibility levels (nvinfer1::HardwareCompatibilityLevel). */
#define TRTCACHE_TRT_HWCOMPAT_NONE 0
#define TRTCACHE_TRT_HWCOMPAT_AMPERE_PLUS 1
#define TRTCACHE_TRT_HWCOMPAT_SAME_COMPUTE_CAPABILITY 2

/* Bytes owned by the shim; free with trtcache_trt_bytes_free. */
typedef struct trtcache_trt_bytes {
    uint8_t *data;
    size_t len;
} trtcache_trt_bytes;

/* A parsed ONNX model: builder, network definition and parser together. */
typedef struct trtcache_trt_network trtcache_trt_network;
/* A deserialized engine with one execution context. */
typedef struct trtcache_trt_engine trtcache_trt_engine;
/* Output tensors of one run. */
typedef struct trtcache_trt_outputs trtcache_trt_outputs;

/* One input's shapes in an optimization profile. */
typedef struct trtcache_trt_profile_shape {
    const char *input;
    int32_t nb_dims;
    int64_t min[TRTCACHE_TRT_MAX_DIMS];
    int64_t opt[TRTCACHE_TRT_MAX_DIMS];
    int64_t max[TRTCACHE_TRT_MAX_DIMS];
} trtcache_trt_profile_shape;

/* One optimization profile: a shape for every dynamic input. */
typedef struct trtcache_trt_profile {
    const trtcache_trt_profile_shape *shapes;
    size_t nb_shapes;
} trtcache_trt_profile;

/* How to build. A zeroed struct (with builder_optimization_level = -1) is TensorRT's default. */
typedef struct trtcache_trt_build_options {
    /* TRTCACHE_TRT_PRECISION_* bits. */
    uint32_t precision_flags;
    /* Workspace memory-pool limit in bytes; 0 keeps TensorRT's default (the device's memory). */
    uint64_t workspace_bytes;
    /* 0..5; -1 keeps TensorRT's default (3). */
    int32_t builder_optimization_level;
    /* TRTCACHE_TRT_HWCOMPAT_*. */
    int32_t hardware_compatibility_level;
    const trtcache_trt_profile *profiles;
    size_t nb_profiles;
    /* A serialized timing cache to start from (may be empty); entries the build adds are
     * returned in `timing_cache_out` of trtcache_trt_build. */
    const uint8_t *timing_cache;
    size_t timing_cache_len;
} trtcache_trt_build_options;

/* A host tensor: an input (borrowed) or an output (owned by trtcache_trt_outputs). */
typedef struct trtcache_trt_tensor {
    const char *name;
    int32_t dtype; /* trtcache_trt_dtype */
    int32_t nb_dims;
    int64_t dims[TRTCACHE_TRT_MAX_DIMS];
    const void *data;
    size_t bytes;
} trtcache_trt_tensor;

/* --- library ------------------------------------------------------------------------- */

/* TRTCACHE_TRT_ABI_VERSION the library was compiled with. */
uint32_t trtcache_trt_abi_version(void);
/* The loaded TensorRT's version, from getInferLibVersion(): MAJOR*10000 + MINOR*100 + PATCH
 * for TensorRT 10+ (e.g. 101601 for 10.16.1). */
int32_t trtcache_trt_library_version(void);
/* The TensorRT headers the shim was compiled against, encoded as trtcache_trt_library_version:
 * NV_TENSORRT_MAJOR*10000 + NV_TENSORRT_MINOR*100 + NV_TENSORRT_PATCH. */
int32_t trtcache_trt_compiled_version(void);
/* The calling thread's message for the last failed call ("" when none); valid until the
 * thread's next call into the library. */
const char *trtcache_trt_last_error(void);
/* A static name for a status ("TRTCACHE_TRT_PARSE_FAILED"). */
const char *trtcache_trt_status_name(int32_t status);
void trtcache_trt_bytes_free(trtcache_trt_bytes *bytes);

/* --- parse, support query, build ------------------------------------------------------ */

/* Parses an ONNX model from memory on CUDA device `device` (the network, and the engine
 * trtcache_trt_build makes from it, belong to that device). `external_data_dir` is the folder
 * external-data locations are relative to (NULL or "" when the model has none). */
trtcache_trt_status trtcache_trt_parse(const uint8_t *model, size_t model_len,
                                       const char *external_data_dir, int32_t device,
                                       trtcache_trt_network **out);
void trtcache_trt_network_free(trtcache_trt_network *network);
/* The network's inputs and outputs as JSON:
 * {"inputs":[{"name":..,"dtype":..,"shape":[..]}],"outputs":[..]} (-1 for a dynamic dim). */
trtcache_trt_status trtcache_trt_network_io_json(trtcache_trt_network *network,
                                                 trtcache_trt_bytes *out);
/* The parser's support query (IParser::supportsModelV2) as JSON:
 * {"supported":bool,"subgraphs":[{"supported":bool,"nodes":[node indices]}],"errors":[..]}. */
trtcache_trt_status trtcache_trt_supports(const uint8_t *model, size_t model_len,
                                          const char *external_data_dir, int32_t device,
                                          trtcache_trt_bytes *out);
/* Builds a serialized engine (a `.plan`) on the network's device. `timing_cache_out`
 * receives the timing cache after the build (the input cache plus what the build measured). */
trtcache_trt_status trtcache_trt_build(trtcache_trt_network *network,
                                       const trtcache_trt_build_options *options,
                                       trtcache_trt_bytes *engine_out,
                                       trtcache_trt_bytes *timing_cache_out);
/* Merges two serialized timing caches (ITimingCache::combine) on CUDA device `device` into
 * `out`. Either may be empty. Caches from another device or TensorRT version are refused. */
trtcache_trt_status trtcache_trt_timing_cache_combine(int32_t device, const uint8_t *a, size_t a_len,
                                                      const uint8_t *b, size_t b_len,
                                                      trtcache_trt_bytes *out);

/* --- engines --------------------------------------------------------------------------- */

/* Deserializes an engine on CUDA device `device`; every later call on the engine runs there. */
trtcache_trt_status trtcache_trt_engine_load(const uint8_t *plan, size_t plan_len, int32_t device,
                                             trtcache_trt_engine **out);
void trtcache_trt_engine_free(trtcache_trt_engine *engine);
/* The engine's I/O tensors as JSON (as trtcache_trt_network_io_json, plus
 * "profiles": the number of optimization profiles). */
trtcache_trt_status trtcache_trt_engine_io_json(trtcache_trt_engine *engine,
                                                trtcache_trt_bytes *out);
/* The engine inspector's layer information (IEngineInspector, LayerInformationFormat::kJSON). */
trtcache_trt_status trtcache_trt_engine_inspect_json(trtcache_trt_engine *engine,
                                                     trtcache_trt_bytes *out);
/* Runs the engine once, synchronously, on host buffers: copies the inputs to the device,
 * selects optimization profile `profile`, enqueues, copies every output back. Outputs with
 * data-dependent shapes are refused (TRTCACHE_TRT_UNSUPPORTED). */
trtcache_trt_status trtcache_trt_engine_run(trtcache_trt_engine *engine, int32_t profile,
                                            const trtcache_trt_tensor *inputs,
                                            size_t nb_inputs, trtcache_trt_outputs **out);
size_t trtcache_trt_outputs_count(const trtcache_trt_outputs *outputs);
/* The i-th output (NULL when out of range); valid until trtcache_trt_outputs_free. */
const trtcache_trt_tensor *trtcache_trt_outputs_get(const trtcache_trt_outputs *outputs,
                                                    size_t index);
void trtcache_trt_outputs_free(trtcache_trt_outputs *outputs);

#ifdef __cplusplus
}
#endif

#endif /* TRTCACHE_TRT_H */

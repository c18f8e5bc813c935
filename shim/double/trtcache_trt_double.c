/*
 * A TEST DOUBLE of include/trtcache_trt.h: canned behaviour, no TensorRT, no GPU. It exists
 * so the Rust side's plumbing (loading, ABI check, error mapping, option marshalling,
 * artifact layout, key parts, timing-cache merging, the Triton export) is tested on machines
 * without TensorRT. It proves nothing about TensorRT: tests/it/trt.rs compiles it with the
 * system C compiler. Canned behaviour:
 *   - version: DOUBLE_VERSION (default 101601, i.e. 10.16.1), or, built with
 *     -DDOUBLE_LINK_TRT, what the getInferLibVersion() it is linked against returns (a real
 *     dynamic-linking test of which libnvinfer the loader bound); compiled-against version:
 *     DOUBLE_COMPILED_VERSION (default DOUBLE_VERSION); ABI: DOUBLE_ABI (default the header's);
 *   - devices: DOUBLE_DEVICE_COUNT (default 1) CUDA devices; a call given another ordinal
 *     fails as the shim does. The device a network was parsed on is written into its plan
 *     ("device"), and engine_load refuses a plan built on another device than it is given,
 *     so a test sees which device every call was given;
 *   - parse: refuses an empty model and one starting with "REJECT"; the network has one fp32
 *     input `x` [-1,4] and one output `y` [-1,4];
 *   - supports: one supported subgraph of nodes 0 and 1, unless the model starts with
 *     "PARTIAL" (then node 1 is in an unsupported subgraph);
 *   - build: the plan is "TRTDOUBLEPLAN\n" followed by the options as JSON; the timing
 *     cache is "double-timing-cache\n" + the input cache's entries + one entry naming the
 *     model's length;
 *   - timing_cache_combine: the union of both caches' lines (each must start with the
 *     header line);
 *   - engine_run: `y` = `x`, plus 0.5 on every element when the plan was built with INT8, or
 *     from a model whose bytes contain "trtcache-double-perturb" (e.g. in its doc_string):
 *     engines that must fail validation.
 */
#define _GNU_SOURCE /* memmem */
#include "trtcache_trt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef DOUBLE_VERSION
#define DOUBLE_VERSION 101601
#endif
#ifndef DOUBLE_COMPILED_VERSION
#define DOUBLE_COMPILED_VERSION DOUBLE_VERSION
#endif
#ifndef DOUBLE_ABI
#define DOUBLE_ABI TRTCACHE_TRT_ABI_VERSION
#endif
#ifndef DOUBLE_DEVICE_COUNT
#define DOUBLE_DEVICE_COUNT 1
#endif

static _Thread_local char last_error[512];
static const char CACHE_HEADER[] = "double-timing-cache\n";
static const char PLAN_HEADER[] = "TRTDOUBLEPLAN\n";

static trtcache_trt_status fail(trtcache_trt_status st, const char *msg) {
    snprintf(last_error, sizeof last_error, "double: %s", msg);
    return st;
}

static trtcache_trt_status give(const char *data, size_t len, trtcache_trt_bytes *out) {
    out->data = NULL;
    out->len = 0;
    if (len == 0) return TRTCACHE_TRT_OK;
    out->data = malloc(len);
    if (!out->data) return fail(TRTCACHE_TRT_OUT_OF_MEMORY, "malloc");
    memcpy(out->data, data, len);
    out->len = len;
    return TRTCACHE_TRT_OK;
}

static const char PERTURB[] = "trtcache-double-perturb";

static trtcache_trt_status select_device(int32_t device) {
    if (device < 0) return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "CUDA device is not an ordinal");
    if (device >= DOUBLE_DEVICE_COUNT) {
        snprintf(last_error, sizeof last_error, "double: CUDA device %d does not exist (%d visible)",
                 (int)device, DOUBLE_DEVICE_COUNT);
        return TRTCACHE_TRT_CUDA_FAILED;
    }
    return TRTCACHE_TRT_OK;
}

struct trtcache_trt_network { size_t model_len; int perturb; int32_t device; };
struct trtcache_trt_engine { int int8; int profiles; int32_t device; };
struct trtcache_trt_outputs { trtcache_trt_tensor t; void *data; };

uint32_t trtcache_trt_abi_version(void) { return DOUBLE_ABI; }
#ifdef DOUBLE_LINK_TRT
extern int32_t getInferLibVersion(void);
int32_t trtcache_trt_library_version(void) { return getInferLibVersion(); }
#else
int32_t trtcache_trt_library_version(void) { return DOUBLE_VERSION; }
#endif
int32_t trtcache_trt_compiled_version(void) { return DOUBLE_COMPILED_VERSION; }
const char *trtcache_trt_last_error(void) { return last_error; }
const char *trtcache_trt_status_name(int32_t s) { return s == 0 ? "TRTCACHE_TRT_OK" : "DOUBLE_STATUS"; }
void trtcache_trt_bytes_free(trtcache_trt_bytes *b) { if (b) { free(b->data); b->data = NULL; b->len = 0; } }

trtcache_trt_status trtcache_trt_parse(const uint8_t *model, size_t len, const char *dir, int32_t device,
                                       trtcache_trt_network **out) {
    (void)dir;
    last_error[0] = 0;
    if (!model || !out) return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "null argument");
    if (select_device(device)) return TRTCACHE_TRT_CUDA_FAILED;
    if (len == 0) return fail(TRTCACHE_TRT_PARSE_FAILED, "the model is empty");
    if (len >= 6 && memcmp(model, "REJECT", 6) == 0)
        return fail(TRTCACHE_TRT_PARSE_FAILED, "node 0 (bad Foo): no importer for op Foo");
    *out = malloc(sizeof **out);
    if (!*out) return fail(TRTCACHE_TRT_OUT_OF_MEMORY, "malloc");
    (*out)->model_len = len;
    (*out)->perturb = memmem(model, len, PERTURB, sizeof PERTURB - 1) != NULL;
    (*out)->device = device;
    return TRTCACHE_TRT_OK;
}

void trtcache_trt_network_free(trtcache_trt_network *n) { free(n); }

static const char IO[] =
    "{\"inputs\":[{\"name\":\"x\",\"dtype\":0,\"shape\":[-1,4]}],"
    "\"outputs\":[{\"name\":\"y\",\"dtype\":0,\"shape\":[-1,4]}]";

trtcache_trt_status trtcache_trt_network_io_json(trtcache_trt_network *n, trtcache_trt_bytes *out) {
    char buf[256];
    if (!n || !out) return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "null argument");
    snprintf(buf, sizeof buf, "%s}", IO);
    return give(buf, strlen(buf), out);
}

trtcache_trt_status trtcache_trt_supports(const uint8_t *model, size_t len, const char *dir, int32_t device,
                                          trtcache_trt_bytes *out) {
    (void)dir;
    if (!model || !out) return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "null argument");
    if (select_device(device)) return TRTCACHE_TRT_CUDA_FAILED;
    const char *js = (len >= 7 && memcmp(model, "PARTIAL", 7) == 0)
        ? "{\"supported\":false,\"subgraphs\":[{\"supported\":true,\"nodes\":[0]},"
          "{\"supported\":false,\"nodes\":[1]}],\"errors\":[]}"
        : "{\"supported\":true,\"subgraphs\":[{\"supported\":true,\"nodes\":[0,1]}],\"errors\":[]}";
    return give(js, strlen(js), out);
}

trtcache_trt_status trtcache_trt_build(trtcache_trt_network *n, const trtcache_trt_build_options *o,
                                       trtcache_trt_bytes *plan, trtcache_trt_bytes *cache) {
    char buf[4096];
    size_t at;
    if (!n || !o || !plan || !cache) return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "null argument");
    if (o->builder_optimization_level > 5) return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "optimization level over 5");
    if (o->hardware_compatibility_level < 0 || o->hardware_compatibility_level > 2)
        return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "unknown hardware compatibility level");
    if (o->timing_cache_len > 0 &&
        (o->timing_cache_len < sizeof CACHE_HEADER - 1 ||
         memcmp(o->timing_cache, CACHE_HEADER, sizeof CACHE_HEADER - 1) != 0))
        return fail(TRTCACHE_TRT_DESERIALIZE_FAILED, "the timing cache could not be read");
    at = (size_t)snprintf(buf, sizeof buf,
        "%s{\"precision_flags\":%u,\"perturb\":%d,\"device\":%d,\"workspace_bytes\":%llu,\"opt_level\":%d,\"hwcompat\":%d,\"profiles\":[",
        PLAN_HEADER, o->precision_flags, n->perturb, (int)n->device, (unsigned long long)o->workspace_bytes,
        o->builder_optimization_level, o->hardware_compatibility_level);
    for (size_t p = 0; p < o->nb_profiles && at < sizeof buf; ++p) {
        at += (size_t)snprintf(buf + at, sizeof buf - at, "%s[", p ? "," : "");
        for (size_t s = 0; s < o->profiles[p].nb_shapes && at < sizeof buf; ++s) {
            const trtcache_trt_profile_shape *sh = &o->profiles[p].shapes[s];
            at += (size_t)snprintf(buf + at, sizeof buf - at, "%s{\"input\":\"%s\",\"min0\":%lld,\"max0\":%lld,\"rank\":%d}",
                                   s ? "," : "", sh->input, (long long)sh->min[0], (long long)sh->max[0], sh->nb_dims);
        }
        if (at < sizeof buf) at += (size_t)snprintf(buf + at, sizeof buf - at, "]");
    }
    if (at < sizeof buf) at += (size_t)snprintf(buf + at, sizeof buf - at, "]}");
    if (at >= sizeof buf) return fail(TRTCACHE_TRT_INTERNAL, "options too long");
    trtcache_trt_status st = give(buf, at, plan);
    if (st) return st;
    /* Timing cache out: the input's entries plus this build's. */
    size_t in_len = o->timing_cache_len;
    char entry[64];
    int el = snprintf(entry, sizeof entry, "entry-model-%zu\n", n->model_len);
    size_t total = (in_len ? in_len : sizeof CACHE_HEADER - 1) + (size_t)el + 1;
    char *c = malloc(total);
    if (!c) { trtcache_trt_bytes_free(plan); return fail(TRTCACHE_TRT_OUT_OF_MEMORY, "malloc"); }
    size_t cl = 0;
    if (in_len) { memcpy(c, o->timing_cache, in_len); cl = in_len; if (c[cl - 1] != '\n') c[cl++] = '\n'; }
    else { memcpy(c, CACHE_HEADER, sizeof CACHE_HEADER - 1); cl = sizeof CACHE_HEADER - 1; }
    memcpy(c + cl, entry, (size_t)el);
    cl += (size_t)el;
    cache->data = (uint8_t *)c;
    cache->len = cl;
    return TRTCACHE_TRT_OK;
}

/* Union of lines (after the header), sorted by first appearance: a, then b's new ones. */
trtcache_trt_status trtcache_trt_timing_cache_combine(int32_t device, const uint8_t *a, size_t al, const uint8_t *b,
                                                      size_t bl, trtcache_trt_bytes *out) {
    const size_t hl = sizeof CACHE_HEADER - 1;
    if (!out) return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "null out");
    if (select_device(device)) return TRTCACHE_TRT_CUDA_FAILED;
    if ((al && (al < hl || memcmp(a, CACHE_HEADER, hl))) || (bl && (bl < hl || memcmp(b, CACHE_HEADER, hl))))
        return fail(TRTCACHE_TRT_DESERIALIZE_FAILED, "a timing cache could not be read");
    char *res = malloc(hl + al + bl + 2);
    if (!res) return fail(TRTCACHE_TRT_OUT_OF_MEMORY, "malloc");
    size_t rl = hl;
    memcpy(res, CACHE_HEADER, hl);
    const uint8_t *srcs[2] = {a, b};
    size_t lens[2] = {al, bl};
    for (int k = 0; k < 2; ++k) {
        size_t i = lens[k] ? hl : lens[k];
        while (i < lens[k]) {
            size_t j = i;
            while (j < lens[k] && srcs[k][j] != '\n') ++j;
            size_t ll = j - i;
            int seen = 0;
            for (size_t p = hl; p < rl && !seen;) {
                size_t q = p;
                while (q < rl && res[q] != '\n') ++q;
                if (q - p == ll && memcmp(res + p, srcs[k] + i, ll) == 0) seen = 1;
                p = q + 1;
            }
            if (!seen && ll > 0) { memcpy(res + rl, srcs[k] + i, ll); rl += ll; res[rl++] = '\n'; }
            i = j + 1;
        }
    }
    out->data = (uint8_t *)res;
    out->len = rl;
    return TRTCACHE_TRT_OK;
}

trtcache_trt_status trtcache_trt_engine_load(const uint8_t *plan, size_t len, int32_t device,
                                             trtcache_trt_engine **out) {
    const size_t hl = sizeof PLAN_HEADER - 1;
    if (!plan || !out) return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "null argument");
    if (select_device(device)) return TRTCACHE_TRT_CUDA_FAILED;
    if (len < hl || memcmp(plan, PLAN_HEADER, hl)) return fail(TRTCACHE_TRT_DESERIALIZE_FAILED, "not a plan");
    unsigned flags = 0;
    int perturb = 0, built_on = 0;
    char text[128];
    size_t tl = len - hl < sizeof text - 1 ? len - hl : sizeof text - 1;
    memcpy(text, plan + hl, tl);
    text[tl] = 0;
    if (sscanf(text, "{\"precision_flags\":%u,\"perturb\":%d,\"device\":%d", &flags, &perturb, &built_on) != 3)
        return fail(TRTCACHE_TRT_DESERIALIZE_FAILED, "not a plan of this double");
    if (built_on != device) {
        snprintf(last_error, sizeof last_error, "double: the plan was built on CUDA device %d, loaded on %d",
                 built_on, (int)device);
        return TRTCACHE_TRT_DESERIALIZE_FAILED;
    }
    *out = calloc(1, sizeof **out);
    if (!*out) return fail(TRTCACHE_TRT_OUT_OF_MEMORY, "malloc");
    (*out)->int8 = (flags & TRTCACHE_TRT_PRECISION_INT8) != 0 || perturb;
    (*out)->profiles = 1;
    (*out)->device = device;
    return TRTCACHE_TRT_OK;
}

void trtcache_trt_engine_free(trtcache_trt_engine *e) { free(e); }

trtcache_trt_status trtcache_trt_engine_io_json(trtcache_trt_engine *e, trtcache_trt_bytes *out) {
    char buf[256];
    if (!e || !out) return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "null argument");
    snprintf(buf, sizeof buf, "%s,\"profiles\":%d}", IO, e->profiles);
    return give(buf, strlen(buf), out);
}

trtcache_trt_status trtcache_trt_engine_inspect_json(trtcache_trt_engine *e, trtcache_trt_bytes *out) {
    static const char js[] = "{\"Layers\":[{\"Name\":\"double identity\",\"LayerType\":\"Identity\"}],\"Bindings\":[\"x\",\"y\"]}";
    if (!e || !out) return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "null argument");
    return give(js, sizeof js - 1, out);
}

trtcache_trt_status trtcache_trt_engine_run(trtcache_trt_engine *e, int32_t profile, const trtcache_trt_tensor *in,
                                            size_t n, trtcache_trt_outputs **out) {
    if (!e || !out) return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "null argument");
    if (profile != 0) return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "profile does not exist (the engine has 1)");
    if (n != 1 || strcmp(in[0].name, "x") != 0) return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "the engine has one input `x`");
    if (in[0].dtype != TRTCACHE_TRT_FLOAT) return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "input `x`: wrong element type");
    if (in[0].nb_dims != 2 || in[0].dims[1] != 4) return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "input `x`: shape is outside the profile");
    trtcache_trt_outputs *o = calloc(1, sizeof *o);
    if (!o) return fail(TRTCACHE_TRT_OUT_OF_MEMORY, "malloc");
    o->data = malloc(in[0].bytes ? in[0].bytes : 1);
    if (!o->data) { free(o); return fail(TRTCACHE_TRT_OUT_OF_MEMORY, "malloc"); }
    memcpy(o->data, in[0].data, in[0].bytes);
    if (e->int8) {
        float *f = o->data;
        for (size_t i = 0; i < in[0].bytes / sizeof(float); ++i) f[i] += 0.5f;
    }
    o->t = in[0];
    o->t.name = "y";
    o->t.data = o->data;
    *out = o;
    return TRTCACHE_TRT_OK;
}

size_t trtcache_trt_outputs_count(const trtcache_trt_outputs *o) { return o ? 1 : 0; }
const trtcache_trt_tensor *trtcache_trt_outputs_get(const trtcache_trt_outputs *o, size_t i) {
    return (o && i == 0) ? &o->t : NULL;
}
void trtcache_trt_outputs_free(trtcache_trt_outputs *o) { if (o) { free(o->data); free(o); } }

// The TensorRT shim: implements include/trtcache_trt.h over TensorRT's C++ builder, ONNX
// parser and runtime (NvInfer.h, NvOnnxParser.h) and the CUDA runtime API.
//
// Written against TensorRT 10 and compiled against TensorRT 10.0, 10.7, 10.8, 10.9, 10.13,
// 10.16 and 11.1 headers (scripts/check-trt-shim.sh, docs/trt.md). What older headers lack is
// guarded by version (TRTCACHE_TRT_AT_LEAST): the parser's supportsModelV2 (10.1; 10.0 uses
// supportsModel), DataType::kFP4 (10.8), HardwareCompatibilityLevel::kSAME_COMPUTE_CAPABILITY
// (10.9; asking for it from a shim compiled against older headers returns
// TRTCACHE_TRT_UNSUPPORTED naming both versions). TensorRT 11 removed the weakly typed
// precision flags (BuilderFlag::kFP16, kINT8, kBF16, kFP8): built against 11, asking for them
// returns TRTCACHE_TRT_UNSUPPORTED. Nothing here has been run: no GPU and no TensorRT library
// were available where it was written (docs/trt.md).
//
// Every entry point catches everything: no exception crosses the C boundary. Every entry point
// that touches CUDA or TensorRT selects its device first (selectDevice).

#include "trtcache_trt.h"

#include <NvInfer.h>
#include <NvOnnxParser.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#if NV_TENSORRT_MAJOR < 10
#error "trtcache's TensorRT shim needs TensorRT 10 or later headers (NvInferVersion.h says an older major)"
#endif

// Whether the TensorRT headers compiled against are MAJOR.MINOR or later.
#define TRTCACHE_TRT_AT_LEAST(major, minor)                                                       \
    (NV_TENSORRT_MAJOR > (major) || (NV_TENSORRT_MAJOR == (major) && NV_TENSORRT_MINOR >= (minor)))
// The headers' version, encoded as getInferLibVersion() encodes the library's.
#define TRTCACHE_TRT_COMPILED_VERSION (NV_TENSORRT_MAJOR * 10000 + NV_TENSORRT_MINOR * 100 + NV_TENSORRT_PATCH)

namespace
{

thread_local std::string g_last_error;

// TensorRT's last error-level message on this thread (TensorRT logs on the calling thread),
// appended to the thread's error string when a call fails.
thread_local std::string g_trt_error;

class Logger : public nvinfer1::ILogger
{
public:
    void log(Severity severity, char const* msg) noexcept override
    {
        if (severity <= Severity::kERROR && msg != nullptr)
        {
            try
            {
                g_trt_error = msg;
            }
            catch (...)
            {
            }
        }
    }

    std::string takeLastError()
    {
        std::string e;
        e.swap(g_trt_error);
        return e;
    }
};

Logger& logger()
{
    static Logger instance;
    return instance;
}

trtcache_trt_status fail(trtcache_trt_status status, std::string const& message)
{
    std::string trt = logger().takeLastError();
    g_last_error = message;
    if (!trt.empty())
    {
        g_last_error += ": ";
        g_last_error += trt;
    }
    return status;
}

trtcache_trt_status cudaFail(char const* what, cudaError_t e)
{
    return fail(TRTCACHE_TRT_CUDA_FAILED, std::string(what) + ": " + cudaGetErrorString(e));
}

// Used only in messages for what the compiled-against headers lack.
[[maybe_unused]] std::string compiledVersionString()
{
    return std::to_string(NV_TENSORRT_MAJOR) + "." + std::to_string(NV_TENSORRT_MINOR) + "."
        + std::to_string(NV_TENSORRT_PATCH);
}

// Makes `device` the calling thread's current CUDA device. Not restored afterwards: setting
// the previous device back would create a context on it (CUDA 12 initialises the primary
// context in cudaSetDevice), and every entry point selects its own device anyway.
trtcache_trt_status selectDevice(int32_t device)
{
    if (device < 0)
    {
        return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "CUDA device " + std::to_string(device) + " is not an ordinal");
    }
    int count = 0;
    cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess)
    {
        return cudaFail("cudaGetDeviceCount", ce);
    }
    if (device >= count)
    {
        return fail(TRTCACHE_TRT_CUDA_FAILED,
            "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(count)
                + " visible to the CUDA runtime; CUDA_VISIBLE_DEVICES renumbers them)");
    }
    ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
    {
        return cudaFail(("cudaSetDevice(" + std::to_string(device) + ")").c_str(), ce);
    }
    return TRTCACHE_TRT_OK;
}

#define TRTCACHE_SELECT_DEVICE(device)                                                            \
    do                                                                                            \
    {                                                                                             \
        trtcache_trt_status selected = selectDevice(device);                                      \
        if (selected != TRTCACHE_TRT_OK)                                                          \
        {                                                                                         \
            return selected;                                                                      \
        }                                                                                         \
    } while (false)

// Copies `s` into shim-owned bytes.
trtcache_trt_status toBytes(void const* data, size_t len, trtcache_trt_bytes* out)
{
    out->data = nullptr;
    out->len = 0;
    if (len == 0)
    {
        return TRTCACHE_TRT_OK;
    }
    auto* p = static_cast<uint8_t*>(std::malloc(len));
    if (p == nullptr)
    {
        return fail(TRTCACHE_TRT_OUT_OF_MEMORY, "allocating " + std::to_string(len) + " bytes");
    }
    std::memcpy(p, data, len);
    out->data = p;
    out->len = len;
    return TRTCACHE_TRT_OK;
}

trtcache_trt_status stringToBytes(std::string const& s, trtcache_trt_bytes* out)
{
    return toBytes(s.data(), s.size(), out);
}

std::string jsonString(char const* s)
{
    std::string out = "\"";
    for (char const* p = s == nullptr ? "" : s; *p != '\0'; ++p)
    {
        unsigned char c = static_cast<unsigned char>(*p);
        if (c == '"' || c == '\\')
        {
            out += '\\';
            out += static_cast<char>(c);
        }
        else if (c < 0x20)
        {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", c);
            out += buf;
        }
        else
        {
            out += static_cast<char>(c);
        }
    }
    return out + "\"";
}

std::string jsonDims(nvinfer1::Dims const& d)
{
    std::string out = "[";
    for (int32_t i = 0; i < d.nbDims; ++i)
    {
        if (i > 0)
        {
            out += ",";
        }
        out += std::to_string(d.d[i]);
    }
    return out + "]";
}

int32_t dtypeCode(nvinfer1::DataType t)
{
    int32_t v = static_cast<int32_t>(t);
    return v <= TRTCACHE_TRT_FP4 ? v : TRTCACHE_TRT_DTYPE_OTHER;
}

size_t dtypeBits(nvinfer1::DataType t)
{
    switch (t)
    {
    case nvinfer1::DataType::kFLOAT:
    case nvinfer1::DataType::kINT32: return 32;
    case nvinfer1::DataType::kHALF:
    case nvinfer1::DataType::kBF16: return 16;
    case nvinfer1::DataType::kINT8:
    case nvinfer1::DataType::kUINT8:
    case nvinfer1::DataType::kBOOL:
    case nvinfer1::DataType::kFP8: return 8;
    case nvinfer1::DataType::kINT64: return 64;
    case nvinfer1::DataType::kINT4: return 4;
#if TRTCACHE_TRT_AT_LEAST(10, 8)
    case nvinfer1::DataType::kFP4: return 4;
#endif
    default: return 0;
    }
}

std::string modelPathFor(char const* external_data_dir)
{
    // The parser resolves external-data locations relative to the model file's folder; the
    // file itself is never opened (the bytes come from memory).
    if (external_data_dir == nullptr || external_data_dir[0] == '\0')
    {
        return std::string();
    }
    return std::string(external_data_dir) + "/model.onnx";
}

std::string parserErrors(nvonnxparser::IParser& parser)
{
    std::string out;
    for (int i = 0; i < parser.getNbErrors(); ++i)
    {
        nvonnxparser::IParserError const* e = parser.getError(i);
        if (e == nullptr)
        {
            continue;
        }
        if (!out.empty())
        {
            out += "; ";
        }
        out += "node ";
        out += std::to_string(e->node());
        out += " (";
        out += e->nodeName() == nullptr ? "" : e->nodeName();
        out += " ";
        out += e->nodeOperator() == nullptr ? "" : e->nodeOperator();
        out += "): ";
        out += e->desc() == nullptr ? "" : e->desc();
    }
    return out;
}

nvinfer1::NetworkDefinitionCreationFlags networkFlags()
{
#if NV_TENSORRT_MAJOR >= 11
    return 0; // every network is strongly typed
#else
    return 0; // explicit batch is the only mode since TensorRT 10
#endif
}

struct CudaBuffer
{
    void* ptr = nullptr;
    ~CudaBuffer()
    {
        if (ptr != nullptr)
        {
            cudaFree(ptr);
        }
    }
};

} // namespace

struct trtcache_trt_network
{
    int32_t device = 0;
    std::unique_ptr<nvinfer1::IBuilder> builder;
    std::unique_ptr<nvinfer1::INetworkDefinition> network;
    std::unique_ptr<nvonnxparser::IParser> parser;
};

struct trtcache_trt_engine
{
    int32_t device = 0;
    std::unique_ptr<nvinfer1::IRuntime> runtime;
    std::unique_ptr<nvinfer1::ICudaEngine> engine;
    std::unique_ptr<nvinfer1::IExecutionContext> context;
};

struct trtcache_trt_outputs
{
    std::vector<std::string> names;
    std::vector<std::vector<uint8_t>> data;
    std::vector<trtcache_trt_tensor> tensors;
};

#define TRTCACHE_GUARD_BEGIN                                                                      \
    g_last_error.clear();                                                                         \
    g_trt_error.clear();                                                                          \
    try                                                                                           \
    {
#define TRTCACHE_GUARD_END                                                                        \
    }                                                                                             \
    catch (std::bad_alloc const&)                                                                 \
    {                                                                                             \
        return fail(TRTCACHE_TRT_OUT_OF_MEMORY, "out of host memory");                            \
    }                                                                                             \
    catch (std::exception const& e)                                                               \
    {                                                                                             \
        return fail(TRTCACHE_TRT_INTERNAL, e.what());                                             \
    }                                                                                             \
    catch (...)                                                                                   \
    {                                                                                             \
        return fail(TRTCACHE_TRT_INTERNAL, "unknown exception");                                  \
    }

extern "C" {

uint32_t trtcache_trt_abi_version(void)
{
    return TRTCACHE_TRT_ABI_VERSION;
}

int32_t trtcache_trt_library_version(void)
{
    return getInferLibVersion();
}

int32_t trtcache_trt_compiled_version(void)
{
    return TRTCACHE_TRT_COMPILED_VERSION;
}

char const* trtcache_trt_last_error(void)
{
    return g_last_error.c_str();
}

char const* trtcache_trt_status_name(int32_t status)
{
    switch (status)
    {
    case TRTCACHE_TRT_OK: return "TRTCACHE_TRT_OK";
    case TRTCACHE_TRT_INVALID_ARGUMENT: return "TRTCACHE_TRT_INVALID_ARGUMENT";
    case TRTCACHE_TRT_PARSE_FAILED: return "TRTCACHE_TRT_PARSE_FAILED";
    case TRTCACHE_TRT_BUILD_FAILED: return "TRTCACHE_TRT_BUILD_FAILED";
    case TRTCACHE_TRT_DESERIALIZE_FAILED: return "TRTCACHE_TRT_DESERIALIZE_FAILED";
    case TRTCACHE_TRT_RUN_FAILED: return "TRTCACHE_TRT_RUN_FAILED";
    case TRTCACHE_TRT_CUDA_FAILED: return "TRTCACHE_TRT_CUDA_FAILED";
    case TRTCACHE_TRT_UNSUPPORTED: return "TRTCACHE_TRT_UNSUPPORTED";
    case TRTCACHE_TRT_OUT_OF_MEMORY: return "TRTCACHE_TRT_OUT_OF_MEMORY";
    case TRTCACHE_TRT_INTERNAL: return "TRTCACHE_TRT_INTERNAL";
    default: return "TRTCACHE_TRT_UNKNOWN_STATUS";
    }
}

void trtcache_trt_bytes_free(trtcache_trt_bytes* bytes)
{
    if (bytes != nullptr)
    {
        std::free(bytes->data);
        bytes->data = nullptr;
        bytes->len = 0;
    }
}

trtcache_trt_status trtcache_trt_parse(uint8_t const* model, size_t model_len, char const* external_data_dir,
    int32_t device, trtcache_trt_network** out)
{
    TRTCACHE_GUARD_BEGIN
    if (model == nullptr || out == nullptr)
    {
        return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "trtcache_trt_parse: null model or out");
    }
    *out = nullptr;
    TRTCACHE_SELECT_DEVICE(device);
    auto n = std::make_unique<trtcache_trt_network>();
    n->device = device;
    n->builder.reset(nvinfer1::createInferBuilder(logger()));
    if (!n->builder)
    {
        return fail(TRTCACHE_TRT_INTERNAL, "createInferBuilder failed");
    }
    n->network.reset(n->builder->createNetworkV2(networkFlags()));
    if (!n->network)
    {
        return fail(TRTCACHE_TRT_INTERNAL, "createNetworkV2 failed");
    }
    n->parser.reset(nvonnxparser::createParser(*n->network, logger()));
    if (!n->parser)
    {
        return fail(TRTCACHE_TRT_INTERNAL, "createParser failed");
    }
    std::string path = modelPathFor(external_data_dir);
    if (!n->parser->parse(model, model_len, path.empty() ? nullptr : path.c_str()))
    {
        return fail(TRTCACHE_TRT_PARSE_FAILED, "the ONNX parser rejected the model: " + parserErrors(*n->parser));
    }
    *out = n.release();
    return TRTCACHE_TRT_OK;
    TRTCACHE_GUARD_END
}

void trtcache_trt_network_free(trtcache_trt_network* network)
{
    if (network == nullptr)
    {
        return;
    }
    // TensorRT's objects are released on the device they were made on; nothing to report
    // from a void function if that fails.
    (void) cudaSetDevice(network->device);
    // Destruction order: parser, network, builder (members are destroyed in reverse order).
    delete network;
}

trtcache_trt_status trtcache_trt_network_io_json(trtcache_trt_network* network, trtcache_trt_bytes* out)
{
    TRTCACHE_GUARD_BEGIN
    if (network == nullptr || out == nullptr)
    {
        return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "trtcache_trt_network_io_json: null argument");
    }
    std::ostringstream js;
    js << "{\"inputs\":[";
    for (int32_t i = 0; i < network->network->getNbInputs(); ++i)
    {
        nvinfer1::ITensor* t = network->network->getInput(i);
        js << (i > 0 ? "," : "") << "{\"name\":" << jsonString(t->getName())
           << ",\"dtype\":" << dtypeCode(t->getType()) << ",\"shape\":" << jsonDims(t->getDimensions()) << "}";
    }
    js << "],\"outputs\":[";
    for (int32_t i = 0; i < network->network->getNbOutputs(); ++i)
    {
        nvinfer1::ITensor* t = network->network->getOutput(i);
        js << (i > 0 ? "," : "") << "{\"name\":" << jsonString(t->getName())
           << ",\"dtype\":" << dtypeCode(t->getType()) << ",\"shape\":" << jsonDims(t->getDimensions()) << "}";
    }
    js << "]}";
    return stringToBytes(js.str(), out);
    TRTCACHE_GUARD_END
}

trtcache_trt_status trtcache_trt_supports(
    uint8_t const* model, size_t model_len, char const* external_data_dir, int32_t device, trtcache_trt_bytes* out)
{
    TRTCACHE_GUARD_BEGIN
    if (model == nullptr || out == nullptr)
    {
        return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "trtcache_trt_supports: null model or out");
    }
    TRTCACHE_SELECT_DEVICE(device);
    std::unique_ptr<nvinfer1::IBuilder> builder(nvinfer1::createInferBuilder(logger()));
    if (!builder)
    {
        return fail(TRTCACHE_TRT_INTERNAL, "createInferBuilder failed");
    }
    std::unique_ptr<nvinfer1::INetworkDefinition> network(builder->createNetworkV2(networkFlags()));
    if (!network)
    {
        return fail(TRTCACHE_TRT_INTERNAL, "createNetworkV2 failed");
    }
    std::unique_ptr<nvonnxparser::IParser> parser(nvonnxparser::createParser(*network, logger()));
    if (!parser)
    {
        return fail(TRTCACHE_TRT_INTERNAL, "createParser failed");
    }
    std::string path = modelPathFor(external_data_dir);
    std::ostringstream js;
#if TRTCACHE_TRT_AT_LEAST(10, 1)
    bool supported = parser->supportsModelV2(model, model_len, path.empty() ? nullptr : path.c_str());
    js << "{\"supported\":" << (supported ? "true" : "false") << ",\"subgraphs\":[";
    int64_t n = parser->getNbSubgraphs();
    for (int64_t i = 0; i < n; ++i)
    {
        int64_t len = 0;
        int64_t* nodes = parser->getSubgraphNodes(i, len);
        js << (i > 0 ? "," : "") << "{\"supported\":" << (parser->isSubgraphSupported(i) ? "true" : "false")
           << ",\"nodes\":[";
        for (int64_t j = 0; nodes != nullptr && j < len; ++j)
        {
            js << (j > 0 ? "," : "") << nodes[j];
        }
        js << "]}";
    }
#else
    // TensorRT 10.0's parser has no supportsModelV2: supportsModel fills the same partition.
    SubGraphCollection_t subgraphs;
    bool supported = parser->supportsModel(model, model_len, subgraphs, path.empty() ? nullptr : path.c_str());
    js << "{\"supported\":" << (supported ? "true" : "false") << ",\"subgraphs\":[";
    for (size_t i = 0; i < subgraphs.size(); ++i)
    {
        js << (i > 0 ? "," : "") << "{\"supported\":" << (subgraphs[i].second ? "true" : "false") << ",\"nodes\":[";
        for (size_t j = 0; j < subgraphs[i].first.size(); ++j)
        {
            js << (j > 0 ? "," : "") << subgraphs[i].first[j];
        }
        js << "]}";
    }
#endif
    js << "],\"errors\":[";
    bool firstError = true;
    for (int i = 0; i < parser->getNbErrors(); ++i)
    {
        nvonnxparser::IParserError const* e = parser->getError(i);
        if (e == nullptr)
        {
            continue;
        }
        js << (firstError ? "" : ",") << "{\"node\":" << e->node() << ",\"operator\":" << jsonString(e->nodeOperator())
           << ",\"desc\":" << jsonString(e->desc()) << "}";
        firstError = false;
    }
    js << "]}";
    return stringToBytes(js.str(), out);
    TRTCACHE_GUARD_END
}

trtcache_trt_status trtcache_trt_build(trtcache_trt_network* network, trtcache_trt_build_options const* options,
    trtcache_trt_bytes* engine_out, trtcache_trt_bytes* timing_cache_out)
{
    TRTCACHE_GUARD_BEGIN
    if (network == nullptr || options == nullptr || engine_out == nullptr || timing_cache_out == nullptr)
    {
        return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "trtcache_trt_build: null argument");
    }
    engine_out->data = nullptr;
    engine_out->len = 0;
    timing_cache_out->data = nullptr;
    timing_cache_out->len = 0;
    TRTCACHE_SELECT_DEVICE(network->device);
    nvinfer1::IBuilder& builder = *network->builder;
    std::unique_ptr<nvinfer1::IBuilderConfig> config(builder.createBuilderConfig());
    if (!config)
    {
        return fail(TRTCACHE_TRT_INTERNAL, "createBuilderConfig failed");
    }

    uint32_t const flags = options->precision_flags;
    uint32_t const weak = TRTCACHE_TRT_PRECISION_FP16 | TRTCACHE_TRT_PRECISION_BF16 | TRTCACHE_TRT_PRECISION_INT8
        | TRTCACHE_TRT_PRECISION_FP8;
    if ((flags & ~(weak | TRTCACHE_TRT_PRECISION_NO_TF32)) != 0)
    {
        return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "unknown precision flags " + std::to_string(flags));
    }
#if NV_TENSORRT_MAJOR >= 11
    if ((flags & weak) != 0)
    {
        return fail(TRTCACHE_TRT_UNSUPPORTED,
            "TensorRT 11 builds strongly typed networks only: precision comes from the model's types, not "
            "from builder flags (convert the model to fp16 instead)");
    }
#else
    if ((flags & TRTCACHE_TRT_PRECISION_FP16) != 0)
    {
        config->setFlag(nvinfer1::BuilderFlag::kFP16);
    }
    if ((flags & TRTCACHE_TRT_PRECISION_BF16) != 0)
    {
        config->setFlag(nvinfer1::BuilderFlag::kBF16);
    }
    if ((flags & TRTCACHE_TRT_PRECISION_INT8) != 0)
    {
        config->setFlag(nvinfer1::BuilderFlag::kINT8);
    }
    if ((flags & TRTCACHE_TRT_PRECISION_FP8) != 0)
    {
        config->setFlag(nvinfer1::BuilderFlag::kFP8);
    }
#endif
    if ((flags & TRTCACHE_TRT_PRECISION_NO_TF32) != 0)
    {
        config->clearFlag(nvinfer1::BuilderFlag::kTF32);
    }

    if (options->workspace_bytes > 0)
    {
        config->setMemoryPoolLimit(nvinfer1::MemoryPoolType::kWORKSPACE, options->workspace_bytes);
    }
    if (options->builder_optimization_level >= 0)
    {
        if (options->builder_optimization_level > 5)
        {
            return fail(TRTCACHE_TRT_INVALID_ARGUMENT,
                "builder optimization level " + std::to_string(options->builder_optimization_level)
                    + " is outside 0..5");
        }
        config->setBuilderOptimizationLevel(options->builder_optimization_level);
    }
    switch (options->hardware_compatibility_level)
    {
    case TRTCACHE_TRT_HWCOMPAT_NONE: break;
    case TRTCACHE_TRT_HWCOMPAT_AMPERE_PLUS:
        config->setHardwareCompatibilityLevel(nvinfer1::HardwareCompatibilityLevel::kAMPERE_PLUS);
        break;
    case TRTCACHE_TRT_HWCOMPAT_SAME_COMPUTE_CAPABILITY:
#if TRTCACHE_TRT_AT_LEAST(10, 9)
        config->setHardwareCompatibilityLevel(nvinfer1::HardwareCompatibilityLevel::kSAME_COMPUTE_CAPABILITY);
        break;
#else
        return fail(TRTCACHE_TRT_UNSUPPORTED,
            "hardware compatibility level same-compute-capability needs TensorRT 10.9 or later; this shim was "
            "compiled against TensorRT "
                + compiledVersionString() + " headers (rebuild it against TensorRT 10.9+ headers, or build with "
                + "hardware compatibility none or ampere-plus)");
#endif
    default:
        return fail(TRTCACHE_TRT_INVALID_ARGUMENT,
            "hardware compatibility level " + std::to_string(options->hardware_compatibility_level) + " is unknown");
    }

    for (size_t p = 0; p < options->nb_profiles; ++p)
    {
        trtcache_trt_profile const& prof = options->profiles[p];
        nvinfer1::IOptimizationProfile* profile = builder.createOptimizationProfile();
        if (profile == nullptr)
        {
            return fail(TRTCACHE_TRT_INTERNAL, "createOptimizationProfile failed");
        }
        for (size_t s = 0; s < prof.nb_shapes; ++s)
        {
            trtcache_trt_profile_shape const& sh = prof.shapes[s];
            if (sh.input == nullptr || sh.nb_dims < 0 || sh.nb_dims > TRTCACHE_TRT_MAX_DIMS)
            {
                return fail(TRTCACHE_TRT_INVALID_ARGUMENT,
                    "profile " + std::to_string(p) + " shape " + std::to_string(s) + ": no input name or bad rank");
            }
            nvinfer1::Dims mn{}, op{}, mx{};
            mn.nbDims = op.nbDims = mx.nbDims = sh.nb_dims;
            for (int32_t d = 0; d < sh.nb_dims; ++d)
            {
                mn.d[d] = sh.min[d];
                op.d[d] = sh.opt[d];
                mx.d[d] = sh.max[d];
            }
            bool ok = profile->setDimensions(sh.input, nvinfer1::OptProfileSelector::kMIN, mn)
                && profile->setDimensions(sh.input, nvinfer1::OptProfileSelector::kOPT, op)
                && profile->setDimensions(sh.input, nvinfer1::OptProfileSelector::kMAX, mx);
            if (!ok)
            {
                return fail(TRTCACHE_TRT_INVALID_ARGUMENT,
                    "profile " + std::to_string(p) + ": TensorRT refused the shapes of input `" + sh.input + "`");
            }
        }
        if (config->addOptimizationProfile(profile) < 0)
        {
            return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "profile " + std::to_string(p) + " is not valid for the network");
        }
    }

    std::unique_ptr<nvinfer1::ITimingCache> cache(
        config->createTimingCache(options->timing_cache, options->timing_cache == nullptr ? 0 : options->timing_cache_len));
    if (!cache)
    {
        return fail(TRTCACHE_TRT_DESERIALIZE_FAILED, "the timing cache could not be read");
    }
    if (!config->setTimingCache(*cache, false))
    {
        return fail(TRTCACHE_TRT_DESERIALIZE_FAILED, "the timing cache belongs to another device or TensorRT version");
    }

    std::unique_ptr<nvinfer1::IHostMemory> plan(builder.buildSerializedNetwork(*network->network, *config));
    if (!plan || plan->size() == 0)
    {
        return fail(TRTCACHE_TRT_BUILD_FAILED, "buildSerializedNetwork produced no engine");
    }
    trtcache_trt_status st = toBytes(plan->data(), plan->size(), engine_out);
    if (st != TRTCACHE_TRT_OK)
    {
        return st;
    }
    nvinfer1::ITimingCache const* used = config->getTimingCache();
    if (used != nullptr)
    {
        std::unique_ptr<nvinfer1::IHostMemory> blob(used->serialize());
        if (blob)
        {
            st = toBytes(blob->data(), blob->size(), timing_cache_out);
            if (st != TRTCACHE_TRT_OK)
            {
                trtcache_trt_bytes_free(engine_out);
                return st;
            }
        }
    }
    return TRTCACHE_TRT_OK;
    TRTCACHE_GUARD_END
}

trtcache_trt_status trtcache_trt_timing_cache_combine(
    int32_t device, uint8_t const* a, size_t a_len, uint8_t const* b, size_t b_len, trtcache_trt_bytes* out)
{
    TRTCACHE_GUARD_BEGIN
    if (out == nullptr)
    {
        return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "trtcache_trt_timing_cache_combine: null out");
    }
    TRTCACHE_SELECT_DEVICE(device);
    std::unique_ptr<nvinfer1::IBuilder> builder(nvinfer1::createInferBuilder(logger()));
    if (!builder)
    {
        return fail(TRTCACHE_TRT_INTERNAL, "createInferBuilder failed");
    }
    std::unique_ptr<nvinfer1::IBuilderConfig> config(builder->createBuilderConfig());
    if (!config)
    {
        return fail(TRTCACHE_TRT_INTERNAL, "createBuilderConfig failed");
    }
    std::unique_ptr<nvinfer1::ITimingCache> base(config->createTimingCache(a, a == nullptr ? 0 : a_len));
    std::unique_ptr<nvinfer1::ITimingCache> other(config->createTimingCache(b, b == nullptr ? 0 : b_len));
    if (!base || !other)
    {
        return fail(TRTCACHE_TRT_DESERIALIZE_FAILED, "a timing cache could not be read");
    }
    if (!base->combine(*other, false))
    {
        return fail(TRTCACHE_TRT_DESERIALIZE_FAILED,
            "the timing caches could not be combined (another device or TensorRT version)");
    }
    std::unique_ptr<nvinfer1::IHostMemory> blob(base->serialize());
    if (!blob)
    {
        return fail(TRTCACHE_TRT_INTERNAL, "serializing the combined timing cache failed");
    }
    return toBytes(blob->data(), blob->size(), out);
    TRTCACHE_GUARD_END
}

trtcache_trt_status trtcache_trt_engine_load(
    uint8_t const* plan, size_t plan_len, int32_t device, trtcache_trt_engine** out)
{
    TRTCACHE_GUARD_BEGIN
    if (plan == nullptr || plan_len == 0 || out == nullptr)
    {
        return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "trtcache_trt_engine_load: empty plan or null out");
    }
    *out = nullptr;
    TRTCACHE_SELECT_DEVICE(device);
    auto e = std::make_unique<trtcache_trt_engine>();
    e->device = device;
    e->runtime.reset(nvinfer1::createInferRuntime(logger()));
    if (!e->runtime)
    {
        return fail(TRTCACHE_TRT_INTERNAL, "createInferRuntime failed");
    }
    e->engine.reset(e->runtime->deserializeCudaEngine(plan, plan_len));
    if (!e->engine)
    {
        return fail(TRTCACHE_TRT_DESERIALIZE_FAILED, "deserializeCudaEngine failed");
    }
    e->context.reset(e->engine->createExecutionContext());
    if (!e->context)
    {
        return fail(TRTCACHE_TRT_INTERNAL, "createExecutionContext failed");
    }
    *out = e.release();
    return TRTCACHE_TRT_OK;
    TRTCACHE_GUARD_END
}

void trtcache_trt_engine_free(trtcache_trt_engine* engine)
{
    if (engine == nullptr)
    {
        return;
    }
    (void) cudaSetDevice(engine->device); // as in trtcache_trt_network_free
    delete engine;
}

trtcache_trt_status trtcache_trt_engine_io_json(trtcache_trt_engine* engine, trtcache_trt_bytes* out)
{
    TRTCACHE_GUARD_BEGIN
    if (engine == nullptr || out == nullptr)
    {
        return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "trtcache_trt_engine_io_json: null argument");
    }
    TRTCACHE_SELECT_DEVICE(engine->device);
    nvinfer1::ICudaEngine& eng = *engine->engine;
    std::ostringstream ins;
    std::ostringstream outs;
    bool firstIn = true;
    bool firstOut = true;
    for (int32_t i = 0; i < eng.getNbIOTensors(); ++i)
    {
        char const* name = eng.getIOTensorName(i);
        bool input = eng.getTensorIOMode(name) == nvinfer1::TensorIOMode::kINPUT;
        std::ostringstream& js = input ? ins : outs;
        bool& first = input ? firstIn : firstOut;
        js << (first ? "" : ",") << "{\"name\":" << jsonString(name)
           << ",\"dtype\":" << dtypeCode(eng.getTensorDataType(name)) << ",\"shape\":" << jsonDims(eng.getTensorShape(name))
           << "}";
        first = false;
    }
    std::string js = "{\"inputs\":[" + ins.str() + "],\"outputs\":[" + outs.str()
        + "],\"profiles\":" + std::to_string(eng.getNbOptimizationProfiles()) + "}";
    return stringToBytes(js, out);
    TRTCACHE_GUARD_END
}

trtcache_trt_status trtcache_trt_engine_inspect_json(trtcache_trt_engine* engine, trtcache_trt_bytes* out)
{
    TRTCACHE_GUARD_BEGIN
    if (engine == nullptr || out == nullptr)
    {
        return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "trtcache_trt_engine_inspect_json: null argument");
    }
    TRTCACHE_SELECT_DEVICE(engine->device);
    std::unique_ptr<nvinfer1::IEngineInspector> inspector(engine->engine->createEngineInspector());
    if (!inspector)
    {
        return fail(TRTCACHE_TRT_INTERNAL, "createEngineInspector failed");
    }
    inspector->setExecutionContext(engine->context.get());
    char const* info = inspector->getEngineInformation(nvinfer1::LayerInformationFormat::kJSON);
    if (info == nullptr)
    {
        return fail(TRTCACHE_TRT_INTERNAL, "getEngineInformation returned nothing");
    }
    return stringToBytes(info, out);
    TRTCACHE_GUARD_END
}

trtcache_trt_status trtcache_trt_engine_run(trtcache_trt_engine* engine, int32_t profile,
    trtcache_trt_tensor const* inputs, size_t nb_inputs, trtcache_trt_outputs** out)
{
    TRTCACHE_GUARD_BEGIN
    if (engine == nullptr || out == nullptr || (inputs == nullptr && nb_inputs > 0))
    {
        return fail(TRTCACHE_TRT_INVALID_ARGUMENT, "trtcache_trt_engine_run: null argument");
    }
    *out = nullptr;
    TRTCACHE_SELECT_DEVICE(engine->device);
    nvinfer1::ICudaEngine& eng = *engine->engine;
    nvinfer1::IExecutionContext& ctx = *engine->context;
    if (profile < 0 || profile >= eng.getNbOptimizationProfiles())
    {
        return fail(TRTCACHE_TRT_INVALID_ARGUMENT,
            "profile " + std::to_string(profile) + " does not exist (the engine has "
                + std::to_string(eng.getNbOptimizationProfiles()) + ")");
    }
    cudaStream_t stream = nullptr;
    cudaError_t ce = cudaStreamCreate(&stream);
    if (ce != cudaSuccess)
    {
        return cudaFail("cudaStreamCreate", ce);
    }
    struct StreamGuard
    {
        cudaStream_t s;
        ~StreamGuard()
        {
            cudaStreamDestroy(s);
        }
    } streamGuard{stream};
    if (!ctx.setOptimizationProfileAsync(profile, stream))
    {
        return fail(TRTCACHE_TRT_RUN_FAILED, "setOptimizationProfileAsync failed");
    }
    std::vector<CudaBuffer> buffers(static_cast<size_t>(eng.getNbIOTensors()));
    size_t bufferIndex = 0;
    int32_t expectedInputs = 0;
    for (int32_t i = 0; i < eng.getNbIOTensors(); ++i)
    {
        if (eng.getTensorIOMode(eng.getIOTensorName(i)) == nvinfer1::TensorIOMode::kINPUT)
        {
            ++expectedInputs;
        }
    }
    if (static_cast<size_t>(expectedInputs) != nb_inputs)
    {
        return fail(TRTCACHE_TRT_INVALID_ARGUMENT,
            "the engine has " + std::to_string(expectedInputs) + " inputs, " + std::to_string(nb_inputs) + " given");
    }
    for (size_t i = 0; i < nb_inputs; ++i)
    {
        trtcache_trt_tensor const& t = inputs[i];
        if (t.name == nullptr || eng.getTensorIOMode(t.name) != nvinfer1::TensorIOMode::kINPUT)
        {
            return fail(TRTCACHE_TRT_INVALID_ARGUMENT,
                std::string("`") + (t.name == nullptr ? "" : t.name) + "` is not an input of the engine");
        }
        if (dtypeCode(eng.getTensorDataType(t.name)) != t.dtype)
        {
            return fail(TRTCACHE_TRT_INVALID_ARGUMENT, std::string("input `") + t.name + "`: wrong element type");
        }
        if (t.nb_dims < 0 || t.nb_dims > TRTCACHE_TRT_MAX_DIMS)
        {
            return fail(TRTCACHE_TRT_INVALID_ARGUMENT, std::string("input `") + t.name + "`: bad rank");
        }
        nvinfer1::Dims d{};
        d.nbDims = t.nb_dims;
        for (int32_t k = 0; k < t.nb_dims; ++k)
        {
            d.d[k] = t.dims[k];
        }
        if (!ctx.setInputShape(t.name, d))
        {
            return fail(TRTCACHE_TRT_INVALID_ARGUMENT,
                std::string("input `") + t.name + "`: shape " + jsonDims(d) + " is outside the profile");
        }
        CudaBuffer& buf = buffers[bufferIndex++];
        ce = cudaMalloc(&buf.ptr, t.bytes == 0 ? 1 : t.bytes);
        if (ce != cudaSuccess)
        {
            return cudaFail("cudaMalloc", ce);
        }
        if (t.bytes > 0)
        {
            ce = cudaMemcpyAsync(buf.ptr, t.data, t.bytes, cudaMemcpyHostToDevice, stream);
            if (ce != cudaSuccess)
            {
                return cudaFail("cudaMemcpyAsync (input)", ce);
            }
        }
        if (!ctx.setTensorAddress(t.name, buf.ptr))
        {
            return fail(TRTCACHE_TRT_RUN_FAILED, std::string("setTensorAddress `") + t.name + "` failed");
        }
    }
    auto result = std::make_unique<trtcache_trt_outputs>();
    std::vector<void*> outputDevice;
    for (int32_t i = 0; i < eng.getNbIOTensors(); ++i)
    {
        char const* name = eng.getIOTensorName(i);
        if (eng.getTensorIOMode(name) != nvinfer1::TensorIOMode::kOUTPUT)
        {
            continue;
        }
        nvinfer1::Dims d = ctx.getTensorShape(name);
        size_t elements = 1;
        for (int32_t k = 0; k < d.nbDims; ++k)
        {
            if (d.d[k] < 0)
            {
                return fail(TRTCACHE_TRT_UNSUPPORTED,
                    std::string("output `") + name + "` has a data-dependent shape " + jsonDims(d));
            }
            elements *= static_cast<size_t>(d.d[k]);
        }
        size_t bits = dtypeBits(eng.getTensorDataType(name));
        if (bits == 0)
        {
            return fail(TRTCACHE_TRT_UNSUPPORTED, std::string("output `") + name + "` has an unknown element type");
        }
        size_t bytes = (elements * bits + 7) / 8;
        CudaBuffer& buf = buffers[bufferIndex++];
        ce = cudaMalloc(&buf.ptr, bytes == 0 ? 1 : bytes);
        if (ce != cudaSuccess)
        {
            return cudaFail("cudaMalloc", ce);
        }
        if (!ctx.setTensorAddress(name, buf.ptr))
        {
            return fail(TRTCACHE_TRT_RUN_FAILED, std::string("setTensorAddress `") + name + "` failed");
        }
        result->names.emplace_back(name);
        result->data.emplace_back(bytes);
        trtcache_trt_tensor t{};
        t.dtype = dtypeCode(eng.getTensorDataType(name));
        t.nb_dims = d.nbDims;
        for (int32_t k = 0; k < d.nbDims; ++k)
        {
            t.dims[k] = d.d[k];
        }
        t.bytes = bytes;
        result->tensors.push_back(t);
        outputDevice.push_back(buf.ptr);
    }
    if (!ctx.enqueueV3(stream))
    {
        return fail(TRTCACHE_TRT_RUN_FAILED, "enqueueV3 failed");
    }
    for (size_t i = 0; i < result->tensors.size(); ++i)
    {
        if (result->tensors[i].bytes == 0)
        {
            continue;
        }
        ce = cudaMemcpyAsync(result->data[i].data(), outputDevice[i], result->tensors[i].bytes,
            cudaMemcpyDeviceToHost, stream);
        if (ce != cudaSuccess)
        {
            return cudaFail("cudaMemcpyAsync (output)", ce);
        }
    }
    ce = cudaStreamSynchronize(stream);
    if (ce != cudaSuccess)
    {
        return cudaFail("cudaStreamSynchronize", ce);
    }
    // Pointers into the vectors are taken only now that they no longer grow.
    for (size_t i = 0; i < result->tensors.size(); ++i)
    {
        result->tensors[i].name = result->names[i].c_str();
        result->tensors[i].data = result->data[i].data();
    }
    *out = result.release();
    return TRTCACHE_TRT_OK;
    TRTCACHE_GUARD_END
}

size_t trtcache_trt_outputs_count(trtcache_trt_outputs const* outputs)
{
    return outputs == nullptr ? 0 : outputs->tensors.size();
}

trtcache_trt_tensor const* trtcache_trt_outputs_get(trtcache_trt_outputs const* outputs, size_t index)
{
    if (outputs == nullptr || index >= outputs->tensors.size())
    {
        return nullptr;
    }
    return &outputs->tensors[index];
}

void trtcache_trt_outputs_free(trtcache_trt_outputs* outputs)
{
    delete outputs;
}

} // extern "C"

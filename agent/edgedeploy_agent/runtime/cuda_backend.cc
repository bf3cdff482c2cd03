// edgedeploy's CUDA backend for the TVM 0.27 runtime: what libtvm_runtime_cuda.so does for the agent,
// on every NVIDIA driver from CUDA 11.4 up (JetPack 5 Xaviers, T4 servers on long-term driver branches).
//
// The apache-tvm wheel's backend links libcudart.so.13 and calls cuLaunchKernelEx and
// cuTensorMapEncodeTiled, so it needs a CUDA 13 driver (R580+). This one is written against the headers
// the wheels ship (tvm/include, tvm_ffi/include, tvm/src/runtime/workspace_pool.h) and uses only the CUDA
// *driver* API, resolved at run time from libcuda.so.1 with dlsym: no libcudart, no cuda.h, no toolkit on
// the build host. Every entry point it resolves is listed once, in kDriverEntryPoints below; the test
// tests/agent/test_cuda_backend.py checks that list against CUDA 11.7's cuda.h and the entry points
// NVIDIA's release notes name as new in 11.5-11.7, and against the built library's strings.
//
// It registers what a Relax VM executable for a CUDA target calls:
//   device_api.cuda, device_api.cuda_host       memory, copies, streams, attributes (DeviceAPI)
//   ffi.Module.load_from_bytes.cuda              the device module an exported library carries
//                                                (cubin, fatbin or PTX, loaded with cuModuleLoadData)
//   vm.builtin.cuda_graph.run_or_capture         CUDA graphs (bundles are built with them by default)
//   vm.builtin.cuda_graph.get_cached_alloc
//   runtime.get_cuda_stream
//   edgedeploy.cuda.backend_info                 driver version, device, this backend's name
//   edgedeploy.cuda.module_info                  a loaded module's format and kernels (tests, no GPU)
// What needs a newer driver than 11.4 (thread-block clusters, programmatic dependent launch, TMA tensor
// maps) is refused with a clear error when a kernel asks for it; TVM emits none of it below sm_90.
//
// Build: host/edgedeploy/cuda_backend.py (g++ or aarch64-linux-gnu-g++, C++17). Never load it in the same
// process as the wheel's libtvm_runtime_cuda.so: both register the same global functions.

#include <dlfcn.h>
#include <tvm/ffi/cast.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/map.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/reflection/registry.h>
#include <tvm/runtime/device_api.h>
#include <tvm/runtime/vm/vm.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "workspace_pool.h"  // tvm/src/runtime in the apache-tvm wheel; WorkspacePool is exported

// The library must load on JetPack 5 (Ubuntu 20.04: glibc 2.31, GCC 10's libstdc++, GLIBCXX_3.4.28) when
// it is built on a newer distribution. Two symbols would raise that floor:
// - glibc 2.34 moved dlopen/dlsym/dlerror into libc.so.6 under a new version; bind the old one, which
//   every glibc keeps (the build passes GLIBC_2.2.5 for x86_64, GLIBC_2.17 for aarch64).
#ifdef EDGEDEPLOY_DL_VERSION
__asm__(".symver dlopen,dlopen@" EDGEDEPLOY_DL_VERSION);
__asm__(".symver dlsym,dlsym@" EDGEDEPLOY_DL_VERSION);
__asm__(".symver dlerror,dlerror@" EDGEDEPLOY_DL_VERSION);
#endif
// - GCC 11+'s allocators call std::__throw_bad_array_new_length (GLIBCXX_3.4.29): a copy here, kept out of
//   the dynamic symbol table by the build's version script.
namespace std {
[[noreturn]] void __throw_bad_array_new_length() {
  throw std::bad_array_new_length();
}
}  // namespace std

namespace edgedeploy {
namespace cuda {

using tvm::ffi::Any;
using tvm::ffi::AnyView;
using tvm::ffi::PackedArgs;

// ---- The CUDA driver API, as much of it as we use (types and values from the driver API docs) ----------

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;  // NOLINT(runtime/int): 64-bit on every platform CUDA supports
using CUcontext = struct CUctx_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;
using CUgraph = struct CUgraph_st*;
using CUgraphExec = struct CUgraphExec_st*;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_DEINITIALIZED = 4;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr CUresult CUDA_ERROR_ILLEGAL_ADDRESS = 700;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X = 2;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8;
constexpr int CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10;
constexpr int CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK = 12;
constexpr int CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13;
constexpr int CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr int CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
constexpr int CU_STREAM_CAPTURE_MODE_GLOBAL = 0;
constexpr int CU_STREAM_DEFAULT = 0;
constexpr int CU_STREAM_NON_BLOCKING = 1;
constexpr int CU_EVENT_DISABLE_TIMING = 2;

// X(return-free name in the library, C signature). Each is the exact symbol libcuda.so.1 exports; the
// versioned ones (_v2) are what cuda.h maps the plain names to since CUDA 4.0-11.0.
#define EDGEDEPLOY_CUDA_ENTRY_POINTS(X)                                                               \
  X(cuInit, (unsigned int))                                                                            \
  X(cuDriverGetVersion, (int*))                                                                        \
  X(cuGetErrorName, (CUresult, const char**))                                                          \
  X(cuGetErrorString, (CUresult, const char**))                                                        \
  X(cuDeviceGetCount, (int*))                                                                          \
  X(cuDeviceGet, (CUdevice*, int))                                                                     \
  X(cuDeviceGetAttribute, (int*, int, CUdevice))                                                       \
  X(cuDeviceGetName, (char*, int, CUdevice))                                                           \
  X(cuDeviceTotalMem_v2, (size_t*, CUdevice))                                                          \
  X(cuDevicePrimaryCtxRetain, (CUcontext*, CUdevice))                                                  \
  X(cuCtxSetCurrent, (CUcontext))                                                                      \
  X(cuMemGetInfo_v2, (size_t*, size_t*))                                                               \
  X(cuMemAlloc_v2, (CUdeviceptr*, size_t))                                                             \
  X(cuMemFree_v2, (CUdeviceptr))                                                                       \
  X(cuMemAllocHost_v2, (void**, size_t))                                                               \
  X(cuMemFreeHost, (void*))                                                                            \
  X(cuMemcpyHtoDAsync_v2, (CUdeviceptr, const void*, size_t, CUstream))                                \
  X(cuMemcpyDtoHAsync_v2, (void*, CUdeviceptr, size_t, CUstream))                                      \
  X(cuMemcpyDtoDAsync_v2, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                                \
  X(cuMemcpyPeerAsync, (CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream))             \
  X(cuStreamCreate, (CUstream*, unsigned int))                                                         \
  X(cuStreamDestroy_v2, (CUstream))                                                                    \
  X(cuStreamSynchronize, (CUstream))                                                                   \
  X(cuStreamWaitEvent, (CUstream, CUevent, unsigned int))                                              \
  X(cuEventCreate, (CUevent*, unsigned int))                                                           \
  X(cuEventRecord, (CUevent, CUstream))                                                                \
  X(cuEventDestroy_v2, (CUevent))                                                                      \
  X(cuModuleLoadData, (CUmodule*, const void*))                                                        \
  X(cuModuleUnload, (CUmodule))                                                                        \
  X(cuModuleGetFunction, (CUfunction*, CUmodule, const char*))                                         \
  X(cuFuncSetAttribute, (CUfunction, int, int))                                                        \
  X(cuLaunchKernel, (CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int, \
                     unsigned int, unsigned int, CUstream, void**, void**))                            \
  X(cuStreamBeginCapture_v2, (CUstream, int))                                                          \
  X(cuStreamIsCapturing, (CUstream, int*))                                                             \
  X(cuStreamEndCapture, (CUstream, CUgraph*))                                                          \
  X(cuGraphInstantiateWithFlags, (CUgraphExec*, CUgraph, unsigned long long))                          \
  X(cuGraphLaunch, (CUgraphExec, CUstream))                                                            \
  X(cuGraphExecDestroy, (CUgraphExec))                                                                 \
  X(cuGraphDestroy, (CUgraph))

#define EDGEDEPLOY_CUDA_NAME(name, sig) #name,
// Read by tests (strings in the built library) and by edgedeploy.cuda.backend_info.
static const char* const kDriverEntryPoints[] = {EDGEDEPLOY_CUDA_ENTRY_POINTS(EDGEDEPLOY_CUDA_NAME)};
#undef EDGEDEPLOY_CUDA_NAME

/*! \brief libcuda.so.1, opened on first use. A process without a driver loads this library fine and gets
 * one clear error from the first call that needs the GPU. */
class Driver {
 public:
#define EDGEDEPLOY_CUDA_POINTER(name, sig) CUresult(*name) sig = nullptr;
  EDGEDEPLOY_CUDA_ENTRY_POINTS(EDGEDEPLOY_CUDA_POINTER)
#undef EDGEDEPLOY_CUDA_POINTER

  static Driver& Get() {
    static Driver* inst = new Driver();  // never destroyed: kernels may be freed during process exit
    inst->Check();
    return *inst;
  }

  /*! \brief "" when the driver is usable, else why not (without throwing). */
  static std::string Problem() {
    try {
      Get();
    } catch (const tvm::ffi::Error& e) {
      return e.message();
    }
    return "";
  }

  void Call(CUresult r, const char* what) const {
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_DEINITIALIZED) return;
    TVM_FFI_THROW(RuntimeError) << "CUDA " << what << " failed: " << ErrorText(r);
  }

  std::string ErrorText(CUresult r) const {
    const char* name = nullptr;
    const char* text = nullptr;
    if (cuGetErrorName == nullptr || cuGetErrorName(r, &name) != CUDA_SUCCESS) name = nullptr;
    if (cuGetErrorString == nullptr || cuGetErrorString(r, &text) != CUDA_SUCCESS) text = nullptr;
    std::ostringstream os;
    os << (name ? name : "CUDA_ERROR") << " (" << r << ")";
    if (text) os << ": " << text;
    return os.str();
  }

  int version() const { return version_; }
  int device_count() const { return device_count_; }

 private:
  Driver() {
    lib_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) {
      problem_ = "no CUDA driver: libcuda.so.1 cannot be loaded (" + std::string(dlerror()) + ")";
      return;
    }
#define EDGEDEPLOY_CUDA_RESOLVE(name, sig)                                                  \
  name = reinterpret_cast<CUresult(*) sig>(dlsym(lib_, #name));                             \
  if (name == nullptr && problem_.empty()) {                                                \
    problem_ = "the CUDA driver lacks " #name " (the edgedeploy backend needs CUDA 11.4+)"; \
  }
    EDGEDEPLOY_CUDA_ENTRY_POINTS(EDGEDEPLOY_CUDA_RESOLVE)
#undef EDGEDEPLOY_CUDA_RESOLVE
    if (!problem_.empty()) return;
    CUresult r = cuInit(0);
    if (r != CUDA_SUCCESS) {
      problem_ = r == CUDA_ERROR_NO_DEVICE ? "no CUDA device (cuInit: " + ErrorText(r) + ")"
                                           : "CUDA driver present but cuInit failed: " + ErrorText(r);
      return;
    }
    cuDriverGetVersion(&version_);
    if (cuDeviceGetCount(&device_count_) != CUDA_SUCCESS || device_count_ < 1) {
      problem_ = "no CUDA device (the driver reports none)";
    }
  }

  void Check() const {
    if (!problem_.empty()) TVM_FFI_THROW(RuntimeError) << "edgedeploy CUDA backend: " << problem_;
  }

  void* lib_ = nullptr;
  std::string problem_;
  int version_ = 0;
  int device_count_ = 0;
};

#define CU(call) Driver::Get().Call(Driver::Get().call, #call)

constexpr int kMaxDevices = 32;

/*! \brief The primary context of each device, retained once, and the device this thread works on (the
 * runtime API's cudaSetDevice/cudaGetDevice, which the driver API leaves to us). */
class Contexts {
 public:
  static CUcontext Primary(int device_id) {
    static std::array<CUcontext, kMaxDevices> contexts{};
    static std::mutex mutex;
    TVM_FFI_CHECK(device_id >= 0 && device_id < Driver::Get().device_count() && device_id < kMaxDevices,
                  ValueError)
        << "CUDA device " << device_id << " does not exist (" << Driver::Get().device_count() << " found)";
    std::lock_guard<std::mutex> lock(mutex);
    if (contexts[device_id] == nullptr) {
      CUdevice dev;
      CU(cuDeviceGet(&dev, device_id));
      CU(cuDevicePrimaryCtxRetain(&contexts[device_id], dev));
    }
    return contexts[device_id];
  }

  /*! \brief Make `device_id` this thread's device: its primary context current. Every kernel launch passes
   * here: once the thread is on that device it returns at once (no lock, no driver call). */
  static void Use(int device_id) {
    thread_local int current = -1;  // the device whose context this thread made current
    CurrentDevice() = device_id;
    if (device_id == current) return;
    CU(cuCtxSetCurrent(Primary(device_id)));
    current = device_id;
  }

  static int& CurrentDevice() {
    thread_local int device = 0;
    return device;
  }

  /*! \brief This thread's device, its context current (what the runtime API does implicitly). */
  static int Current() {
    int dev = CurrentDevice();
    Use(dev);
    return dev;
  }
};

inline CUstream CurrentStream(int device_id) {
  return static_cast<CUstream>(TVMFFIEnvGetStream(kDLCUDA, device_id));
}

/*! \brief This thread's current stream is being recorded (the agent's frame graphs, runtime/frame_graph.py). The
    legacy stream, the default one, never is. */
inline bool Recording(int device_id) {
  CUstream s = CurrentStream(device_id);
  int status = 0;  // CU_STREAM_CAPTURE_STATUS_NONE
  return s != nullptr && Driver::Get().cuStreamIsCapturing(s, &status) == CUDA_SUCCESS && status != 0;
}

// ---- DeviceAPI ------------------------------------------------------------------------------------------

class CudaDeviceAPI final : public tvm::runtime::DeviceAPI {
 public:
  void SetDevice(tvm::Device dev) final { Contexts::Use(dev.device_id); }

  void GetAttr(tvm::Device dev, tvm::runtime::DeviceAttrKind kind, Any* rv) final {
    using namespace tvm::runtime;  // NOLINT(build/namespaces): the DeviceAttrKind values
    if (kind == kExist) {
      *rv = static_cast<int>(Driver::Problem().empty() && dev.device_id < Driver::Get().device_count());
      return;
    }
    Contexts::Use(dev.device_id);
    CUdevice d;
    CU(cuDeviceGet(&d, dev.device_id));
    auto attr = [&](int which) {
      int v = 0;
      CU(cuDeviceGetAttribute(&v, which, d));
      return v;
    };
    switch (kind) {
      case kMaxThreadsPerBlock:
        *rv = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
        return;
      case kWarpSize:
        *rv = attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE);
        return;
      case kMaxSharedMemoryPerBlock:
        *rv = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
        return;
      case kComputeVersion:
        *rv = std::to_string(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)) + "." +
              std::to_string(attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR));
        return;
      case kDeviceName: {
        char name[256] = {0};
        CU(cuDeviceGetName(name, sizeof(name) - 1, d));
        *rv = std::string(name);
        return;
      }
      case kMaxClockRate:
        *rv = attr(CU_DEVICE_ATTRIBUTE_CLOCK_RATE);
        return;
      case kMultiProcessorCount:
        *rv = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
        return;
      case kMaxThreadDimensions: {
        std::ostringstream os;  // a JSON list, as TVM's own backends answer
        os << "[" << attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X) << ", "
           << attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X + 1) << ", "
           << attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X + 2) << "]";
        *rv = os.str();
        return;
      }
      case kMaxRegistersPerBlock:
        *rv = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
        return;
      case kApiVersion:
      case kDriverVersion:
        *rv = Driver::Get().version();
        return;
      case kL2CacheSizeBytes:
        *rv = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
        return;
      case kTotalGlobalMemory: {
        size_t total = 0;
        CU(cuDeviceTotalMem_v2(&total, d));
        *rv = static_cast<int64_t>(total);
        return;
      }
      case kAvailableGlobalMemory: {
        size_t free_mem = 0, total = 0;
        CU(cuMemGetInfo_v2(&free_mem, &total));
        *rv = static_cast<int64_t>(free_mem);
        return;
      }
      default:
        return;  // kGcnArch, kImagePitchAlignment: not CUDA's
    }
  }

  void* AllocDataSpace(tvm::Device dev, size_t nbytes, size_t alignment, DLDataType type_hint) final {
    TVM_FFI_CHECK(256 % alignment == 0, ValueError) << "CUDA memory is aligned at 256 bytes, not " << alignment;
    if (dev.device_type == kDLCUDAHost) {  // page-locked host memory, for fast copies
      Contexts::Current();
      void* ptr = nullptr;
      CU(cuMemAllocHost_v2(&ptr, nbytes));
      return ptr;
    }
    Contexts::Use(dev.device_id);
    CUdeviceptr ptr = 0;
    CU(cuMemAlloc_v2(&ptr, nbytes == 0 ? 1 : nbytes));
    return reinterpret_cast<void*>(ptr);
  }

  void FreeDataSpace(tvm::Device dev, void* ptr) final {
    if (dev.device_type == kDLCUDAHost) {
      Contexts::Current();
      CU(cuMemFreeHost(ptr));
      return;
    }
    Contexts::Use(dev.device_id);
    // While a graph is recorded nothing is freed (the memory is left allocated): the VM's pooled allocator answers
    // an allocation the driver refused (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, in a recording's thread-local
    // mode; the agent's recordings are relaxed since 2026-12-07, runtime/frame_graph.py) by freeing every buffer
    // it caches, and graphs recorded before hold those buffers' addresses (the model's scratch tensors, back in
    // the pool after their recording). Seen on the H200, 2026-12-07, a whole-frame graph's recording. What a
    // refusal then costs is the pool's cache, left allocated.
    if (Recording(dev.device_id)) return;
    CUresult r = Driver::Get().cuMemFree_v2(reinterpret_cast<CUdeviceptr>(ptr));
    // after a kernel fault the context is unusable and every free fails the same way: do not mask the
    // fault with a second exception while one is unwinding
    if (r == CUDA_ERROR_ILLEGAL_ADDRESS && std::uncaught_exceptions()) return;
    Driver::Get().Call(r, "cuMemFree_v2");
  }

  TVMStreamHandle CreateStream(tvm::Device dev) final {
    Contexts::Use(dev.device_id);
    CUstream s = nullptr;
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    return s;
  }

  void FreeStream(tvm::Device dev, TVMStreamHandle stream) final {
    Contexts::Use(dev.device_id);
    CU(cuStreamDestroy_v2(static_cast<CUstream>(stream)));
  }

  void StreamSync(tvm::Device dev, TVMStreamHandle stream) final {
    Contexts::Use(dev.device_id);
    CU(cuStreamSynchronize(static_cast<CUstream>(stream)));
  }

  void SyncStreamFromTo(tvm::Device dev, TVMStreamHandle src,
                        TVMStreamHandle dst) final {
    Contexts::Use(dev.device_id);
    CUevent ev = nullptr;
    CU(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    CU(cuEventRecord(ev, static_cast<CUstream>(src)));
    CU(cuStreamWaitEvent(static_cast<CUstream>(dst), ev, 0));
    CU(cuEventDestroy_v2(ev));
  }

  void* AllocWorkspace(tvm::Device dev, size_t size, DLDataType type_hint) final {
    return Workspaces()->AllocWorkspace(dev, size);
  }

  void FreeWorkspace(tvm::Device dev, void* data) final { Workspaces()->FreeWorkspace(dev, data); }

  bool SupportsDevicePointerArithmeticsOnHost() final { return true; }

  static CudaDeviceAPI* Global() {
    static auto* inst = new CudaDeviceAPI();
    return inst;
  }

 protected:
  void CopyDataFromTo(const void* from, size_t from_offset, void* to, size_t to_offset, size_t size,
                      tvm::Device dev_from, tvm::Device dev_to, DLDataType type_hint,
                      TVMStreamHandle stream) final {
    auto src = static_cast<const char*>(from) + from_offset;
    auto dst = static_cast<char*>(to) + to_offset;
    auto s = static_cast<CUstream>(stream);
    bool from_gpu = dev_from.device_type == kDLCUDA, to_gpu = dev_to.device_type == kDLCUDA;
    if (!from_gpu && !to_gpu) {  // cpu or page-locked host memory on both sides
      std::memcpy(dst, src, size);
    } else if (from_gpu && to_gpu && dev_from.device_id != dev_to.device_id) {
      Contexts::Use(dev_from.device_id);
      CU(cuMemcpyPeerAsync(reinterpret_cast<CUdeviceptr>(dst), Contexts::Primary(dev_to.device_id),
                           reinterpret_cast<CUdeviceptr>(src), Contexts::Primary(dev_from.device_id), size, s));
    } else if (from_gpu && to_gpu) {
      Contexts::Use(dev_from.device_id);
      CU(cuMemcpyDtoDAsync_v2(reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src), size, s));
    } else if (from_gpu) {
      Contexts::Use(dev_from.device_id);
      CU(cuMemcpyDtoHAsync_v2(dst, reinterpret_cast<CUdeviceptr>(src), size, s));
    } else {
      Contexts::Use(dev_to.device_id);
      CU(cuMemcpyHtoDAsync_v2(reinterpret_cast<CUdeviceptr>(dst), src, size, s));
    }
  }

 private:
  static tvm::runtime::WorkspacePool* Workspaces() {
    static thread_local tvm::runtime::WorkspacePool pool(kDLCUDA, Global());
    return &pool;
  }
};

// ---- The device module: what an exported library carries for its kernels --------------------------------

/*! \brief Reads TVM's binary serialization (tvm/support/serializer.h: little-endian scalars, a string or
 * array as a uint64 count then its items), the format CUDAModuleNode::SaveToBytes writes:
 * [fmt: string][functions: map<string, FunctionInfo>][code: bytes]. */
class Reader {
 public:
  Reader(const char* data, size_t size) : p_(data), end_(data + size) {}

  template <typename T>
  T Scalar() {
    T v;
    Need(sizeof(T));
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }

  uint64_t Count(size_t min_item_bytes) {
    uint64_t n = Scalar<uint64_t>();
    TVM_FFI_CHECK(n <= static_cast<uint64_t>(end_ - p_) / (min_item_bytes ? min_item_bytes : 1), ValueError)
        << "corrupt CUDA module: a count of " << n << " runs past its end";
    return n;
  }

  std::string String() {
    uint64_t n = Count(1);
    std::string s(p_, n);
    p_ += n;
    return s;
  }

  bool AtEnd() const { return p_ == end_; }

 private:
  void Need(size_t n) const {
    TVM_FFI_CHECK(static_cast<size_t>(end_ - p_) >= n, ValueError) << "corrupt CUDA module: truncated";
  }
  const char* p_;
  const char* end_;
};

enum class ArgKind { kPointer, kInt64, kInt32, kUInt32, kFloat64, kFloat32 };

struct Kernel {
  std::string name;
  std::vector<ArgKind> args;
  std::vector<int> launch_slots;  // per launch argument: 0-2 grid x/y/z, 3-5 block x/y/z
  bool dynamic_shared_memory = false;
};

/*! \brief One argument of FunctionInfo.arg_types as TVM's pack_args.h passes it to a kernel. */
ArgKind ArgKindOf(const DLDataType& t, const std::string& kernel) {
  if (t.lanes == 1) {
    if (t.code == kDLOpaqueHandle) return ArgKind::kPointer;
    if (t.code == kDLInt && t.bits == 64) return ArgKind::kInt64;
    if (t.code == kDLInt && t.bits == 32) return ArgKind::kInt32;
    if (t.code == kDLUInt && t.bits == 32) return ArgKind::kUInt32;
    if (t.code == kDLFloat && t.bits == 64) return ArgKind::kFloat64;
    if (t.code == kDLFloat && t.bits == 32) return ArgKind::kFloat32;
  }
  TVM_FFI_THROW(ValueError) << "kernel " << kernel << ": argument type code " << int(t.code) << " bits "
                            << int(t.bits) << " lanes " << t.lanes << " cannot be passed to a CUDA kernel";
  TVM_FFI_UNREACHABLE();
}

/*! \brief A launch tag of FunctionInfo.launch_param_tags: which launch dimension its argument sets. */
void AddLaunchTag(Kernel* k, const std::string& tag, bool last) {
  static const char* const kDims[] = {"blockIdx.x", "blockIdx.y", "blockIdx.z",
                                      "threadIdx.x", "threadIdx.y", "threadIdx.z"};
  for (int i = 0; i < 6; ++i) {
    if (tag == kDims[i]) {
      k->launch_slots.push_back(i);
      return;
    }
  }
  if (tag == "tirx.use_dyn_shared_memory" || tag == "tir.use_dyn_shared_memory") {
    TVM_FFI_CHECK(last, ValueError) << "kernel " << k->name << ": the dynamic shared memory tag must be last";
    k->dynamic_shared_memory = true;
    return;
  }
  if (tag == "tirx.use_required_block_dimension") return;  // the block size is the launch's all the same
  TVM_FFI_THROW(RuntimeError) << "kernel " << k->name << " needs launch feature '" << tag
                              << "' (thread-block clusters, programmatic or cooperative launch: CUDA 12 "
                                 "drivers), which the edgedeploy CUDA backend does not offer";
}

Kernel ReadKernel(Reader* r) {
  Kernel k;
  k.name = r->String();
  uint64_t nargs = r->Count(4);
  for (uint64_t i = 0; i < nargs; ++i) {
    DLDataType t;
    t.code = r->Scalar<uint8_t>();
    t.bits = r->Scalar<uint8_t>();
    t.lanes = r->Scalar<uint16_t>();
    k.args.push_back(ArgKindOf(t, k.name));
  }
  uint64_t ntags = r->Count(8);
  std::vector<std::string> tags;
  for (uint64_t i = 0; i < ntags; ++i) tags.push_back(r->String());
  for (size_t i = 0; i < tags.size(); ++i) AddLaunchTag(&k, tags[i], i + 1 == tags.size());
  uint64_t nextra = r->Count(4);
  for (uint64_t i = 0; i < nextra; ++i) {
    TVM_FFI_CHECK(r->Scalar<int32_t>() == 0, RuntimeError)
        << "kernel " << k.name << " takes a TMA tensor map (CUDA 12 drivers), which the edgedeploy CUDA "
        << "backend does not offer";
  }
  return k;
}

class CudaModule;

/*! \brief A kernel bound to its module: the packed function the host code calls with the kernel's
 * arguments followed by its launch dimensions. */
class KernelLauncher {
 public:
  KernelLauncher(CudaModule* module, tvm::ffi::ObjectPtr<tvm::ffi::Object> keep, const Kernel* kernel)
      : module_(module), keep_(std::move(keep)), kernel_(kernel) {
    functions_.fill(nullptr);
  }

  void operator()(PackedArgs args, Any* rv) const;

 private:
  CudaModule* module_;
  tvm::ffi::ObjectPtr<tvm::ffi::Object> keep_;  // the module outlives every function taken from it
  const Kernel* kernel_;
  mutable std::array<CUfunction, kMaxDevices> functions_;
};

class CudaModule : public tvm::ffi::ModuleObj {
 public:
  CudaModule(std::string fmt, std::vector<Kernel> kernels, std::string code)
      : fmt_(std::move(fmt)), code_(std::move(code)) {
    for (auto& k : kernels) kernels_.emplace(k.name, std::move(k));
    modules_.fill(nullptr);
    if (fmt_ == "ptx" && (code_.empty() || code_.back() != '\0')) code_.push_back('\0');  // PTX is text
  }

  ~CudaModule() {
    // the driver frees a context's modules with it; unloading here only matters for a long-lived process
    // that loads and drops releases, and must not throw while the process exits
    for (size_t i = 0; i < modules_.size(); ++i) {
      if (modules_[i] != nullptr && Driver::Problem().empty()) (void)Driver::Get().cuModuleUnload(modules_[i]);
    }
  }

  const char* kind() const final { return "cuda"; }
  int GetPropertyMask() const final { return tvm::ffi::Module::kRunnable; }

  tvm::ffi::Optional<tvm::ffi::Function> GetFunction(const tvm::ffi::String& name) final {
    auto it = kernels_.find(std::string(name));
    if (it == kernels_.end()) return std::nullopt;
    KernelLauncher launcher(this, tvm::ffi::GetObjectPtr<tvm::ffi::Object>(this), &it->second);
    return tvm::ffi::Function::FromPacked(
        [launcher](PackedArgs args, Any* rv) { launcher(args, rv); });
  }

  CUfunction Load(int device_id, const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (modules_[device_id] == nullptr) {
      CUresult r = Driver::Get().cuModuleLoadData(&modules_[device_id], code_.data());
      if (r != CUDA_SUCCESS) {
        TVM_FFI_THROW(RuntimeError) << "the CUDA driver (" << Driver::Get().version()
                                    << ") cannot load this bundle's device code (" << fmt_
                                    << "): " << Driver::Get().ErrorText(r)
                                    << "; likely causes: code for another GPU, or PTX from a newer CUDA than "
                                       "the driver";
      }
    }
    CUfunction f = nullptr;
    CUresult r = Driver::Get().cuModuleGetFunction(&f, modules_[device_id], name.c_str());
    if (r != CUDA_SUCCESS) {
      TVM_FFI_THROW(RuntimeError) << "kernel " << name << " not in the device code: " << Driver::Get().ErrorText(r);
    }
    return f;
  }

  const std::string& fmt() const { return fmt_; }
  const std::unordered_map<std::string, Kernel>& kernels() const { return kernels_; }

 private:
  std::string fmt_;
  std::string code_;
  std::unordered_map<std::string, Kernel> kernels_;
  std::array<CUmodule, kMaxDevices> modules_;
  std::mutex mutex_;
};

void KernelLauncher::operator()(PackedArgs args, Any* rv) const {
  const Kernel& k = *kernel_;
  size_t nargs = k.args.size();
  size_t nlaunch = k.launch_slots.size() + (k.dynamic_shared_memory ? 1 : 0);
  TVM_FFI_CHECK(static_cast<size_t>(args.size()) == nargs + nlaunch, TypeError)
      << "kernel " << k.name << " takes " << nargs << " arguments and " << nlaunch << " launch values, got "
      << args.size();
  const TVMFFIAny* raw = reinterpret_cast<const TVMFFIAny*>(args.data());
  // the launch: grid and block sizes follow the kernel's arguments (a 0 from a dynamic shape means 1)
  size_t dims[6] = {1, 1, 1, 1, 1, 1};
  for (size_t i = 0; i < k.launch_slots.size(); ++i) {
    int64_t v = raw[nargs + i].v_int64;
    if (v > 0) dims[k.launch_slots[i]] = static_cast<size_t>(v);
  }
  unsigned shared = k.dynamic_shared_memory ? static_cast<unsigned>(raw[nargs + k.launch_slots.size()].v_int64) : 0;

  int device_id = Contexts::Current();
  CUfunction f = functions_[device_id];
  if (f == nullptr) {
    f = module_->Load(device_id, k.name);
    if (shared >= (48u << 10)) {  // above 48 KB a kernel must opt in (the size is the same on every call)
      CU(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(shared)));
    }
    functions_[device_id] = f;
  }
  // cuLaunchKernel takes the address of each argument's value, at the kernel's own width
  union Narrow {
    int32_t i32;
    uint32_t u32;
    float f32;
  };
  constexpr size_t kInline = 16;
  void* addr_inline[kInline];
  Narrow narrow_inline[kInline];
  std::vector<void*> addr_heap;
  std::vector<Narrow> narrow_heap;
  void** addr = addr_inline;
  Narrow* narrow = narrow_inline;
  if (nargs > kInline) {
    addr_heap.resize(nargs);
    narrow_heap.resize(nargs);
    addr = addr_heap.data();
    narrow = narrow_heap.data();
  }
  for (size_t i = 0; i < nargs; ++i) {
    switch (k.args[i]) {
      case ArgKind::kPointer:
      case ArgKind::kInt64:
      case ArgKind::kFloat64:
        addr[i] = const_cast<void*>(static_cast<const void*>(&raw[i].v_int64));
        break;
      case ArgKind::kInt32:
        narrow[i].i32 = static_cast<int32_t>(raw[i].v_int64);
        addr[i] = &narrow[i];
        break;
      case ArgKind::kUInt32:
        narrow[i].u32 = static_cast<uint32_t>(raw[i].v_int64);
        addr[i] = &narrow[i];
        break;
      case ArgKind::kFloat32:
        narrow[i].f32 = static_cast<float>(raw[i].v_float64);
        addr[i] = &narrow[i];
        break;
    }
  }
  CUresult r = Driver::Get().cuLaunchKernel(
      f, static_cast<unsigned>(dims[0]), static_cast<unsigned>(dims[1]), static_cast<unsigned>(dims[2]),
      static_cast<unsigned>(dims[3]), static_cast<unsigned>(dims[4]), static_cast<unsigned>(dims[5]), shared,
      CurrentStream(device_id), addr, nullptr);
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_DEINITIALIZED) {
    TVM_FFI_THROW(RuntimeError) << "CUDA launch of " << k.name << " failed: " << Driver::Get().ErrorText(r)
                                << " (grid " << dims[0] << "x" << dims[1] << "x" << dims[2] << ", block "
                                << dims[3] << "x" << dims[4] << "x" << dims[5] << ", " << shared
                                << " B dynamic shared memory)";
  }
}

tvm::ffi::Module LoadModule(const tvm::ffi::Bytes& bytes) {
  Reader r(bytes.data(), bytes.size());
  std::string fmt = r.String();
  uint64_t n = r.Count(8);
  std::vector<Kernel> kernels;
  for (uint64_t i = 0; i < n; ++i) {
    std::string key = r.String();
    kernels.push_back(ReadKernel(&r));
    TVM_FFI_CHECK(kernels.back().name == key, ValueError)
        << "corrupt CUDA module: function " << key << " describes " << kernels.back().name;
  }
  std::string code = r.String();
  TVM_FFI_CHECK(r.AtEnd(), ValueError) << "corrupt CUDA module: bytes after the device code";
  TVM_FFI_CHECK(fmt == "cubin" || fmt == "fatbin" || fmt == "ptx", RuntimeError)
      << "the bundle's CUDA module holds '" << fmt
      << "', not device code: it was built on a host where TVM could not compile CUDA (rebuild it)";
  return tvm::ffi::Module(tvm::ffi::make_object<CudaModule>(fmt, std::move(kernels), std::move(code)));
}

// ---- CUDA graphs for the Relax VM ------------------------------------------------------------------------

/*! \brief A captured graph per (capture function, symbolic shape), and the allocations it runs in. The VM
 * calls run_or_capture with a function whose kernels it may replay as one graph: the first call runs it
 * plainly (modules load, attributes are set), the second records it on a capture stream. Called while the
 * current stream is being captured (a frame graph of the agent's, recording the model among other work), it
 * runs the function plainly there, so its kernels become part of that graph. */
class GraphCache : public tvm::runtime::vm::VMExtensionNode {
 public:
  ~GraphCache() {
    if (!Driver::Problem().empty()) return;
    for (auto& kv : graphs_) (void)Driver::Get().cuGraphExecDestroy(kv.second.exec);
  }

  tvm::ffi::ObjectRef RunOrCapture(tvm::runtime::vm::VirtualMachine* vm, const tvm::ffi::ObjectRef& func,
                                   const Any& args, int64_t index, const tvm::ffi::Optional<tvm::ffi::Shape>& shape) {
    std::vector<int64_t> key{index};
    if (shape.has_value()) {
      for (int64_t v : shape.value()) key.push_back(v);
    }
    int device_id = Contexts::Current();
    if (Recording(device_id)) {  // the caller records a graph of its own (the agent's frame graphs, runtime/
      // frame_graph.py): a graph cannot be launched into a capture, so the kernels go into the caller's
      auto tuple = args.cast<tvm::ffi::Array<Any>>();
      std::vector<AnyView> packed(tuple.begin(), tuple.end());
      Any rv;
      vm->InvokeClosurePacked(func, PackedArgs(packed.data(), static_cast<int>(packed.size())), &rv);
      return rv.cast<tvm::ffi::ObjectRef>();
    }
    if (auto it = graphs_.find(key); it != graphs_.end()) {
      CU(cuGraphLaunch(it->second.exec, CurrentStream(device_id)));
      return it->second.outputs;
    }
    auto tuple = args.cast<tvm::ffi::Array<Any>>();
    std::vector<AnyView> packed(tuple.begin(), tuple.end());
    PackedArgs call(packed.data(), static_cast<int>(packed.size()));
    Any rv;
    vm->InvokeClosurePacked(func, call, &rv);  // warm-up: loads modules, sets kernel attributes

    CUstream capture = nullptr;
    CU(cuStreamCreate(&capture, CU_STREAM_DEFAULT));
    TVMFFIStreamHandle previous = nullptr;
    TVM_FFI_CHECK_SAFE_CALL(TVMFFIEnvSetStream(kDLCUDA, device_id, capture, &previous));
    CUgraph graph = nullptr;
    try {
      CU(cuStreamBeginCapture_v2(capture, CU_STREAM_CAPTURE_MODE_GLOBAL));
      try {
        vm->InvokeClosurePacked(func, call, &rv);
      } catch (...) {
        (void)Driver::Get().cuStreamEndCapture(capture, &graph);
        if (graph) (void)Driver::Get().cuGraphDestroy(graph);
        throw;
      }
      CU(cuStreamEndCapture(capture, &graph));
    } catch (...) {
      (void)TVMFFIEnvSetStream(kDLCUDA, device_id, previous, nullptr);
      (void)Driver::Get().cuStreamDestroy_v2(capture);
      throw;
    }
    TVM_FFI_CHECK_SAFE_CALL(TVMFFIEnvSetStream(kDLCUDA, device_id, previous, nullptr));
    CU(cuStreamDestroy_v2(capture));
    Captured entry;
    entry.outputs = rv.cast<tvm::ffi::ObjectRef>();
    CU(cuGraphInstantiateWithFlags(&entry.exec, graph, 0));
    CU(cuGraphDestroy(graph));
    graphs_.emplace(std::move(key), entry);
    return entry.outputs;
  }

  tvm::ffi::ObjectRef CachedAlloc(tvm::runtime::vm::VirtualMachine* vm, const tvm::ffi::ObjectRef& alloc,
                                  int64_t index) {
    if (auto it = allocations_.find(index); it != allocations_.end()) return it->second;
    Any rv;
    vm->InvokeClosurePacked(alloc, PackedArgs(nullptr, 0), &rv);
    return allocations_[index] = rv.cast<tvm::ffi::ObjectRef>();
  }

  static constexpr const bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("edgedeploy.cuda.GraphCache", GraphCache,
                                    tvm::runtime::vm::VMExtensionNode);

 private:
  struct Captured {
    tvm::ffi::ObjectRef outputs;  // the tensors the captured function returns, reused by every replay
    CUgraphExec exec = nullptr;
  };
  struct KeyHash {
    size_t operator()(const std::vector<int64_t>& k) const {
      size_t h = 0;
      for (int64_t v : k) h = h * 1000003u ^ std::hash<int64_t>()(v);
      return h;
    }
  };
  std::unordered_map<std::vector<int64_t>, Captured, KeyHash> graphs_;
  std::unordered_map<int64_t, tvm::ffi::ObjectRef> allocations_;
};

class GraphCacheRef : public tvm::runtime::vm::VMExtension {
 public:
  TVM_FFI_DEFINE_OBJECT_REF_METHODS_NULLABLE(GraphCacheRef, tvm::runtime::vm::VMExtension, GraphCache);
  static GraphCacheRef Create() { return GraphCacheRef(tvm::ffi::make_object<GraphCache>()); }
};

tvm::ffi::Map<tvm::ffi::String, Any> BackendInfo() {
  tvm::ffi::Map<tvm::ffi::String, Any> info;
  info.Set("backend", tvm::ffi::String("edgedeploy-cuda"));
  tvm::ffi::Array<tvm::ffi::String> entry_points;
  for (const char* name : kDriverEntryPoints) entry_points.push_back(name);
  info.Set("entry_points", entry_points);
  std::string problem = Driver::Problem();
  info.Set("problem", tvm::ffi::String(problem));
  if (problem.empty()) {
    int v = Driver::Get().version();
    info.Set("driver_api", tvm::ffi::String(std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10)));
    info.Set("devices", static_cast<int64_t>(Driver::Get().device_count()));
  }
  return info;
}

tvm::ffi::Map<tvm::ffi::String, Any> ModuleInfo(tvm::ffi::Module module) {
  auto* m = dynamic_cast<CudaModule*>(module.operator->());
  TVM_FFI_CHECK(m != nullptr, TypeError) << "not a module of the edgedeploy CUDA backend: " << module->kind();
  tvm::ffi::Map<tvm::ffi::String, Any> info;
  info.Set("format", tvm::ffi::String(m->fmt()));
  tvm::ffi::Map<tvm::ffi::String, Any> kernels;
  for (const auto& kv : m->kernels()) {
    tvm::ffi::Map<tvm::ffi::String, Any> k;
    k.Set("args", static_cast<int64_t>(kv.second.args.size()));
    k.Set("launch_values", static_cast<int64_t>(kv.second.launch_slots.size()));
    k.Set("dynamic_shared_memory", kv.second.dynamic_shared_memory);
    kernels.Set(kv.first, k);
  }
  info.Set("kernels", kernels);
  return info;
}

TVM_FFI_STATIC_INIT_BLOCK() {
  namespace refl = tvm::ffi::reflection;
  using tvm::runtime::vm::VirtualMachine;
  refl::GlobalDef()
      .def_packed("device_api.cuda",
                  [](PackedArgs, Any* rv) { *rv = static_cast<void*>(CudaDeviceAPI::Global()); })
      .def_packed("device_api.cuda_host",
                  [](PackedArgs, Any* rv) { *rv = static_cast<void*>(CudaDeviceAPI::Global()); })
      .def("ffi.Module.load_from_bytes.cuda", LoadModule)
      .def("runtime.get_cuda_stream", []() { return static_cast<void*>(CurrentStream(Contexts::Current())); })
      .def("edgedeploy.cuda.backend_info", BackendInfo)
      .def("edgedeploy.cuda.module_info", ModuleInfo)
      .def_packed("vm.builtin.cuda_graph.run_or_capture",
                  [](PackedArgs args, Any* rv) {
                    TVM_FFI_CHECK(args.size() == 4 || args.size() == 5, TypeError)
                        << "vm.builtin.cuda_graph.run_or_capture takes 4 or 5 arguments";
                    VirtualMachine* vm = VirtualMachine::GetContextPtr(args[0]);
                    tvm::ffi::Optional<tvm::ffi::Shape> shape = std::nullopt;
                    if (args.size() == 5) shape = args[4].cast<tvm::ffi::Shape>();
                    *rv = vm->GetOrCreateExtension<GraphCacheRef>()->RunOrCapture(
                        vm, args[1].cast<tvm::ffi::ObjectRef>(), args[2], args[3].cast<int64_t>(), shape);
                  })
      .def_packed("vm.builtin.cuda_graph.get_cached_alloc", [](PackedArgs args, Any* rv) {
        TVM_FFI_CHECK(args.size() == 3, TypeError) << "vm.builtin.cuda_graph.get_cached_alloc takes 3 arguments";
        VirtualMachine* vm = VirtualMachine::GetContextPtr(args[0]);
        *rv = vm->GetOrCreateExtension<GraphCacheRef>()->CachedAlloc(vm, args[1].cast<tvm::ffi::ObjectRef>(),
                                                                   args[2].cast<int64_t>());
      });
}

}  // namespace cuda
}  // namespace edgedeploy

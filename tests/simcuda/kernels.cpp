// Kernels: nvcc's registration and launch entry points (crt/host_runtime.h), and the host twins
// that stand in for arcpool's device kernels, each declaring the memory it touches.
#include <cxxabi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "pattern.hpp"
#include "state.hpp"

namespace simcuda {
namespace {

/// kernels/kernels.cu's word_range, as its kernels receive it (the launch ABI of the twins).
struct word_range {
  uint32_t* words;
  uint64_t count;
  uint64_t head;
  uint64_t vecs;
  uint64_t first;
};

/// kernels/kernels.hpp's verify_counters.
struct verify_counters {
  unsigned long long mismatches;
  unsigned long long first_bad_word;
  unsigned long long words;
};

/// What a launch of a twin does: the ranges it touches, and the work on their aliases.
struct kernel_plan {
  std::vector<std::pair<uintptr_t, size_t>> touches;
  std::function<void()> run;
};
using planner = kernel_plan (*)(void** args);

kernel_plan plan_fill(void** args) {
  const word_range r = *static_cast<word_range*>(args[0]);
  const uint32_t tag = *static_cast<uint32_t*>(args[1]);
  const auto p = reinterpret_cast<uintptr_t>(r.words);
  auto* w = static_cast<uint32_t*>(alias_of(p));
  return {{{p, r.count * 4}}, [w, r, tag] {
            for (uint64_t i = 0; i < r.count; ++i)
              w[i] = arcpool::kernels::pattern_word(tag, r.first + i);
          }};
}

kernel_plan plan_verify(void** args) {
  const word_range r = *static_cast<word_range*>(args[0]);
  const uint32_t tag = *static_cast<uint32_t*>(args[1]);
  auto* counters = *static_cast<verify_counters**>(args[2]);
  const auto p = reinterpret_cast<uintptr_t>(r.words);
  const auto c = reinterpret_cast<uintptr_t>(counters);
  const auto* w = static_cast<const uint32_t*>(alias_of(p));
  auto* out = static_cast<verify_counters*>(alias_of(c));
  return {{{p, r.count * 4}, {c, sizeof(verify_counters)}}, [w, r, tag, out] {
            unsigned long long bad = 0;
            unsigned long long first_bad = ~0ull;
            for (uint64_t i = 0; i < r.count; ++i) {
              if (w[i] != arcpool::kernels::pattern_word(tag, r.first + i)) {
                ++bad;
                first_bad = std::min<unsigned long long>(first_bad, r.first + i);
              }
            }
            __atomic_fetch_add(&out->mismatches, bad, __ATOMIC_RELAXED);
            __atomic_fetch_add(&out->words, r.count, __ATOMIC_RELAXED);
            unsigned long long seen = __atomic_load_n(&out->first_bad_word, __ATOMIC_RELAXED);
            while (first_bad < seen &&
                   !__atomic_compare_exchange_n(&out->first_bad_word, &seen, first_bad, false,
                                                __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            }
          }};
}

kernel_plan plan_poison(void** args) {
  const word_range r = *static_cast<word_range*>(args[0]);
  const auto p = reinterpret_cast<uintptr_t>(r.words);
  auto* w = static_cast<uint32_t*>(alias_of(p));
  return {{{p, r.count * 4}}, [w, r] { std::fill(w, w + r.count, arcpool::kernels::kPoisonWord); }};
}

kernel_plan plan_spin(void** args) {
  const uint64_t ns = std::min<uint64_t>(*static_cast<uint64_t*>(args[0]), 50'000'000);
  return {{}, [ns] { std::this_thread::sleep_for(std::chrono::nanoseconds(ns)); }};
}

/// The host twins, by the kernel's demangled name (up to its parameter list).
const std::pair<const char*, planner> kTwins[] = {
    {"arcpool::kernels::(anonymous namespace)::fill_kernel", plan_fill},
    {"arcpool::kernels::(anonymous namespace)::verify_kernel", plan_verify},
    {"arcpool::kernels::(anonymous namespace)::poison_kernel", plan_poison},
    {"arcpool::kernels::(anonymous namespace)::spin_kernel", plan_spin},
};

struct kernel_record {
  void** module = nullptr;
  std::string name;  ///< demangled, without parameters
  planner plan = nullptr;
};

std::unordered_map<const void*, std::unique_ptr<kernel_record>>& kernels() {
  static auto* k = new std::unordered_map<const void*, std::unique_ptr<kernel_record>>;
  return *k;
}

std::string demangled(const char* name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d != nullptr ? d : name;
  std::free(d);
  // Drop the parameter list: the parenthesis that matches the last one ("(anonymous
  // namespace)" may come before it).
  if (out.empty() || out.back() != ')') return out;
  int depth = 0;
  for (size_t i = out.size(); i-- > 0;) {
    if (out[i] == ')') ++depth;
    if (out[i] == '(' && --depth == 0) return out.substr(0, i);
  }
  return out;
}

cudaError_t launch(cudaKernel_t kernel, dim3 grid, dim3 block, void** args, cudaStream_t stream,
                   bool ptds) {
  SIMCUDA_ENTER("__cudaLaunchKernel");
  auto* k = reinterpret_cast<kernel_record*>(kernel);
  if (k == nullptr) return ret(cudaErrorInvalidResourceHandle);
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || block.x == 0 || block.y == 0 || block.z == 0 ||
      block.x * block.y * block.z > 1024) {
    return ret(cudaErrorInvalidConfiguration);
  }
  stream_obj* s = resolve_stream(stream, ptds, "__cudaLaunchKernel");
  if (s == nullptr) return ret(cudaErrorInvalidResourceHandle);
  // Programming guide, "Stream and Event Behavior": "A kernel launch will fail if it is issued
  // to a stream that is not associated with the current device."
  if (s->device != ts().device) return ret(cudaErrorInvalidResourceHandle);
  if (k->plan == nullptr) {
    violation(format("kernel %s has no host twin (unmapped kernel)", k->name.c_str()));
    return ret(cudaErrorInvalidDeviceFunction);
  }
  cudaError_t e = cudaSuccess;
  graph_node* node = nullptr;
  if (capture_node(*s, k->name, &e, &node)) {
    if (node != nullptr) {
      kernel_plan plan = k->plan(args);  // arguments are copied at capture
      node->run = std::move(plan.run);
      for (const auto& [p, bytes] : plan.touches)
        node->touches.push_back({p, bytes, false, "kernel " + k->name});
    }
    return ret(e);
  }
  // Fault injection: a sticky error after N launches, as an illegal address corrupts the
  // context ("the process must be terminated and relaunched").
  if (r.cfg.sticky_after_launches >= 0 && ++r.launches > r.cfg.sticky_after_launches) {
    r.sticky = cudaErrorIllegalAddress;
    return ret(r.sticky);
  }
  kernel_plan plan = k->plan(args);  // arguments are copied at launch
  auto o = std::make_unique<op>();
  o->what = k->name;
  o->run = std::move(plan.run);
  const uint64_t seq = enqueue(*s, std::move(o));
  for (const auto& [p, bytes] : plan.touches)
    check_access(*s, seq, p, bytes, /*host_ok=*/false, "kernel " + k->name);
  return cudaSuccess;
}

}  // namespace
}  // namespace simcuda

using namespace simcuda;

extern "C" {

void** __cudaRegisterFatBinary(void* fat_cubin) {
  (void)fat_cubin;  // device code is not run: kernels are matched to host twins by name
  return new void* [1] { nullptr };
}

void __cudaRegisterFatBinaryEnd(void** module) {
  (void)module;
}

void __cudaUnregisterFatBinary(void** module) {
  std::lock_guard<std::mutex> lock(rt().mu);
  auto& k = kernels();
  for (auto it = k.begin(); it != k.end();)
    it = it->second->module == module ? k.erase(it) : std::next(it);
  delete[] module;
}

void __cudaRegisterFunction(void** module, const char* host_fun, char* device_fun,
                            const char* device_name, int thread_limit, uint3* tid, uint3* bid,
                            dim3* block_dim, dim3* grid_dim, int* warp_size) {
  (void)device_fun, (void)thread_limit, (void)tid, (void)bid, (void)block_dim, (void)grid_dim,
      (void)warp_size;
  std::lock_guard<std::mutex> lock(rt().mu);
  auto record = std::make_unique<kernel_record>();
  record->module = module;
  record->name = demangled(device_name);
  for (const auto& [name, plan] : kTwins)
    if (record->name == name) record->plan = plan;
  kernels()[host_fun] = std::move(record);
}

void __cudaRegisterVar(void** module, char* host_var, char* device_address, const char* device_name,
                       int ext, size_t size, int constant, int global) {
  // Device variables belong to kernels without twins (CUB's, Thrust's): those kernels are
  // refused at launch, so their variables need no storage.
  (void)module, (void)host_var, (void)device_address, (void)device_name, (void)ext, (void)size,
      (void)constant, (void)global;
}

char __cudaInitModule(void** module) {
  (void)module;
  return 1;
}

cudaError_t __cudaGetKernel(cudaKernel_t* out, const void* host_fun) {
  std::lock_guard<std::mutex> lock(rt().mu);
  auto it = kernels().find(host_fun);
  if (out == nullptr || it == kernels().end()) return ret(cudaErrorInvalidDeviceFunction);
  *out = reinterpret_cast<cudaKernel_t>(it->second.get());
  return cudaSuccess;
}

unsigned __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared, cudaStream_t stream) {
  ts().configs.push_back({grid, block, shared, stream});
  return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3* grid, dim3* block, size_t* shared, void* stream) {
  thread_state& t = ts();
  if (t.configs.empty()) return ret(cudaErrorMissingConfiguration);
  const thread_state::launch_config c = t.configs.back();
  t.configs.pop_back();
  *grid = c.grid;
  *block = c.block;
  *shared = c.shared;
  *static_cast<cudaStream_t*>(stream) = c.stream;
  return cudaSuccess;
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                               size_t shared, cudaStream_t stream) {
  (void)shared;
  return launch(kernel, grid, block, args, stream, false);
}

cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 grid, dim3 block, void** args,
                                    size_t shared, cudaStream_t stream) {
  (void)shared;
  return launch(kernel, grid, block, args, stream, true);
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t* config, const void* func, void** args) {
  if (config == nullptr) return ret(cudaErrorInvalidValue);
  cudaKernel_t kernel = nullptr;
  if (__cudaGetKernel(&kernel, func) != cudaSuccess) return ret(cudaErrorInvalidDeviceFunction);
  // Launch attributes (clusters, priorities, programmatic serialization) do not change what a
  // host twin does or the stream order it runs in.
  return launch(kernel, config->gridDim, config->blockDim, args, config->stream, false);
}

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void* func) {
  SIMCUDA_ENTER("cudaFuncGetAttributes");
  if (attr == nullptr || kernels().count(func) == 0) return ret(cudaErrorInvalidDeviceFunction);
  *attr = cudaFuncAttributes{};
  attr->maxThreadsPerBlock = 1024;
  attr->numRegs = 32;
  attr->ptxVersion = 90;
  attr->binaryVersion = 90;
  return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* blocks, const void* func,
                                                                   int block_size, size_t shared,
                                                                   unsigned int flags) {
  SIMCUDA_ENTER("cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  (void)shared, (void)flags;
  if (blocks == nullptr || block_size <= 0 || kernels().count(func) == 0) {
    return ret(cudaErrorInvalidValue);
  }
  *blocks = std::clamp(2048 / block_size, 1, 32);  // 2048 resident threads per SM (sm_90)
  return cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void* func,
                                                          int block_size, size_t shared) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(blocks, func, block_size, shared,
                                                                cudaOccupancyDefault);
}

}  // extern "C"

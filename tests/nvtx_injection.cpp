// A minimal NVTX tool, loaded by NVTX through NVTX_INJECTION64_PATH, that records the ranges of
// the "arcpool" domain, and counts the memory regions registered and unregistered there (the NVTX
// memory extension), so that a test can check them without Nsight.
#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtMem.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace {

nvtxDomainHandle_t const kArcpoolDomain = reinterpret_cast<nvtxDomainHandle_t>(uintptr_t{0xA4C});

std::mutex g_mutex;
std::vector<std::string> g_messages;  // "category:payload:message" of every push
std::atomic<int> g_pushes{0};
std::atomic<int> g_pops{0};
std::atomic<int> g_categories{0};
std::atomic<int> g_regions{0};
std::set<const void*> g_live_regions;       // registered and not unregistered since (g_mutex)
std::atomic<int> g_unknown_unregisters{0};  // unregisters of a pointer not registered

nvtxDomainHandle_t NVTX_API domain_create(const char* name) {
  return std::strcmp(name, "arcpool") == 0 ? kArcpoolDomain : nullptr;
}

void NVTX_API name_category(nvtxDomainHandle_t domain, uint32_t, const char*) {
  if (domain == kArcpoolDomain) g_categories.fetch_add(1);
}

int NVTX_API range_push(nvtxDomainHandle_t domain, const nvtxEventAttributes_t* a) {
  if (domain != kArcpoolDomain || a == nullptr) return 0;
  std::string row = std::to_string(a->category) + ":" + std::to_string(a->payload.ullValue) + ":" +
                    (a->messageType == NVTX_MESSAGE_TYPE_ASCII ? a->message.ascii : "");
  std::lock_guard<std::mutex> lock(g_mutex);
  g_messages.push_back(row);
  return g_pushes.fetch_add(1) + 1;
}

void NVTX_API regions_register(nvtxDomainHandle_t domain,
                               const nvtxMemRegionsRegisterBatch_t* batch) {
  if (domain != kArcpoolDomain || batch == nullptr) return;
  g_regions.fetch_add(static_cast<int>(batch->regionCount));
  const auto* regions = static_cast<const nvtxMemVirtualRangeDesc_t*>(batch->regionDescElements);
  std::lock_guard<std::mutex> lock(g_mutex);
  for (size_t i = 0; i < batch->regionCount; ++i)
    g_live_regions.insert(regions[i].ptr);
}

void NVTX_API regions_unregister(nvtxDomainHandle_t domain,
                                 const nvtxMemRegionsUnregisterBatch_t* batch) {
  if (domain != kArcpoolDomain || batch == nullptr) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  for (size_t i = 0; i < batch->refCount; ++i) {
    if (g_live_regions.erase(batch->refElements[i].pointer) == 0) {
      g_unknown_unregisters.fetch_add(1);
    }
  }
}

int NVTX_API range_pop(nvtxDomainHandle_t domain) {
  if (domain != kArcpoolDomain) return 0;
  return g_pops.fetch_add(1);
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int InitializeInjectionNvtx2(
    NvtxGetExportTableFunc_t get_export_table) {
  const auto* callbacks =
      static_cast<const NvtxExportTableCallbacks*>(get_export_table(NVTX_ETID_CALLBACKS));
  if (callbacks == nullptr) return 0;
  NvtxFunctionTable table = nullptr;
  unsigned int size = 0;
  if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size)) return 0;
  *table[NVTX_CBID_CORE2_DomainCreateA] = reinterpret_cast<NvtxFunctionPointer>(&domain_create);
  *table[NVTX_CBID_CORE2_DomainNameCategoryA] =
      reinterpret_cast<NvtxFunctionPointer>(&name_category);
  *table[NVTX_CBID_CORE2_DomainRangePushEx] = reinterpret_cast<NvtxFunctionPointer>(&range_push);
  *table[NVTX_CBID_CORE2_DomainRangePop] = reinterpret_cast<NvtxFunctionPointer>(&range_pop);
  return 1;
}

/// The memory extension's entry point: nvtxMemRegionsRegister and nvtxMemRegionsUnregister are
/// implemented.
__attribute__((visibility("default"))) int InitializeInjectionNvtxExtension(
    nvtxExtModuleInfo_t* info) {
  if (info == nullptr || info->moduleId != NVTX_EXT_MODULEID_MEM) return 1;
  for (size_t s = 0; s < info->segmentsCount; ++s) {
    nvtxExtModuleSegment_t& segment = info->segments[s];
    if (segment.slotCount > NVTX3EXT_CBID_nvtxMemRegionsRegister) {
      segment.functionSlots[NVTX3EXT_CBID_nvtxMemRegionsRegister] =
          reinterpret_cast<intptr_t>(&regions_register);
    }
    if (segment.slotCount > NVTX3EXT_CBID_nvtxMemRegionsUnregister) {
      segment.functionSlots[NVTX3EXT_CBID_nvtxMemRegionsUnregister] =
          reinterpret_cast<intptr_t>(&regions_unregister);
    }
  }
  return 1;
}

/// What the test reads back (looked up with dlsym).
__attribute__((visibility("default"))) int arcpool_test_nvtx_pushes() {
  return g_pushes.load();
}
__attribute__((visibility("default"))) int arcpool_test_nvtx_pops() {
  return g_pops.load();
}
__attribute__((visibility("default"))) int arcpool_test_nvtx_regions() {
  return g_regions.load();
}
__attribute__((visibility("default"))) int arcpool_test_nvtx_live_regions() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return static_cast<int>(g_live_regions.size());
}
__attribute__((visibility("default"))) int arcpool_test_nvtx_unknown_unregisters() {
  return g_unknown_unregisters.load();
}
__attribute__((visibility("default"))) int arcpool_test_nvtx_categories() {
  return g_categories.load();
}
__attribute__((visibility("default"))) int arcpool_test_nvtx_find(const char* needle) {
  std::lock_guard<std::mutex> lock(g_mutex);
  int n = 0;
  for (const std::string& m : g_messages)
    n += m.find(needle) != std::string::npos;
  return n;
}

}  // extern "C"

#include "observe/nvtx.hpp"

#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtMem.h>

#include <cstdio>

namespace arcpool::detail::nvtx {
namespace {

const char* name_of(op kind) {
  switch (kind) {
    case op::allocate:
      return "allocate";
    case op::deallocate:
      return "deallocate";
    case op::transfer:
      return "transfer";
    case op::record_use:
      return "record_use";
    case op::preserve:
      return "preserve";
    case op::discard:
      return "discard";
    case op::import:
      return "import";
    case op::export_memory:
      return "export";
    case op::trim:
      return "trim";
  }
  return "operation";
}

/// The domain, or null when no tool is attached: without a tool NVTX's own implementation of
/// nvtxDomainCreateA returns null, which is how arcpool knows to skip everything else.
struct domain_state {
  nvtxDomainHandle_t domain = nullptr;
  domain_state() {
    domain = nvtxDomainCreateA("arcpool");
    if (domain == nullptr) return;
    for (uint32_t c = static_cast<uint32_t>(op::allocate); c <= static_cast<uint32_t>(op::trim);
         ++c) {
      nvtxDomainNameCategoryA(domain, c, name_of(static_cast<op>(c)));
    }
  }
};

const domain_state& state() {
  static const domain_state s;
  return s;
}

}  // namespace

std::atomic<signed char> g_attached{-1};

bool decide() noexcept {
  const bool on = state().domain != nullptr;  // thread-safe: a function-local static
  g_attached.store(on ? 1 : 0, std::memory_order_relaxed);
  return on;
}

void range::push(op kind, size_t bytes, stream_handle stream) noexcept {
  char message[96];
  std::snprintf(message, sizeof(message), "%s %zu B stream %p", name_of(kind), bytes,
                static_cast<void*>(stream));
  nvtxEventAttributes_t a{};
  a.version = NVTX_VERSION;
  a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  a.category = static_cast<uint32_t>(kind);
  a.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
  a.payload.ullValue = bytes;
  a.messageType = NVTX_MESSAGE_TYPE_ASCII;
  a.message.ascii = message;
  nvtxDomainRangePushEx(state().domain, &a);
  pushed_ = true;
}

void range::pop() noexcept {
  nvtxDomainRangePop(state().domain);
}

void register_region(const void* pointer, size_t bytes, uint64_t serial) noexcept {
  nvtxMemVirtualRangeDesc_t region{bytes, pointer};
  nvtxMemRegionsRegisterBatch_t batch{};
  batch.extCompatID = NVTX_EXT_COMPATID_MEM;
  batch.structSize = sizeof(batch);
  batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  batch.heap = NVTX_MEM_HEAP_HANDLE_PROCESS_WIDE;
  batch.regionCount = 1;
  batch.regionDescElementSize = sizeof(region);
  batch.regionDescElements = &region;
  nvtxMemRegionsRegister(state().domain, &batch);

  char name[48];
  std::snprintf(name, sizeof(name), "arcpool #%llu", static_cast<unsigned long long>(serial));
  nvtxMemRegionNameDesc_t desc{};
  desc.regionRefType = NVTX_MEM_REGION_REF_TYPE_POINTER;
  desc.nameType = NVTX_MESSAGE_TYPE_ASCII;
  desc.region.pointer = pointer;
  desc.name.ascii = name;
  desc.category = static_cast<uint32_t>(op::allocate);
  nvtxMemRegionsNameBatch_t names{};
  names.extCompatID = NVTX_EXT_COMPATID_MEM;
  names.structSize = sizeof(names);
  names.regionCount = 1;
  names.regionElementSize = sizeof(desc);
  names.regionElements = &desc;
  nvtxMemRegionsName(state().domain, &names);
}

void unregister_region(const void* pointer) noexcept {
  nvtxMemRegionRef_t ref;
  ref.pointer = pointer;
  nvtxMemRegionsUnregisterBatch_t batch{};
  batch.extCompatID = NVTX_EXT_COMPATID_MEM;
  batch.structSize = sizeof(batch);
  batch.refType = NVTX_MEM_REGION_REF_TYPE_POINTER;
  batch.refCount = 1;
  batch.refElementSize = sizeof(ref);
  batch.refElements = &ref;
  nvtxMemRegionsUnregister(state().domain, &batch);
}

}  // namespace arcpool::detail::nvtx

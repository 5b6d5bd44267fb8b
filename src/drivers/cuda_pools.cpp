// The CUDA driver's pools: the owned pool's creation with arcpool's settings, peer access to a
// pool (design.md §7, "Peers"), and an imported pool's access.
#include "drivers/cuda_pools.hpp"

#include "drivers/cuda_calls.hpp"
#include "support/status.hpp"

namespace arcpool::detail::cuda {

namespace {

/// Sets an int-valued attribute of `pool`; `name` names the call in messages.
arcpool_status_t set_pool_attribute(cudaMemPool_t pool, cudaMemPoolAttr attr, int value,
                                    const char* name) {
  return check(cudaMemPoolSetAttribute(pool, attr, &value), name);
}

/// Gives read and write access to `pool` (of `device`) to every other device that can reach it
/// (cudaDeviceCanAccessPeer: "Returns in *canAccessPeer a value of 1 if device device is capable
/// of directly accessing memory from peerDevice"), skipping the others.
arcpool_status_t grant_reachable_peers(cudaMemPool_t pool, int device) {
  int count = 0;
  ARCPOOL_RETURN_IF_ERROR(check(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  for (int peer = 0; peer < count; ++peer) {
    if (peer == device) continue;
    int can = 0;
    ARCPOOL_RETURN_IF_ERROR(
        check(cudaDeviceCanAccessPeer(&can, peer, device), "cudaDeviceCanAccessPeer"));
    if (can != 0) ARCPOOL_RETURN_IF_ERROR(grant_peer_access(pool, device, peer, "peer access"));
  }
  return ARCPOOL_STATUS_SUCCESS;
}

}  // namespace

arcpool_status_t grant_peer_access(cudaMemPool_t pool, int device, int peer, const char* what) {
  int count = 0;
  ARCPOOL_RETURN_IF_ERROR(check(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  if (peer == device || peer < 0 || peer >= count) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                "%s: %d is %s (the pool is device %d's, of %d devices)", what, peer,
                peer == device ? "the pool's own device" : "not a device", device, count);
  }
  int can = 0;
  ARCPOOL_RETURN_IF_ERROR(
      check(cudaDeviceCanAccessPeer(&can, peer, device), "cudaDeviceCanAccessPeer"));
  if (can == 0) {
    return fail(ARCPOOL_STATUS_UNSUPPORTED,
                "%s: device %d cannot access device %d's memory "
                "(cudaDeviceCanAccessPeer answers 0)",
                what, peer, device);
  }
  cudaMemAccessDesc access{};
  access.location.type = cudaMemLocationTypeDevice;
  access.location.id = peer;
  access.flags = cudaMemAccessFlagsProtReadWrite;
  ARCPOOL_RETURN_IF_ERROR(check(cudaMemPoolSetAccess(pool, &access, 1), "cudaMemPoolSetAccess"));
  cudaMemAccessFlags granted = cudaMemAccessFlagsProtNone;
  ARCPOOL_RETURN_IF_ERROR(
      check(cudaMemPoolGetAccess(&granted, pool, &access.location), "cudaMemPoolGetAccess"));
  if (granted != cudaMemAccessFlagsProtReadWrite) {
    return fail(ARCPOOL_STATUS_CUDA_ERROR,
                "%s: cudaMemPoolSetAccess succeeded, yet device %d has access %d to "
                "device %d's pool, not read-write",
                what, peer, static_cast<int>(granted), device);
  }
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t create_owned_pool(const driver_config& config, cudaMemPool_t* out) {
  int supported_types = 0;
  ARCPOOL_RETURN_IF_ERROR(
      check(cudaDeviceGetAttribute(&supported_types, cudaDevAttrMemoryPoolSupportedHandleTypes,
                                   config.device),
            "cudaDeviceGetAttribute(MemoryPoolSupportedHandleTypes)"));
  if ((config.ipc_handle_types & ~static_cast<uint32_t>(supported_types)) != 0) {
    return fail(ARCPOOL_STATUS_INVALID_ARGUMENT,
                "IPC handle types 0x%x are not all supported by device %d (supported: 0x%x)",
                config.ipc_handle_types, config.device, supported_types);
  }
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = static_cast<cudaMemAllocationHandleType>(config.ipc_handle_types);
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = config.device;
  props.maxSize = config.max_pool_bytes;
  cudaMemPool_t pool = nullptr;
  ARCPOOL_RETURN_IF_ERROR(check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate"));

  uint64_t threshold = config.release_threshold;
  arcpool_status_t status =
      check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
            "cudaMemPoolSetAttribute(ReleaseThreshold)");
  if (status == ARCPOOL_STATUS_SUCCESS) {
    status = set_pool_attribute(pool, cudaMemPoolReuseFollowEventDependencies,
                                config.reuse_follow_event_dependencies,
                                "cudaMemPoolSetAttribute(ReuseFollowEventDependencies)");
  }
  if (status == ARCPOOL_STATUS_SUCCESS) {
    status = set_pool_attribute(pool, cudaMemPoolReuseAllowOpportunistic,
                                config.reuse_allow_opportunistic,
                                "cudaMemPoolSetAttribute(ReuseAllowOpportunistic)");
  }
  if (status == ARCPOOL_STATUS_SUCCESS) {
    status = set_pool_attribute(pool, cudaMemPoolReuseAllowInternalDependencies,
                                config.reuse_allow_internal_dependencies,
                                "cudaMemPoolSetAttribute(ReuseAllowInternalDependencies)");
  }
  for (int peer : config.peer_devices) {
    if (status != ARCPOOL_STATUS_SUCCESS) break;
    status = grant_peer_access(pool, config.device, peer, "peer_devices");
  }
  if (status == ARCPOOL_STATUS_SUCCESS && config.all_reachable_peers) {
    status = grant_reachable_peers(pool, config.device);
  }
  if (status != ARCPOOL_STATUS_SUCCESS) {
    discard(cudaMemPoolDestroy(pool));
    return status;
  }
  *out = pool;
  return ARCPOOL_STATUS_SUCCESS;
}

arcpool_status_t reach_imported_pool(cudaMemPool_t pool, int device) {
  cudaMemLocation here{};
  here.type = cudaMemLocationTypeDevice;
  here.id = device;
  cudaMemAccessFlags access = cudaMemAccessFlagsProtNone;
  ARCPOOL_RETURN_IF_ERROR(
      check(cudaMemPoolGetAccess(&access, pool, &here), "cudaMemPoolGetAccess (imported)"));
  if (access == cudaMemAccessFlagsProtReadWrite) return ARCPOOL_STATUS_SUCCESS;
  int count = 0;
  ARCPOOL_RETURN_IF_ERROR(check(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  for (int resident = 0; resident < count; ++resident) {
    cudaMemLocation there{};
    there.type = cudaMemLocationTypeDevice;
    there.id = resident;
    ARCPOOL_RETURN_IF_ERROR(
        check(cudaMemPoolGetAccess(&access, pool, &there), "cudaMemPoolGetAccess (imported)"));
    if (access == cudaMemAccessFlagsProtReadWrite) {
      return grant_peer_access(pool, resident, device, "imported pool");
    }
  }
  return fail(ARCPOOL_STATUS_CUDA_ERROR,
              "the imported pool is accessible from no device of this process");
}

}  // namespace arcpool::detail::cuda

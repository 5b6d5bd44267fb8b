// The CUDA driver's pools: the owned pool's creation with arcpool's settings, peer access to a
// pool (design.md §7, "Peers"), and an imported pool's access.
#pragma once

#include <cuda_runtime_api.h>

#include "arcpool/arcpool.h"
#include "drivers/driver.hpp"

namespace arcpool::detail::cuda {

/// Gives device `peer` read and write access to `pool` (of `device`), then checks that it has
/// it; `what` names the request in messages (design.md §7, "Peers"): cudaMemPoolSetAccess "Controls
/// visibility of pools between devices", cudaMemPoolGetAccess "Returns the accessibility of the
/// pool's memory from the specified location".
arcpool_status_t grant_peer_access(cudaMemPool_t pool, int device, int peer, const char* what);

/// Creates `config.device`'s owned pool (cudaMemPoolCreate) with the configuration's IPC handle
/// types, maximum size, release threshold and reuse policies, and grants its peers access. On
/// failure nothing is left behind.
arcpool_status_t create_owned_pool(const driver_config& config, cudaMemPool_t* out);

/// Gives `device` read-write access to an imported pool that resides on another device.
/// "Imported memory pools are initially only accessible from their resident device. The
/// imported memory pool does not inherit any accessibility set by the exporting process. The
/// importing process needs to enable access (with cudaMemPoolSetAccess) from any GPU it plans to
/// access the memory from" (CUDA programming guide, "Set Access in the Importing Process"). The
/// resident device is the one that has access already.
arcpool_status_t reach_imported_pool(cudaMemPool_t pool, int device);

}  // namespace arcpool::detail::cuda

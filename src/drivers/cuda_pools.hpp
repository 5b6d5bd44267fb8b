// The CUDA driver's pools: the owned pool's creation with arcpool's settings, and peer access
// to a pool (design.md §7, "Peers").
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

}  // namespace arcpool::detail::cuda

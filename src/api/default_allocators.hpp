// The per-device allocators serving the raw-pointer entry points.
#pragma once

#include "core/allocator.hpp"

namespace arcpool::detail {

/// The allocator serving `device`, created with default options on first use, with a new
/// reference the caller releases.
arcpool_status_t default_allocator(int device, allocator** out);

/// Replaces `device`'s default allocator (null: a fresh default one on next use). Keeps its
/// own reference.
arcpool_status_t set_default_allocator(int device, allocator* a);

}  // namespace arcpool::detail

// Tears down allocators whose handles are all released once their last allocation record is
// gone. Records count themselves in per-thread shards (no shared atomic per allocation), so
// "the last one" is found by summing, here, off the hot path.
#pragma once

namespace arcpool::detail {

class allocator;

/// Takes a closing allocator (no handle left) and deletes it once it is quiescent (no record
/// left). Never blocks the caller, allocates nothing and cannot fail.
void janitor_adopt(allocator* a) noexcept;

/// Asks the janitor to look again soon (a record of a closing allocator went). Touches no
/// allocator.
void janitor_wake() noexcept;

}  // namespace arcpool::detail

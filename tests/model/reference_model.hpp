// A plain, obviously-correct model of design.md §3's state table: owner and reference counts,
// states, the current stream and the use records of every allocation, and the status every
// call must return. The harness (harness.cpp) checks arcpool against it call by call.
#pragma once

#include <cstdint>
#include <map>
#include <set>

#include "arcpool/arcpool.h"

namespace arcpool::model {

struct allocation {
  arcpool_allocation_state_t state = ARCPOOL_ALLOCATION_LIVE;
  uint32_t owners = 1;
  uint32_t references = 1;  // of the record: the allocation handle's plus one per live view
  size_t size = 0;
  bool indeterminate = false;
  int current = 0;  // stream index
  /// The registration of the current stream when it became current (0: none). Once that
  /// registration is withdrawn, arcpool can no longer enqueue on it (export is refused).
  int current_registration = 0;
  std::set<int> uses;  // stream indexes: the current one only once registered again
};

/// The state table as functions: each returns the status arcpool must answer and applies the
/// change when it succeeds.
class reference_model {
 public:
  /// A new allocation on `stream`; returns its id.
  int allocate(size_t size, int stream, bool indeterminate, int registration) {
    allocation a;
    a.size = size;
    a.indeterminate = indeterminate;
    a.current = stream;
    a.current_registration = registration;
    allocations_[next_] = a;
    return next_++;
  }

  allocation& at(int id) { return allocations_.at(id); }
  bool exists(int id) const { return allocations_.count(id) != 0; }

  static bool usable(const allocation& a) {
    return a.state == ARCPOOL_ALLOCATION_LIVE || a.state == ARCPOOL_ALLOCATION_UNOWNED;
  }

  arcpool_status_t preserve(int id) {
    allocation& a = at(id);
    if (a.state == ARCPOOL_ALLOCATION_UNOWNED) return ARCPOOL_STATUS_NOT_OWNER;
    if (a.state != ARCPOOL_ALLOCATION_LIVE) return ARCPOOL_STATUS_ALREADY_DEALLOCATED;
    ++a.owners;
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t discard(int id, bool* last) {
    allocation& a = at(id);
    if (a.state == ARCPOOL_ALLOCATION_UNOWNED) return ARCPOOL_STATUS_NOT_OWNER;
    if (a.state != ARCPOOL_ALLOCATION_LIVE) return ARCPOOL_STATUS_ALREADY_DEALLOCATED;
    *last = --a.owners == 0;
    if (*last) a.state = ARCPOOL_ALLOCATION_UNOWNED;
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t deallocate(int id, bool force) {
    allocation& a = at(id);
    if (a.state == ARCPOOL_ALLOCATION_LIVE && a.owners > 1 && !force) {
      return ARCPOOL_STATUS_NOT_OWNER;
    }
    if (!usable(a)) return ARCPOOL_STATUS_ALREADY_DEALLOCATED;
    a.state = ARCPOOL_ALLOCATION_DEALLOCATED;
    a.owners = 0;
    a.uses.clear();
    return ARCPOOL_STATUS_SUCCESS;
  }

  /// `over_aligned`: the data pointer is not the pool's; `live_registration`: the registration
  /// in force now (0: none).
  arcpool_status_t export_memory(int id, bool over_aligned, int live_registration) {
    allocation& a = at(id);
    if (a.state == ARCPOOL_ALLOCATION_LIVE && a.owners > 1) return ARCPOOL_STATUS_NOT_OWNER;
    if (!usable(a)) return ARCPOOL_STATUS_ALREADY_DEALLOCATED;
    if (over_aligned) return ARCPOOL_STATUS_UNSUPPORTED;
    if (a.current_registration != 0 && a.current_registration != live_registration) {
      return ARCPOOL_STATUS_UNSUPPORTED;  // its current stream was retired
    }
    a.state = ARCPOOL_ALLOCATION_EXPORTED;
    a.owners = 0;
    a.uses.clear();
    return ARCPOOL_STATUS_SUCCESS;
  }

  arcpool_status_t transfer(int id, int to, int registration) {
    allocation& a = at(id);
    if (!usable(a)) return ARCPOOL_STATUS_ALREADY_DEALLOCATED;
    a.current = to;
    a.current_registration = registration;
    a.uses.clear();
    return ARCPOOL_STATUS_SUCCESS;
  }

  /// A use of `stream`, whose registration now is `registration` (0: none). The current
  /// stream's own order covers a use of it, unless the registration it had when it became
  /// current was withdrawn: arcpool never enqueues on that registration again, so the use is
  /// recorded, whether the stream stays unregistered or is registered again (another stream
  /// to arcpool).
  arcpool_status_t record_use(int id, int stream, int registration) {
    allocation& a = at(id);
    if (!usable(a)) return ARCPOOL_STATUS_ALREADY_DEALLOCATED;
    const bool withdrawn = a.current_registration != 0 && registration != a.current_registration;
    if (stream != a.current || withdrawn) a.uses.insert(stream);
    return ARCPOOL_STATUS_SUCCESS;
  }

  /// A view or data call: usable states only.
  arcpool_status_t touch(int id) {
    return usable(at(id)) ? ARCPOOL_STATUS_SUCCESS : ARCPOOL_STATUS_ALREADY_DEALLOCATED;
  }

  /// A reference went; returns true when the record is gone (an implicit free if it was live or
  /// unowned, which `implicit` reports).
  bool release(int id, bool* implicit) {
    allocation& a = at(id);
    *implicit = false;
    if (--a.references != 0) return false;
    *implicit = usable(a);
    allocations_.erase(id);
    return true;
  }

  size_t live_records() const { return allocations_.size(); }
  const std::map<int, allocation>& all() const { return allocations_; }

 private:
  std::map<int, allocation> allocations_;
  int next_ = 1;
};

}  // namespace arcpool::model

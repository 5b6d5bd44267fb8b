// The one reference-count helper, and an intrusive pointer built on it.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>

namespace arcpool::detail {

/// An atomic count of references. Memory orders, written once:
/// - increment is relaxed: the caller already holds a reference, so the object is alive and
///   nothing needs to be published by the increment itself;
/// - decrement is acq_rel: the release half publishes this holder's writes, the acquire half
///   lets whoever drops the last reference see every other holder's writes before destroying;
/// - a decrement that finds the count at 1 is the last without writing it: the one reference
///   is the caller's, so no other thread holds one and none can add one (increment needs a
///   reference), and its acquire load sees what earlier holders published by their release
///   decrements. The common last release then makes no locked read-modify-write. The count of
///   an object released that way stays at 1 (reset re-arms it for reuse).
class refcount {
 public:
  explicit refcount(uint32_t initial) noexcept : count_(initial) {}

  /// Adds a reference. The caller must hold one already.
  void increment() noexcept { count_.fetch_add(1, std::memory_order_relaxed); }

  /// Drops a reference. Returns true if it was the last one.
  [[nodiscard]] bool decrement() noexcept {
    if (count_.load(std::memory_order_acquire) == 1) return true;
    return count_.fetch_sub(1, std::memory_order_acq_rel) == 1;
  }

  /// Re-arms a count that reached zero (for recycled objects). No other thread may hold one.
  void reset(uint32_t value) noexcept { count_.store(value, std::memory_order_relaxed); }

  /// The current count, for diagnostics only.
  [[nodiscard]] uint32_t load() const noexcept { return count_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint32_t> count_;
};

/// An owning pointer to an object with `retain()` and `release()` members.
template <class T>
class ref_ptr {
 public:
  ref_ptr() noexcept = default;
  /// Adopts a reference the caller already holds.
  static ref_ptr adopt(T* p) noexcept { return ref_ptr(p); }
  ref_ptr(const ref_ptr& other) noexcept : p_(other.p_) {
    if (p_) p_->retain();
  }
  ref_ptr(ref_ptr&& other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  ref_ptr& operator=(ref_ptr other) noexcept {
    std::swap(p_, other.p_);
    return *this;
  }
  ~ref_ptr() {
    if (p_) p_->release();
  }
  T* get() const noexcept { return p_; }
  T* operator->() const noexcept { return p_; }
  T& operator*() const noexcept { return *p_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }
  /// Gives up the reference without releasing it.
  T* detach() noexcept { return std::exchange(p_, nullptr); }

 private:
  explicit ref_ptr(T* p) noexcept : p_(p) {}
  T* p_ = nullptr;
};

}  // namespace arcpool::detail

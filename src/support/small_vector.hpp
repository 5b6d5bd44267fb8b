// A vector that keeps its first N elements inline: the fence lists of one operation rarely
// exceed a few streams, and a heap allocation per transfer or free would cost more than the
// bookkeeping itself.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace arcpool::detail {

template <class T, size_t N>
class small_vector {
 public:
  small_vector() = default;
  small_vector(const small_vector&) = delete;
  small_vector& operator=(const small_vector&) = delete;
  small_vector(small_vector&& other) noexcept { *this = std::move(other); }
  /// Moves the first N elements one by one and takes the storage of the rest with them: a move
  /// allocates nothing (a noexcept move that allocated would end the process without memory).
  small_vector& operator=(small_vector&& other) noexcept {
    static_assert(std::is_nothrow_move_constructible_v<T>, "a move may not throw");
    if (this == &other) return *this;
    clear();
    const size_t n = other.size_;
    for (size_t i = 0; i < n && i < N; ++i) {
      new (inline_ptr() + i) T(std::move(other.inline_ptr()[i]));
      other.inline_ptr()[i].~T();
    }
    if (n > N) overflow_ = std::move(other.overflow_);
    size_ = n;
    other.size_ = 0;
    return *this;
  }
  ~small_vector() { clear(); }

  /// Room for `n` elements in all, so that pushing up to `n` allocates nothing (bad_alloc if
  /// the room cannot be made; the elements are unchanged then).
  void reserve(size_t n) {
    if (n <= N) return;
    if (!overflow_) overflow_ = std::make_unique<std::vector<T>>();
    overflow_->reserve(n - N);
  }
  /// Appends `value`: allocates only past the first N elements and the room reserved.
  void push_back(T value) {
    if (size_ < N) {
      new (inline_ptr() + size_) T(std::move(value));
    } else {
      if (!overflow_) overflow_ = std::make_unique<std::vector<T>>();
      overflow_->push_back(std::move(value));
    }
    ++size_;
  }
  void clear() noexcept {
    if (size_ == 0) return;  // the common case: a record's or an operation's empty list
    for (size_t i = 0; i < size_ && i < N; ++i)
      inline_ptr()[i].~T();
    if (size_ > N) overflow_->clear();
    size_ = 0;
  }
  T& back() noexcept { return (*this)[size_ - 1]; }
  void pop_back() noexcept {
    --size_;
    if (size_ < N) {
      inline_ptr()[size_].~T();
    } else {
      overflow_->pop_back();
    }
  }
  size_t size() const noexcept { return size_; }
  /// Empty, and no storage was ever made for elements past the first N.
  bool empty_and_inline() const noexcept { return size_ == 0 && !overflow_; }
  bool empty() const noexcept { return size_ == 0; }
  T& operator[](size_t i) noexcept { return i < N ? inline_ptr()[i] : (*overflow_)[i - N]; }
  const T& operator[](size_t i) const noexcept {
    return i < N ? inline_ptr()[i] : (*overflow_)[i - N];
  }

  /// Index-based iteration over both parts.
  template <class V>
  class iterator_t {
   public:
    iterator_t(V* v, size_t i) : v_(v), i_(i) {}
    decltype(auto) operator*() const { return (*v_)[i_]; }
    iterator_t& operator++() {
      ++i_;
      return *this;
    }
    bool operator!=(const iterator_t& o) const { return i_ != o.i_; }

   private:
    V* v_;
    size_t i_;
  };
  iterator_t<small_vector> begin() { return {this, 0}; }
  iterator_t<small_vector> end() { return {this, size_}; }
  iterator_t<const small_vector> begin() const { return {this, 0}; }
  iterator_t<const small_vector> end() const { return {this, size_}; }

 private:
  T* inline_ptr() noexcept { return std::launder(reinterpret_cast<T*>(storage_)); }
  const T* inline_ptr() const noexcept {
    return std::launder(reinterpret_cast<const T*>(storage_));
  }

  alignas(T) unsigned char storage_[N * sizeof(T)];
  size_t size_ = 0;
  /// Elements past the first N, made at the first of them: an empty list costs one pointer to
  /// build and one test to destroy.
  std::unique_ptr<std::vector<T>> overflow_;
};

}  // namespace arcpool::detail

// Stand-in for abseil's absl::Span (GPU-only build without abseil; see ../status/status.h).
#ifndef CARPOOL_TESTS_GPU_COMPAT_ABSL_TYPES_SPAN_H_
#define CARPOOL_TESTS_GPU_COMPAT_ABSL_TYPES_SPAN_H_

#include <cstddef>
#include <type_traits>
#include <vector>

namespace absl {

template <typename T>
class Span {
 public:
  Span() = default;
  Span(T* data, size_t size) : data_(data), size_(size) {}
  template <typename V, typename = decltype(std::declval<V&>().data())>
  Span(V& container) : data_(container.data()), size_(container.size()) {}  // NOLINT: implicit
  template <typename V, typename = decltype(std::declval<const V&>().data()),
            typename = std::enable_if_t<std::is_const_v<T>>>
  Span(const V& container) : data_(container.data()), size_(container.size()) {}  // NOLINT

  T* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* begin() const { return data_; }
  T* end() const { return data_ + size_; }
  T& operator[](size_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace absl

#endif  // CARPOOL_TESTS_GPU_COMPAT_ABSL_TYPES_SPAN_H_

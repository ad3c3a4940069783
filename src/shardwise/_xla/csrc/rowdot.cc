// Row-wise dot products on CPU, registered with XLA as FFI targets by shardwise/_xla/native.py.
//
// out[i] = sum_j x[i, j] * y[i, j] over row-major (rows, cols) arrays: the local computation
// of `nd,nd->n`-shaped einsums (S4's "partial dot products" on each device). It keeps
// kLanes independent sums per row, which the compiler turns into several vector registers
// of fused multiply-adds, so one core streams both operands at the memory limit, where XLA's
// own fused multiply-and-reduce falls short of it.
//
// Built by native.py with the system C++ compiler: g++ -O3 -march=native -shared -fPIC.

#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

template <typename T, int kLanes>
void RowDotLoop(const T* __restrict x, const T* __restrict y, T* __restrict out, int64_t rows,
                int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    const T* a = x + i * cols;
    const T* b = y + i * cols;
    T acc[kLanes] = {};
    int64_t j = 0;
    for (; j + kLanes <= cols; j += kLanes) {
      for (int k = 0; k < kLanes; ++k) acc[k] += a[j + k] * b[j + k];
    }
    T sum = 0;
    for (; j < cols; ++j) sum += a[j] * b[j];
    // pairwise over the lanes: the order does not depend on the row's length
    for (int width = kLanes / 2; width > 0; width /= 2) {
      for (int k = 0; k < width; ++k) acc[k] += acc[k + width];
    }
    out[i] = acc[0] + sum;
  }
}

// x and y have one shape, (..., cols); out is (...): every leading index is a row.
template <ffi::DataType D, typename T, int kLanes>
ffi::Error RowDot(ffi::Buffer<D> x, ffi::Buffer<D> y, ffi::ResultBuffer<D> out) {
  auto dims = x.dimensions();
  auto other = y.dimensions();
  bool same = dims.size() == other.size() && dims.size() > 0;
  for (size_t k = 0; same && k < dims.size(); ++k) same = dims[k] == other[k];
  int64_t cols = same ? dims.back() : 0;
  int64_t rows = static_cast<int64_t>(out->element_count());
  if (!same || rows * cols != static_cast<int64_t>(x.element_count())) {
    return ffi::Error::InvalidArgument("rowdot: x and y must share a shape (..., cols), out (...)");
  }
  RowDotLoop<T, kLanes>(x.typed_data(), y.typed_data(), out->typed_data(), rows, cols);
  return ffi::Error::Success();
}

}  // namespace

// 64 float32 or 32 float64 sums: four 512-bit registers (eight 256-bit ones).
XLA_FFI_DEFINE_HANDLER_SYMBOL(ShardwiseRowDotF32, (RowDot<ffi::F32, float, 64>),
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(ShardwiseRowDotF64, (RowDot<ffi::F64, double, 32>),
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>());

// Matrix products on CPU through OpenBLAS (the scipy-openblas32 wheel), registered with XLA
// as FFI targets by shardwise/_xla/native.py.
//
// out = a @ b for row-major (m, k) and (k, n) arrays: the local step of `mk,kn->mn`-shaped
// einsums (the tutorial's `da.dot(data, data)`). shardwise uses it only when a program's CPU
// devices are at least as many as the cores, so each call runs single-threaded in its
// device's thread (set once by native.py).
//
// Built by native.py: g++ -O3 -shared -fPIC, linked to libscipy_openblas.

#include <cstdint>

#include "cblas.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

template <ffi::DataType D>
ffi::Error Check(ffi::Buffer<D>& a, ffi::Buffer<D>& b, ffi::ResultBuffer<D>& out, int64_t& m,
                 int64_t& k, int64_t& n) {
  auto da = a.dimensions();
  auto db = b.dimensions();
  auto dout = out->dimensions();
  if (da.size() != 2 || db.size() != 2 || dout.size() != 2 || da[1] != db[0] ||
      dout[0] != da[0] || dout[1] != db[1]) {
    return ffi::Error::InvalidArgument("matmul: operands must be (m, k) and (k, n), out (m, n)");
  }
  m = da[0];
  k = da[1];
  n = db[1];
  if (m > INT32_MAX || k > INT32_MAX || n > INT32_MAX) {  // OpenBLAS's 32-bit interface
    return ffi::Error::InvalidArgument("matmul: a dimension is larger than 2^31 - 1");
  }
  return ffi::Error::Success();
}

// C = A @ B, row-major, through OpenBLAS's single- or double-precision product.
void Gemm(int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c) {
  scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, k > 0 ? k : 1,
                    b, n, 0.0f, c, n);
}
void Gemm(int64_t m, int64_t n, int64_t k, const double* a, const double* b, double* c) {
  scipy_cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, a, k > 0 ? k : 1, b,
                    n, 0.0, c, n);
}

template <ffi::DataType D>
ffi::Error Matmul(ffi::Buffer<D> a, ffi::Buffer<D> b, ffi::ResultBuffer<D> out) {
  int64_t m, k, n;
  if (auto e = Check(a, b, out, m, k, n); e.failure()) return e;
  if (m > 0 && n > 0) Gemm(m, n, k, a.typed_data(), b.typed_data(), out->typed_data());
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ShardwiseMatmulF32, Matmul<ffi::F32>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(ShardwiseMatmulF64, Matmul<ffi::F64>,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>());

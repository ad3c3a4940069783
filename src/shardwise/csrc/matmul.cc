// Matrix products on CPU through OpenBLAS (the scipy-openblas32 wheel), registered with XLA
// as FFI targets by shardwise/_native.py.
//
// out = a @ b for row-major (m, k) and (k, n) arrays: the local step of `mk,kn->mn`-shaped
// einsums (the tutorial's `da.dot(data, data)`). shardwise uses it only when a program's CPU
// devices are at least as many as the cores, so each call runs single-threaded in its
// device's thread (set once by _native.py); on the 2-core CI machine kind, 8 such calls at
// once run 4096x4096 float32 about 8% faster than XLA's own (YNNPACK) matmul, level with
// NumPy's two-threaded OpenBLAS call on the whole matrix.
//
// Built by _native.py: g++ -O3 -shared -fPIC, linked to libscipy_openblas.

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
  return ffi::Error::Success();
}

ffi::Error MatmulF32(ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                     ffi::ResultBuffer<ffi::F32> out) {
  int64_t m, k, n;
  if (auto e = Check(a, b, out, m, k, n); e.failure()) return e;
  if (m == 0 || n == 0) return ffi::Error::Success();
  scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a.typed_data(),
                    k > 0 ? k : 1, b.typed_data(), n, 0.0f, out->typed_data(), n);
  return ffi::Error::Success();
}

ffi::Error MatmulF64(ffi::Buffer<ffi::F64> a, ffi::Buffer<ffi::F64> b,
                     ffi::ResultBuffer<ffi::F64> out) {
  int64_t m, k, n;
  if (auto e = Check(a, b, out, m, k, n); e.failure()) return e;
  if (m == 0 || n == 0) return ffi::Error::Success();
  scipy_cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, a.typed_data(),
                    k > 0 ? k : 1, b.typed_data(), n, 0.0, out->typed_data(), n);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(ShardwiseMatmulF32, MatmulF32,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(ShardwiseMatmulF64, MatmulF64,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>());

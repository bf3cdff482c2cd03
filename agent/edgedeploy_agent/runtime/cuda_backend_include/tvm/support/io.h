// The apache-tvm 0.27 wheel ships tvm/runtime/tensor.h, which includes <tvm/support/io.h> and
// <tvm/support/serializer.h>, but not those two headers. cuda_backend.cc needs tensor.h (through
// tvm/runtime/vm/vm.h) and never (de)serializes a tensor, so these stand-ins only declare what the
// inline code in tensor.h names: a byte stream with typed reads and writes. Nothing here is defined or
// called; a use would fail to link, not run wrongly.
#ifndef EDGEDEPLOY_TVM_SUPPORT_IO_H_
#define EDGEDEPLOY_TVM_SUPPORT_IO_H_

#include <cstddef>

namespace tvm {
namespace support {

class Stream {
 public:
  virtual ~Stream() = default;
  virtual size_t Read(void* ptr, size_t size) = 0;
  virtual size_t Write(const void* ptr, size_t size) = 0;
  template <typename T>
  void Write(const T& value);
  template <typename T>
  bool Read(T* out);
  template <typename T>
  void WriteArray(const T* values, size_t n);
  template <typename T>
  bool ReadArray(T* values, size_t n);
};

}  // namespace support
}  // namespace tvm

#endif  // EDGEDEPLOY_TVM_SUPPORT_IO_H_

// See io.h beside this file: a stand-in for a header the apache-tvm 0.27 wheel omits.
#ifndef EDGEDEPLOY_TVM_SUPPORT_SERIALIZER_H_
#define EDGEDEPLOY_TVM_SUPPORT_SERIALIZER_H_

#include <tvm/support/io.h>

namespace tvm {
namespace support {

/*! \brief Specialised by tvm/runtime/vm/executable.h for its function table; never used here. */
template <typename T, typename Enable = void>
struct Serializer;

}  // namespace support
}  // namespace tvm

#endif  // EDGEDEPLOY_TVM_SUPPORT_SERIALIZER_H_

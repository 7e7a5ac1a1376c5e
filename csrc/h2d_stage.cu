// h2d_stage: a DP-meta stager's per-step device work in one host call, on the
// current stream of `device`: an async H2D from a persistent pinned slot, an
// optional second one (nbytes2 > 0), then a record of the slot's event.
// Arguments are raw addresses: the stager owns every buffer and keeps it alive
// until the event recorded after its last copy has fired.
#include <torch/extension.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

namespace {

void stage(int64_t device, int64_t dst, int64_t src, int64_t nbytes, int64_t dst2, int64_t src2,
           int64_t nbytes2, int64_t event) {
  TORCH_CHECK(nbytes > 0 && nbytes2 >= 0 && event != 0, "h2d_stage: bad sizes or event");
  const auto index = static_cast<c10::DeviceIndex>(device);
  const c10::cuda::CUDAGuard guard(index);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(index).stream();
  C10_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src),
                                 static_cast<size_t>(nbytes), cudaMemcpyHostToDevice, stream));
  if (nbytes2 > 0) {
    C10_CUDA_CHECK(cudaMemcpyAsync(reinterpret_cast<void*>(dst2), reinterpret_cast<const void*>(src2),
                                   static_cast<size_t>(nbytes2), cudaMemcpyHostToDevice, stream));
  }
  C10_CUDA_CHECK(cudaEventRecord(reinterpret_cast<cudaEvent_t>(event), stream));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("stage", &stage, "DP-meta staging: pinned-slot H2D copies + event record on the current stream");
}

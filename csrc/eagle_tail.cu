// eagle_fixed_shape_tail: the (target, source) KV slots of
// duplicate_prefix_tail_to_draft_branches with a fixed shape, no host read.
// One thread per (request, branch b >= 1, page offset) lane. Lanes at or past
// last_page emit (0, 0): slot 0 is the pool's padding slot (never given to a
// request), so copying it onto itself rewrites bytes with themselves.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

namespace {

template <typename slot_t>
__global__ void tail_slots_kernel(const slot_t* __restrict__ rows, int64_t row_stride,
                                  const int64_t* __restrict__ prefix_base,
                                  const int64_t* __restrict__ last_page,
                                  const int64_t* __restrict__ num_new_pages,
                                  slot_t* __restrict__ tgt, slot_t* __restrict__ src,
                                  int64_t lanes_per_req, int64_t page_size, int64_t total) {
  const int64_t lane = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (lane >= total) return;
  const int64_t req = lane / lanes_per_req;
  const int64_t within = lane - req * lanes_per_req;
  const int64_t branch = within / page_size + 1;
  const int64_t off = within - (branch - 1) * page_size;
  slot_t t = 0, s = 0;
  if (off < last_page[req]) {
    const slot_t* row = rows + req * row_stride;
    const int64_t base = prefix_base[req];
    s = row[base + off];
    t = row[base + branch * num_new_pages[req] * page_size + off];
  }
  tgt[lane] = t;
  src[lane] = s;
}

std::vector<torch::Tensor> tail_slots(torch::Tensor rows, torch::Tensor prefix_base,
                                      torch::Tensor last_page, torch::Tensor num_new_pages,
                                      int64_t topk, int64_t page_size) {
  TORCH_CHECK(rows.is_cuda() && rows.dim() == 2 && rows.stride(1) == 1, "rows: 2-D CUDA, unit column stride");
  TORCH_CHECK(prefix_base.scalar_type() == torch::kInt64 && last_page.scalar_type() == torch::kInt64 &&
                  num_new_pages.scalar_type() == torch::kInt64,
              "prefix_base, last_page, num_new_pages: int64");
  TORCH_CHECK(prefix_base.is_contiguous() && last_page.is_contiguous() && num_new_pages.is_contiguous(),
              "prefix_base, last_page, num_new_pages: contiguous");
  const c10::cuda::CUDAGuard guard(rows.device());
  const int64_t bs = rows.size(0);
  const int64_t lanes_per_req = (topk - 1) * page_size;
  const int64_t total = bs * lanes_per_req;
  auto tgt = torch::empty({total}, rows.options());
  auto src = torch::empty({total}, rows.options());
  if (total == 0) return {tgt, src};
  const int threads = 256;
  const int64_t blocks = (total + threads - 1) / threads;
  auto stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_INDEX_TYPES(rows.scalar_type(), "tail_slots", [&] {
    tail_slots_kernel<index_t><<<static_cast<unsigned int>(blocks), threads, 0, stream>>>(
        rows.data_ptr<index_t>(), rows.stride(0), prefix_base.data_ptr<int64_t>(),
        last_page.data_ptr<int64_t>(), num_new_pages.data_ptr<int64_t>(), tgt.data_ptr<index_t>(),
        src.data_ptr<index_t>(), lanes_per_req, page_size, total);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {tgt, src};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("tail_slots", &tail_slots, "eagle_fixed_shape_tail: fixed-shape (tgt, src) KV slots");
}

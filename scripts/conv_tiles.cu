// One CUTLASS 3 implicit-GEMM 3-D convolution (forward, cross-correlation, stride 1) for Hopper
// (sm_90a: TMA im2col loads, wgmma, a producer warp and one consumer warp group), channels last:
//   y[n, z, p, q, k] = sum_{t, r, s, c} x[n, z + t - pd, p + r - ph, q + s - pw, c] * w[k, t, r, s, c]
// x: [N, D, H, W, C], w: [K, T, R, S, C], y: [N, D - T + 1 + 2 pd, H - R + 1 + 2 ph, W - S + 1 + 2 pw, K],
// fp32 accumulation, no bias (the decoder's fused norms add it). These are the memory layouts of
// PyTorch's channels_last_3d tensors [N, C, D, H, W] and weights [K, C, T, R, S]: no copies.
//
// Compiled once per tile by scripts/conv_tiles.py with
//   -DCONV_NAME=<name> -DTILE_M=<m> -DTILE_N=<n> -DTILE_K=<k> -DCONV_ELEMENT=<cutlass::bfloat16_t|cutlass::half_t>
// and exported with a C interface:
//   int  <name>(x, w, y, dims, workspace, workspace_bytes, stream)   0 = ran; 1 = the tile cannot run this
//        problem (can_implement); 2 = workspace too small; 3 = initialize failed; 4 = launch failed
//   size_t <name>_workspace(dims)
// dims = {N, D, H, W, C, K, T, R, S, pad_d, pad_h, pad_w}.
#include <cstdint>

#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cutlass/conv/device/conv_universal_adapter.hpp"  // before the builders: it brings what they use
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"

namespace {

using namespace cute;

using Element = CONV_ELEMENT;
using Layout = cutlass::layout::TensorNDHWC;
constexpr int kAlignment = 128 / cutlass::sizeof_bits<Element>::value;  // 16-byte TMA accesses
constexpr auto kOp = cutlass::conv::Operator::kFprop;
using TileShape = Shape<Int<TILE_M>, Int<TILE_N>, Shape<Int<TILE_K>>>;
using ClusterShape = Shape<_1, _1, _1>;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    void, Layout, kAlignment,  // no source tensor: D = accumulators
    Element, Layout, kAlignment, cutlass::epilogue::TmaWarpSpecialized>::CollectiveOp;
using Mainloop = typename cutlass::conv::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, kOp,
    Element, Layout, kAlignment, Element, Layout, kAlignment, float, TileShape, ClusterShape,
    cutlass::conv::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;
using Problem = cutlass::conv::ConvProblemShape<kOp, Mainloop::DispatchPolicy::NumSpatialDimensions>;
using Kernel = cutlass::conv::kernel::ConvUniversal<Problem, Mainloop, Epilogue>;
using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;

typename Conv::Arguments arguments(const void* x, const void* w, void* y, const int64_t* d) {
  const int n = int(d[0]), depth = int(d[1]), h = int(d[2]), wd = int(d[3]), c = int(d[4]), k = int(d[5]);
  const int t = int(d[6]), r = int(d[7]), s = int(d[8]), pd = int(d[9]), ph = int(d[10]), pw = int(d[11]);
  Problem problem(cutlass::conv::Mode::kCrossCorrelation, {n, depth, h, wd, c}, {k, t, r, s, c},
                  {pd, ph, pw}, {pd, ph, pw}, {1, 1, 1}, {1, 1, 1}, 1);
  typename Kernel::StrideD stride;  // the output's packed strides, innermost mode first
  cute::for_each(cute::make_seq<cute::rank<0>(typename Kernel::StrideD{})>{}, [&](auto i) {
    cute::get<0, i>(stride) = problem.stride_C[Problem::RankT - 2 - i];
  });
  return {problem,
          {static_cast<const Element*>(x), static_cast<const Element*>(w)},
          {{1.f, 0.f}, nullptr, stride, static_cast<Element*>(y), stride}};
}

}  // namespace

#define WAN_CAT2(a, b) a##b
#define WAN_CAT(a, b) WAN_CAT2(a, b)

extern "C" int CONV_NAME(const void* x, const void* w, void* y, const int64_t* dims, void* workspace,
                         size_t workspace_bytes, cudaStream_t stream) {
  auto args = arguments(x, w, y, dims);
  Conv conv;
  if (conv.can_implement(args) != cutlass::Status::kSuccess) return 1;
  if (Conv::get_workspace_size(args) > workspace_bytes) return 2;
  if (conv.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return 3;
  return conv.run(stream) == cutlass::Status::kSuccess ? 0 : 4;
}

extern "C" size_t WAN_CAT(CONV_NAME, _workspace)(const int64_t* dims) {
  return Conv::get_workspace_size(arguments(nullptr, nullptr, nullptr, dims));
}

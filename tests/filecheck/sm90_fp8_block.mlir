// RUN: assign-warpgroup-roles,tma-cluster-layout,pipeline-staging,verify-resources
// DeepSeek-V3 blockwise fp8: A's scales per 1x128 block (M x 56), B's per 128x128 block (56 x 56). Each
// 128-wide k-tile's WGMMA result is promoted into a second, f32 accumulator times its block scales
// (promote 128, accumulators 2); the consumers read the scales per k-tile (ldg) and the registers hold two
// 128x128 accumulators (232 per consumer thread).
builtin.module {
  %x = gemm.arg "x" : !gemmc.tensor<M x 7168 x f8e4m3, mk>
  %w = gemm.arg "w" : !gemmc.tensor<7168 x 7168 x f8e4m3, nk>
  %sx = gemm.arg "sx" : !gemmc.tensor<M x 56 x f32, mk>
  %sw = gemm.arg "sw" : !gemmc.tensor<56 x 56 x f32, nk>
  %out = gemm.matmul @deepseek_fp8(%x, %w) scaled block(%sx, %sw) acc f32 -> !gemmc.tensor<M x 7168 x bf16, mn>
      schedule #gemmc.schedule<tile = 128x128x128, cluster = 2x1, stages = auto, mode = cooperative, raster = m, swizzle = 1, split_k = 2, arch = sm_90a> epilogue {
  ^bb0(%acc: f32):
    gemm.yield %acc
  }
}

// CHECK: kernel.gemm @deepseek_fp8(%x, %w) scaled block(%sx, %sw) acc f32
// CHECK: kernel.warpgroup consumer index 1 regs 232 warps 4
// CHECK: kernel.mma wgmma inst 64x128x32 atoms 2x1x1
// CHECK: kernel.scaling block promote 128 accumulators 2
// CHECK: kernel.copy b tma box 64x128 swizzle 128 multicast 2 along m
// CHECK: kernel.copy sx ldg box 128x1 swizzle 0 vector 4
// CHECK: kernel.copy sw ldg box 1x1 swizzle 0 vector 4
// CHECK: kernel.tile_scheduler persistent true raster m swizzle 1 split_k 2 split_k_mode fixup

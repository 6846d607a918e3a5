// RUN: assign-warpgroup-roles,tma-cluster-layout,pipeline-staging,verify-resources
// fp8 with rowwise scales, e4m3 x e5m2, and a bias: the fp8 WGMMA takes K 32 per instruction; the scales
// are read in the epilogue (kernel.scaling row: no promotion), from global memory as column and row vectors;
// a tile K of 128 fp8 elements is one 128-byte swizzle atom (the box spans all 128).
builtin.module {
  %x = gemm.arg "x" : !gemmc.tensor<M x 4096 x f8e4m3, mk>
  %w = gemm.arg "w" : !gemmc.tensor<11008 x 4096 x f8e5m2, nk>
  %sx = gemm.arg "sx" : !gemmc.tensor<M x f32, col>
  %sw = gemm.arg "sw" : !gemmc.tensor<11008 x f32, row>
  %bias = gemm.arg "bias" : !gemmc.tensor<11008 x bf16, row>
  %out = gemm.matmul @linear_fp8(%x, %w) scaled row(%sx, %sw) inputs(%bias) acc f32 -> !gemmc.tensor<M x 11008 x bf16, mn>
      schedule #gemmc.schedule<tile = 128x256x128, cluster = 1x2, stages = auto, mode = cooperative, raster = m, swizzle = 1, split_k = 1, arch = sm_90a> epilogue {
  ^bb0(%acc: f32, %bias_1: f32):
    %0 = gemm.add %acc, %bias_1
    gemm.yield %0
  }
}

// CHECK: kernel.gemm @linear_fp8(%x, %w) scaled row(%sx, %sw) inputs(%bias) acc f32
// CHECK: kernel.mma wgmma inst 64x256x32 atoms 2x1x1
// CHECK: kernel.scaling row
// CHECK: kernel.cluster 1x2
// CHECK: kernel.copy a tma box 64x128 swizzle 128 multicast 2 along n
// CHECK: kernel.copy b tma box 256x128 swizzle 128
// CHECK: kernel.copy sx ldg box 128x1 swizzle 0 vector 4
// CHECK: kernel.copy sw ldg box 1x256 swizzle 0 vector 4
// CHECK: kernel.copy out tma_store box 128x32 swizzle 64
// CHECK: kernel.copy bias ldg box 1x256 swizzle 0
// CHECK: kernel.pipeline stages 4 barriers [full, empty]
// CHECK: %0 = gemm.add %acc, %bias_1
// CHECK-NOT: promote

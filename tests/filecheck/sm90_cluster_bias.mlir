// RUN: assign-warpgroup-roles,tma-cluster-layout,pipeline-staging,verify-resources
// A 2x1 cluster: B is multicast to the 2 CTAs along the cluster's M extent, A to nobody.
builtin.module {
  %a = gemm.arg "a" : !gemmc.tensor<M x 4096 x bf16, mk>
  %b = gemm.arg "b" : !gemmc.tensor<11008 x 4096 x bf16, nk>
  %bias = gemm.arg "bias" : !gemmc.tensor<11008 x f32, row>
  %out = gemm.matmul @linear(%a, %b) inputs(%bias) acc f32 -> !gemmc.tensor<M x 11008 x bf16, mn>
      schedule #gemmc.schedule<tile = 128x256x64, cluster = 2x1, stages = auto, mode = cooperative, raster = m, swizzle = 8, split_k = 1, arch = sm_90a> epilogue {
  ^bb0(%acc: f32, %bias_1: f32):
    %0 = gemm.add %acc, %bias_1
    %1 = gemm.gelu_tanh %0
    gemm.yield %1
  }
}

// CHECK: %out = kernel.gemm @linear(%a, %b) inputs(%bias) acc f32 -> !gemmc.tensor<M x 11008 x bf16, mn>
// CHECK:   arch sm_90a tile 128x256x64 mode cooperative threads 384
// CHECK:   kernel.warpgroup producer index 0 regs 40 warps 4
// CHECK:   kernel.warpgroup consumer index 1 regs 232 warps 4
// CHECK:   kernel.warpgroup consumer index 2 regs 232 warps 4
// CHECK:   kernel.mma wgmma inst 64x256x16 atoms 2x1x1
// CHECK:   kernel.cluster 2x1
// CHECK:   kernel.copy a tma box 128x64 swizzle 128
// CHECK:   kernel.copy b tma box 128x64 swizzle 128 multicast 2 along m
// CHECK:   kernel.copy out tma_store box 128x32 swizzle 64
// CHECK:   kernel.copy bias ldg box 1x256 swizzle 0
// CHECK:   kernel.pipeline stages 4 barriers [full, empty] epi_stages 2 epi_tile 128x32 smem 214016
// CHECK:   kernel.tile_scheduler persistent true raster m swizzle 8 split_k 1 split_k_mode none pdl true
// CHECK:   kernel.epilogue store tma {
// CHECK:     %0 = gemm.add %acc, %bias_1
// CHECK:     %1 = gemm.gelu_tanh %0
// CHECK:     gemm.yield %1

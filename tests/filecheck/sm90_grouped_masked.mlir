// RUN: assign-warpgroup-roles,tma-cluster-layout,pipeline-staging,map-groups,verify-resources
// Decode under CUDA graphs, masked groups: x [E, M, 4096] (M rows per expert, counts[e] of them used), one
// weight per expert; a symbolic group count, a scalar epilogue input and N-fastest tiles inside a group.
builtin.module {
  %a = gemm.arg "a" : !gemmc.tensor<E x M x 4096 x bf16, mk>
  %b = gemm.arg "b" : !gemmc.tensor<E x 1536 x 4096 x bf16, nk>
  %counts = gemm.arg "counts" : !gemmc.tensor<E x i32, counts>
  %alpha = gemm.arg "alpha" : !gemmc.tensor<f32, scalar>
  %out = gemm.matmul @decode(%a, %b) grouped masked(%counts) inputs(%alpha) acc f32 -> !gemmc.tensor<E x M x 1536 x bf16, mn>
      schedule #gemmc.schedule<tile = 64x128x64, cluster = 1x1, stages = auto, mode = pingpong, raster = n, swizzle = 1, split_k = 1, arch = sm_90a> epilogue {
  ^bb0(%acc: f32, %alpha_1: f32):
    %0 = gemm.mul %acc, %alpha_1
    gemm.yield %0
  }
}

// CHECK: %out = kernel.gemm @decode(%a, %b) grouped masked(%counts) inputs(%alpha) acc f32 -> !gemmc.tensor<E x M x 1536 x bf16, mn>
// CHECK:   arch sm_90a tile 64x128x64 mode pingpong threads 384
// CHECK:   kernel.copy out st_global box 1x1 swizzle 0 vector 2
// CHECK:   kernel.group masked groups E order n walk warp_scan descriptors shared
// CHECK:   kernel.epilogue store direct {
// CHECK:     %0 = gemm.mul %acc, %alpha_1

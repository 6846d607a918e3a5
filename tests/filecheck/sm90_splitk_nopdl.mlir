// RUN: assign-warpgroup-roles,tma-cluster-layout,pipeline-staging,verify-resources
// Split-K 2 with programmatic dependent launch turned off (Schedule(pdl=False)): plain launches.
builtin.module {
  %a = gemm.arg "a" : !gemmc.tensor<64 x 8192 x bf16, mk>
  %b = gemm.arg "b" : !gemmc.tensor<4096 x 8192 x bf16, nk>
  %out = gemm.matmul @decode(%a, %b) acc f32 -> !gemmc.tensor<64 x 4096 x bf16, mn>
      schedule #gemmc.schedule<tile = 128x128x64, cluster = 1x1, stages = auto, mode = cooperative, raster = m, swizzle = 1, split_k = 2, arch = sm_90a, pdl = false> epilogue {
  ^bb0(%acc: f32):
    gemm.yield %acc
  }
}

// CHECK: split_k = 2, arch = sm_90a, pdl = false>
// CHECK: kernel.tile_scheduler persistent true raster m swizzle 1 split_k 2 split_k_mode fixup
// CHECK: kernel.epilogue store tma
// CHECK-NOT: pdl true

// RUN: assign-warpgroup-roles,tma-cluster-layout,pipeline-staging,map-groups,verify-resources
// Mixture-of-experts up-projection, contiguous groups: x [M, 7168] with its rows sorted by expert, one [gate; up]
// weight per expert (256 x 4096 x 7168), E + 1 row offsets on the device. Tiles map to groups on the device
// (kernel.group); A and out share one descriptor each; the store is from registers, row-predicated.
builtin.module {
  %a = gemm.arg "a" : !gemmc.tensor<M x 7168 x bf16, mk>
  %b = gemm.arg "b" : !gemmc.tensor<256 x 4096 x 7168 x bf16, nk>
  %offsets = gemm.arg "offsets" : !gemmc.tensor<256 x i32, offsets>
  %out = gemm.matmul @experts_up(%a, %b) grouped contiguous(%offsets) acc f32 gate silu -> !gemmc.tensor<M x 2048 x bf16, mn>
      schedule #gemmc.schedule<tile = 128x128x64, cluster = 2x1, stages = auto, mode = cooperative, raster = m, swizzle = 1, split_k = 1, arch = sm_90a> epilogue {
  ^bb0(%acc: f32):
    gemm.yield %acc
  }
}

// CHECK: %out = kernel.gemm @experts_up(%a, %b) grouped contiguous(%offsets) acc f32 gate silu -> !gemmc.tensor<M x 2048 x bf16, mn>
// CHECK:   kernel.copy b tma box 64x64 swizzle 128 multicast 2 along m
// CHECK:   kernel.copy out st_global box 1x1 swizzle 0 vector 2
// CHECK:   kernel.tile_scheduler persistent true raster m swizzle 1 split_k 1 split_k_mode none pdl true pdl_early_ctas 82 pdl_full_ctas 118 max_active_clusters 66
// CHECK:   kernel.group contiguous groups 256 order m walk warp_scan descriptors shared
// CHECK:   kernel.epilogue store direct {
// CHECK-NOT: pdl_prefetch_k_tiles
// CHECK-NOT: tma_store

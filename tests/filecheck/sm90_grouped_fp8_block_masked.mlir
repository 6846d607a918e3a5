// RUN: assign-warpgroup-roles,tma-cluster-layout,pipeline-staging,map-groups,verify-resources
// fp8 experts at decode, masked groups: x [E, M, 4096] e4m3 with its scales [E, M, 32], weights [E, 1536, 4096]
// with scales [E, 12, 32]; a symbolic group count and a ping-pong 64-row tile (its B scale block covers the tile's
// 128 columns).
builtin.module {
  %x = gemm.arg "x" : !gemmc.tensor<E x M x 4096 x f8e4m3, mk>
  %w = gemm.arg "w" : !gemmc.tensor<E x 1536 x 4096 x f8e4m3, nk>
  %counts = gemm.arg "counts" : !gemmc.tensor<E x i32, counts>
  %sx = gemm.arg "sx" : !gemmc.tensor<E x M x 32 x f32, mk>
  %sw = gemm.arg "sw" : !gemmc.tensor<E x 12 x 32 x f32, nk>
  %out = gemm.matmul @decode_fp8(%x, %w) grouped masked(%counts) scaled block(%sx, %sw) acc f32 -> !gemmc.tensor<E x M x 1536 x bf16, mn>
      schedule #gemmc.schedule<tile = 64x128x128, cluster = 1x1, stages = auto, mode = pingpong, raster = m, swizzle = 1, split_k = 1, arch = sm_90a> epilogue {
  ^bb0(%acc: f32):
    gemm.yield %acc
  }
}

// CHECK: kernel.gemm @decode_fp8(%x, %w) grouped masked(%counts) scaled block(%sx, %sw) acc f32 -> !gemmc.tensor<E x M x 1536 x bf16, mn>
// CHECK:   arch sm_90a tile 64x128x128 mode pingpong threads 384
// CHECK: kernel.scaling block promote 128 accumulators 2
// CHECK: kernel.copy sx ldg box 64x1 swizzle 0 vector 4
// CHECK: kernel.group masked groups E order m walk warp_scan descriptors shared
// CHECK: kernel.epilogue store direct {

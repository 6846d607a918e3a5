// RUN: assign-warpgroup-roles,tma-cluster-layout,pipeline-staging,map-groups,verify-resources
// DeepSeek-V3's experts in fp8, contiguous groups: x [M, 7168] e4m3 with its scales per 1x128 block of each row
// (M x 56), 256 experts' weights [256, 2048, 7168] with each expert's scales per 128x128 block (256 x 16 x 56).
// The grouped walk and row-predicated store (map-groups, tma-cluster-layout) meet the block promotion
// (kernel.scaling promote 128: each k-tile of 128 times the group's rows' and its weight's block scales).
builtin.module {
  %x = gemm.arg "x" : !gemmc.tensor<M x 7168 x f8e4m3, mk>
  %w = gemm.arg "w" : !gemmc.tensor<256 x 2048 x 7168 x f8e4m3, nk>
  %offsets = gemm.arg "offsets" : !gemmc.tensor<256 x i32, offsets>
  %sx = gemm.arg "sx" : !gemmc.tensor<M x 56 x f32, mk>
  %sw = gemm.arg "sw" : !gemmc.tensor<256 x 16 x 56 x f32, nk>
  %out = gemm.matmul @experts_fp8(%x, %w) grouped contiguous(%offsets) scaled block(%sx, %sw) acc f32 -> !gemmc.tensor<M x 2048 x bf16, mn>
      schedule #gemmc.schedule<tile = 128x128x128, cluster = 2x1, stages = auto, mode = cooperative, raster = m, swizzle = 1, split_k = 1, arch = sm_90a> epilogue {
  ^bb0(%acc: f32):
    gemm.yield %acc
  }
}

// CHECK: kernel.gemm @experts_fp8(%x, %w) grouped contiguous(%offsets) scaled block(%sx, %sw) acc f32
// CHECK: kernel.mma wgmma inst 64x128x32 atoms 2x1x1
// CHECK: kernel.scaling block promote 128 accumulators 2
// CHECK: kernel.copy sx ldg box 128x1 swizzle 0 vector 4
// CHECK: kernel.copy sw ldg box 1x1 swizzle 0 vector 4
// CHECK: kernel.copy out st_global box 1x1 swizzle 0 vector 2
// CHECK: kernel.group contiguous groups 256 order m walk warp_scan descriptors shared
// CHECK: kernel.epilogue store direct {

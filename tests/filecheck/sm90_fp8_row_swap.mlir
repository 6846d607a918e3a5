// RUN: assign-warpgroup-roles,tma-cluster-layout,pipeline-staging,verify-resources
// Rowwise fp8 scales for decode, with A and B swapped: the kernel's A is w (its 64-row tiles), its B the
// 16-row x; the scale boxes stay in the problem's terms (16 rows of x's scales, 64 columns of w's), read
// in the epilogue at each element's (m, n).
builtin.module {
  %x = gemm.arg "x" : !gemmc.tensor<M x 4096 x f8e4m3, mk>
  %w = gemm.arg "w" : !gemmc.tensor<4096 x 4096 x f8e4m3, nk>
  %sx = gemm.arg "sx" : !gemmc.tensor<M x f32, col>
  %sw = gemm.arg "sw" : !gemmc.tensor<4096 x f32, row>
  %out = gemm.matmul @decode_fp8(%x, %w) scaled row(%sx, %sw) acc f32 -> !gemmc.tensor<M x 4096 x bf16, mn>
      schedule #gemmc.schedule<tile = 64x16x128, cluster = 1x1, stages = auto, mode = pingpong, raster = m, swizzle = 1, split_k = 1, arch = sm_90a, swap_ab = true> epilogue {
  ^bb0(%acc: f32):
    gemm.yield %acc
  }
}

// CHECK: kernel.gemm @decode_fp8(%x, %w) scaled row(%sx, %sw) acc f32
// CHECK: kernel.mma wgmma inst 64x16x32 atoms 1x1x1
// CHECK: kernel.scaling row
// CHECK: kernel.copy b tma box 64x128 swizzle 128
// CHECK: kernel.copy a tma box 16x128 swizzle 128
// CHECK: kernel.copy sx ldg box 16x1 swizzle 0 vector 4
// CHECK: kernel.copy sw ldg box 1x64 swizzle 0 vector 4
// CHECK: kernel.copy out st_global box 1x1 swizzle 0 vector 2
// CHECK: kernel.epilogue store direct
// CHECK-NOT: promote

// RUN: assign-warpgroup-roles,tma-cluster-layout,pipeline-staging,map-groups,verify-resources
// A grouped GEMM's work units are whole tiles of one group: split-K and a swizzle are refused, with the fix.
builtin.module {
  %a = gemm.arg "a" : !gemmc.tensor<M x 2048 x bf16, mk>
  %b = gemm.arg "b" : !gemmc.tensor<128 x 768 x 2048 x bf16, nk>
  %offsets = gemm.arg "offsets" : !gemmc.tensor<128 x i32, offsets>
  %out = gemm.matmul @experts(%a, %b) grouped contiguous(%offsets) acc f32 -> !gemmc.tensor<M x 768 x bf16, mn>
      schedule #gemmc.schedule<tile = 128x128x64, cluster = 1x1, stages = auto, mode = cooperative, raster = m, swizzle = 8, split_k = 2, arch = sm_90a> epilogue {
  ^bb0(%acc: f32):
    gemm.yield %acc
  }
}

// ERROR: grouped GEMM: got split_k=2, swizzle=8
// ERROR: use split_k=1 and swizzle=1

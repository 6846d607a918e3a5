// RUN: verify-resources
// ERROR: shared memory: got 361472 B (7 stages x 49152 B + 16384 B epilogue)
// ERROR: use stages<=4 or stages='auto'
builtin.module {
  %a = gemm.arg "a" : !gemmc.tensor<4096 x 4096 x bf16, mk>
  %b = gemm.arg "b" : !gemmc.tensor<4096 x 4096 x bf16, nk>
  %out = gemm.matmul @gemm(%a, %b) acc f32 -> !gemmc.tensor<4096 x 4096 x bf16, mn>
      schedule #gemmc.schedule<tile = 128x256x64, cluster = 1x1, stages = 7, mode = cooperative, raster = m, swizzle = 1, split_k = 1, arch = sm_90a> epilogue {
  ^bb0(%acc: f32):
    gemm.yield %acc
  }
}

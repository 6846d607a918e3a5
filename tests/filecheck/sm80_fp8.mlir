// RUN: verify-resources
// SM80 has no fp8 MMA: an fp8 GEMM for sm_80 is refused before anything is laid out.
builtin.module {
  %x = gemm.arg "x" : !gemmc.tensor<M x 4096 x f8e4m3, mk>
  %w = gemm.arg "w" : !gemmc.tensor<4096 x 4096 x f8e4m3, nk>
  %sx = gemm.arg "sx" : !gemmc.tensor<f32, scalar>
  %sw = gemm.arg "sw" : !gemmc.tensor<f32, scalar>
  %out = gemm.matmul @fp8_sm80(%x, %w) scaled tensor(%sx, %sw) acc f32 -> !gemmc.tensor<M x 4096 x bf16, mn>
      schedule #gemmc.schedule<tile = 128x128x64, cluster = 1x1, stages = auto, mode = cooperative, raster = m, swizzle = 1, split_k = 1, arch = sm_80> epilogue {
  ^bb0(%acc: f32):
    gemm.yield %acc
  }
}

// ERROR: fp8 (sm_80): got sm_80; SM80 has no fp8 MMA: compile for sm_90a (H100/H200)

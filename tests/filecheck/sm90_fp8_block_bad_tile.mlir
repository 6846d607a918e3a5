// RUN: verify-resources
// Block scaling promotes each k-tile with one 128-block's scales: a 64-wide k-tile, a 256-wide N tile (two B
// scale blocks) and a swapped kernel are refused, each naming the fix.
builtin.module {
  %x = gemm.arg "x" : !gemmc.tensor<M x 7168 x f8e4m3, mk>
  %w = gemm.arg "w" : !gemmc.tensor<7168 x 7168 x f8e4m3, nk>
  %sx = gemm.arg "sx" : !gemmc.tensor<M x 56 x f32, mk>
  %sw = gemm.arg "sw" : !gemmc.tensor<56 x 56 x f32, nk>
  %out = gemm.matmul @deepseek_fp8(%x, %w) scaled block(%sx, %sw) acc f32 -> !gemmc.tensor<M x 7168 x bf16, mn>
      schedule #gemmc.schedule<tile = 128x256x64, cluster = 1x1, stages = auto, mode = cooperative, raster = m, swizzle = 1, split_k = 1, arch = sm_90a> epilogue {
  ^bb0(%acc: f32):
    gemm.yield %acc
  }
}

// ERROR: tile K (block scaling): got 64; each k-tile is promoted with one block's scales: use tile K 128
// ERROR: tile N (block scaling): got 256; one B scale per k-tile covers a tile's columns

// RUN: assign-warpgroup-roles,tma-cluster-layout,pipeline-staging,verify-resources
// SM80: 8 uniform warps, cp.async into swizzled smem, a 5-deep ring, split-K 2 (serial fix-up).
builtin.module {
  %a = gemm.arg "a" : !gemmc.tensor<8192 x 1024 x f16, km>
  %b = gemm.arg "b" : !gemmc.tensor<8192 x 2048 x f16, kn>
  %out = gemm.matmul @skinny(%a, %b) acc f32 -> !gemmc.tensor<1024 x 2048 x f32, mn>
      schedule #gemmc.schedule<tile = 128x256x32, cluster = 1x1, stages = auto, mode = cooperative, raster = n, swizzle = 1, split_k = 2, arch = sm_80> epilogue {
  ^bb0(%acc: f32):
    gemm.yield %acc
  }
}

// CHECK: arch sm_80 tile 128x256x32 mode multistage threads 256
// CHECK: kernel.warpgroup uniform index 0 regs 0 warps 4
// CHECK: kernel.warpgroup uniform index 1 regs 0 warps 4
// CHECK: kernel.mma mma.sync inst 16x8x16 atoms 2x4x1
// CHECK: kernel.cluster 1x1
// CHECK: kernel.copy a cp_async box 32x128 swizzle 128
// CHECK: kernel.copy b cp_async box 32x256 swizzle 128
// CHECK: kernel.pipeline stages 5 barriers [cp.async.group] epi_stages 0 epi_tile 128x256 smem 123904
// CHECK: kernel.tile_scheduler persistent false raster n swizzle 1 split_k 2 split_k_mode serial
// CHECK: kernel.epilogue store direct
// CHECK-NOT: pdl

// The AVX2 codec kernels (F16C for float16); compiled with -mavx2 -mfma -mf16c and
// -ffp-contract=off, and only called after cpuSupports(Isa::kAvx2).
#define NANOCCL_SIMD_WIDTH 256
#define NANOCCL_SIMD_FILL fillAvx2Kernels
#include "collectives/codec/codec_simd.inc"

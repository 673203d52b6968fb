"""Helpers every generated C-like source (C, CUDA, HIP) starts with.

Python-style floor division and modulo (an integer division by zero gives -1 / the dividend, as
garbage on a GPU would, instead of trapping), and bfloat16 stored as 16-bit integers and computed
in float.  Each backend defines ``TM_FN`` (how a helper function is declared) and ``TM_BITCAST``.
"""

HELPERS = r"""
TM_FN int32_t tm_fdiv_i32(int32_t a, int32_t b) {
  if (b == 0) return -1;
  if (b == -1) return (int32_t)(0u - (uint32_t)a);
  int32_t q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }
TM_FN int64_t tm_fdiv_i64(int64_t a, int64_t b) {
  if (b == 0) return -1;
  if (b == -1) return (int64_t)(0ull - (uint64_t)a);
  int64_t q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }
TM_FN int32_t tm_fmod_i32(int32_t a, int32_t b) {
  if (b == 0) return a;
  if (b == -1) return 0;
  int32_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
TM_FN int64_t tm_fmod_i64(int64_t a, int64_t b) {
  if (b == 0) return a;
  if (b == -1) return 0;
  int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
TM_FN float tm_fmod_f32(float a, float b) {
  float r = fmodf(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
TM_FN double tm_fmod_f64(double a, double b) {
  double r = fmod(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }

TM_FN float tm_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16; float f; TM_BITCAST(f, u); return f; }
/* round to nearest even, NaN kept quiet; branch-free (selects), so that gcc vectorizes the loops
   that store or round bf16 (an early return for NaN kept fused epilogues scalar) */
TM_FN uint16_t tm_f32_to_bf16(float f) {
  uint32_t u; TM_BITCAST(u, f);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
  return (uint16_t)(((u & 0x7fffffffu) > 0x7f800000u) ? q : r); }
TM_FN float tm_round_bf16(float f) {
  uint32_t u; TM_BITCAST(u, f);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u, q = (u | 0x400000u) & 0xffff0000u;
  u = ((u & 0x7fffffffu) > 0x7f800000u) ? q : r;
  float o; TM_BITCAST(o, u); return o; }
"""


// ---- values of T (common.cuh: the elementwise and the canonical-order kernels) -------------
template <typename T> struct KT;
template <> struct KT<float> {
  static KZ_DEV float f(float v) { return v; }
  static KZ_DEV float rnd(float v) { return v; }
  static KZ_DEV float from(float v) { return v; }
};
template <> struct KT<__nv_bfloat16> {
  static KZ_DEV float f(__nv_bfloat16 v) { return __bfloat162float(v); }
  // round to bf16 and widen back: f32(round(v))
  static KZ_DEV float rnd(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
  static KZ_DEV __nv_bfloat16 from(float v) { return __float2bfloat16_rn(v); }
};
template <> struct KT<__half> {
  static KZ_DEV float f(__half v) { return __half2float(v); }
  static KZ_DEV float rnd(float v) { return __half2float(__float2half_rn(v)); }
  static KZ_DEV __half from(float v) { return __float2half_rn(v); }
};

KZ_DEV bool kz_al16(const void* p) { return (((unsigned long long)p) & 15ull) == 0ull; }

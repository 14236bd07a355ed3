
// ---- residual add + nn.LayerNorm (fused_add_layer_norm) -------------------------------------------
// s = round(x + residual) (eager's add in T); residual := s; out = nn.LayerNorm of s in the
// layer-norm order (eager.cuh's LnP, the layer_norm kernel's arithmetic). GPT-2's
// `h = attn(ln_1(x)) + residual; ln_2(h)` as one launch for exact compile (docs/compile.md).
// The decode and staged engines add the residual themselves (kz_direct and kz_staged with
// RESID); the row engine (rows that are not whole 16-byte chunks, misaligned tensors) reads each
// unit through `load`, which adds and writes the residual as the mean order's MeanP does, and
// re-reads the stored sum for the outputs of streamed rows.
template <typename T>
struct LnResP : LnP<T, false> {
  T* res;
  template <bool VEC> KZ_DEV void load(Un<T, VEC>& u, i64 row, i64 e) const {
    const i64 at = row * this->cols + e;
    u.ld(this->x + at, this->al);
    Un<T, VEC> r;
    r.ld(res + at, this->al);
#pragma unroll
    for (int i = 0; i < Un<T, VEC>::N; ++i) u.set(i, __fadd_rn(u.f(i), r.f(i)));
    u.st(res + at, this->al);
  }
  template <bool VEC> KZ_DEV void reload(Un<T, VEC>& u, i64 row, i64 e) const {
    u.ld(res + row * this->cols + e, this->al);
  }
};

// The entry is kz_ln_order's (eager.cuh) with this P. They become one template over P when
// eager.cuh next changes (which bumps every eager kernel's version and certificate); until then
// this file is apart so that the released kernels' sources stay as certified.
template <typename T>
KZ_DEV void kz_ln_resid(T* out, T* res, const T* x, const T* w, const T* b, i64 rows, i64 cols, float eps) {
  typedef LnResP<T> P;
  const bool vec = cols % 4 == 0 && cols <= (1LL << 24);
  const bool al = vec && kz_al<T>(x) && kz_al<T>(out) && kz_al<T>(res);
  const P p{{out, x, w, b, cols, eps, al, kz_al<T>(w) && kz_al<T>(b)}, res};
  if (blockDim.z != 1) __trap();
  if (vec && cols > 128 && (cols * (i64)sizeof(T)) % 16 == 0 && kz_al16(x) && kz_al16(out) && kz_al16(res) &&
      kz_al16(w) && kz_al16(b)) {
    if (rows <= gridDim.x && kz_direct_fits<T>(cols)) kz_direct<T, P, true>(p, x, res, rows, KzCfg{});
    else kz_staged<T, P, true>(p, x, res, rows, KzCfg{});
    return;
  }
  if (blockDim.x == 32) {
    // the launch rules send only cols <= 2048 here: the row always fits in registers
    if (cols > 2048) __trap();
    if (vec) kz_rows<T, P, true, 32, 4, 16>(p, rows, 32);
    else kz_rows<T, P, false, 32, 16, 64>(p, rows, 32);
  } else if (blockDim.x == 128 && blockDim.y == 1) {
    if (vec) {
      if (cols <= 16 * 512) kz_rows<T, P, true, 128, 1, 16>(p, rows, 128);
      else kz_rows<T, P, true, 128, 1, 0>(p, rows, 128);
    } else {
      if (cols <= 64 * 128) kz_rows<T, P, false, 128, 4, 64>(p, rows, 128);
      else kz_rows<T, P, false, 128, 4, 0>(p, rows, 128);
    }
  } else {
    __trap();
  }
}

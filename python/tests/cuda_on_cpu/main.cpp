// Runs kernels (bundled kernel entries, the verifier's reference layers, scalar references) on
// the CPU under harness.h. Jobs, one per line of the file named by argv[1]:
//   KIND SYMBOL DTYPE ROWS COLS EPS GRID_X BLOCK_X BLOCK_Y IN OUT
// Row kernels: KIND rms (out, x, w, rows, cols, eps), fused (out, residual, x, w, rows, cols,
// eps), ln (out, x, w, b, rows, cols, eps) or fused_ln (out, residual, x, w, b, rows, cols, eps).
// IN holds x (rows*cols elements), w (cols), then residual (rows*cols, fused), b (cols, ln) or
// residual then b (fused_ln), raw little-endian DTYPE (bf16, f16, f32). OUT receives out, then
// the residual after the launch (fused, fused_ln).
// Elementwise kernels: KIND unary (out, x, n = rows*cols), sam (out, x, rows, cols; x is
// [rows, 2*cols]) or gated (out, gate, up, rows, cols). IN holds x (rows*cols elements; sam:
// rows*2*cols), or gate then up; OUT receives out. EPS is then the offset, in elements, of every
// tensor from a 256-byte boundary (0: aligned, as the ABI promises; 1: the kernels' unaligned
// paths). The symbol table comes from syms.inc.
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <sstream>
#include <string>

#include "syms.inc"  // harness.h, the entries' declarations and KZ_SYMS (KZ_SYM(name) ...)

#if !defined(__x86_64__)
#error "the CPU harness switches fibers with x86-64 assembly"
#endif
// kz_switch(from, to): push the callee-saved registers, MXCSR and the x87 control word, save the
// stack pointer in *from, load `to`, pop the same, return into the other fiber.
asm(R"(
    .text
    .globl kz_switch
    .type kz_switch, @function
kz_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size kz_switch, .-kz_switch
)");

inline std::function<void()> g_call;
static void tramp() { g_call(); }

static std::vector<unsigned char> slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) { std::fprintf(stderr, "cannot read %s\n", p.c_str()); std::exit(2); }
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(f), {});
}

int main(int argc, char** argv) {
  if (argc != 2) { std::fprintf(stderr, "usage: %s JOBS\n", argv[0]); return 2; }
  std::map<std::string, void*> syms;
#define KZ_SYM(name) syms[#name] = (void*)&name;
  KZ_SYMS
#undef KZ_SYM
  std::ifstream jobs(argv[1]);
  std::string line;
  int n = 0;
  while (std::getline(jobs, line)) {
    if (line.empty()) continue;
    std::istringstream ss(line);
    std::string kind, sym, dt, in, out;
    long long rows, cols;
    float eps;
    unsigned gx, bx, by;
    ss >> kind >> sym >> dt >> rows >> cols >> eps >> gx >> bx >> by >> in >> out;
    if (!ss) { std::fprintf(stderr, "bad job: %s\n", line.c_str()); return 2; }
    auto it = syms.find(sym);
    if (it == syms.end()) { std::fprintf(stderr, "unknown symbol %s\n", sym.c_str()); return 2; }
    const size_t es = dt == "f32" ? 4 : 2;
    const size_t ne = (size_t)(rows * cols);
    std::vector<unsigned char> buf = slurp(in);
    auto aligned = [](size_t bytes) { return (unsigned char*)std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256); };
    if (kind == "unary" || kind == "sam" || kind == "gated") {
      const size_t off = es * (size_t)eps;
      const size_t nin = kind == "unary" ? ne : 2 * ne;
      if (buf.size() != es * nin) { std::fprintf(stderr, "%s: %zu bytes, want %zu\n", in.c_str(), buf.size(), es * nin); return 2; }
      unsigned char* a = aligned(es * ne + off);  // x, or the gate
      unsigned char* b = aligned(es * ne + off);  // up (gated)
      unsigned char* o = aligned(es * ne + off);
      unsigned char* xs = kind == "sam" ? aligned(es * nin + off) : a;
      if (kind == "sam") std::memcpy(xs + off, buf.data(), es * nin);
      else std::memcpy(a + off, buf.data(), es * ne);
      if (kind == "gated") std::memcpy(b + off, buf.data() + es * ne, es * ne);
      std::memset(o, 0xA7, es * ne + off);
      void* f = it->second;
      unsigned char *O = o + off, *X = xs + off, *B = b + off;
      if (kind == "unary") {
        auto fn = (void (*)(void*, const void*, long long))f;
        g_call = [=] { fn(O, X, rows * cols); };
      } else if (kind == "sam") {
        auto fn = (void (*)(void*, const void*, long long, long long))f;
        g_call = [=] { fn(O, X, rows, cols); };
      } else {
        auto fn = (void (*)(void*, const void*, const void*, long long, long long))f;
        g_call = [=] { fn(O, X, B, rows, cols); };
      }
      kzcpu::launch(uint3{gx, 1, 1}, uint3{bx, by, 1}, tramp);
      std::ofstream of(out, std::ios::binary);
      of.write((const char*)O, es * ne);
      if (kind == "sam") std::free(xs);
      std::free(a); std::free(b); std::free(o);
      ++n;
      continue;
    }
    const bool res = kind == "fused" || kind == "fused_ln", bias = kind == "ln" || kind == "fused_ln";
    const size_t want = es * (ne + cols + (res ? ne : 0) + (bias ? cols : 0));
    if (buf.size() != want) { std::fprintf(stderr, "%s: %zu bytes, want %zu\n", in.c_str(), buf.size(), want); return 2; }
    // 16-byte aligned copies (the ABI promises aligned tensors)
    unsigned char* x = aligned(es * ne);
    unsigned char* w = aligned(es * cols);
    unsigned char* extra = aligned(es * (res ? ne : cols));  // the residual, or ln's b
    unsigned char* bv = aligned(es * cols);                  // fused_ln's b
    unsigned char* o = aligned(es * ne);
    std::memcpy(x, buf.data(), es * ne);
    std::memcpy(w, buf.data() + es * ne, es * cols);
    if (res) std::memcpy(extra, buf.data() + es * (ne + cols), es * ne);
    if (kind == "ln") std::memcpy(extra, buf.data() + es * (ne + cols), es * cols);
    if (kind == "fused_ln") std::memcpy(bv, buf.data() + es * (2 * ne + cols), es * cols);
    std::memset(o, 0xA7, es * ne);
    void* f = it->second;
    if (kind == "rms") {
      auto fn = (void (*)(void*, const void*, const void*, long long, long long, float))f;
      g_call = [=] { fn(o, x, w, rows, cols, eps); };
    } else if (kind == "fused") {
      auto fn = (void (*)(void*, void*, const void*, const void*, long long, long long, float))f;
      g_call = [=] { fn(o, extra, x, w, rows, cols, eps); };
    } else if (kind == "ln") {
      auto fn = (void (*)(void*, const void*, const void*, const void*, long long, long long, float))f;
      g_call = [=] { fn(o, x, w, extra, rows, cols, eps); };
    } else if (kind == "fused_ln") {
      auto fn = (void (*)(void*, void*, const void*, const void*, const void*, long long, long long, float))f;
      g_call = [=] { fn(o, extra, x, w, bv, rows, cols, eps); };
    } else {
      std::fprintf(stderr, "unknown kind %s\n", kind.c_str());
      return 2;
    }
    kzcpu::launch(uint3{gx, 1, 1}, uint3{bx, by, 1}, tramp);
    std::ofstream of(out, std::ios::binary);
    of.write((const char*)o, es * ne);
    if (res) of.write((const char*)extra, es * ne);
    std::free(x); std::free(w); std::free(extra); std::free(bv); std::free(o);
    ++n;
  }
  std::printf("%d jobs\n", n);
  return 0;
}

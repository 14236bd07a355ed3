//! The reference layers' source a verification of (op, semantics, dtype) compiles
//! (`verifier::ref_module::source`), on stdout: to time its NVRTC without a GPU,
//!
//!     cargo run -q -p verifier --example ref_source -- rms_norm_backward torch bf16 > /tmp/r.cu
//!     python/.venv/bin/python bench/nvrtc_time.py --kernels silu --dtypes bf16 --reference /tmp/r.cu
use kernel_registry::{DType, Op, Semantics};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: ref_source OP SEMANTICS DTYPE (e.g. layer_norm_backward default f32)";
    let op: Op = args.first().expect(usage).parse().expect("an op name");
    let sem: Semantics = args.get(1).expect(usage).parse().expect("a semantics");
    let dt: DType = args
        .get(2)
        .expect(usage)
        .parse()
        .expect("a dtype (bf16, f16, f32)");
    print!("{}", verifier::ref_module::source(op, sem, dt));
}

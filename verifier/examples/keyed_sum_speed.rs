fn main() {
    let n: usize = 256 << 20;
    let bytes: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
    for _ in 0..3 {
        let t = std::time::Instant::now();
        let s = verifier::numeric::keyed_sum(&bytes, 0x1234_5678, 0xA5);
        let e = t.elapsed().as_secs_f64();
        println!("{s:#x} {:.1} ms, {:.2} GB/s", e * 1e3, n as f64 / e / 1e9);
    }
}

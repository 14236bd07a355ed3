//! The red-team corpus without a GPU: every fixture's manifest and source load, every broken
//! fixture has its expected reason recorded where the GPU run checks it (`tests/gpu.rs`, run by
//! `scripts/gpu-check`) and a row in docs/verifier.md's corpus table, and the reasons recorded
//! for the address cases are the text the verifier writes.

use kernel_registry::KernelBundle;
use std::path::{Path, PathBuf};
use verifier::measure::address::{address_line, Difference, Placement};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn fixtures(kind: &str) -> Vec<PathBuf> {
    let dir = root().join("tests/fixtures").join(kind);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("kernel.toml").is_file())
        .collect();
    v.sort();
    v
}

fn name(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn every_fixture_loads_and_is_named_after_its_folder() {
    let all: Vec<PathBuf> = fixtures("good")
        .into_iter()
        .chain(fixtures("broken"))
        .collect();
    assert!(all.len() >= 18, "{} fixtures", all.len());
    for dir in all {
        let b = KernelBundle::load_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        assert_eq!(b.manifest.name, name(&dir), "{}", dir.display());
    }
}

#[test]
fn every_broken_fixture_has_an_expected_reason_in_the_gpu_run_and_the_docs() {
    let gpu = std::fs::read_to_string(root().join("tests/gpu.rs")).expect("tests/gpu.rs");
    let docs = std::fs::read_to_string(root().join("../docs/verifier.md")).expect("verifier.md");
    for dir in fixtures("broken") {
        let n = name(&dir);
        let b = KernelBundle::load_dir(&dir).expect("loads");
        assert!(
            b.manifest.description.starts_with("BROKEN: "),
            "{n}: the description says what is broken"
        );
        assert!(
            gpu.contains(&format!("(\"broken/{n}\", |r|")),
            "{n}: no check in tests/gpu.rs"
        );
        assert!(
            docs.contains(&format!("\n| {n} |")),
            "{n}: no row in docs/verifier.md's red-team corpus table"
        );
    }
}

#[test]
fn the_address_fixture_is_expected_to_fail_with_the_reason_the_verifier_writes() {
    let gpu = std::fs::read_to_string(root().join("tests/gpu.rs")).expect("tests/gpu.rs");
    let check = gpu
        .split("(\"broken/unnormalised_at_16_byte_offset\", |r|")
        .nth(1)
        .expect("a check for the fixture");
    assert!(check.contains("any_integrity(r, ADDRESS_REASON)"));
    let recorded = gpu
        .split("const ADDRESS_REASON: &str =")
        .nth(1)
        .and_then(|s| s.split('"').nth(1))
        .expect("ADDRESS_REASON");
    // The line the address cases write for that kernel: at the first placement off a 256-byte
    // boundary (every buffer 16 bytes past one), out differs.
    let d = Difference {
        tensor: "out".into(),
        differ: 4096,
        elements: 4096,
        first: 0,
        max_abs_diff: 1.03,
    };
    let line = address_line(
        &["out", "x", "w"],
        (&Placement { at: vec![16; 3] }, &[d]),
        32,
        33,
        4096,
    );
    assert!(
        line.starts_with(recorded),
        "{line}\ndoes not start with\n{recorded}"
    );
    let p = verifier::measure::address::plan(3);
    assert!(
        p[0].at.iter().all(|&r| r % 256 == 0),
        "placement 1 is on the boundary"
    );
    assert_eq!(
        p[1].at,
        vec![16; 3],
        "the first placement off a 256-byte boundary"
    );
}

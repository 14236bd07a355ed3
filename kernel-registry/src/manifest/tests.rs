use super::*;

pub(crate) const GOOD: &str = r#"
name = "rms_norm_demo"
version = "1.0.0"
op = "rms_norm"
semantics = "llama"
description = "demo"
authors = ["someone"]
license = "MIT"
source = "k.cu"

[entry]
bf16 = "k_bf16"
f32 = "k_f32"

[[launch]]
cols_max = 1024
block = [32, 8]
grid = "per_row"
rows_per_block = 8

[[launch]]
block = 1024
grid = "per_row"
smem_bytes_per_col = 4

[constraints]
cols_max = 65536
archs = ["sm_90", "sm_80"]
"#;

const SRC: &str =
    "extern \"C\" __global__ void k_bf16() {}\nextern \"C\" __global__ void k_f32() {}\n";

fn with(from: &str, to: &str) -> String {
    assert!(GOOD.contains(from), "fixture lacks {from}");
    GOOD.replacen(from, to, 1)
}

#[test]
fn good_manifest_parses() {
    let m = Manifest::parse(GOOD).unwrap();
    assert_eq!(m.op, Op::RmsNorm);
    assert_eq!(m.semantics, Semantics::Llama);
    assert_eq!(m.dtypes(), vec![DType::Bf16, DType::F32]);
    assert_eq!(m.constraints.archs, vec![Arch::new(8, 0), Arch::new(9, 0)]);
    assert_eq!(m.launch_rule(1024).unwrap().block, [32, 8, 1]);
    assert_eq!(m.launch_rule(1025).unwrap().block, [1024, 1, 1]);
    let d = m.launch_dims(100, 512, 132).unwrap();
    assert_eq!(d.grid, [13, 1, 1]);
    let d = m.launch_dims(100, 4096, 132).unwrap();
    assert_eq!((d.grid[0], d.shared_mem_bytes), (100, 16384));
}

#[test]
fn semantics_defaults_for_single_semantics_ops() {
    let t = with("op = \"rms_norm\"\nsemantics = \"llama\"", "op = \"silu\"");
    assert_eq!(Manifest::parse(&t).unwrap().semantics, Semantics::Default);
}

#[test]
fn bad_manifests_name_the_field() {
    let cases: Vec<(String, &str, &str)> = vec![
        (
            with("source = \"k.cu\"", "source = \"k\\u0000.cu\""),
            "`source`",
            "U+0000",
        ),
        (
            with("description = \"demo\"", "description = \"de\\u0007mo\""),
            "`description`",
            "U+0007",
        ),
        (
            with(
                "authors = [\"someone\"]",
                "authors = [\"ok\", \"some\\none\"]",
            ),
            "`authors[1]`",
            "U+000A",
        ),
        (
            with("license = \"MIT\"", "license = \"MIT\\u001b[31m\""),
            "`license`",
            "one line of printable text",
        ),
        (
            with(
                "source = \"k.cu\"",
                "source = \"k.cu\"\nnvrtc_options = [\"-DX=\\u0000\"]",
            ),
            "`nvrtc_options[0]`",
            "U+0000",
        ),
        (
            with("name = \"rms_norm_demo\"", "name = \"a\\u0000b\""),
            "`name`",
            "U+0000",
        ),
        (
            format!("# a NUL \u{0} in a comment\n{GOOD}"),
            "NUL byte",
            "is text",
        ),
        (
            with("op = \"rms_norm\"", "op = \"rmsnorm\""),
            "`op`",
            "one of rms_norm",
        ),
        (
            with("semantics = \"llama\"", "semantics = \"mistral\""),
            "`semantics`",
            "one of llama",
        ),
        (
            with(
                "op = \"rms_norm\"\nsemantics = \"llama\"",
                "op = \"silu\"\nsemantics = \"llama\"",
            ),
            "`semantics`",
            "for op silu",
        ),
        (
            with("version = \"1.0.0\"", "version = \"1.0\""),
            "`version`",
            "semantic version",
        ),
        (
            with("name = \"rms_norm_demo\"", "name = \"Bad Name\""),
            "`name`",
            "a-z",
        ),
        (
            with("source = \"k.cu\"", "source = \"../k.cu\""),
            "`source`",
            ".cu",
        ),
        (
            with("license = \"MIT\"", "license = \" \""),
            "`license`",
            "SPDX",
        ),
        (
            with("bf16 = \"k_bf16\"", "bf8 = \"k_bf16\""),
            "`entry.bf8`",
            "one of bf16",
        ),
        (
            with("bf16 = \"k_bf16\"", "bf16 = \"k-bf16\""),
            "`entry.bf16`",
            "C identifier",
        ),
        (
            with(
                "grid = \"per_row\"\nrows_per_block = 8",
                "grid = \"per_rows\"",
            ),
            "`launch[0].grid`",
            "per_row, per_element, persistent",
        ),
        (
            with("block = [32, 8]", "block = [64, 32]"),
            "`launch[0].block`",
            "1024 threads",
        ),
        (
            with(
                "rows_per_block = 8",
                "rows_per_block = 8\nblocks_per_sm = 2",
            ),
            "`launch[0].blocks_per_sm`",
            "not used",
        ),
        (
            with("cols_max = 1024\nblock", "block"),
            "`launch[0].cols_max`",
            "needs cols_max",
        ),
        (
            with("block = 1024\n", "cols_max = 2048\nblock = 1024\n"),
            "`launch[1].cols_max`",
            "last launch rule",
        ),
        (
            with("archs = [\"sm_90\", \"sm_80\"]", "archs = [\"hopper\"]"),
            "`constraints.archs[0]`",
            "sm_",
        ),
        (
            with("cols_max = 65536", "cols_max = 65536\ncols_multiple_of = 0"),
            "`constraints.cols_multiple_of`",
            "at least 1",
        ),
        (
            with(
                "source = \"k.cu\"",
                "source = \"k.cu\"\nnvrtc_options = [\"--include-path=/etc\"]",
            ),
            "`nvrtc_options[0]`",
            "not allowed",
        ),
        (
            with(
                "source = \"k.cu\"",
                "source = \"k.cu\"\nnvrtc_options = [\"-Xptxas=--split-compile=0,-O0\"]",
            ),
            "`nvrtc_options[0]`",
            "not allowed",
        ),
        (
            with(
                "source = \"k.cu\"",
                "source = \"k.cu\"\nnvrtc_options = [\"-DKERNELIZE_DTYPE_F16\"]",
            ),
            "`nvrtc_options[0]`",
            "the verifier's",
        ),
        (
            with("description = \"demo\"", "description = \"\""),
            "`description`",
            "must say",
        ),
        (
            with("authors = [\"someone\"]", "authors = []"),
            "`authors`",
            "at least one",
        ),
        // Syntax-level problems: the TOML library names the field.
        (
            with("name = \"rms_norm_demo\"", "nme = \"rms_norm_demo\""),
            "unknown field `nme`",
            "expected",
        ),
        (
            with("license = \"MIT\"\n", ""),
            "missing field `license`",
            "",
        ),
        (
            with("version = \"1.0.0\"", "version = 1"),
            "version",
            "string",
        ),
        ("name = [".to_string(), "kernel.toml", "line"),
        (
            with("rows_per_block = 8", "rows_per_block = \"8\""),
            "launch[0]",
            "rows_per_block",
        ),
        (
            with("block = [32, 8]", "block = \"big\""),
            "`launch[0].block`",
            "e.g. `256`",
        ),
        (
            with("block = [32, 8]", "block = [32, 8]\nthreads = 3"),
            "launch[0]",
            "unknown field `threads`",
        ),
    ];
    for (text, must1, must2) in cases {
        let e = Manifest::parse(&text).expect_err(&text).to_string();
        assert!(
            e.contains(must1) && e.contains(must2),
            "message `{e}` lacks `{must1}`/`{must2}`"
        );
    }
}

#[test]
fn text_fields_keep_newlines_where_text_may_span_lines() {
    let m = Manifest::parse(&with(
        "description = \"demo\"",
        "description = \"\"\"\nline one\n\tline two\r\n\"\"\"",
    ))
    .unwrap();
    assert!(m.description.contains("line one\n\tline two"));
    let e = KernelBundle::from_parts(GOOD, &format!("{SRC}\u{0}")).unwrap_err();
    assert_eq!(e.field_name(), Some("source"), "{e}");
    assert!(e.to_string().contains("NUL byte"), "{e}");
}

#[test]
fn bundle_checks_symbols_and_digest_is_stable() {
    let b = KernelBundle::from_parts(GOOD, SRC).unwrap();
    let again = KernelBundle::from_parts(GOOD, SRC).unwrap();
    assert_eq!(b.digest(), again.digest());
    // Comments and layout do not change the digest...
    let relaid = format!(
        "# a comment\n{}",
        GOOD.replace("op = \"rms_norm\"", "op   =   \"rms_norm\"")
    );
    assert_eq!(
        KernelBundle::from_parts(&relaid, SRC).unwrap().digest(),
        b.digest()
    );
    // ...every source byte and every manifest value does.
    for i in 0..SRC.len() {
        let mut bytes = SRC.as_bytes().to_vec();
        bytes[i] ^= 0x01;
        let Ok(src) = String::from_utf8(bytes) else {
            continue;
        };
        if let Ok(k) = KernelBundle::from_parts(GOOD, &src) {
            assert_ne!(k.digest(), b.digest(), "byte {i}");
        }
    }
    let bumped = with("version = \"1.0.0\"", "version = \"1.0.1\"");
    assert_ne!(
        KernelBundle::from_parts(&bumped, SRC).unwrap().digest(),
        b.digest()
    );

    let e = KernelBundle::from_parts(GOOD, "extern \"C\" __global__ void k_bf16() {}").unwrap_err();
    assert!(e.to_string().contains("entry.f32"), "{e}");
}

#[test]
fn applicability() {
    let m = Manifest::parse(GOOD).unwrap();
    assert!(m.not_applicable(4096, Some(Arch::new(9, 0))).is_none());
    assert!(m.not_applicable(131072, None).unwrap().contains("cols_max"));
    assert!(m
        .not_applicable(4096, Some(Arch::new(8, 9)))
        .unwrap()
        .contains("sm_89"));
}

#[test]
fn entry_options_append_the_dtype_macro_after_the_authors_options() {
    let author = vec!["--fmad=false".to_string()];
    assert_eq!(
        entry_options(&author, DType::Bf16),
        vec![
            "--fmad=false".to_string(),
            "-DKERNELIZE_DTYPE_BF16".to_string()
        ]
    );
    assert_eq!(dtype_macro(DType::F32), "-DKERNELIZE_DTYPE_F32");
    assert_eq!(dtype_macro(DType::F16), "-DKERNELIZE_DTYPE_F16");
}

#[test]
fn gated_ops_parse_with_default_semantics_and_launch_over_all_elements() {
    for (word, op) in [
        ("silu_mul", Op::SiluMul),
        ("gelu_tanh_mul", Op::GeluTanhMul),
    ] {
        let t = GOOD
            .replacen(
                "op = \"rms_norm\"\nsemantics = \"llama\"",
                &format!("op = \"{word}\""),
                1,
            )
            .replacen(
                "[[launch]]\ncols_max = 1024\nblock = [32, 8]\ngrid = \"per_row\"\nrows_per_block = 8\n\n[[launch]]\nblock = 1024\ngrid = \"per_row\"\nsmem_bytes_per_col = 4\n",
                "[launch]\nblock = 256\ngrid = \"per_element\"\nelements_per_thread = 32\n",
                1,
            );
        let m = Manifest::parse(&t).unwrap_or_else(|e| panic!("{word}: {e}\n{t}"));
        assert_eq!((m.op, m.semantics), (op, Semantics::Default));
        assert!(m.op.is_rowwise() && m.op.is_gated());
        // rows x cols outputs, each of gate and up the same shape: 4096 x 8192 / (256 * 32)
        assert_eq!(m.launch_dims(4096, 8192, 132).unwrap().grid, [4096, 1, 1]);
        // the constraints apply to cols (a row-wise op), not to rows * cols
        assert_eq!(m.not_applicable(8192, Some(Arch::new(9, 0))), None);
        let e = Manifest::parse(&t.replacen(
            &format!("op = \"{word}\""),
            &format!("op = \"{word}\"\nsemantics = \"llama\""),
            1,
        ))
        .unwrap_err();
        assert_eq!(e.field_name(), Some("semantics"), "{e}");
        assert!(e.to_string().contains("default"), "{e}");
    }
    let e = Manifest::parse(&with("op = \"rms_norm\"", "op = \"silu_and_mul2\"")).unwrap_err();
    assert!(e.to_string().contains("silu_mul, gelu_tanh_mul"), "{e}");
}

// ---- Python candidates (docs/spec.md section 2b) ---------------------------------------------------------

pub(crate) const PY_GOOD: &str = r#"
name = "liger_rms_norm_llama"
version = "0.8.5"
op = "rms_norm"
semantics = "llama"
description = "Liger-Kernel's RMSNorm, llama casting mode"
authors = ["someone"]
license = "BSD-2-Clause"
runtime = "python"
source = "kernel.py"
requires = ["liger-kernel==0.8.5", "torch>=2.5,<3"]

[entry]
bf16 = "rms_norm"
f32 = "rms_norm"

[constraints]
cols_max = 65536
"#;

pub(crate) const PY_SRC: &str =
    "import torch\n\n\ndef rms_norm(x, weight, eps):\n    return torch.nn.functional.rms_norm(x, x.shape[-1:], weight, eps)\n";

fn py_with(from: &str, to: &str) -> String {
    assert!(PY_GOOD.contains(from), "fixture lacks {from}");
    PY_GOOD.replacen(from, to, 1)
}

#[test]
fn python_candidate_parses() {
    let m = Manifest::parse(PY_GOOD).unwrap();
    assert_eq!(m.runtime, Runtime::Python);
    assert_eq!(m.requires, ["liger-kernel==0.8.5", "torch>=2.5,<3"]);
    assert_eq!(m.required_packages(), ["liger-kernel", "torch"]);
    assert!(m.launch.is_empty() && m.nvrtc_options.is_empty());
    assert_eq!(m.entries[&DType::Bf16], "rms_norm");
    assert!(m.launch_rule(4096).is_none());
    assert!(m
        .launch_dims(4, 4096, 132)
        .unwrap_err()
        .contains("no launch rules"));
    let b = KernelBundle::from_parts(PY_GOOD, PY_SRC).unwrap();
    // runtime and requires are part of the canonical form (and so of the digest)
    let j = serde_json::to_string(&b.manifest).unwrap();
    assert!(
        j.ends_with(r#""runtime":"python","requires":["liger-kernel==0.8.5","torch>=2.5,<3"]}"#),
        "{j}"
    );
    let other = py_with("\"torch>=2.5,<3\"", "\"torch>=2.6\"");
    assert_ne!(
        KernelBundle::from_parts(&other, PY_SRC).unwrap().digest(),
        b.digest()
    );
}

#[test]
fn cuda_kernels_keep_their_canonical_form() {
    // A CUDA manifest's JSON has no runtime or requires: digests made before docs/spec.md section 2b hold.
    let m = Manifest::parse(GOOD).unwrap();
    let j = serde_json::to_string(&m).unwrap();
    assert!(!j.contains("runtime") && !j.contains("requires"), "{j}");
    let explicit = with("source = \"k.cu\"", "source = \"k.cu\"\nruntime = \"cuda\"");
    assert_eq!(
        KernelBundle::from_parts(&explicit, SRC).unwrap().digest(),
        KernelBundle::from_parts(GOOD, SRC).unwrap().digest()
    );
}

#[test]
fn bad_python_candidates_name_the_field() {
    let launch = "\n[launch]\nblock = 256\ngrid = \"per_row\"\n";
    let cases: Vec<(String, &str, &str)> = vec![
        (
            py_with("runtime = \"python\"", "runtime = \"triton\""),
            "`runtime`",
            "one of cuda, python",
        ),
        (
            py_with("source = \"kernel.py\"", "source = \"kernel.cu\""),
            "`source`",
            "`.py` file",
        ),
        (
            py_with("source = \"kernel.py\"", "source = \"../x/kernel.py\""),
            "`source`",
            "no path",
        ),
        (
            py_with(
                "requires = [\"liger-kernel==0.8.5\", \"torch>=2.5,<3\"]\n",
                "",
            ),
            "`requires`",
            "list the Python packages",
        ),
        (
            py_with(
                "requires = [\"liger-kernel==0.8.5\", \"torch>=2.5,<3\"]",
                "requires = []",
            ),
            "`requires`",
            "1 to 16",
        ),
        (
            py_with("\"liger-kernel==0.8.5\"", "\"liger-kernel\""),
            "`requires[0]`",
            "gives no version",
        ),
        (
            py_with(
                "\"liger-kernel==0.8.5\"",
                "\"liger-kernel @ https://x/y.whl\"",
            ),
            "`requires[0]`",
            "not a version specifier",
        ),
        (
            py_with("\"torch>=2.5,<3\"", "\"torch>=two\""),
            "`requires[1]`",
            "not a version",
        ),
        (
            py_with("\"torch>=2.5,<3\"", "\"Liger_Kernel>=0.8\""),
            "`requires[1]`",
            "listed twice",
        ),
        (
            py_with("\"torch>=2.5,<3\"", "\"-torch>=2\""),
            "`requires[1]`",
            "package name is not valid",
        ),
        (
            py_with("\"torch>=2.5,<3\"", "\"torch>=2\\u0000\""),
            "`requires[1]`",
            "U+0000",
        ),
        (
            py_with("bf16 = \"rms_norm\"", "bf16 = \"rms-norm\""),
            "`entry.bf16`",
            "not a Python function name",
        ),
        (
            py_with("bf16 = \"rms_norm\"", "bf16 = \"__import__\""),
            "`entry.bf16`",
            "not a Python function name",
        ),
        (
            py_with("bf16 = \"rms_norm\"", "bfloat16 = \"rms_norm\""),
            "`entry.bfloat16`",
            "dtype",
        ),
        (format!("{PY_GOOD}{launch}"), "`launch`", "no launch rules"),
        (
            py_with(
                "runtime = \"python\"",
                "runtime = \"python\"\nnvrtc_options = [\"--use_fast_math\"]",
            ),
            "`nvrtc_options`",
            "not compiled by NVRTC",
        ),
        (
            py_with("cols_max = 65536", "cols_max = 65536\ncols_min = 0"),
            "`constraints.cols_min`",
            "at least 1",
        ),
        (
            py_with("runtime = \"python\"", "runtime = \"python\"\nextra = 1"),
            "unknown field `extra`",
            "expected one of",
        ),
        // a CUDA kernel may not name Python packages, and still needs launch rules
        (
            with(
                "source = \"k.cu\"",
                "source = \"k.cu\"\nrequires = [\"torch>=2\"]",
            ),
            "`requires`",
            "only a Python candidate",
        ),
        (
            GOOD.split("[[launch]]").next().unwrap().to_string(),
            "`launch`",
            "needs launch rules",
        ),
    ];
    for (text, field, words) in cases {
        let e = Manifest::parse(&text).unwrap_err().to_string();
        assert!(
            e.contains(field) && e.contains(words),
            "want {field} / {words}, got: {e}\n{text}"
        );
    }
    // The source must define each entry's function at module level.
    let e = KernelBundle::from_parts(
        PY_GOOD,
        "def other(x, weight, eps):\n    return x\n# rms_norm\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("`entry.bf16`") && e.contains("def rms_norm("),
        "{e}"
    );
}

#[test]
fn requirement_names_normalise_as_pip_does() {
    assert_eq!(
        check_requirement("Liger_Kernel==0.8.5").unwrap(),
        "liger-kernel"
    );
    assert_eq!(check_requirement("a.b__c>=1.0,!=1.2.*").unwrap(), "a-b-c");
    assert_eq!(check_requirement("torch >= 2.5").unwrap(), "torch");
    assert!(check_requirement("torch>=2.5 ; python_version>'3'").is_err());
}

/// `python/tests/fixtures/python_digests.json`: Python candidates' canonical manifests and
/// digests as this crate computes them, for the Python client's parser and digest to agree
/// with (written here; `KERNELIZE_UPDATE_FIXTURES=1` rewrites it).
#[test]
fn python_digest_fixture_is_current() {
    let third_party =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels/third-party");
    let mut cases = vec![serde_json::json!({
        "name": "inline",
        "manifest_toml": PY_GOOD,
        "source": PY_SRC,
        "manifest": Manifest::parse(PY_GOOD).unwrap(),
        "digest": KernelBundle::from_parts(PY_GOOD, PY_SRC).unwrap().digest().to_string(),
    })];
    let mut dirs: Vec<_> = std::fs::read_dir(&third_party)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    dirs.sort();
    for dir in dirs.iter().filter(|d| d.join("kernel.toml").exists()) {
        let b = KernelBundle::load_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        cases.push(serde_json::json!({
            "name": dir.file_name().unwrap().to_string_lossy(),
            "manifest_toml": b.manifest_toml,
            "source": b.source,
            "manifest": b.manifest,
            "digest": b.digest().to_string(),
        }));
    }
    let want = serde_json::to_string_pretty(&serde_json::json!({
        "comment": "Written by kernel-registry's test manifest::tests::python_digest_fixture_is_current (the inline candidate and kernels/third-party/*); do not edit: run KERNELIZE_UPDATE_FIXTURES=1 cargo test -p kernel-registry python_digest_fixture",
        "cases": cases,
    }))
    .unwrap()
        + "\n";
    crate::fixtures::check_current("python_digests.json", &want, "python_digest_fixture");
}

/// Every stored field has a length limit, refused naming the field, its length and the limit;
/// a value at the limit is accepted.
#[test]
fn every_stored_field_has_a_length_limit() {
    let err = |m: &str| Manifest::parse(m).unwrap_err();
    let field = |m: &str| err(m).field_name().map(str::to_string);
    // A 10,000-character prerelease: semver accepts it, the manifest does not.
    let long_pre = format!("1.0.0-{}", "a".repeat(10_000));
    let e = err(&with(
        "version = \"1.0.0\"",
        &format!("version = \"{long_pre}\""),
    ));
    assert_eq!(e.field_name(), Some("version"));
    assert!(
        e.to_string().contains("is 10006 bytes long; at most 64"),
        "{e}"
    );
    let at_limit = format!("1.0.0-{}", "a".repeat(MAX_VERSION - 6));
    assert!(Manifest::parse(&with(
        "version = \"1.0.0\"",
        &format!("version = \"{at_limit}\"")
    ))
    .is_ok());
    let build = format!("1.0.0+{}", "b".repeat(MAX_VERSION));
    assert_eq!(
        field(&with(
            "version = \"1.0.0\"",
            &format!("version = \"{build}\"")
        ))
        .as_deref(),
        Some("version")
    );

    let cases: Vec<(String, &str)> = vec![
        (
            with(
                "description = \"demo\"",
                &format!("description = \"{}\"", "d".repeat(MAX_DESCRIPTION + 1)),
            ),
            "description",
        ),
        (
            with(
                "authors = [\"someone\"]",
                &format!("authors = [\"{}\"]", "a".repeat(MAX_AUTHOR + 1)),
            ),
            "authors[0]",
        ),
        (
            with(
                "authors = [\"someone\"]",
                &format!("authors = [{}]", vec!["\"x\""; MAX_AUTHORS + 1].join(",")),
            ),
            "authors",
        ),
        (
            with(
                "license = \"MIT\"",
                &format!("license = \"{}\"", ["MIT"; 60].join(" OR ")),
            ),
            "license",
        ),
        (
            with(
                "source = \"k.cu\"",
                &format!("source = \"{}.cu\"", "k".repeat(MAX_SOURCE_NAME)),
            ),
            "source",
        ),
        (
            with(
                "bf16 = \"k_bf16\"",
                &format!("bf16 = \"{}\"", "k".repeat(MAX_ENTRY + 1)),
            ),
            "entry.bf16",
        ),
        (
            with(
                "op = \"rms_norm\"",
                &format!("op = \"{}\"", "o".repeat(MAX_WORD + 1)),
            ),
            "op",
        ),
        (
            with(
                "source = \"k.cu\"",
                &format!(
                    "source = \"k.cu\"\nnvrtc_options = [\"-D{}\"]",
                    "X".repeat(MAX_NVRTC_OPTION)
                ),
            ),
            "nvrtc_options[0]",
        ),
        (
            with(
                "source = \"k.cu\"",
                &format!(
                    "source = \"k.cu\"\nnvrtc_options = [{}]",
                    vec!["\"-lineinfo\""; MAX_NVRTC_OPTIONS + 1].join(",")
                ),
            ),
            "nvrtc_options",
        ),
        (
            with(
                "name = \"rms_norm_demo\"",
                &format!("name = \"{}\"", "n".repeat(MAX_NAME + 1)),
            ),
            "name",
        ),
    ];
    for (m, f) in cases {
        let e = err(&m);
        assert_eq!(e.field_name(), Some(f), "{e}");
        assert!(e.to_string().contains("at most"), "{e}");
    }
    // At the limit: accepted.
    let ok = with(
        "description = \"demo\"",
        &format!("description = \"{}\"", "d".repeat(MAX_DESCRIPTION)),
    );
    assert!(Manifest::parse(&ok).is_ok());
}

#[test]
fn license_is_an_spdx_expression() {
    for good in [
        "MIT",
        "Apache-2.0",
        "MIT OR Apache-2.0",
        "Apache-2.0 WITH LLVM-exception",
        "(MIT OR Apache-2.0) AND BSD-3-Clause",
        " MIT ",
    ] {
        let m = Manifest::parse(&with("license = \"MIT\"", &format!("license = \"{good}\"")))
            .unwrap_or_else(|e| panic!("{good}: {e}"));
        assert_eq!(m.license, good.trim());
    }
    for bad in [
        "",
        "   ",
        "Apache 2.0",
        "MIT-ish",
        "GPL",
        "MIT OR",
        "proprietary, ask me",
        "MIT/Apache-2.0",
    ] {
        let e = Manifest::parse(&with("license = \"MIT\"", &format!("license = \"{bad}\"")))
            .unwrap_err();
        assert_eq!(e.field_name(), Some("license"), "{bad}: {e}");
        assert!(e.to_string().contains("SPDX"), "{bad}: {e}");
    }
}

/// Every bundled kernel's manifest passes the checks (SPDX licence, limits) as written.
#[test]
fn bundled_manifests_pass() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels");
    let mut n = 0;
    for dir in [root.clone(), root.join("third-party")] {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path().join("kernel.toml");
            if p.exists() {
                let text = std::fs::read_to_string(&p).unwrap();
                Manifest::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                n += 1;
            }
        }
    }
    assert!(n >= 30, "found only {n} bundled manifests");
}

/// `[[capability]]`: what the compiled code needs, each with a reason; part of the digest
/// when present, absent from the canonical form (and so from old digests) when not.
#[test]
fn capabilities_are_declared_with_a_reason() {
    let decl = "[[capability]]\nname = \"trap\"\nreason = \"traps on a launch shape the launch rules never produce\"\n\n[[capability]]\nname = \"global_atomics\"\nreason = \"a grid-wide sum\"\n";
    let t = format!("{GOOD}\n{decl}");
    let m = Manifest::parse(&t).unwrap();
    assert_eq!(
        m.capabilities
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        vec!["global_atomics", "trap"],
        "sorted by name"
    );
    assert_eq!(
        m.capabilities[1].reason,
        "traps on a launch shape the launch rules never produce"
    );
    let json = serde_json::to_value(&m).unwrap();
    assert_eq!(json["capabilities"][1]["name"], "trap");
    let plain = serde_json::to_value(Manifest::parse(GOOD).unwrap()).unwrap();
    assert!(plain.get("capabilities").is_none(), "{plain}");
    let with_caps = KernelBundle::from_parts(&t, SRC).unwrap().digest();
    assert_ne!(
        with_caps,
        KernelBundle::from_parts(GOOD, SRC).unwrap().digest()
    );
    // Refused, naming the field.
    for (bad, field, says) in [
        ("[[capability]]\nname = \"clocks\"\nreason = \"x\"\n", "capability[0].name", "not a capability"),
        ("[[capability]]\nname = \"clock\"\nreason = \"  \"\n", "capability[0].reason", "say why"),
        ("[[capability]]\nname = \"inline_asm\"\nreason = \"x\"\n", "capability[0].name", "needs no declaration"),
        (
            "[[capability]]\nname = \"trap\"\nreason = \"x\"\n[[capability]]\nname = \"trap\"\nreason = \"y\"\n",
            "capability[1].name",
            "declared twice",
        ),
    ] {
        let e = Manifest::parse(&format!("{GOOD}\n{bad}")).unwrap_err();
        assert_eq!(e.field_name(), Some(field), "{bad}: {e}");
        assert!(e.to_string().contains(says), "{e}");
    }
    let long = format!(
        "{GOOD}\n[[capability]]\nname = \"trap\"\nreason = \"{}\"\n",
        "r".repeat(crate::capability::MAX_CAPABILITY_REASON + 1)
    );
    let e = Manifest::parse(&long).unwrap_err();
    assert_eq!(e.field_name(), Some("capability[0].reason"), "{e}");
    let e = Manifest::parse(&format!("{GOOD}\n[[capability]]\nname = \"trap\"\n")).unwrap_err();
    assert!(e.to_string().contains("reason"), "{e}");
}

// ---- backward ops (docs/spec.md section 2c) ------------------------------------------------

const BWD: &str = r#"
name = "rms_norm_llama_backward"
version = "1.0.0"
op = "rms_norm_backward"
semantics = "llama"
description = "HF LlamaRMSNorm's backward in eager autograd's order"
authors = ["kernelize"]
license = "Apache-2.0"
source = "kernel.cu"

[entry.bf16]
dx = "bwd_dx_bf16"
dwp = "bwd_dwp_bf16"
dw = "bwd_dw_bf16"

[entry.f32]
dx = "bwd_dx_f32"
dwp = "bwd_dwp_f32"
dw = "bwd_dw_f32"
"#;

const BWD_SRC: &str = "bwd_dx_bf16 bwd_dwp_bf16 bwd_dw_bf16 bwd_dx_f32 bwd_dwp_f32 bwd_dw_f32";

fn bwd_with(from: &str, to: &str) -> String {
    assert!(BWD.contains(from), "fixture lacks {from}");
    BWD.replacen(from, to, 1)
}

#[test]
fn a_backward_manifest_names_every_entry_per_dtype() {
    let m = Manifest::parse(BWD).unwrap();
    assert_eq!((m.op, m.semantics), (Op::RmsNormBackward, Semantics::Llama));
    assert_eq!(m.dtypes(), vec![DType::Bf16, DType::F32]);
    // `entries` names each dtype's first launch; `stages` every launch
    assert_eq!(m.entries[&DType::Bf16], "bwd_dx_bf16");
    assert_eq!(m.stages[&DType::F32]["dwp"], "bwd_dwp_f32");
    assert_eq!(m.stages[&DType::F32].len(), 3);
    assert!(m.launch.is_empty());
    let e = m.launch_dims(4, 4096, 132).unwrap_err();
    assert!(e.contains("stage_dims"), "{e}");
    // the canonical encoding carries the stages; a forward manifest's has no such key
    let json = serde_json::to_string(&m).unwrap();
    assert!(
        json.contains(
            r#""stages":{"bf16":{"dw":"bwd_dw_bf16","dwp":"bwd_dwp_bf16","dx":"bwd_dx_bf16"}"#
        ),
        "{json}"
    );
    let fwd = serde_json::to_string(&Manifest::parse(GOOD).unwrap()).unwrap();
    assert!(!fwd.contains("stages"), "{fwd}");
    // semantics default to the op's only one
    let m = Manifest::parse(&bwd_with("semantics = \"llama\"\n", "")).unwrap();
    assert_eq!(m.semantics, Semantics::Llama);
}

#[test]
fn a_backward_bundle_needs_every_entry_in_its_source() {
    let b = KernelBundle::from_parts(BWD, BWD_SRC).unwrap();
    let d = b.digest();
    // a stage's symbol takes part in the digest
    let other = bwd_with("dw = \"bwd_dw_f32\"", "dw = \"bwd_dw2_f32\"");
    let b2 = KernelBundle::from_parts(&other, &format!("{BWD_SRC} bwd_dw2_f32")).unwrap();
    assert_ne!(b2.digest(), d);
    let e = KernelBundle::from_parts(
        BWD,
        "bwd_dx_bf16 bwd_dwp_bf16 bwd_dx_f32 bwd_dwp_f32 bwd_dw_f32",
    )
    .unwrap_err();
    assert_eq!(e.field_name(), Some("entry.bf16.dw"), "{e}");
}

#[test]
fn bad_backward_manifests_name_the_field() {
    let cases: Vec<(String, &str, &str)> = vec![
        (
            bwd_with(
                "[entry.f32]\ndx = \"bwd_dx_f32\"\ndwp = \"bwd_dwp_f32\"\ndw = \"bwd_dw_f32\"\n",
                "[entry]\nf32 = \"bwd_dx_f32\"\n",
            ),
            "entry.f32",
            "give a table `[entry.f32]` naming each (dx = \"...\", dwp = \"...\", dw = \"...\")",
        ),
        (
            bwd_with("dw = \"bwd_dw_bf16\"\n", ""),
            "entry.bf16.dw",
            "is missing",
        ),
        (
            bwd_with(
                "dw = \"bwd_dw_bf16\"\n",
                "dw = \"bwd_dw_bf16\"\ndb = \"bwd_db_bf16\"\n",
            ),
            "entry.bf16.db",
            "has no entry `db`; its entries are dx, dwp, dw",
        ),
        (
            bwd_with("dw = \"bwd_dw_bf16\"", "dw = \"bwd_dx_bf16\""),
            "entry.bf16.dx",
            "is named for two entries",
        ),
        (
            bwd_with("dw = \"bwd_dw_bf16\"", "dw = \"1bad\""),
            "entry.bf16.dw",
            "not a C identifier",
        ),
        (bwd_with("[entry.f32]", "[entry.f64]"), "entry.f64", "dtype"),
        (
            format!("{BWD}\n[launch]\nblock = 512\ngrid = \"persistent\"\nblocks_per_sm = 8\n"),
            "launch",
            "launches are its ABI's",
        ),
        (
            // a Python candidate of a backward op names a function per dtype, not its stages
            bwd_with(
                "source = \"kernel.cu\"",
                "source = \"kernel.py\"\nruntime = \"python\"\nrequires = [\"torch>=2.5\"]",
            ),
            "entry.bf16",
            "name one Python function",
        ),
        (
            bwd_with("semantics = \"llama\"", "semantics = \"default\""),
            "semantics",
            "one of llama, gemma, torch",
        ),
        (
            with(
                "[entry]\nbf16 = \"k_bf16\"\nf32 = \"k_f32\"\n",
                "[entry.bf16]\ndx = \"k_bf16\"\n",
            ),
            "entry.bf16",
            "rms_norm has one entry per dtype",
        ),
        (
            bwd_with(
                "dw = \"bwd_dw_bf16\"",
                &format!("dw = \"{}\"", "a".repeat(MAX_ENTRY + 1)),
            ),
            "entry.bf16.dw",
            "bytes long",
        ),
        (
            bwd_with("dw = \"bwd_dw_bf16\"", "dw = \"bwd_dw\\u0007bf16\""),
            "entry.bf16.dw",
            "control character",
        ),
    ];
    for (text, field, want) in cases {
        let e = Manifest::parse(&text).unwrap_err();
        assert_eq!(e.field_name(), Some(field), "{e}\n{text}");
        assert!(e.to_string().contains(want), "want `{want}` in: {e}");
    }
    // a value of the wrong TOML type is refused naming its key
    for text in [
        bwd_with("dw = \"bwd_dw_bf16\"", "dw = 3"),
        bwd_with(
            "[entry.f32]\ndx = \"bwd_dx_f32\"\ndwp = \"bwd_dwp_f32\"\ndw = \"bwd_dw_f32\"\n",
            "[entry]\nf32 = 3\n",
        ),
    ] {
        let e = Manifest::parse(&text).unwrap_err();
        assert!(matches!(e, ManifestError::Syntax(_)), "{e}");
        assert!(
            e.to_string()
                .contains("for a backward op a table of its entries"),
            "{e}"
        );
    }
    // a Python candidate's entry is one function name
    let py = with("source = \"k.cu\"", "source = \"k.py\"\nruntime = \"python\"\nrequires = [\"torch>=2.5\"]")
        .replace("\n[[launch]]\ncols_max = 1024\nblock = [32, 8]\ngrid = \"per_row\"\nrows_per_block = 8\n\n[[launch]]\nblock = 1024\ngrid = \"per_row\"\nsmem_bytes_per_col = 4\n", "")
        .replace("[entry]\nbf16 = \"k_bf16\"\nf32 = \"k_f32\"\n", "[entry.bf16]\ndx = \"k_bf16\"\n");
    let e = Manifest::parse(&py).unwrap_err();
    assert_eq!(e.field_name(), Some("entry.bf16"), "{e}");
}

/// A Python candidate of a backward op (docs/spec.md section 2b: `f(dy, x, w, eps) -> (dx, dw)`
/// for rms_norm_backward), as `kernels/third-party/` holds them.
const PY_BWD: &str = r#"
name = "liger_rms_norm_llama_backward"
version = "1.0.0"
op = "rms_norm_backward"
semantics = "llama"
description = "Liger-Kernel's RMSNorm backward, llama casting mode"
authors = ["kernelize"]
license = "Apache-2.0"
runtime = "python"
source = "kernel.py"
requires = ["liger-kernel==0.8.5", "torch>=2.5"]

[entry]
bf16 = "rms_norm_backward"
f32 = "rms_norm_backward"
"#;

const PY_BWD_SRC: &str =
    "import torch\n\n\ndef rms_norm_backward(dy, x, w, eps):\n    return dy.clone(), w.clone()\n";

#[test]
fn a_python_candidate_of_a_backward_op_names_one_function_per_dtype() {
    let m = Manifest::parse(PY_BWD).unwrap();
    assert_eq!((m.op, m.runtime), (Op::RmsNormBackward, Runtime::Python));
    assert_eq!(m.entries[&DType::Bf16], "rms_norm_backward");
    assert_eq!(m.dtypes(), vec![DType::Bf16, DType::F32]);
    // no stages (the function launches its own kernels) and no launch rules
    assert!(m.stages.is_empty() && m.launch.is_empty());
    assert!(m.launch_dims(4, 4096, 132).is_err());
    // its canonical form is a forward Python candidate's: no `stages` key
    let j = serde_json::to_string(&m).unwrap();
    assert!(!j.contains("stages"), "{j}");
    assert!(
        j.ends_with(r#""runtime":"python","requires":["liger-kernel==0.8.5","torch>=2.5"]}"#),
        "{j}"
    );
    let b = KernelBundle::from_parts(PY_BWD, PY_BWD_SRC).unwrap();
    assert_eq!(b.manifest, m);
    // the function must be defined in the source, as a forward candidate's
    let e =
        KernelBundle::from_parts(PY_BWD, "import torch\nrms_norm_backward = None\n").unwrap_err();
    assert_eq!(e.field_name(), Some("entry.bf16"), "{e}");
    // every backward op takes one (the semantics its op has)
    for &op in Op::ALL.iter().filter(|o| o.is_backward()) {
        let text = PY_BWD
            .replace("op = \"rms_norm_backward\"", &format!("op = \"{op}\""))
            .replace(
                "semantics = \"llama\"",
                &format!("semantics = \"{}\"", op.default_semantics()),
            );
        let m = Manifest::parse(&text).unwrap_or_else(|e| panic!("{op}: {e}"));
        assert_eq!((m.op, m.runtime), (op, Runtime::Python));
    }
    // what a Python candidate refuses, a backward one refuses too
    for (from, to, field) in [
        (
            "[entry]\nbf16 = \"rms_norm_backward\"\n",
            "[entry]\nbf16 = \"rms_norm_backward\"\n\n[launch]\nblock = 256\ngrid = \"per_row\"\n",
            "launch",
        ),
        (
            "requires = [\"liger-kernel==0.8.5\", \"torch>=2.5\"]\n",
            "",
            "requires",
        ),
        (
            "bf16 = \"rms_norm_backward\"",
            "bf16 = \"__rms_norm_backward\"",
            "entry.bf16",
        ),
        (
            "[entry]\nbf16 = \"rms_norm_backward\"\nf32 = \"rms_norm_backward\"\n",
            "[entry.bf16]\ndx = \"dx\"\ndwp = \"dwp\"\ndw = \"dw\"\n",
            "entry.bf16",
        ),
    ] {
        assert!(PY_BWD.contains(from), "fixture lacks {from}");
        let e = Manifest::parse(&PY_BWD.replacen(from, to, 1)).unwrap_err();
        assert_eq!(e.field_name(), Some(field), "{e}");
    }
}

/// [`PY_BWD`] with a setup function per dtype (`[setup]`, docs/spec.md section 2b).
fn py_bwd_setup() -> String {
    format!("{PY_BWD}\n[setup]\nbf16 = \"forward\"\nf32 = \"forward\"\n")
}

const PY_BWD_SETUP_SRC: &str = "import torch\n\n\ndef forward(x, w, eps):\n    return None\n\n\ndef rms_norm_backward(dy, x, w, eps, state):\n    return dy.clone(), w.clone()\n";

#[test]
fn a_python_backward_candidate_may_name_a_setup_function_per_dtype() {
    let text = py_bwd_setup();
    let m = Manifest::parse(&text).unwrap();
    assert_eq!(m.setup[&DType::Bf16], "forward");
    assert_eq!(m.setup.keys().copied().collect::<Vec<_>>(), m.dtypes());
    // in the canonical form last (serde's order), and only when given: the digests of
    // candidates without one are unchanged (a_python_candidate_of_a_backward_op_hashes_as_in_python)
    let j = serde_json::to_string(&m).unwrap();
    assert!(
        j.ends_with(r#""setup":{"bf16":"forward","f32":"forward"}}"#),
        "{j}"
    );
    assert!(!serde_json::to_string(&Manifest::parse(PY_BWD).unwrap())
        .unwrap()
        .contains("setup"));
    let b = KernelBundle::from_parts(&text, PY_BWD_SETUP_SRC).unwrap();
    assert_ne!(
        b.digest(),
        KernelBundle::from_parts(PY_BWD, PY_BWD_SETUP_SRC)
            .unwrap()
            .digest()
    );
    // python/tests/test_python_manifest.py's copy of both gets the same from the client
    assert_eq!(
        b.digest().to_string(),
        "sha256:6d56547d90ec5bcdac21a2a527e1892e6e600f3834f9ed49a6e06ab0f961e164"
    );
    // the function must be defined, as an entry's
    let e = KernelBundle::from_parts(&text, PY_BWD_SRC).unwrap_err();
    assert_eq!(e.field_name(), Some("setup.bf16"), "{e}");
    assert!(e.to_string().contains("`forward` is not defined"), "{e}");
    // refused: a dtype without an entry, a dtype without a setup, a bad name, an unknown dtype,
    // a forward op's candidate, a CUDA kernel
    for (from, to, field) in [
        (
            "f32 = \"forward\"\n",
            "f32 = \"forward\"\nf16 = \"forward\"\n",
            "setup.f16",
        ),
        ("f32 = \"forward\"\n", "", "setup"),
        ("bf16 = \"forward\"", "bf16 = \"__forward\"", "setup.bf16"),
        ("bf16 = \"forward\"", "fp8 = \"forward\"", "setup.fp8"),
        ("op = \"rms_norm_backward\"", "op = \"rms_norm\"", "setup"),
    ] {
        assert!(text.contains(from), "fixture lacks {from}");
        let e = Manifest::parse(&text.replacen(from, to, 1)).unwrap_err();
        assert_eq!(e.field_name(), Some(field), "{from} -> {to}: {e}");
    }
    let cuda = format!("{BWD}\n[setup]\nbf16 = \"forward\"\n");
    let e = Manifest::parse(&cuda).unwrap_err();
    assert_eq!(e.field_name(), Some("setup"), "{e}");
}

/// The digest of [`PY_BWD`] and [`PY_BWD_SRC`], which python/tests/test_python_manifest.py's
/// copy of both must get from the client's parser and digest too.
#[test]
fn a_python_candidate_of_a_backward_op_hashes_as_in_python() {
    let b = KernelBundle::from_parts(PY_BWD, PY_BWD_SRC).unwrap();
    assert_eq!(
        b.digest().to_string(),
        "sha256:1ab5f747654c767a854d211f5427889d80f9526aa54a8f26802565b3ae11fc1e"
    );
}

/// The Python candidates of backward ops in `kernels/third-party/` parse, and their entries
/// (and setup functions) are defined in their sources.
#[test]
fn the_field_backward_candidates_parse() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels/third-party");
    let mut dirs: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    dirs.sort();
    let mut n = 0;
    for d in dirs.iter().filter(|d| d.join("kernel.toml").exists()) {
        let b = KernelBundle::load_dir(d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        if b.manifest.op.is_backward() {
            assert_eq!(b.manifest.runtime, Runtime::Python, "{}", d.display());
            n += 1;
        }
    }
    assert!(n >= 7, "{n} backward candidates in {}", dir.display());
}

/// `python/tests/fixtures/backward_digests.json`: a backward kernel's canonical manifest and
/// digest as this crate computes them, for the Python client's parser and digest to agree with
/// (`KERNELIZE_UPDATE_FIXTURES=1` rewrites it).
#[test]
fn backward_digest_fixture_is_current() {
    let b = KernelBundle::from_parts(BWD, BWD_SRC).unwrap();
    let want = serde_json::to_string_pretty(&serde_json::json!({
        "comment": "Written by kernel-registry's test manifest::tests::backward_digest_fixture_is_current; do not edit: run KERNELIZE_UPDATE_FIXTURES=1 cargo test -p kernel-registry backward_digest_fixture",
        "cases": [{
            "name": "inline",
            "manifest_toml": BWD,
            "source": BWD_SRC,
            "manifest": b.manifest,
            "digest": b.digest().to_string(),
        }],
    }))
    .unwrap()
        + "\n";
    crate::fixtures::check_current("backward_digests.json", &want, "backward_digest_fixture");
}

/// `python/tests/fixtures/launch_dims.json`: every bundled CUDA kernel's launch rule
/// (`Manifest::launch_dims`, the one home of the arithmetic) at shapes on both sides of its
/// rules' `cols_max`, decode to large rows, two SM counts: the Python client's
/// `kernelize.manifest.launch_dims` (which scripts/bench_kernels.py launches with) must agree
/// (`KERNELIZE_UPDATE_FIXTURES=1` rewrites it).
#[test]
fn launch_fixture_is_current() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels");
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("kernel.toml").is_file())
        .collect();
    dirs.sort();
    let mut cases = Vec::new();
    for d in dirs {
        let toml = std::fs::read_to_string(d.join("kernel.toml")).unwrap();
        let m = Manifest::parse(&toml).unwrap();
        if m.runtime != crate::Runtime::Cuda || m.op.is_backward() {
            continue;
        }
        let mut cols: Vec<u64> = vec![1, 64, 1001, 4096, 8192, 16384, 65536];
        for r in &m.launch {
            if let Some(c) = r.cols_max {
                cols.extend([c, c + 1]);
            }
        }
        cols.sort_unstable();
        cols.dedup();
        let mut dims = serde_json::Map::new();
        for sms in [132u32, 114] {
            for rows in [1u64, 3, 64, 4096, 32768] {
                for &c in &cols {
                    let v = match m.launch_dims(rows, c, sms) {
                        Ok(d) => serde_json::json!([d.grid, d.block, d.shared_mem_bytes]),
                        Err(e) => serde_json::json!(e),
                    };
                    dims.insert(format!("{rows},{c},{sms}"), v);
                }
            }
        }
        cases.push(serde_json::json!({
            "name": m.name,
            "manifest_toml": toml,
            "dims": dims,
        }));
    }
    assert!(cases.len() >= 10, "{} bundled CUDA kernels", cases.len());
    let want = serde_json::to_string_pretty(&serde_json::json!({
        "comment": "Written by kernel-registry's test manifest::tests::launch_fixture_is_current from every bundled CUDA kernel's kernel.toml: \"rows,cols,sms\": [grid, block, dynamic shared memory] (Manifest::launch_dims) or its refusal; do not edit: run KERNELIZE_UPDATE_FIXTURES=1 cargo test -p kernel-registry launch_fixture",
        "cases": cases,
    }))
    .unwrap()
        + "\n";
    crate::fixtures::check_current("launch_dims.json", &want, "launch_fixture");
}

/// ptxas on several threads is the one ptxas option an author may pass, and only whole: a thread
/// count of at most three digits, nothing after it (a comma would pass more options to ptxas).
#[test]
fn ptxas_threads_is_the_one_ptxas_option_and_only_whole() {
    for ok in [
        "-Xptxas=--split-compile=0",
        "-Xptxas=--split-compile=16",
        "--ptxas-options=--split-compile=128",
    ] {
        assert!(is_ptxas_threads_option(ok), "{ok}");
        let m = Manifest::parse(&with(
            "source = \"k.cu\"",
            &format!("source = \"k.cu\"\nnvrtc_options = [\"{ok}\"]"),
        ))
        .unwrap();
        assert_eq!(m.nvrtc_options, vec![ok.to_string()]);
    }
    for bad in [
        "-Xptxas=--split-compile=",
        "-Xptxas=--split-compile=0,-O0",
        "-Xptxas=--split-compile=1234",
        "-Xptxas=-O0",
        "-Xptxas=--split-compile=x",
        "--ptxas-options=--gpu-name=sm_80",
    ] {
        assert!(!is_ptxas_threads_option(bad), "{bad}");
        let e = Manifest::parse(&with(
            "source = \"k.cu\"",
            &format!("source = \"k.cu\"\nnvrtc_options = [\"{bad}\"]"),
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("not allowed"), "{bad}: {e}");
    }
}

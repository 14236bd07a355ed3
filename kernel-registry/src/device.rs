//! Known GPUs: the architecture and the peak DRAM bandwidth their vendor publishes, so that a
//! report naming a device can be held to what that device can do.

use crate::domain::Arch;

/// A GPU model as the CUDA driver names it, with its vendor figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KnownDevice {
    /// What the model is called here (e.g. `H100 SXM`).
    pub model: &'static str,
    /// Words that all appear in the driver's device name (`cuDeviceGetName`, split at spaces
    /// and dashes, case-insensitive), e.g. `["H100", "PCIe"]` for `NVIDIA H100 PCIe`.
    pub words: &'static [&'static str],
    /// Words that must not appear (`H100` but not `PCIe`, `NVL`).
    pub not_words: &'static [&'static str],
    pub arch: Arch,
    /// Peak DRAM bandwidth from the vendor's data sheet, GB/s (10^9 bytes per second).
    pub peak_dram_gbps: f64,
}

const fn dev(
    model: &'static str,
    words: &'static [&'static str],
    not_words: &'static [&'static str],
    major: u32,
    minor: u32,
    peak_dram_gbps: f64,
) -> KnownDevice {
    KnownDevice {
        model,
        words,
        not_words,
        arch: Arch { major, minor },
        peak_dram_gbps,
    }
}

/// Data-center and common workstation GPUs, from NVIDIA's data sheets. The first entry whose
/// words match a name wins, so the more specific spellings come first (`GH200` before `H200`;
/// `H100 PCIe` and `H100 NVL` before `H100`, which the SXM part is called: `NVIDIA H100 80GB
/// HBM3`). A device missing here is held to the fastest known device of its architecture.
pub const KNOWN_DEVICES: &[KnownDevice] = &[
    // Blackwell
    dev("B300", &["B300"], &[], 10, 3, 8000.0),
    dev("GB300", &["GB300"], &[], 10, 3, 8000.0),
    dev("B200", &["B200"], &[], 10, 0, 8000.0),
    dev("GB200", &["GB200"], &[], 10, 0, 8000.0),
    dev("RTX 5090", &["RTX", "5090"], &[], 12, 0, 1792.0),
    // Hopper
    dev("GH200 (HBM3e)", &["GH200"], &[], 9, 0, 4900.0),
    dev("H200", &["H200"], &[], 9, 0, 4800.0),
    dev("H20", &["H20"], &[], 9, 0, 4000.0),
    dev("H100 PCIe", &["H100", "PCIe"], &[], 9, 0, 2000.0),
    dev("H100 NVL", &["H100", "NVL"], &[], 9, 0, 3900.0),
    dev("H100 SXM", &["H100"], &["PCIe", "NVL"], 9, 0, 3350.0),
    dev("H800", &["H800"], &[], 9, 0, 3350.0),
    // Ada
    dev("L40S", &["L40S"], &[], 8, 9, 864.0),
    dev("L40", &["L40"], &[], 8, 9, 864.0),
    dev("L4", &["L4"], &[], 8, 9, 300.0),
    dev("RTX 6000 Ada", &["RTX", "6000", "Ada"], &[], 8, 9, 960.0),
    dev("RTX 4090", &["RTX", "4090"], &[], 8, 9, 1008.0),
    // Ampere
    dev("A100 80GB", &["A100", "80GB"], &[], 8, 0, 2039.0),
    dev("A100 40GB", &["A100"], &["80GB"], 8, 0, 1555.0),
    dev("A800", &["A800"], &[], 8, 0, 2039.0),
    dev("A30", &["A30"], &[], 8, 0, 933.0),
    dev("A40", &["A40"], &[], 8, 6, 696.0),
    dev("A10", &["A10"], &[], 8, 6, 600.0),
    dev("RTX 3090", &["RTX", "3090"], &[], 8, 6, 936.0),
    // Turing, Volta
    dev("T4", &["T4"], &[], 7, 5, 320.0),
    dev("V100", &["V100"], &[], 7, 0, 900.0),
];

/// A measured copy bandwidth may exceed the data sheet's peak by this factor at most (the
/// sheets round: "3.35 TB/s"); the H200 measures 0.86 of its peak.
pub const PEAK_MARGIN: f64 = 1.02;

fn words(name: &str) -> Vec<String> {
    name.split(|c: char| c.is_whitespace() || c == '-' || c == '_')
        .filter(|w| !w.is_empty())
        .map(|w| w.to_ascii_uppercase())
        .collect()
}

/// The known model a driver's device name denotes, if any.
pub fn lookup(name: &str) -> Option<&'static KnownDevice> {
    let have = words(name);
    let has = |w: &str| have.iter().any(|h| h == &w.to_ascii_uppercase());
    KNOWN_DEVICES
        .iter()
        .find(|d| d.words.iter().all(|w| has(w)) && !d.not_words.iter().any(|w| has(w)))
}

/// The most DRAM bandwidth any known device of `arch` has: the bound for a device this table
/// does not name. `None` for an architecture the table does not know.
pub fn arch_ceiling_gbps(arch: Arch) -> Option<f64> {
    KNOWN_DEVICES
        .iter()
        .filter(|d| d.arch == arch)
        .map(|d| d.peak_dram_gbps)
        .reduce(f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names_find_their_model() {
        for (name, model, arch) in [
            ("NVIDIA H200", "H200", "sm_90"),
            ("NVIDIA GH200 480GB", "GH200 (HBM3e)", "sm_90"),
            ("NVIDIA H20", "H20", "sm_90"),
            ("NVIDIA H100 80GB HBM3", "H100 SXM", "sm_90"),
            ("NVIDIA H100 PCIe", "H100 PCIe", "sm_90"),
            ("NVIDIA H100 NVL", "H100 NVL", "sm_90"),
            ("NVIDIA A100-SXM4-80GB", "A100 80GB", "sm_80"),
            ("NVIDIA A100 80GB PCIe", "A100 80GB", "sm_80"),
            ("NVIDIA A100-SXM4-40GB", "A100 40GB", "sm_80"),
            ("NVIDIA A10", "A10", "sm_86"),
            ("NVIDIA L40S", "L40S", "sm_89"),
            ("NVIDIA L4", "L4", "sm_89"),
            ("NVIDIA GeForce RTX 4090", "RTX 4090", "sm_89"),
            ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada", "sm_89"),
            ("NVIDIA B200", "B200", "sm_100"),
            ("Tesla V100-SXM2-32GB", "V100", "sm_70"),
            ("Tesla T4", "T4", "sm_75"),
        ] {
            let d = lookup(name).unwrap_or_else(|| panic!("{name} not found"));
            assert_eq!(
                (d.model, d.arch.to_string().as_str()),
                (model, arch),
                "{name}"
            );
        }
        for unknown in ["Fake GPU", "test", "NVIDIA GeForce GTX 1080"] {
            assert_eq!(lookup(unknown), None, "{unknown}");
        }
    }

    #[test]
    fn unknown_devices_are_held_to_their_architecture() {
        assert_eq!(arch_ceiling_gbps(Arch::new(9, 0)), Some(4900.0));
        assert_eq!(arch_ceiling_gbps(Arch::new(8, 0)), Some(2039.0));
        assert_eq!(arch_ceiling_gbps(Arch::new(11, 0)), None);
    }
}

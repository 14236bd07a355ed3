//! Determinism: repeated launches on the same input give identical bits (outputs and, for
//! fused_add_rms_norm, the updated residual).

use crate::numeric::count_bit_differences;
use kernel_registry::DType;

/// The most elements in which any later launch differs from launch 1, over every buffer
/// (`launches[k][b]` is buffer b after launch k).
pub fn max_differing(dt: DType, launches: &[Vec<&[u8]>]) -> u64 {
    let Some(first) = launches.first() else {
        return 0;
    };
    launches[1..]
        .iter()
        .flat_map(|l| {
            l.iter()
                .zip(first)
                .map(|(a, b)| count_bit_differences(dt, a, b))
        })
        .max()
        .unwrap_or(0)
}

/// The note of a non-deterministic case.
pub fn note(differing: u64) -> Option<String> {
    (differing > 0).then(|| {
        format!("repeated launches on the same input differ in up to {differing} element(s)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_buffer_of_any_later_launch_counts() {
        let a = vec![0u8; 8];
        let mut b = a.clone();
        b[2] = 1; // element 1 of a bf16 buffer
        let same: Vec<Vec<&[u8]>> = vec![vec![&a, &a], vec![&a, &a], vec![&a, &a]];
        assert_eq!(max_differing(DType::Bf16, &same), 0);
        assert_eq!(note(0), None);
        // Only the residual of launch 3 differs.
        let third: Vec<Vec<&[u8]>> = vec![vec![&a, &a], vec![&a, &a], vec![&a, &b]];
        assert_eq!(max_differing(DType::Bf16, &third), 1);
        assert!(note(1).unwrap().contains("differ in up to 1 element"));
    }
}
